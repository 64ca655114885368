"""ZeroGPU: spaces.GPU when the package is there (both forms), the function unchanged when not."""
import sys
import types

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
    # step, run, Play's tick and Teach mode's next frame (which steps after the last frame) decode;
    # compare runs every method; warm_up loads the model and times its forwards.  History, replay,
    # run files, settings and reset never touch the model and stay off the GPU.
    assert sorted(wrapped) == ["compare", "next_frame", "run", "step", "tick", "warm_up"]
