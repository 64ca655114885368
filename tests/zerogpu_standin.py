"""A stand-in for Hugging Face's ``spaces`` package as it runs on ZeroGPU, for tests on any machine.

``spaces.GPU`` (bare or with ``duration=``) runs each call in a process **forked for it**: the
arguments are pickled into it and the result (or the exception) is pickled back, as ZeroGPU's queue
does; whatever the call changed in its own memory is gone when it returns.  A call whose arguments or
result cannot be pickled fails, as it would there.  ``spaces.config.Config.zero_gpu`` is True.
"""
from __future__ import annotations

import functools
import multiprocessing
import os
import pickle
import signal
import types


CHILD_LIMIT_S = 300


class CallFailed(RuntimeError):
    """The forked call's result or exception could not be pickled back."""


def _run_forked(fn, args, kwargs):
    payload = pickle.dumps((args, kwargs))  # arguments cross pickled
    ctx = multiprocessing.get_context("fork")
    reader, writer = ctx.Pipe(duplex=False)

    def child():
        # Here the call computes on the CPU, whose OpenMP thread pool does not survive a fork (GNU
        # libgomp hangs at the first parallel region): one thread, as ZeroGPU's GPU work needs none.
        import torch

        torch.set_num_threads(1)
        try:
            a, k = pickle.loads(payload)
            out = ("ok", fn(*a, **k))
        except BaseException as err:  # noqa: BLE001 - every failure goes back to the caller
            out = ("err", err)
        try:
            data = pickle.dumps(out)
        except Exception as err:  # noqa: BLE001
            data = pickle.dumps(("err", CallFailed(f"the result of {fn.__name__} cannot cross: {err}")))
        writer.send_bytes(data)
        writer.close()

    proc = ctx.Process(target=child, daemon=True)
    proc.start()
    writer.close()
    try:
        if not reader.poll(CHILD_LIMIT_S):  # ZeroGPU ends a call that outlives its time
            os.kill(proc.pid, signal.SIGABRT)  # faulthandler, inherited from pytest, prints its stack
            proc.join()
            raise CallFailed(f"the GPU process of {fn.__name__} was stuck for {CHILD_LIMIT_S} s")
        data = reader.recv_bytes()
    except EOFError:
        proc.join()
        raise CallFailed(f"the GPU process of {fn.__name__} died (exit code {proc.exitcode})") from None
    proc.join()
    kind, value = pickle.loads(data)
    if kind == "err":
        raise value
    return value


def module() -> types.ModuleType:
    """A fresh ``spaces`` module; ``spaces.calls`` lists the name of every GPU call made through it,
    ``spaces.asked`` the ``duration`` each function was wrapped with (a number or a function of the
    call's arguments) and ``spaces.durations`` the seconds each call asked for."""
    spaces = types.ModuleType("spaces")
    spaces.calls, spaces.asked, spaces.durations = [], {}, []

    def GPU(fn=None, duration=None):  # noqa: N802 - the name spaces uses
        def wrap(f):
            spaces.asked[f.__name__] = duration

            @functools.wraps(f)
            def call(*args, **kwargs):
                spaces.calls.append(f.__name__)
                spaces.durations.append(duration(*args, **kwargs) if callable(duration) else duration)
                return _run_forked(f, args, kwargs)
            return call
        return wrap(fn) if fn is not None else wrap

    spaces.GPU = GPU
    spaces.config = types.SimpleNamespace(Config=types.SimpleNamespace(zero_gpu=True))
    return spaces
