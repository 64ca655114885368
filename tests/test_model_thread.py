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


@pytest.fixture
def two_torch_threads():
    """At least two torch threads on the main thread (a worker of ``pytest -n 2`` runs one), so that a
    serial thread differs from the rest; afterwards the count the next threads take is as before."""
    import torch

    count = torch.get_num_threads()
    torch.set_num_threads(max(2, count))
    yield
    torch.set_num_threads(count)


def test_event_threads_run_torch_serially_and_the_model_thread_keeps_its_workers(two_torch_threads):
    """A class's event threads run their torch work on themselves alone; the model thread keeps the
    thread count of whoever made it, even when made after an event thread went serial (torch hands
    that count to threads that first run torch later); the main thread never goes serial."""
    import torch

    from components.handlers import serially
    from tr_core.devices import serial_torch_here

    main = torch.get_num_threads()
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


def test_the_model_thread_keeps_its_workers_when_an_event_goes_serial_before_its_first_forward(
        two_torch_threads):
    """A server makes its model thread at build time; its first event (a tab's Step) goes serial on an
    event thread before the model thread has run anything.  Torch settles a thread's count at its first
    parallel work from the process's last stored count, so, unsettled, the model thread would take the
    event's 1 and run every forward of the server on one core."""
    import torch

    from tr_core.devices import serial_torch_here

    main = torch.get_num_threads()
    mt = ModelThread()  # made first, nothing run on it yet
    event = threading.Thread(target=serial_torch_here)
    event.start()
    event.join()
    assert mt.run(lambda: (torch.ones(64, 64) @ torch.ones(64, 64), torch.get_num_threads())[1]) == main


def test_start_up_work_runs_on_the_callers_thread_while_another_reports_progress():
    """Start-up's timed forwards run where it was called (a server's model thread), never on a thread of
    its own (a second OpenMP team slows every forward and skews the cost curve); the progress reports come
    from another thread, with the caller's context, and an error reaches the caller."""
    import time

    from components.startup import with_progress

    tab = contextvars.ContextVar("tab")
    tab.set("mine")
    reports: list[tuple[float, str, int]] = []

    def work():
        time.sleep(0.25)
        return threading.get_ident()
    ran_on = with_progress(work, lambda t: reports.append((t, tab.get(), threading.get_ident())), every=0.05)
    assert ran_on == threading.get_ident()
    assert len(reports) >= 3 and reports[0][0] == 0.0 and reports[-1][0] > 0.1
    assert {who for _, who, _ in reports} == {"mine"}
    assert any(thread != ran_on for _, _, thread in reports)

    def fails():
        raise ValueError("no model")
    with pytest.raises(ValueError, match="no model"):
        with_progress(fails, lambda t: None, every=0.05)


def test_submit_queues_work_for_the_model_thread_and_leaves_it_to_a_caller_on_that_thread():
    """Work queued from another thread runs on the model thread; from the model thread itself nothing
    is queued (it would wait behind the caller forever): the caller is told to run it."""
    thread = ModelThread()
    ran_on = []
    done = threading.Event()
    assert thread.submit(lambda: (ran_on.append(thread.here()), done.set())) is True
    assert done.wait(10) and ran_on == [True]
    assert thread.run(lambda: thread.submit(lambda: None)) is False
    assert ModelThread(enabled=False).submit(lambda: None) is False
