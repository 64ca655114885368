"""A lesson with no surprises, without a browser: the counters take the speedup apart, a failed model
load keeps the run, the browser's copy of a tab brings it back, and Compare runs in slices."""
from __future__ import annotations

from components.compare import CompareSteps
from components.counters import counters_html
from components.handlers import Handlers
from components.run_files import RunFiles, open_run_bytes
from components.session import SETTINGS_FIELDS, Session

from .test_app import PROMPT

PAGE = dict(model="embedded", tree="tr-16", k=8, max_new_tokens=12, hot_start=True, lookup=True,
            method="Token Recycling (TR)", temperature=0.0, top_p=1.0, seed=0, start="hot")


def test_the_counters_lead_with_mat_and_take_the_speedup_apart():
    fig = {"tr": {"tokens": 30, "forwards": 12, "mat": 2.5, "tok_per_s": 15.0, "seconds": 2.0},
           "greedy": {"tokens": 30, "forwards": 30, "mat": 1.0, "tok_per_s": 12.0, "seconds": 2.5},
           "speedup": 1.25, "identical": True, "compared": 30}
    html = counters_html(fig, cpu=True)
    assert html.index("MAT <b>2.50</b>") < html.index("speedup here")  # MAT leads
    # a step of the method took (2.0 / 12) / (2.5 / 30) = 2.00 greedy steps: 2.5 / 2.00 = 1.25
    assert "1.25× = MAT 2.50 ÷ 2.00" in html and "a projection, not a measurement" in html and "2.5×" in html
    assert "projection" not in counters_html(fig, cpu=False)  # on a GPU the speedup is measured, not projected
    assert "not a gain" not in html  # drafts were accepted: the speedup is the method's


def test_before_any_draft_is_accepted_a_speedup_above_one_is_said_to_be_the_timings_variation():
    """Same work on both sides (MAT 1.00): a figure above 1× is step times varying, and the page says so;
    below 1× it is the drafts' cost, which the usual words already say."""
    fig = {"tr": {"tokens": 3, "forwards": 3, "mat": 1.0, "tok_per_s": 2.3, "seconds": 1.3},
           "greedy": {"tokens": 3, "forwards": 3, "mat": 1.0, "tok_per_s": 1.8, "seconds": 1.67},
           "speedup": 1.26, "identical": True, "compared": 3}
    assert "No draft has been accepted yet" in counters_html(fig) and "not a gain" in counters_html(fig)
    slower = {**fig, "tr": {**fig["tr"], "tok_per_s": 1.5, "seconds": 2.0}, "speedup": 0.83}
    assert "No draft has been accepted yet" not in counters_html(slower)


def test_a_replays_figures_are_said_to_be_the_recording_machines():
    fig = {"tr": {"tokens": 30, "forwards": 12, "mat": 2.5, "tok_per_s": 15.0, "seconds": 2.0, "alongside": 4},
           "greedy": {"tokens": 30, "forwards": 30, "mat": 1.0, "tok_per_s": 12.0, "seconds": 2.5, "alongside": 9},
           "speedup": 1.25, "identical": True, "compared": 30}
    there = counters_html(fig, recorded_on="the machine that recorded this run, Some CPU,")
    assert "on the machine that recorded this run, Some CPU, a step of the method took 2.00×" in there
    assert "speedup recorded" in there and "speedup here" not in there and "this machine" not in there
    assert "A class on the server that recorded it" in there and "this server" not in there
    here = counters_html(fig)
    assert "speedup here" in here and "on this machine" in here and "A class on this server" in here
    # a run file's machine is a visitor's text: shown as text, never as markup
    assert "<script>" not in counters_html(fig, recorded_on="the machine that recorded this run, <script>,")


def test_a_failed_model_switch_keeps_the_run_shown(hub):
    h = Handlers(hub, 256)
    sess = Session()
    for _ in range(2):
        h.step(None, sess, PROMPT, **PAGE)
    text = sess.views().text
    out = h.step(None, sess, PROMPT, **{**PAGE, "model": "nobody/nothing-7b"})
    assert "The run shown stays" in out[-1]
    assert sess.live.race is None and len(sess.view().steps) == 2 and sess.views().text == text  # detached, the same
    assert "step 2 of 2" in out[-2].label
    out = h.step(None, sess, PROMPT, **PAGE)  # the model that loads: a new run, from step 1
    assert len(sess.view().steps) == 1 and sess.live.kept is None


def test_the_browsers_copy_of_a_tab_brings_back_its_prompt_settings_and_run(hub):
    h = Handlers(hub, 256)
    files = RunFiles(h)
    sess = Session()
    for _ in range(3):
        h.step(None, sess, PROMPT, **PAGE)
    _button, kept = files.prepare(sess)
    assert kept["prompt"] == PROMPT and kept["run"] and set(kept["settings"]) == set(SETTINGS_FIELDS)
    out = files.restore(None, kept)  # a reload: a new session from what the browser kept
    restored, prompt, fields = out[0], out[-1 - len(SETTINGS_FIELDS)], out[-len(SETTINGS_FIELDS):]
    assert restored is not sess and len(restored.view().steps) == 3 and prompt == PROMPT
    assert fields[SETTINGS_FIELDS.index("tree")] == "tr-16" and fields[SETTINGS_FIELDS.index("method")] == PAGE["method"]
    assert restored.view().output == sess.view().output
    assert "speedup here" in out[5] and "on this machine" in out[5]  # this server's own run: timed here
    replay = Session()
    open_run_bytes(replay, kept["run"], "run.json")  # the same run as a file: its times are the file's
    _button, kept_replay = files.prepare(replay)
    out = files.restore(None, kept_replay)
    assert "speedup recorded" in out[5] and "on this machine" not in out[5]
    out = files.restore(None, {**kept, "run": "{not a run"})  # a damaged copy: the prompt and settings alone
    assert out[0].view() is None and out[-1 - len(SETTINGS_FIELDS)] == PROMPT


def test_compare_runs_in_slices_to_the_end_and_cancels(hub):
    steps = CompareSteps(hub, 256)
    run = steps.begin(PROMPT, "embedded", 12)[0]
    ticks = 0
    while run is not None:
        out = steps.tick(run)
        run, ticks = out[0], ticks + 1
        if run is not None:
            assert "Method" in out[2] and "of at most 12 tokens" in out[2]  # progress per step
    assert ticks > 1 and "identical to greedy" in out[2] and "differs" not in out[2]
    run = steps.begin(PROMPT, "embedded", 12)[0]
    steps.tick(run)
    out = steps.cancel(run)
    assert "Cancelled after" in out[1] and out[0] is None
    assert "Cancelled after" in steps.tick(run)[2]  # a slice in flight when Cancel came ends there
    refused = steps.begin("", "embedded", 12)
    assert refused[0] is None and "empty" in refused[2]


def test_teach_mode_keeps_a_steps_verdict_off_the_status_line_until_accept(hub):
    """Retrieve and verify come before the verdict, and so does any earlier step's frame: the status
    line says that the step ran, not what it committed; from accept on it says it, as outside Teach mode."""
    h = Handlers(hub, 256)
    sess = Session()
    h.step(None, sess, PROMPT, teach=False, **PAGE)
    out = h.step(None, sess, PROMPT, teach=True, **PAGE)
    assert sess.cursor.frame == 1 and out[-1] == "Step 2 has run: what it accepts shows at phase 3, accept."
    out = h.prev_frame(sess)  # step 1's last frame: step 2's verdict still waits
    assert (sess.cursor.shown, sess.cursor.frame) == (1, 4) and "committed" not in out[-1]
    assert out[-1].startswith("Showing step 1 of 2. Step 2 has run")  # which step the panels show
    out = h.history(1, sess)
    assert "committed" not in out[-1]
    for frame in (1, 2):
        out = h.next_frame(None, sess, PROMPT, teach=True, **PAGE)
        assert (sess.cursor.shown, sess.cursor.frame) == (2, frame) and "committed" not in out[-1]
    out = h.next_frame(None, sess, PROMPT, teach=True, **PAGE)
    assert sess.cursor.frame == 3 and out[-1].startswith("Step 2 done:") and "committed" in out[-1]
    out = h.step(None, sess, PROMPT, teach=False, **PAGE)
    assert sess.cursor.frame == 0 and out[-1].startswith("Step 3 done:")
    out = h.history(1, sess)  # outside Teach mode an earlier step says which, and the latest step's words follow
    assert out[-1].startswith("Showing step 1 of 3. Step 3 done:") and "committed" in out[-1]
    out = h.history(3, sess)
    assert out[-1].startswith("Step 3 done:")
