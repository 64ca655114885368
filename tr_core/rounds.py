"""A server's tabs stepping together: every waiting race's step in forwards shared with the others'.

Each tab's event (its own thread) asks :class:`Batcher` for one step of its race.  Nothing waits on
purpose: a race that finds the batcher idle starts a serving loop at once (a tab alone steps exactly
as without a batcher).  The loop (on one thread: ``submit``, a server's model thread) steps its races
in lockstep (:class:`tr_core.race.Lockstep`): each race drafts, one forward verifies every race's
tree (and greedy's tokens), each race verifies, recycles and prunes its own; greedy's catch-up steps
share forwards too.  A race that asks while the loop runs joins it at the next forward, and each race's
step is handed back the moment it ends, so no tab waits for the slowest of a round, and the lone
one-token forwards at the end of a round get company.  After ``join_seconds`` a loop takes no one
new: it finishes its races, and the next loop is queued behind whatever else the model thread has
to do (start-up, a Compare's slice).
"""
from __future__ import annotations

import gc
import threading
import time
from collections import deque

from .batching import run_forwards
from .devices import wake
from .race import Lockstep, Race, prepare_race

SIZES_KEPT = 10_000  # a server runs for days: only the last forwards' sizes are kept


class Batcher:
    """Gathers the steps that concurrent callers (a server's tabs, each in its own thread) ask for into
    serving loops whose forwards are batched (:func:`tr_core.batching.run_forwards`)."""

    def __init__(self, max_races: int = 64, submit=None, join_seconds: float = 1.0):
        """``max_races``: races stepping together at most (more wait for a place); ``submit(fn, later) ->
        bool``: queues ``fn()`` on the thread of the model's work (``ModelThread.submit``; ``later``: even
        when called from that thread, behind its other work), False where the caller must run it itself;
        default: the caller that starts a loop runs it.  ``join_seconds``: how long a loop takes newcomers."""
        self.max_races, self.submit, self.join_seconds = max_races, submit, join_seconds
        self._lock = threading.Lock()
        self._queue: list[_Job] = []
        self._busy = False
        self.sizes: deque[int] = deque(maxlen=SIZES_KEPT)  # requests per forward lately (tests, benchmarks)
        self.rounds: deque[int] = deque(maxlen=SIZES_KEPT)  # races per serving loop lately
        self._ended = float("-inf")  # when the last loop ended

    def step(self, race: Race):
        """One step of ``race`` (its ``Step``), its forwards shared with every other race stepping now."""
        job = _Job(race)
        with self._lock:
            idle = None if self._busy else time.perf_counter() - self._ended
            self._queue.append(job)
            start, self._busy = not self._busy, True
        if start:
            try:
                queued = self._queued(lambda: self._serve(idle))
            except BaseException as err:  # nothing will serve the queue: every caller in it hears of it
                self._fail([], err)
                raise
            if not queued:
                self._serve(idle)
        job.ready.wait()
        if isinstance(job.result, BaseException):
            raise job.result
        return job.result

    def _serve(self, idle: float | None) -> None:
        """Step every queued race and every race that joins within ``join_seconds``; hand each its step
        as it ends; then end (or, with races still queued, queue the next loop behind the model thread's
        other work).  Should the loop itself fail, every race in it or queued hears of it."""
        unanswered: set[_Job] = set()
        try:
            self._loop(Lockstep(self._forwards), idle, unanswered)
        except BaseException as err:
            self._fail(unanswered, err)
            if not isinstance(err, Exception):
                raise

    def _loop(self, lockstep: Lockstep, idle: float | None, unanswered: set) -> None:
        began, served, woke = time.perf_counter(), 0, False

        def hand(ended) -> None:
            for job, result in ended:
                unanswered.discard(job)
                self._hand(job, result)

        while True:
            if time.perf_counter() - began < self.join_seconds:
                joining = self._take(self.max_races - len(lockstep.waiting))
                unanswered.update(joining)
                if joining:
                    gc.collect(1)  # what callers left to collect is not a step's work
                for job in joining:
                    served += 1
                    job.race.company = len(joining) + len(lockstep.waiting) > 1  # a class: Race.rides_along
                    ready = prepare_race(job.race)
                    if isinstance(ready, BaseException):
                        hand([(job, ready)])
                        continue
                    if not woke:  # an idle CPU woken once, before the first forward
                        wake(job.race.decoder.lm.device, idle=idle)
                        woke = True
                    hand(lockstep.add(job, job.race.stepping()))
            if not lockstep.waiting:
                if self._finish(served):
                    return
                began, served = time.perf_counter(), 0  # this thread's next loop (no submit)
                continue
            hand(lockstep.forward())

    def _take(self, room: int) -> list["_Job"]:
        with self._lock:
            taken, self._queue = self._queue[:max(room, 0)], self._queue[max(room, 0):]
        return taken

    def _finish(self, served: int) -> bool:
        """The loop's end: True when it ends here (nothing queued, or the next loop queued behind the
        model thread's other work); False when this thread goes on with the next loop."""
        self.rounds.append(served)
        with self._lock:
            if not self._queue:
                self._busy, self._ended = False, time.perf_counter()
                return True
        return self._queued(lambda: self._serve(0.0), later=True)

    def _queued(self, fn, later: bool = False) -> bool:
        return self.submit is not None and bool(self.submit(fn, later))

    def _fail(self, jobs, err: BaseException) -> None:
        """No loop runs any more: ``jobs`` and every queued job hear of ``err``."""
        with self._lock:
            stranded, self._queue = self._queue, []
            self._busy, self._ended = False, time.perf_counter()
        for job in [*jobs, *stranded]:
            self._hand(job, err)

    @staticmethod
    def _hand(job: "_Job", result) -> None:
        job.result = result
        job.ready.set()

    def _forwards(self, lm, requests):
        self.sizes.append(len(requests))
        return run_forwards(lm, requests)


class _Job:
    def __init__(self, race: Race):
        self.race = race
        self.ready = threading.Event()
        self.result = None
