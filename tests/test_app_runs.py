"""The teaching instrument without a browser: run files, replay, history and frames, safety of the fields."""
from __future__ import annotations

import json
import time

import pytest
import torch

from components.handlers import Handlers
from components.model_hub import ModelHub
from components.run_files import EXAMPLE_DIR, example_runs, open_run_bytes, run_file_for
from components.session import Session, UserError
from tr_core.devices import name_machine
from tr_core.runs import RunFileError, read_run, record_run

from .conftest import drawn, is_skip
from .test_app import PROMPT, settings


def stepped(hub, n=3, **kw) -> Session:  # noqa: F811
    sess = Session()
    for _ in range(n):
        sess.step(hub, PROMPT, settings(**kw), cap=256)
    return sess


def test_run_file_round_trip_replays_every_panel_without_a_model(hub, tmp_path):  # noqa: F811
    sess = stepped(hub)
    live = sess.views()
    path = run_file_for(sess)
    doc = json.loads(open(path).read())
    assert doc["format"] == "token-recycling-run" and doc["version"] == 1
    h = doc["header"]
    assert h["prompt"] == PROMPT and h["dtype"] == "float32" and h["device"] == "cpu" and h["settings"]["tree"]
    # the machine by its cores, not by the torch threads of whichever thread wrote the file (a server's
    # event threads run torch serially, its model thread on every core)
    assert h["machine"] == name_machine(torch.device("cpu")) and "thread" not in h["machine"]
    assert len(doc["steps"]) == 3 and doc["outputs"]["baseline"]
    replay = Session()
    assert "3 steps" in open_run_bytes(replay, open(path, "rb").read(), "run.json")
    assert replay.live.race is None and replay.replay is not None
    replay.cursor.shown = 3
    again = replay.views()
    assert again[3] == live[3]  # the text, token for token, from the file's token texts alone
    # the counters, from the file's step and greedy records: the same figures, said of the recording machine
    there = f"the machine that recorded this run, {h['machine']},"
    assert again[4] == live[4].replace("this machine", there).replace("speedup here", "speedup recorded") \
        .replace("time here", "time there")
    assert there in again[4]
    assert again[0].layout.title.text == live[0].layout.title.text


@pytest.mark.parametrize("data, words", [
    (b"\x89PNG not json", "not JSON"),
    (b'{"hello": 1}', "not a run file"),
    (b'{"format": "token-recycling-run", "version": 99}', "version 99"),
    (b'{"format": "token-recycling-run", "version": 1, "header": {}, "steps": [{"index": 1}], '
     b'"baseline": [], "outputs": {}, "tokens": {}}', "damaged"),
    (b" " * (33 * 1024 * 1024), "at most"),
    (b'{"format": "token-recycling-run", "version": 1, "header": {"machine": ["<b>"]}, "steps": [], '
     b'"baseline": [], "outputs": {}, "tokens": {}}', "damaged"),
])
def test_bad_run_files_are_refused_in_words(data, words):
    with pytest.raises(RunFileError, match=words):
        read_run(data)
    with pytest.raises(UserError, match=words):
        open_run_bytes(Session(), data, "x.json")


def test_example_runs_open_and_are_lossless():
    names = example_runs()
    assert len(names) >= 2
    for name in names:
        run = read_run((EXAMPLE_DIR / f"{name}.json").read_bytes())
        n = min(len(run.outputs["method"]), len(run.outputs["baseline"]))
        assert n > 0 and run.outputs["method"][:n] == run.outputs["baseline"][:n], name


def test_phase_pressed_while_the_tabs_step_runs_walks_that_step_and_only_its_draw_shows(hub):  # noqa: F811
    """Tabs side by side: two events of one tab run alongside, and their outputs may reach the page in either
    order.  Phase ▶ pressed while the tab's Step still runs waits for it and walks that step's frames (no
    second step); the Step's own draw then sends no panels, so a late arrival cannot draw over frame 2."""
    import threading

    from tr_core.models import EMBEDDED_LABEL

    h = Handlers(hub, 256)
    page = dict(model=EMBEDDED_LABEL, tree="paper-80", k=8, max_new_tokens=24, hot_start=True, lookup=False,
                method="Token Recycling (TR)", temperature=0.0, top_p=1.0, seed=0, start="hot")
    sess = h.teach_toggled(True, None)[0]
    advance, stepped_once, go = h.advance, threading.Event(), threading.Event()

    def slow(s, prompt, settings_):  # the step's forwards are done; Phase ▶ is pressed before it is drawn
        advance(s, prompt, settings_)
        stepped_once.set()
        go.wait(60)
    h.advance = slow
    out = {}
    step = threading.Thread(target=lambda: out.setdefault("step", h.step(None, sess, PROMPT, True, **page)))
    step.start()
    assert stepped_once.wait(120)
    phase = threading.Thread(target=lambda: out.setdefault("phase", h.next_frame(None, sess, PROMPT, True, **page)))
    phase.start()
    deadline = time.monotonic() + 30
    while not sess.flight.drawn_later() and time.monotonic() < deadline:
        time.sleep(0.01)
    go.set()
    step.join(60)
    phase.join(60)
    h.advance = advance
    assert len(sess.view().steps) == 1 and sess.cursor.frame == 2  # step 1's second frame, not a second step
    assert all(is_skip(panel) for panel in out["step"][1:-1]), "the step's draw would land over frame 2"
    assert "ph-now" in out["phase"][7] and "verify" in out["phase"][7].split("ph-now")[1][:40].lower()
    assert "step 1 of 1" in out["phase"][-2].label


def test_a_step_that_waited_for_its_turn_across_reset_draws_resets_page(hub):  # noqa: F811
    """Tabs side by side: a Step still waiting for the tab's turn when Reset comes takes no step (no new
    run drawn over "Reset.")."""
    import threading

    from tr_core.models import EMBEDDED_LABEL

    h = Handlers(hub, 256)
    page = dict(model=EMBEDDED_LABEL, tree="paper-80", k=8, max_new_tokens=24, hot_start=True, lookup=False,
                method="Token Recycling (TR)", temperature=0.0, top_p=1.0, seed=0, start="hot")
    sess = h.step(None, None, PROMPT, **page)[0]
    race, outs = sess.live.race, {}
    assert len(race.decoder.steps) == 1
    with sess.flight.working():  # the tab's step in flight
        waiting = threading.Thread(target=lambda: outs.update(step=h.step(None, sess, PROMPT, **page)))
        waiting.start()
        deadline = time.monotonic() + 30
        while not sess.flight.drawn_later() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert sess.flight.drawn_later()
        resetting = threading.Thread(target=h.reset, args=(None, sess))
        resetting.start()
        while not sess.flight.resetting and time.monotonic() < deadline:
            time.sleep(0.01)
        assert sess.flight.resetting
    # the step in flight ends: the waiting Step has the tab's turn before Reset starts over
    waiting.join(60)
    resetting.join(60)
    assert len(race.decoder.steps) == 1, "the waiting Step stepped the run Reset was dropping"
    assert sess.view() is None or not sess.view().steps, "a step ran after Reset"
    assert all(is_skip(o) for o in outs["step"][1:]), "its draw would land over Reset's"


def test_a_step_that_ends_while_reset_waits_for_it_draws_nothing(hub):  # noqa: F811
    """Reset waits for the tab's step in flight, then starts over.  The step's outputs and Reset's reach
    the page in either order, so the step's carry nothing: no "Stopped at step 1" over "Reset."."""
    import threading

    h = Handlers(hub, 256)
    page = dict(model="embedded", tree="tr-16", k=8, max_new_tokens=24, hot_start=True, lookup=True,
                method="Token Recycling (TR)")
    sess = h.run_start(None, None, PROMPT, **page)[0]
    race, outs = sess.live.race, {}
    started, release, step = threading.Event(), threading.Event(), sess.live.race.step

    def slow_step():
        started.set()
        release.wait(30)
        step()

    race.step = slow_step
    tick = threading.Thread(target=lambda: outs.update(tick=h.run_tick(None, sess, prompt=PROMPT, **page)))
    tick.start()
    assert started.wait(30)
    reset = threading.Thread(target=lambda: outs.update(reset=h.reset(None, sess)))
    reset.start()
    deadline = time.monotonic() + 30
    while not sess.flight.resetting and time.monotonic() < deadline:
        time.sleep(0.01)
    release.set()  # the step ends while Reset waits for it
    tick.join(60)
    reset.join(60)
    assert len(race.decoder.steps) == 2 and sess.current() is None
    assert all(is_skip(o) for o in outs["tick"][1:-5]), "the step's late draw would land over Reset's"
    assert outs["reset"][-5] == "Reset."


def test_history_frames_and_linked_views(hub):  # noqa: F811
    h = Handlers(hub, 256)
    sess = stepped(hub, 3, tree="paper-80", lookup=0)
    out = drawn(h.history(1, sess))
    assert "Step 1:" in out["tree"].layout.title.text and out["history"].label.startswith("History: step 1 of 3")
    sess.cursor.frame = 1
    heat_before = drawn(h.render(sess))["heatmap"]
    assert "before" in heat_before.layout.title.text
    kinds = {c for t in drawn(h.render(sess))["tree"].data
             for c in ([t.marker.color] if isinstance(t.marker.color, str) else list(t.marker.color or []))}
    assert "#2e9d4f" not in kinds  # retrieve: nothing accepted yet
    for frame in (2, 3, 4):
        out = drawn(h.next_frame(None, sess, PROMPT, teach=True))
        assert sess.cursor.frame == frame
    assert "ph-now" in out["phases"] and "recycle" in out["phases"].split("ph-now")[1][:40].lower()
    assert "after" in out["heatmap"].layout.title.text
    step = sess.live.race.decoder.steps[0]
    node = step.accepted_path[-1] if len(step.accepted_path) > 1 else 1
    out = drawn(h.pick_node(f"{node}:123", sess))
    assert out["heatmap"].layout.shapes, "the clicked node's rows are outlined"
    last_token = len(sess.live.race.decoder.output) - 1
    out = drawn(h.pick_token(f"{last_token}:1", sess))
    assert sess.cursor.shown == 3 and "step 3 of 3" in out["history"].label
    out = h.pick_token("0:1", sess)
    assert sess.cursor.shown == 1


def test_first_steps_leave_out_blank_drafts_say_so_and_stay_greedy(hub):  # noqa: F811
    sess = stepped(hub, 2, tree="paper-80", lookup=0, hot_start=False)
    first, second = sess.live.race.decoder.steps
    assert first.blank_drafts > 0 and "empty" not in first.tree.sources  # rows never written: not drafted
    assert first.forward_tokens == first.tree.size + 1 < 81
    panels = sess.views()
    tree_fig, phases = panels.tree, panels.phases
    assert second.blank_drafts > 0 and "left out" in phases and "∅" in phases  # the strip says why
    ghosts = [tr for tr in tree_fig.data if tr.text is not None and "∅" in list(tr.text)]
    assert len(ghosts) == 1 and len(ghosts[0].x) == len(second.blank_under) > 0  # a hollow ∅ leaf under each
    assert all("never written" in h and "left out" in h for h in ghosts[0].hovertext)
    assert "no candidates after the token above" in tree_fig.layout.title.text
    assert "identical to greedy" in panels.counters
    assert "Step 2 of 2" in panels.alt


@pytest.mark.parametrize("make", [lambda tmp: str(tmp / "exists.json"), lambda tmp: str(tmp / "missing.json"),
                                  lambda tmp: "/etc/passwd", lambda tmp: "../../etc/hostname"])
def test_tree_field_never_touches_server_paths(hub, tmp_path, monkeypatch, make):  # noqa: F811
    import builtins
    import pathlib

    (tmp_path / "exists.json").write_text('{"nodes": [[0]]}')
    spec = make(tmp_path)
    touched = []
    real_open, real_is_file = builtins.open, pathlib.Path.is_file

    def spy_open(file, *a, **k):
        touched.append(str(file))
        return real_open(file, *a, **k)

    def spy_is_file(self):
        touched.append(str(self))
        return real_is_file(self)
    monkeypatch.setattr(builtins, "open", spy_open)
    monkeypatch.setattr(pathlib.Path, "is_file", spy_is_file)
    with pytest.raises(UserError) as err:
        Session().step(hub, PROMPT, settings(tree=spec), cap=256)
    assert not [t for t in touched if spec.strip("./") in t]
    assert str(err.value).startswith("Unknown tree") and "use one of" in str(err.value)
    other = tmp_path / "missing.json" if "exists" in spec else tmp_path / "exists.json"
    with pytest.raises(UserError) as err2:
        Session().step(hub, PROMPT, settings(tree=str(other)), cap=256)
    assert str(err.value).replace(spec[:60], "P") == str(err2.value).replace(str(other)[:60], "P")


def test_unknown_model_id_answers_within_seconds_offline():
    t0 = time.monotonic()
    with pytest.raises(Exception, match="Could not load"):
        ModelHub().get("no-such-org/no-such-model")
    assert time.monotonic() - t0 < 5
    with pytest.raises(Exception, match="Hugging Face model id"):
        ModelHub().get("/etc")


def test_a_relative_folder_named_like_a_hub_id_is_never_read(tmp_path, monkeypatch):
    """``org/name`` is also a relative path, which the loaders would read before the Hub: refused in the
    words of a missing model, even when the Hub offers that id, and its files are never opened."""
    import builtins

    import huggingface_hub

    from tr_core.models import ModelLoadError

    folder = tmp_path / "some-org" / "local-model"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    monkeypatch.chdir(tmp_path)
    opened, real_open = [], builtins.open
    monkeypatch.setattr(builtins, "open", lambda f, *a, **k: (opened.append(str(f)), real_open(f, *a, **k))[1])
    hub = ModelHub()  # nothing loads: the default model is never asked for
    words = []
    for offered in (False, True):  # the Hub has no such id / the Hub offers an id of the same name
        if offered:
            monkeypatch.setattr(huggingface_hub, "model_info", lambda *a, **k: object())
        for spec in ("some-org/local-model", "some-org/missing-model"):
            with pytest.raises(ModelLoadError) as err:
                hub.get(spec)
            words.append(str(err.value).replace(spec, "X"))
    assert not [f for f in opened if "local-model" in f]
    assert words[0] == words[1], words  # existing or not, the same answer
    assert words[2].startswith("Could not load 'X': it is not in the server's model cache")


def test_cost_curve_cached_on_disk(embedded_lm, tmp_path, monkeypatch):
    import dataclasses

    from components.startup import curve_path, read_cached_curve, save_curve
    from tr_core.planner import CostCurve

    monkeypatch.setenv("TR_CACHE", str(tmp_path))
    lm = dataclasses.replace(embedded_lm, cost_curve=CostCurve([1, 2, 4], [0.01, 0.012, 0.011]))
    save_curve(lm)
    assert curve_path(lm).parent == tmp_path / "cost-curves" and curve_path(lm).is_file()
    fresh = dataclasses.replace(embedded_lm, cost_curve=None)
    assert read_cached_curve(fresh).seconds == [0.01, 0.012, 0.011]
    other = dataclasses.replace(embedded_lm, cost_curve=None, dtype=__import__("torch").bfloat16)
    assert curve_path(other) != curve_path(lm) and read_cached_curve(other) is None


def test_compare_runs_every_method_identical_to_greedy(embedded_lm):
    from components.compare import compare_figure, compare_methods, compare_table

    rows = compare_methods(embedded_lm, "Name three fruits.", 8)
    assert [r["name"] for r in rows] == ["greedy", "TR (auto)", "TR (paper-80)", "PTD", "PLD"]
    assert all(r["output"] == rows[0]["output"] and r["tokens"][-1] == 8 for r in rows)
    table = compare_table(rows)
    assert table.count("identical to greedy") == 5 and "MAT" in table and "one method after the other" in table
    assert len(compare_figure(rows).data) == 10


def test_compare_marks_a_speedup_without_an_accepted_draft_as_step_time_variation():
    from components.compare import compare_table

    def row(name, tokens, seconds):  # cumulative tokens and seconds after each forward
        return {"name": name, "tokens": tokens, "seconds": seconds, "output": [1, 2, 3]}
    rows = [row("greedy", [0, 1, 2, 3], [0, 0.1, 0.2, 0.3]), row("TR (auto)", [0, 3], [0, 0.15]),
            row("PLD", [0, 1, 2, 3], [0, 0.09, 0.18, 0.27])]  # MAT 1.00 and 1.11x: noise
    table = compare_table(rows)
    assert "1.11×*" in table and "2.00×<" in table and "not a gain" in table
    assert "*" not in compare_table(rows[:2]) and "not a gain" not in compare_table(rows[:2])


def test_record_run_on_the_tiny_model(tiny_lm):
    from tr_core import GreedyDecoder, TokenRecyclingDecoder

    run = record_run(tiny_lm, "w1 w2 w3", TokenRecyclingDecoder(tiny_lm, tree="tr-8", max_new_tokens=12),
                     GreedyDecoder(tiny_lm, 12))
    assert run.outputs["method"] == run.outputs["baseline"] and len(run.baseline) == len(run.steps)
    back = read_run(json.dumps(run.to_dict()))
    assert [s.committed for s in back.steps] == [s.committed for s in run.steps]


def test_a_step_that_ends_after_pause_or_stop_is_not_drawn(hub):  # noqa: F811
    """Pause (Play's tick) and Stop (Run to end's tick) while a step runs: the panels stay on the step shown
    when it was pressed; the step is kept in the history, and Step shows it without running the model."""
    from tr_core.models import EMBEDDED_LABEL

    h = Handlers(hub, 256)
    page = dict(model=EMBEDDED_LABEL, tree="paper-80", k=8, max_new_tokens=24, hot_start=True, lookup=False,
                method="Token Recycling (TR)", temperature=0.0, top_p=1.0, seed=0, start="hot")
    sess = h.step(None, None, PROMPT, **page)[0]
    advance = h.advance

    def pressed_meanwhile(s, prompt, settings_):  # the step runs, and Pause comes before it ends
        advance(s, prompt, settings_)
        s.flight.stop = True
    beat, label = h.toggle_play("▶ Play", sess)  # Play: a new beat asks for the first step
    assert isinstance(beat, int) and sess.flight.playing and label.value == "❚❚ Pause"
    h.advance = pressed_meanwhile
    out = h.tick(None, sess, PROMPT, **page)
    assert len(sess.view().steps) == 2 and sess.cursor.shown == 1 and "step 1 of 2" in out[-4].label
    assert "Step 1:" in out[1].layout.title.text and "Paused at step 1" in out[-3]
    assert is_skip(out[-2]) and out[-1].value == "▶ Play" and not sess.flight.playing  # no next beat: Play stops
    late = h.tick(None, sess, PROMPT, **page)  # a beat that was already on its way draws nothing new
    assert len(sess.view().steps) == 2 and is_skip(late[-2])
    h.advance = advance
    out = h.step(None, sess, PROMPT, **page)  # Step shows the step kept back, no model work
    assert len(sess.view().steps) == 2 and "Step 2:" in out[1].layout.title.text
    # Run to end: Stop while a tick's step runs
    sess.flight.stop, sess.flight.running = False, sess.current()
    step_of = sess.next_step

    def stopped_meanwhile(run):
        step_of(run)
        sess.flight.stop = True
    sess.next_step = stopped_meanwhile
    out = h.run_tick(None, sess, prompt=PROMPT, **page)
    assert len(sess.view().steps) == 3 and "Step 2:" in out[1].layout.title.text and "Stopped at step 2" in out[-6]


def test_start_up_times_nothing_again_for_a_curve_timed_in_this_process(tiny_lm, tmp_path, monkeypatch):
    """A curve timed in this process (by a bench, a first Step) is today's: start-up neither warms the
    kernels again nor checks its shape.  A curve kept on disk is checked against today's forwards (which
    warm the kernels too), and goes on the model only once checked: a start-up that fails half-way
    leaves it to be checked by the next."""
    import dataclasses
    import weakref

    from components import startup
    from tr_core import wrap_model
    from tr_core.cost import COST_LENGTHS
    from tr_core.planner import CostCurve

    from .conftest import make_tiny_model, make_tiny_tokenizer

    monkeypatch.setenv("TR_CACHE", str(tmp_path))
    monkeypatch.setattr(startup, "_WARM", weakref.WeakSet())  # no model of the session counts as warm here
    monkeypatch.setattr(startup, "set_aside_long_lived", lambda: 0)  # the session's objects stay collectable
    timed, fails = [], []
    seconds = [0.01 * (1 + q / 64) for q in COST_LENGTHS]

    def time_forwards(lm, lengths, **_):
        timed.append(lm)
        if fails:
            raise fails.pop()
        return seconds
    monkeypatch.setattr(startup, "time_forwards", time_forwards)
    quiet = lambda *a, **k: None  # noqa: E731
    curve = CostCurve(list(COST_LENGTHS), seconds)
    here = dataclasses.replace(tiny_lm, cost_curve=curve)
    said = startup.warm_up(ModelHub(loaded={"embedded": here}), quiet)
    assert timed == [] and here.cost_curve is curve and "timed earlier" in said
    startup.save_curve(here)

    fresh = wrap_model(make_tiny_model(), make_tiny_tokenizer(), name=tiny_lm.name)  # no curve on it yet
    assert startup.curve_path(fresh) == startup.curve_path(here)
    fails.append(RuntimeError("out of memory"))
    with pytest.raises(RuntimeError):
        startup.warm_up(ModelHub(loaded={"embedded": fresh}), quiet)
    assert fresh.cost_curve is None, "a kept curve went on the model unchecked"
    startup.warm_up(ModelHub(loaded={"embedded": fresh}), quiet)
    assert timed == [fresh, fresh] and fresh.cost_curve.seconds == seconds  # warmed, and the kept shape holds


def test_a_kept_cost_curve_of_another_shape_is_timed_again():
    """A curve kept from a busy machine (16 tokens as cheap as one) against today's forwards (16 cost
    twice one): timed again.  The same shape at another level, or one length off by noise: kept."""
    from components.startup import curve_still_holds
    from tr_core.planner import CostCurve

    lengths = [1, 2, 4, 8, 16, 32, 64]
    now = [0.030, 0.031, 0.033, 0.038, 0.060, 0.090, 0.150]
    flat = CostCurve(lengths, [0.067, 0.115, 0.058, 0.073, 0.059, 0.100, 0.170])  # kept under load
    assert not curve_still_holds(flat, lengths, now)
    assert curve_still_holds(CostCurve(lengths, [1.5 * s for s in now]), lengths, now)
    noisy = [s * (2.0 if q == 4 else 1.0) for q, s in zip(lengths, now)]
    assert curve_still_holds(CostCurve(lengths, noisy), lengths, now)
    assert not curve_still_holds(CostCurve([2, 4], [0.03, 0.03]), lengths, now)  # nothing to compare with


@pytest.mark.parametrize("method, tree", [("Token Recycling (TR)", "auto"),
                                          ("Progressive Tree Drafting (PTD)", "paper-80")])
def test_a_first_step_through_the_api_times_the_forwards_on_the_model_thread(hub, monkeypatch, method, tree):  # noqa: F811
    """A server reached through its API alone (no page loaded, so no start-up) times the model's
    forwards for the planners (the auto tree's; PTD's, whatever the tree setting) at the first Step: on
    the model thread, where the forwards run with the model's workers, not on the event's own thread,
    which runs torch on one core."""
    import threading

    from components.handlers import serially
    from tr_core.cost import CostCurve
    from tr_core.models import EMBEDDED_LABEL

    lm = hub.get(EMBEDDED_LABEL)
    h = Handlers(hub, 256)
    timed_on, measure = [], CostCurve.measure

    def timed_here(cls, lm_, *args, **kwargs):
        timed_on.append(h.model_thread.here())
        return measure(lm_, lengths=(1, 16), repeats=1)  # where it runs is the point, not the curve

    monkeypatch.setattr(CostCurve, "measure", classmethod(timed_here))
    monkeypatch.setattr(lm, "cost_curve", None)  # never timed in this process (restored afterwards)
    page = dict(model=EMBEDDED_LABEL, tree=tree, k=8, max_new_tokens=8, hot_start=True, lookup=False,
                method=method, temperature=0.0, top_p=1.0, seed=0, start="hot")
    out, count = [], torch.get_num_threads()
    try:
        event = threading.Thread(target=lambda: out.append(serially(h.step)(None, None, PROMPT, **page)))
        event.start()
        event.join(120)
    finally:
        torch.set_num_threads(count)  # the count the next threads take, as before the event went serial
    assert out and len(out[0][0].view().steps) == 1
    assert timed_on == [True]
