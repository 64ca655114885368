"""One thread for all of a server's model work.

On a CPU, torch runs its parallel regions on OpenMP workers that belong to the thread calling torch.
Once a second thread has called torch, GNU OpenMP counts more of its threads than there are cores, and
its workers then sleep between parallel regions instead of spinning: each of a forward's hundreds of
regions pays a wake-up.  A greedy step of the embedded model on 2 cores took 29 ms from one thread and
about 50 ms once another thread had run torch as well.  A web server runs each event on a thread of its
own pool, so it hands its model work to one :class:`ModelThread` instead, and every forward, step and
load of the process runs there, as in a one-thread benchmark.
"""
from __future__ import annotations

import contextvars
import functools
import inspect
import threading
from concurrent.futures import ThreadPoolExecutor

import torch


class ModelThread:
    """Runs callables on one thread of its own, one at a time, in the order asked (``run``), or
    in the caller's thread where ``enabled`` is False (callers that must run side by side)."""

    def __init__(self, enabled: bool = True, name: str = "model"):
        self.enabled = enabled
        self._pool = ThreadPoolExecutor(1, thread_name_prefix=name) if enabled else None
        self._ident = self._pool.submit(_claim, torch.get_num_threads()).result() if enabled else None

    def here(self) -> bool:
        """Whether the caller runs on the model thread."""
        return self.enabled and threading.get_ident() == self._ident

    def run(self, fn, /, *args, **kwargs):
        """``fn(*args, **kwargs)`` on the model thread (the caller's context variables with it, so that
        a web framework's per-event state reaches it); its result, or its exception."""
        if not self.enabled or self.here():
            return fn(*args, **kwargs)
        context = contextvars.copy_context()
        return self._pool.submit(context.run, fn, *args, **kwargs).result()

    def submit(self, fn, later: bool = False) -> bool:
        """Queue ``fn()`` on the model thread, after the work already asked of it, without waiting for it
        (its exceptions are its own to report); True when queued.  Called from the model thread itself,
        nothing is queued unless ``later`` (the caller would wait behind its own work forever): False,
        the caller runs ``fn`` itself.  Where ``enabled`` is False, always False."""
        if not self.enabled or (self.here() and not later):
            return False
        self._pool.submit(contextvars.copy_context().run, fn)
        return True

    def wrap(self, fn):
        """``fn``, run on the model thread; a generator function's every step is (same signature, so
        that a framework that reads it still injects what it asks for)."""
        return wrap_handler(fn, self.run)


def wrap_handler(fn, run):
    """``fn`` called through ``run(f, *args, **kwargs)``; a generator function's every step is (each
    ``next`` goes through ``run``).  Same signature, so that a framework that reads it still injects
    what it asks for."""
    if inspect.isgeneratorfunction(fn):
        @functools.wraps(fn)
        def each(*args, **kwargs):
            gen = run(fn, *args, **kwargs)
            while True:
                try:
                    item = run(next, gen)
                except StopIteration:
                    return
                yield item
        return each

    @functools.wraps(fn)
    def once(*args, **kwargs):
        return run(fn, *args, **kwargs)
    return once

def _claim(threads: int) -> int:
    """The model thread's id; its torch thread count is its creator's (``threads``), settled at once.
    Torch settles a thread's count at the thread's first parallel work, from the count the process's
    last ``set_num_threads`` stored, on whatever thread: an event thread that made itself serial
    (``tr_core.devices.serial_torch_here``) before the model thread's first forward would leave every
    forward of the server on one core.  Reading the count settles it; the count is set after."""
    torch.get_num_threads()  # settled (from whatever count was set last), then set
    torch.set_num_threads(threads)
    return threading.get_ident()
