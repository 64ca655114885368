"""ZeroGPU: spaces.GPU when the package is there (both forms), the function unchanged when not."""
import sys
import types

import pytest

from components.zerogpu import gpu_task


def f(x):
    return x + 1


def test_without_spaces_the_function_is_unchanged(monkeypatch):
    monkeypatch.setitem(sys.modules, "spaces", None)  # import fails as if not installed
    assert gpu_task(f) is f
    assert gpu_task(duration=30)(f) is f


def test_with_spaces_both_decorator_forms_are_used(monkeypatch):
    calls = []

    def GPU(fn=None, duration=None):  # noqa: N802 - the name spaces uses
        def deco(g):
            calls.append(duration)
            return lambda *a: ("on gpu", g(*a))
        return deco(fn) if fn is not None else deco

    monkeypatch.setitem(sys.modules, "spaces", types.SimpleNamespace(GPU=GPU))
    assert gpu_task(f)(1) == ("on gpu", 2)
    assert gpu_task(duration=60)(f)(1) == ("on gpu", 2)
    assert calls == [None, 60]


def test_the_app_puts_its_model_work_under_spaces_gpu(monkeypatch):
    """Every handler that runs the model is wrapped, and nothing else."""
    wrapped = []

    def GPU(fn=None, duration=None):  # noqa: N802
        def deco(g):
            wrapped.append(g.__name__)
            return g
        return deco(fn) if fn is not None else deco

    monkeypatch.setitem(sys.modules, "spaces", types.SimpleNamespace(GPU=GPU))
    from app import build_app
    from components.model_hub import ModelHub

    build_app(ModelHub())
    # step, run (the API's and the page's first step and ticks), Play's tick and Teach mode's next frame
    # (which steps after the last frame) decode;
    # "Run its prompt live" decodes; compare runs every method (the API's in one call, the page's a slice
    # per tick); warm_up loads the model and times its forwards.  History, replay, run files, settings
    # and reset never touch the model and stay off the GPU.
    assert sorted(wrapped) == ["compare", "next_frame", "run", "run_live", "run_start", "run_tick", "step", "tick",
                               "tick", "warm_up"]


def test_the_app_under_a_forking_zerogpu_loads_once_and_steps_runs_and_compares(monkeypatch, embedded_lm, tmp_path):
    """ZeroGPU as it runs: every GPU call in a forked process, arguments and results pickled both ways,
    its memory thrown away (tests/zerogpu_standin.py).  The model loads once, at start-up, outside any
    GPU call; the cost curve measured in a GPU call lives on here; Step, Run to end and Compare work."""
    import dataclasses
    import os

    from app import build_app, serve, warm_or_say_handler
    from components.model_hub import ModelHub
    from components.recorded import Recorder, load_at_start_up
    from tr_core.cost import CostCurve
    from tr_core.models import EMBEDDED_LABEL

    from .conftest import free_port, local_client
    from .zerogpu_standin import module

    spaces = module()
    monkeypatch.setitem(sys.modules, "spaces", spaces)
    monkeypatch.setenv("TR_CACHE", str(tmp_path))  # no cached curve: warm-up measures one
    measure = CostCurve.measure.__func__
    monkeypatch.setattr(CostCurve, "measure", classmethod(lambda cls, lm: measure(cls, lm, (1, 2, 4, 8, 16), repeats=1)))
    loads = tmp_path / "loads.txt"

    def loader(spec, device, dtype):  # the embedded model, with no curve yet; each load logged with its process
        with open(loads, "a") as f:
            f.write(f"{os.getpid()}\n")
        return dataclasses.replace(embedded_lm, cost_curve=None, _token_text={})

    hub = ModelHub(loader=loader)
    load_at_start_up(hub)
    lm = hub.get(None)
    status = warm_or_say_handler(hub, curve_on_gpu=GPU_of(spaces, Recorder(hub).cost_curve))(lambda *a, **k: None)
    assert status.startswith("Ready") and lm.cost_curve is not None  # measured in the GPU process, kept here
    assert spaces.calls == ["cost_curve"]

    demo = build_app(hub, cap=64)
    port = free_port()
    serve(demo, "127.0.0.1", port, prevent_thread_lock=True, quiet=True)
    try:
        client = local_client(f"http://127.0.0.1:{port}/")
        args = ("Name three fruits.", EMBEDDED_LABEL, "auto", 8, 24, True, True, "Token Recycling (TR)")
        outs = [client.predict(*args, api_name="/do_step") for _ in range(3)]
        assert all("speedup" in o[4] and "identical to greedy" in o[4] for o in outs)
        assert len({o[4] for o in outs}) == 3  # three different steps shown
        assert spaces.calls == ["cost_curve", "record"]  # the whole run in one GPU call, stepped here
        final = client.predict(*args, api_name="/do_run")
        assert "Done" in final[-1] and "identical to greedy" in final[4]
        assert spaces.calls == ["cost_curve", "record"]  # the rest of the same recorded run
        ptd = client.predict(*args[:-1], "Progressive Tree Drafting (PTD)", api_name="/do_run")
        assert "Done" in ptd[-1] and "identical to greedy" in ptd[4]
        plot, table = client.predict("Name three fruits.", EMBEDDED_LABEL, 16, api_name="/compare")
        assert table.count("identical to greedy") == 5, table
        assert spaces.calls == ["cost_curve", "record", "record", "compare"]
    finally:
        demo.close()
    assert loads.read_text().split() == [str(os.getpid())]  # loaded once, here, never in a GPU process


def GPU_of(spaces, fn):  # noqa: N802
    return spaces.GPU(fn)


def test_a_recorded_run_steps_through_history_teach_frames_run_files_and_reset(tiny_lm, tmp_path):
    """The ZeroGPU way of stepping, in this process: one recording, then every page control on it."""
    from components.handlers import Handlers
    from components.model_hub import ModelHub
    from components.recorded import Recorder
    from components.run_files import run_file_for
    from components.session import Session, Settings, Superseded
    from tr_core.runs import read_run

    hub = ModelHub(loaded={"tiny": tiny_lm}, default="tiny")
    calls = []

    def record(*args):
        calls.append(args[0])
        return Recorder(hub).record(*args)
    h = Handlers(hub, cap=64, record=record)
    sess = Session()
    s = Settings(model="tiny", tree="auto", k=8, max_new_tokens=30, hot_start=True)
    for _ in range(3):
        h.advance(sess, "w3 w4 w5 w3 w4", s)
    assert calls == ["w3 w4 w5 w3 w4"] and sess.view() is not None and len(sess.view().steps) == 3
    assert sess.live.race is None and sess.in_progress and sess.matrix_state.matrix.table.device.type == "cpu"
    full = len(sess.recorded.run.steps)
    assert sess.view().output == sum((st.committed for st in sess.recorded.run.steps[:3]), [])
    h.history(2, sess)
    assert sess.view().clamp(sess.cursor.shown) == 2  # the history moves within what was shown
    sess.cursor.frame = 4
    h.next_frame(None, sess, "w3 w4 w5 w3 w4", teach=True, model="tiny", tree="auto", k=8, max_new_tokens=30,
                 hot_start=True, lookup=False, method="Token Recycling (TR)")
    assert sess.cursor.shown == 3 and sess.cursor.frame == 1 and calls == ["w3 w4 w5 w3 w4"]  # the next shown step, no GPU call
    h.prev_frame(sess)
    assert (sess.cursor.shown, sess.cursor.frame) == (2, 4)
    doc = read_run(open(run_file_for(sess)).read())
    assert len(doc.steps) == 3  # Save run: what was shown so far
    assert sess.save_matrix(folder=str(tmp_path)).endswith(".safetensors")
    while sess.in_progress:
        h.advance(sess, "w3 w4 w5 w3 w4", s)
    assert len(sess.view().steps) == full and "Done" in sess.message and calls == ["w3 w4 w5 w3 w4"]
    assert sess.view().figures(full)["identical"]
    h.advance(sess, "w3 w4 w5 w3 w4", s)  # Step after the end: a new recording, from the kept matrix
    assert len(calls) == 2 and sess.recorded.revealed == 1

    def reset_meanwhile(*args):  # Reset pressed while the GPU call runs: its recording is dropped
        sess.reset()
        return Recorder(hub).record(*args)
    h.record = reset_meanwhile
    with pytest.raises(Superseded):
        h.advance(sess, "w4 w5 w6", s)
    assert sess.current() is None and sess.message == "Reset."


def test_each_gpu_call_asks_for_the_time_its_run_needs(monkeypatch, tiny_lm):
    """Not 120 s for everything: the run's tokens at the model's measured forward time, twice over,
    within a floor and a cap (ZeroGPU weighs what is asked against a visitor's quota)."""
    import dataclasses

    from app import build_app
    from components.model_hub import ModelHub
    from components.session import Settings
    from components.zerogpu import CAP_SECONDS, FLOOR_SECONDS, gpu_seconds
    from tr_core.cost import CostCurve

    from .zerogpu_standin import module

    spaces = module()
    monkeypatch.setitem(sys.modules, "spaces", spaces)
    lm = dataclasses.replace(tiny_lm, cost_curve=CostCurve([1, 128], [0.05, 0.08]))
    hub = ModelHub(loaded={"tiny": lm}, default="tiny")
    build_app(hub, cap=256)
    record, compare = spaces.asked["record"], spaces.asked["compare"]
    assert callable(record) and callable(compare)

    def settings(n):
        return Settings(model="tiny", tree="auto", k=8, max_new_tokens=n, hot_start=True)
    assert record("p", settings(8), 256, None, None) == FLOOR_SECONDS  # 2 lanes x 8 tokens x 50 ms: the floor
    assert record("p", settings(100), 256, None, None) == 25  # 2 x 2 x 100 x 0.05 + 5 s of set-up
    assert record("p", settings(256), 64, None, None) == 18  # the cap on tokens holds
    assert compare("p", "tiny", 256) == CAP_SECONDS  # five methods of 256 tokens: the cap
    assert compare("p", "org/not-loaded", 100) == gpu_seconds(100, None, lanes=5)  # unmeasured: a default, no load
    assert FLOOR_SECONDS < compare("p", "tiny", 40) < CAP_SECONDS


def test_on_zerogpu_a_model_the_server_does_not_serve_is_refused_before_the_gpu_call(monkeypatch, tiny_lm):
    import components.model_hub as model_hub
    from components.handlers import Handlers
    from components.session import Session, Settings, UserError

    looked_up, recorded = [], []
    monkeypatch.setattr(model_hub, "check_hub_id", looked_up.append)
    hub = model_hub.ModelHub(loaded={"tiny": tiny_lm}, default="tiny")
    hub.freeze()
    h = Handlers(hub, cap=64, record=lambda *a: recorded.append(a))
    with pytest.raises(UserError, match="only the model"):
        h.advance(Session(), "w3 w4", Settings(model="org/other", tree="auto", k=8, max_new_tokens=8, hot_start=True))
    assert looked_up == ["org/other"] and recorded == []  # asked of the Hub here; no GPU call made
