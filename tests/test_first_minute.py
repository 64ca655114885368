"""A visitor's first minute without a browser: the shipped hot start and its cold contrast, Teach frames
that hide what comes next, controls that say what they do."""
from __future__ import annotations

import json
import re

import pytest

from components.counters import counters_html
from components.handlers import Handlers
from components.run_files import EXAMPLE_DIR, example_runs, open_run_bytes
from components.session import PAGE_MAX_NODES, SHIPPED_MATRIX, Session, UserError
from tr_core import AdjacencyMatrix

from .conftest import drawn, is_skip
from .test_app import PROMPT, settings


def page_session() -> Session:
    """A new tab as the page makes it: its own copy of the shipped matrix."""
    return Session.starting_from(warm_file=str(SHIPPED_MATRIX))


def test_the_shipped_matrix_fits_the_embedded_model_and_says_how_it_was_warmed(embedded_lm):
    m = AdjacencyMatrix.load(SHIPPED_MATRIX, embedded_lm.fingerprint, embedded_lm.vocab_size)
    assert m.k == 8 and m.writes > 3000  # thousands of rows, from decoding the calibration prompts
    assert "calibration prompts" in m.note


def test_the_shipped_matrix_holds_pair_rows(embedded_lm):
    m = AdjacencyMatrix.load(SHIPPED_MATRIX, embedded_lm.fingerprint, embedded_lm.vocab_size)
    assert m.pairs.written > 5000


@pytest.mark.parametrize("start", ["hot", "cold"])
def test_the_first_step_on_any_prompt_accepts_a_draft(hub, start):  # noqa: F811
    """The prefill seeds the root's row with the model's own top-k, so the first Step on a new prompt
    shows the method working, hot start or cold, whatever the prompt."""
    for prompt in (PROMPT, "Compose an engaging travel blog post about a trip to the Alps."):
        sess = page_session()
        sess.step(hub, prompt, settings(tree="auto", start=start), cap=256)
        step = sess.live.race.decoder.steps[0]
        assert step.accepted_drafts >= 1 and len(step.committed) >= 2, (prompt, start)


def test_a_new_tab_starts_hot_from_the_shipped_matrix_and_one_choice_shows_a_cold_start(hub):  # noqa: F811
    sess = page_session()
    sess.step(hub, PROMPT, settings(tree="auto"), cap=256)
    assert "warmed on" in sess.live.header["matrix_start"] and "warmed on" in sess.views().counters  # the counters say so
    cold = page_session()
    cold.step(hub, PROMPT, settings(tree="auto", start="cold"), cap=256)
    assert "cold start" in cold.live.header["matrix_start"]
    assert sess.matrix_state.matrix.writes > cold.matrix_state.matrix.writes + 1000  # cold: only the rows of the prompt and one step
    assert cold.matrix_state.matrix.writes > 0  # the cold matrix fills as it decodes ...
    cold.reset()
    cold.step(hub, PROMPT, settings(tree="auto"), cap=256)  # ... and back to hot: the shipped rows again
    assert "warmed on" in cold.live.header["matrix_start"]


def test_save_matrix_never_writes_the_shipped_file_even_when_named_as_the_servers(hub, tmp_path):  # noqa: F811
    shipped = SHIPPED_MATRIX.read_bytes()
    sess = Session.starting_from(start_file=str(SHIPPED_MATRIX), warm_file=str(SHIPPED_MATRIX))  # TR_MATRIX = the shipped file
    sess.step(hub, PROMPT, settings(tree="tr-16"), cap=256)
    assert sess.matrix_state.matrix.writes > 0
    sess.save_matrix(folder=str(tmp_path))  # the download is written ...
    assert SHIPPED_MATRIX.read_bytes() == shipped  # ... the shipped file is not


def test_a_loaded_matrix_is_used_whatever_the_start_and_k_below_8_keeps_the_hot_start(hub, tmp_path):  # noqa: F811
    sess = page_session()
    sess.step(hub, PROMPT, settings(tree="tr-16", start="cold"), cap=256)
    path = sess.save_matrix(folder=str(tmp_path))
    other = page_session()
    other.step(hub, PROMPT, settings(tree="tr-16", start="cold"), cap=256)
    other.load_matrix(hub, path, settings())
    loaded = other.matrix_state.matrix
    other.step(hub, "Another prompt, please.", settings(tree="tr-16"), cap=256)  # hot: the loaded matrix
    assert other.matrix_state.matrix is loaded and "loaded from a matrix file" in other.live.header["matrix_start"]
    narrow = page_session()
    narrow.step(hub, PROMPT, settings(tree="auto", k=4), cap=256)
    assert narrow.matrix_state.matrix.k == 4 and narrow.matrix_state.matrix.writes > 3000  # the shipped rows' first 4 candidates
    assert "warmed on" in narrow.live.header["matrix_start"]


def test_a_page_tree_over_the_cap_is_refused_with_the_cap_named(hub):  # noqa: F811
    big = json.dumps([[r] for r in range(8)] + [[a, b] for a in range(8) for b in range(8)] +
                     [[a, b, c] for a in range(2) for b in range(4) for c in range(8)])
    assert len(json.loads(big)) > PAGE_MAX_NODES
    with pytest.raises(UserError, match=f"at most {PAGE_MAX_NODES}"):
        Session().step(hub, PROMPT, settings(tree=big), cap=256)
    with pytest.raises(UserError, match="limit"):  # a long chain is refused for its depth, in words
        Session().step(hub, PROMPT, settings(tree="chain-200"), cap=256)


@pytest.mark.parametrize("tokens", [0, 100000])
def test_out_of_range_token_counts_get_a_message(hub, tokens):  # noqa: F811
    h = Handlers(hub, 256)
    page = dict(model="embedded", tree="auto", k=8, max_new_tokens=tokens, hot_start=True, lookup=True,
                method="Token Recycling (TR)", temperature=0, top_p=1, seed=0, start="hot")
    out = h.step(None, None, PROMPT, **page)
    assert "between 1 and 256" in out[-1]


def test_teach_frames_show_no_verdict_before_it_happens(hub):  # noqa: F811
    h = Handlers(hub, 256)
    sess = Session()
    for _ in range(2):
        sess.step(hub, PROMPT, settings(tree="tr-16"), cap=256)
    second = sess.live.race.decoder.steps[1]
    sess.cursor.frame = 1
    out = drawn(h.render(sess))
    text, counters, phases = out["text"], out["counters"], out["phases"]
    assert text.count('title="step ') == len(sess.live.race.decoder.steps[0].committed)  # step 2's tokens not yet
    first = sess.live.race.baseline[0]  # greedy's side after step 1: as many tokens as TR's step 1 committed
    forwards = re.search(r"forward passes</th><td>(\d+)</td><td>(\d+)</td>", counters)
    assert forwards and forwards.groups() == ("1", str(first["forwards"]))  # TR's and greedy's, step 2 not counted
    assert "counted at phase 3" in counters
    later = phases.split("2. verify")[1]
    assert "Phase ▶ shows it" in later and "committed" not in later  # accept and recycle still hidden
    hovers = " ".join(h for t in out["tree"].data for h in (t.hovertext or []) if isinstance(h, str))
    assert "accepted" not in hovers and "rejected" not in hovers and "choice" not in hovers  # nor on hover
    assert "verdict comes at phase 3" in out["alt"]  # nor in the words for screen readers
    sess.cursor.frame = 3
    out = drawn(h.render(sess))
    assert out["text"].count('title="step ') == len(sess.live.race.decoder.output)  # accept: the new tokens are in
    assert "counted at phase 3" not in out["counters"] and "Phase ▶ shows it" in out["phases"].split("3. accept")[1]
    assert f"<b>{len(second.committed)}</b>" in out["phases"]


def test_the_sampling_sentence_compares_the_texts_before_it_speaks():
    fig = {"tr": {"tokens": 9, "forwards": 5, "mat": 1.8, "tok_per_s": 10.0},
           "greedy": {"tokens": 9, "forwards": 9, "mat": 1.0, "tok_per_s": 8.0}, "speedup": 1.25,
           "identical": True, "compared": 9}
    assert "the same so far (9 tokens" in counters_html(fig, sampled=True)
    assert "differ" not in counters_html(fig, sampled=True)
    assert "differ" in counters_html({**fig, "identical": False}, sampled=True)
    assert "tokens committed per forward pass" in counters_html(fig)  # MAT explained where it is shown


def test_a_settings_change_says_the_next_step_starts_a_new_run(hub):  # noqa: F811
    h = Handlers(hub, 256)
    base = dict(model="embedded", tree="auto", k=8, max_new_tokens=24, hot_start=True, lookup=True,
                method="Token Recycling (TR)", temperature=0, top_p=1, seed=0, start="hot")
    sess = h.step(None, None, PROMPT, **base)[0]
    assert h.settings_changed(sess, PROMPT, **base) == sess.message  # nothing changed: nothing new to say
    said = h.settings_changed(sess, PROMPT, **{**base, "start": "cold"})
    assert "next Step starts a new run" in said and "cold start" in said
    said = h.settings_changed(sess, PROMPT, **{**base, "temperature": 0.7})
    assert "next Step starts a new run" in said
    assert sess.live.race.decoder.steps  # the run shown stays until then


@pytest.mark.parametrize("first", ["teach", "history", "prev_frame", "pick_node", "pick_token"])
def test_a_tab_whose_first_event_draws_nothing_still_starts_hot(hub, first):  # noqa: F811
    """A visitor who ticks Teach mode (or moves the slider, clicks a node...) before the first Step gets
    the same tab as one who steps first: its own copy of the shipped matrix, not an empty one."""
    h = Handlers(hub, 256)
    first_event = {"teach": lambda: h.teach_toggled(True, None), "history": lambda: h.history(1, None),
                   "prev_frame": lambda: h.prev_frame(None), "pick_node": lambda: h.pick_node("1:0", None),
                   "pick_token": lambda: h.pick_token("0:1", None)}[first]
    sess = first_event()[0]
    out = h.step(None, sess, PROMPT, teach=True, model="embedded", tree="auto", k=8, max_new_tokens=12, hot_start=True,
                 lookup=True, method="Token Recycling (TR)", temperature=0, top_p=1, seed=0, start="hot")
    assert out[0] is sess and "warmed on" in sess.live.header["matrix_start"] and sess.cursor.frame == 1


def test_step_on_a_replay_walks_its_recording_and_run_live_runs_its_prompt(hub):  # noqa: F811
    h = Handlers(hub, 256)
    sess = Session()
    name = example_runs()[0]
    said = open_run_bytes(sess, (EXAMPLE_DIR / f"{name}.json").read_bytes(), name)
    prompt = sess.replay.header["prompt"]
    total = len(sess.replay.steps)
    assert prompt.split()[0] in said and "Replay of" in said
    out = h.history(2, sess)
    assert "Replay of" in out[-1]  # a slider move: the status still speaks of the replay, not "Reset."
    out = h.prev_frame(sess)
    assert "Replay of" in out[-1] and sess.cursor.shown == 1
    page = dict(model="embedded", tree="auto", k=8, max_new_tokens=12, hot_start=True, lookup=True,
                method="Token Recycling (TR)")
    out = h.step(None, sess, "a prompt typed meanwhile", **page)  # Step walks the recording
    assert sess.replay is not None and sess.live.race is None and sess.cursor.shown == 2
    assert f"Replay: step 2 of {total}" in out[-1]
    sess.cursor.shown = total
    out = h.step(None, sess, "", **page)
    assert sess.cursor.shown == total and "end of the replay" in out[-1] and not sess.in_progress
    out = h.run_live(None, sess, "a prompt typed meanwhile", **page)  # the named action
    assert sess.replay is None and sess.live.started_with[0] == prompt  # a live run of the replay's prompt
    assert sess.live.started_with[1].method == "ptd" and len(sess.live.race.decoder.steps) == 1  # with its method
    assert "live run of the opened run's prompt" in out[-1]
    box = h.replay_controls(sess, "a prompt typed meanwhile", live=True)
    assert box[0] == "Progressive Tree Drafting (PTD)" and box[2] == prompt  # asked for by name: the box shows it
    out = h.step(None, sess, prompt, **{**page, "method": "Progressive Tree Drafting (PTD)"})
    assert len(sess.live.race.decoder.steps) == 2  # the box's prompt goes on with that run


def test_run_to_end_takes_one_step_per_event_and_stops_at_the_end_or_on_reset(hub):  # noqa: F811
    h = Handlers(hub, 256)
    page = dict(model="embedded", tree="tr-16", k=8, max_new_tokens=12, hot_start=True, lookup=True,
                method="Token Recycling (TR)")
    out = h.run_start(None, None, PROMPT, **page)
    sess = out[0]
    assert len(sess.live.race.decoder.steps) == 1 and isinstance(out[-5], int)  # the first step, and a beat for the next
    ticks, beats = 0, [out[-5]]
    while sess.in_progress:
        out = h.run_tick(None, sess, prompt=PROMPT, **page)
        ticks += 1
        beats.append(out[-5])
    assert ticks == len(sess.live.race.decoder.steps) - 1  # one step per tick
    new = beats[:-1]  # each step but the last set a new beat (the page asks for one step per beat)
    assert all(isinstance(b, int) for b in new) and len(set(new)) == len(new)
    assert is_skip(out[-5]) and "Done" in out[-6]  # the last one did not: the run ends
    out = h.run_start(None, sess, "Name a fruit.", **page)
    run = sess.live.race
    out = h.run_tick(None, sess, prompt="Something else typed meanwhile.", **{**page, "k": 4})
    assert sess.live.race is run and len(run.decoder.steps) == 2  # edits while it runs never replace the run
    h.reset(None, sess)
    late = h.run_tick(None, sess, prompt="Name a fruit.", **page)  # a tick queued before Reset
    assert sess.current() is None and late[-6] == "Reset." and is_skip(late[-5])


def test_the_warm_command_decodes_calibration_prompts_only_and_records_how(tmp_path, tiny_lm):
    from tr_core.bench.warm import main as warm

    from .test_bench import save_tiny

    folder = save_tiny(tiny_lm, tmp_path)
    prompts = tmp_path / "q.jsonl"
    rows = [{"question_id": str(i), "category": "qa", "turns": [f"w{i} w{i + 1} w{i}"]} for i in range(12)]
    prompts.write_text("\n".join(json.dumps(r) for r in rows))
    out = tmp_path / "m.safetensors"
    assert warm(["--prompts", str(prompts), "--limit", "2", "--max-new-tokens", "6", "--model", str(folder),
                 "--out", str(out)]) == 0
    m = AdjacencyMatrix.load(out, tiny_lm.fingerprint, tiny_lm.vocab_size)
    assert "warmed on 2 calibration prompts" in m.note and m.writes > 0
    few = tmp_path / "few.jsonl"  # only evaluation-split questions: nothing to warm on
    few.write_text("\n".join(json.dumps(r) for r in rows[:10]))
    assert warm(["--prompts", str(few), "--model", str(folder), "--out", str(tmp_path / "x.safetensors")]) == 2
    assert not (tmp_path / "x.safetensors").exists()


def test_the_phase_note_says_when_drafts_hit_and_why_a_step_can_be_slower(hub):  # noqa: F811
    """A step whose drafts hit says what it committed for one forward; every step says why a step can cost
    more than greedy's (the screenshot's question 5); Teach mode tells no hit before the accept frame."""
    from components.phase_strip import phase_html

    sess = page_session()
    sess.step(hub, PROMPT, settings(hot_start=True), cap=256)  # step 1: its first drafts are exact
    step = sess.live.race.decoder.steps[0]
    assert step.accepted_drafts >= 1
    note = phase_html(step, hub.get(None).token_text)
    assert f"drafts hit:</b> {len(step.committed)} tokens from one forward pass" in note
    assert "cost forward time" in note and "most often early ones" in note  # why a step can be slower ...
    assert "still mostly empty" not in note  # ... but not the empty matrix's note: this one hit
    assert "drafts hit" not in phase_html(step, hub.get(None).token_text, frame=1)
    assert "goes on to the next step" in phase_html(step, hub.get(None).token_text, frame=4)


def test_the_first_minute_command_reads_the_counters_of_a_fresh_tab(hub, capsys, tmp_path):  # noqa: F811
    from components.first_minute import FirstSteps, first_steps, main, summary

    sess, figures = first_steps(hub, PROMPT, 3, "hot", str(SHIPPED_MATRIX))
    dec = sess.live.race.decoder
    assert len(dec.steps) == 3 and "warmed on" in sess.live.header["matrix_start"]  # a fresh tab, hot, as the page
    assert dec.planner is not None and dec.lookup > 0  # the page's defaults: the auto tree, prompt lookup
    assert figures["tr"]["mat"] == pytest.approx(len(dec.output) / 3) and figures["tr"]["mat"] > 1.0
    assert figures["speedup"] == sess.live.race.speedups[-1]
    lines = summary([FirstSteps("1", "stem", 5, 2.0, 1.2), FirstSteps("2", "stem", 5, 1.4, 1.1),
                     FirstSteps("3", "writing", 5, 1.6, 0.9)])
    assert lines[0].startswith("stem") and " 1 of 2 " in lines[0] and "median MAT 1.70" in lines[0]
    assert " 0 of 1 " in lines[1]
    prompts = tmp_path / "q.jsonl"
    prompts.write_text('{"question_id": 1, "category": "qa", "turns": ["Who wrote Hamlet?"]}\n')
    assert main(["--prompts", str(prompts), "--categories", "no_such_category"]) == 2
    said = capsys.readouterr().err
    assert "no prompts" in said and "(categories: qa)" in said  # the names there are, not a traceback


def test_the_first_minute_leaves_out_what_a_calibration_command_read(capsys, spec_bench):
    from components.first_minute import calibration_reads, main
    from tr_core.bench.data import load_prompts

    path = str(spec_bench)
    read = calibration_reads(path)
    evaluation = {p.question_id for p in load_prompts(path, 10)}
    assert not read & evaluation  # the evaluation split stays measured in full
    assert {"91", "100", "101"} <= read and "102" not in read  # the presets' 91-100; the matrix's 92-101 (91: an example)
    assert main(["--categories", "roleplay", "--offset", "10", "--limit", "10"]) == 2  # all of them read
    assert "calibration never read" in capsys.readouterr().err


PHONE_LINE = 55  # characters of a plot's title or legend line that fit a 390 px phone at 11 px


@pytest.mark.parametrize("method,start", [("tr", "hot"), ("tr", "cold"), ("ptd", "hot")])
def test_every_plot_title_and_legend_line_fits_a_phone(hub, method, start):  # noqa: F811
    """Plotly does not wrap titles: a longer line is cut at a phone's edge (the walks found several)."""
    from components.figures import Figure
    from components.panels import draw_panels

    sess = page_session()
    for _ in range(3):
        sess.step(hub, "Write a haiku about autumn.", settings(tree="auto", method=method, start=start,
                                                               lookup=24), cap=256)
    view = sess.view()
    too_long = set()
    for shown in (None, 1, 2, 3):
        for frame in range(5):
            for panel in draw_panels(view if shown else None, shown, frame, None):
                text = panel.layout.title.text if isinstance(panel, Figure) else None
                for line in (text or "").split("<br>"):
                    line = re.sub("<[^>]+>", "", line)
                    if len(line) > PHONE_LINE:
                        too_long.add(line)
    assert not too_long, sorted(too_long)


def test_before_any_step_the_panels_describe_the_method_the_method_box_names(hub):  # noqa: F811
    """A fresh tab, a Method box set to PTD, a Reset after a PTD run: the empty panels speak of PTD, not of
    TR's matrix; back to TR, of TR's."""
    h = Handlers(hub, 256)
    tr = drawn(h.method_chosen("Token Recycling (TR)", None))
    assert "<b>Token Recycling</b> keeps" in tr["phases"] and "each token's k candidates" in tr["heatmap"].to_json()
    sess = Session()
    ptd = drawn(h.method_chosen("Progressive Tree Drafting (PTD)", sess))
    assert "Progressive Tree Drafting" in ptd["phases"] and "Token Recycling" not in ptd["phases"]
    assert "No matrix for this method" in ptd["heatmap"].to_json() and "No steps yet" in ptd["acceptance"].to_json()
    title = ptd["acceptance"].layout.title.text
    assert "the auto tree" not in ptd["acceptance"].to_json() and title.startswith("Acceptance map:<br>")
    sess.step(hub, PROMPT, settings(method="ptd"), cap=256)
    after = drawn(h.reset(None, sess))
    assert "Progressive Tree Drafting" in after["phases"] and "No matrix for this method" in after["heatmap"].to_json()
    assert "<b>Token Recycling</b> keeps" in drawn(h.method_chosen("Token Recycling (TR)", sess))["phases"]
    replayed = Session()  # a PTD run file opened (the Method box follows it), then Reset: PTD's panels
    open_run_bytes(replayed, (EXAMPLE_DIR / "ptd-days-of-the-week.json").read_bytes(), "ptd-days-of-the-week.json")
    assert "Progressive Tree Drafting" in drawn(h.reset(None, replayed))["phases"]
