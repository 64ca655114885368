"""tr_core.model_thread: a server's model work on one thread (torch's CPU workers then keep spinning)."""
from __future__ import annotations

import contextvars
import threading

import pytest

from tr_core.model_thread import ModelThread

WHO = contextvars.ContextVar("who", default="nobody")


def test_every_call_runs_on_one_thread_in_order_with_the_callers_context():
    mt = ModelThread()
    seen, done = [], []

    def work(i):
        seen.append(threading.get_ident())
        done.append(i)
        return WHO.get(), i

    def caller(i):
        WHO.set(f"tab {i}")
        assert mt.run(work, i) == (f"tab {i}", i)

    threads = [threading.Thread(target=caller, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(seen)) == 1 and seen[0] != threading.get_ident()
    assert sorted(done) == list(range(6))
    assert mt.run(lambda: mt.run(threading.get_ident)) == seen[0]  # a call from the model thread runs in place


def test_errors_reach_the_caller_and_the_thread_goes_on():
    mt = ModelThread()

    def fail():
        raise MemoryError("out of memory")

    with pytest.raises(MemoryError, match="out of memory"):
        mt.run(fail)
    assert mt.run(lambda: 7) == 7


def test_a_wrapped_handler_keeps_its_signature_and_a_generator_runs_each_step_there():
    import inspect

    mt = ModelThread()
    home = mt.run(threading.get_ident)

    def handler(prompt: str, request: object = None, *, teach: bool = False):
        return threading.get_ident(), prompt, teach

    def steps(n: int):
        for i in range(n):
            yield threading.get_ident(), i

    wrapped = mt.wrap(handler)
    assert inspect.signature(wrapped) == inspect.signature(handler)  # what Gradio reads to inject a request
    assert wrapped("hi", teach=True) == (home, "hi", True)
    assert inspect.isgeneratorfunction(mt.wrap(steps)) or inspect.isgenerator(mt.wrap(steps)(0))
    assert list(mt.wrap(steps)(3)) == [(home, 0), (home, 1), (home, 2)]


def test_switched_off_it_runs_in_the_callers_thread():
    mt = ModelThread(enabled=False)
    assert mt.run(threading.get_ident) == threading.get_ident()


def test_event_threads_run_torch_serially_and_the_model_thread_keeps_its_workers():
    """A class's event threads run their torch work on themselves alone; the model thread keeps the
    thread count of whoever made it, even when made after an event thread went serial (torch hands
    that count to threads that first run torch later); the main thread never goes serial."""
    import torch

    from components.handlers import serially
    from tr_core.devices import serial_torch_here

    main = torch.get_num_threads()
    if main < 2:
        pytest.skip("torch runs one thread here: nothing to tell apart")
    seen = {}

    @serially
    def handler():
        seen["event"] = torch.get_num_threads()
        seen["model"] = ModelThread().run(torch.get_num_threads)  # made here, serial: it takes main's below

    worker = threading.Thread(target=handler)
    worker.start()
    worker.join()
    assert seen["event"] == 1
    assert seen["model"] == 1  # made by a serial thread: its creator's count
    assert ModelThread().run(torch.get_num_threads) == main  # made by the main thread after an event went serial
    serial_torch_here()  # on the main thread: nothing
    assert torch.get_num_threads() == main
