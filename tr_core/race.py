"""A tree decoder and plain greedy decoding on the same prompt and model, advanced side by side.

At every step of the tree decoder, greedy decodes until it has at least as many tokens, one forward
at a time, in the same step: alone, the two never run at once, so neither slows the other.  Every
other step, greedy's first forward of the step runs before the method's, so that whatever slows a
step's first forward (a processor idle while the page drew) is charged to both sides alike.  In a
class (races stepped together), greedy's first token of a step rides in the method's forward instead
(:meth:`Race.rides_along`): each side is charged a shared forward there anyway.

A step is written as a coroutine (:meth:`Race.stepping`) that yields each forward it needs and is
sent the logits back, so that several races (a class of tabs) step together: :class:`Lockstep` runs
every waiting race's next forward in one batched forward (:func:`tr_core.batching.run_forwards`),
greedy's catch-up included (a server's tabs through :class:`tr_core.rounds.Batcher`; a list of races
on one thread through :func:`step_races`).  A race stepped alone runs the same code with forwards of
its own.
"""
from __future__ import annotations

import gc
import time
from collections.abc import Callable, Generator
from dataclasses import dataclass, field

import torch

from .batching import can_pack, run_forwards
from .cache import copy_cache
from .decoders import Decoder, GreedyDecoder
from .decoders.base import ForwardRequest, run_forward
from .devices import synchronize, wake
from .models import LoadedModel
from .precision import Divergence, explain_divergence
from .trace import Step

# A step as a coroutine: yields ``(model, request)`` for each forward it needs, is sent ``(logits [q, vocab],
# seconds the forward took)``, returns what it stepped.
Stepping = Generator[tuple[LoadedModel, ForwardRequest], tuple[torch.Tensor, float], object]


def timed_stepping(dec: Decoder) -> Stepping:
    """One step of ``dec`` (returns its ``Step``), timed as the benchmark times a run: the wall clock of
    the whole step (drafting, forward, verify, update, prune, planning and host work), the device
    synchronised at each end.  Where the forward was shared with other races' steps, the step is charged
    the whole shared forward (what its tab waited for) but not the time it waited while the others'
    steps drafted and verified (kept on its clock as ``"queue"``)."""
    synchronize(dec.lm.device)
    t0 = time.perf_counter()
    request = dec.prepare_step()
    handed = time.perf_counter()
    logits, forward = yield dec.lm, request
    waited = time.perf_counter() - handed - forward
    if waited > 0:
        request.clock.add("queue", waited)
    step = dec.finish_step(request, logits)
    synchronize(dec.lm.device)
    step.wall = time.perf_counter() - t0 - step.timings.get("queue", 0.0)
    step.alongside = max(request.batch - 1, 0)
    return step


PACKED_PROMPT = 256  # a prompt up to this long reads in a forward shared with other races'; a longer one alone


def timed_prefill(dec: Decoder) -> Stepping:
    """Seconds of ``dec``'s prefill (its prompt prepared by ``prepare_start``), timed as a step is
    (:func:`timed_stepping`): in a forward shared with other races' where the prompt has at most
    ``PACKED_PROMPT`` tokens, else in one of its own (a packed forward's mask grows with its tokens)."""
    seconds, _ = yield from prefill_timing(dec)
    return seconds


def prefill_timing(dec: Decoder) -> Stepping:
    """:func:`timed_prefill`, returning ``(seconds of the whole prefill, seconds of its forward)``."""
    dec.cache = dec.lm.new_cache()  # empty (a read that failed half-way left entries; a freed cache none)
    if len(dec.prompt) < 2:
        return 0.0, 0.0
    synchronize(dec.lm.device)
    t0, waited = time.perf_counter(), 0.0
    request = dec.prefill_request()
    if len(dec.prompt) > PACKED_PROMPT:
        logits = run_forward(dec.lm, request)
        synchronize(dec.lm.device)
        forward = time.perf_counter() - t0
    else:
        handed = time.perf_counter()
        logits, forward = yield dec.lm, request
        waited = max(0.0, time.perf_counter() - handed - forward)
    dec.finish_prefill(request, logits)
    synchronize(dec.lm.device)
    return time.perf_counter() - t0 - waited, forward


def read_once(dec: Decoder, other: Decoder) -> Stepping:
    """One prompt read once for two decoders of one model: ``dec``'s prefill (:func:`prefill_timing`),
    then ``other``'s KV cache a copy of ``dec``'s: every decoder reads a prompt in the same forward
    (the whole prompt, as ``generate`` does), so these are the entries ``other``'s own prefill would
    write.  Returns ``(dec's seconds, other's seconds)``: ``other`` is charged the forward, what its own
    prefill costs, and the copy, but not ``dec``'s own use of the prompt (TR's output head over it and
    the top-k it recycles, run after the forward)."""
    seconds, forward = yield from prefill_timing(dec)
    t0 = time.perf_counter()
    other.cache = copy_cache(dec.cache, other.lm.new_cache())
    synchronize(other.lm.device)
    return seconds, forward + time.perf_counter() - t0


class Lockstep:
    """Coroutines (:data:`Stepping`) stepped together: each :meth:`forward` packs the next request of
    every live coroutine on one model into one forward, ``forwards(lm, requests) -> [logits]`` (which also
    fills the ``hidden`` of a request that asks for some: :func:`tr_core.batching.run_forwards`).  A
    coroutine can join between forwards (:meth:`add`); each one's result (its return value, or the
    exception that ended it) is handed back as soon as it ends."""

    def __init__(self, forwards: Callable = run_forwards):
        self.forwards = forwards
        self.waiting: dict[object, tuple[Stepping, LoadedModel, ForwardRequest | list[ForwardRequest]]] = {}

    def add(self, key, stepping: Stepping) -> list[tuple[object, object]]:
        """Start ``stepping`` (under ``key``) up to its first forward; ``[(key, result)]`` if it ended already."""
        return self._resume(key, stepping)

    def forward(self) -> list[tuple[object, object]]:
        """One forward for the requests waiting on one model; ``(key, result)`` of the coroutines it ended.
        A failed forward (out of memory, a device error) is thrown into each coroutine in it."""
        lm = next(iter(self.waiting.values()))[1]
        keys = [k for k, (_, m, _) in self.waiting.items() if m is lm]
        if not can_pack(lm):  # its requests would run one forward each: one at a time, each timed alone
            keys = keys[:1]
        taken = [self.waiting.pop(k) for k in keys]
        try:
            synchronize(lm.device)
            t0 = time.perf_counter()
            rows = iter(self.forwards(lm, [r for _, _, asked in taken for r in _listed(asked)]))
            synchronize(lm.device)
        except Exception as err:
            return [done for k, (st, _, _) in zip(keys, taken) for done in self._resume(k, st, error=err)]
        took = time.perf_counter() - t0
        ended = []
        for k, (st, _, asked) in zip(keys, taken):  # each its own logits (a list where it asked for several)
            answer = [(next(rows), took) for _ in asked] if isinstance(asked, list) else (next(rows), took)
            ended += self._resume(k, st, answer)
        return ended

    def _resume(self, key, stepping: Stepping, value=None, error: BaseException | None = None) -> list:
        try:
            lm, request = stepping.throw(error) if error is not None else stepping.send(value)
        except StopIteration as end:
            return [(key, end.value)]
        except Exception as err:  # this coroutine's own failure: its caller hears of it, the others go on
            return [(key, err)]
        self.waiting[key] = (stepping, lm, request)
        return []


def _listed(asked) -> list:
    return asked if isinstance(asked, list) else [asked]


def side_by_side(first: Stepping, second: Stepping) -> Generator:
    """Two coroutines (:data:`Stepping`, on one model) stepped side by side: each forward carries the next
    request of each one still going (yields ``(model, [requests])``, is sent ``[(logits, seconds)]``);
    returns both results."""
    live, answers, results = {0: first, 1: second}, {0: None, 1: None}, [None, None]
    while live:
        asked = {}
        for i, stepping in list(live.items()):
            try:
                asked[i] = stepping.send(answers[i])
            except StopIteration as end:
                results[i] = end.value
                del live[i]
        if asked:
            lm = next(iter(asked.values()))[0]
            answers.update(zip(asked, (yield lm, [request for _, request in asked.values()])))
    return results


def drive(steppings: list[Stepping], forwards: Callable = run_forwards) -> list:
    """Run coroutines together (:class:`Lockstep`) to their ends; each one's result, or the exception
    that ended it (a failed forward ends every coroutine in it; the others go on)."""
    lockstep, results = Lockstep(forwards), [None] * len(steppings)
    ended = [done for i, st in enumerate(steppings) for done in lockstep.add(i, st)]
    while lockstep.waiting:
        ended += lockstep.forward()
    for i, result in ended:
        results[i] = result
    return results


def prepare_race(race: "Race"):
    """A race about to step: its freed caches rebuilt; the race, or the exception that stops it (a cache
    that cannot be rebuilt: out of memory)."""
    try:
        race.restore_caches()
        return race
    except Exception as err:
        return err


def step_once(dec: Decoder, forwards: Callable = run_forwards) -> Step:
    """One timed step of ``dec`` alone (its forward its own)."""
    return _one(drive([timed_stepping(dec)], forwards))


def _one(results: list):
    if isinstance(results[0], BaseException):
        raise results[0]
    return results[0]


def step_races(races: list["Race"], forwards: Callable = run_forwards) -> list:
    """One step of every race of ``races``, together, on this thread: each forward shared (:func:`drive`),
    an idle CPU woken first (:func:`tr_core.devices.wake`).  Returns each race's ``Step``, or the
    exception that stopped it."""
    ready = [prepare_race(race) for race in races]
    gc.collect(1)  # what the caller left to collect (e.g. drawing the last step) is not this step's work
    live = [r for r in ready if isinstance(r, Race)]
    if live:
        wake(live[0].decoder.lm.device)
    for race in live:
        race.company = len(live) > 1
    stepped = iter(drive([race.stepping() for race in live], forwards))
    return [next(stepped) if isinstance(r, Race) else r for r in ready]


def charge_reading(step: Step, seconds: float) -> None:
    """A side's first step carries its reading of the prompt: in its wall clock, and as phase ``"reading"``."""
    step.wall += seconds
    step.timings["reading"] = seconds


@dataclass
class Race:
    decoder: Decoder
    greedy: GreedyDecoder
    speedups: list[float] = field(default_factory=list)  # cumulative speedup after each step
    baseline: list[dict] = field(default_factory=list)  # greedy's tokens, forwards, seconds after each step
    divergence: Divergence | None = None  # where and why the outputs first parted (greedy decoding only)
    batcher: object = None  # a ``tr_core.rounds.Batcher`` shared with other tabs' races (None: alone)
    reading: dict = field(default_factory=dict)  # each side's seconds reading the prompt (in its first step's)
    unread: bool = False  # started, its prompt's prefill still to run (in its first step)
    prepared: dict = field(default_factory=dict)  # each side's seconds checking the prompt (its reading's first part)
    company: bool = False  # other races share this step's forwards (a class): greedy's first token rides with the method's

    def start(self, prompt_ids: list[int]) -> None:
        """Both sides take the prompt (checked, their state reset: each timed); they read it in the race's
        first step (:meth:`read_stepping`), its forward shared with the other races' there where the race
        has a batcher.  Each side's first step is charged its reading, so the race times whole
        generations, as the benchmark and Spec-Bench do."""
        self.speedups, self.baseline, self.divergence = [], [], None
        for name, dec in (("method", self.decoder), ("greedy", self.greedy)):
            t0 = time.perf_counter()
            dec.prepare_start(prompt_ids)
            self.prepared[name] = time.perf_counter() - t0
        self.reading, self.unread = dict(self.prepared), True

    def read_stepping(self) -> Stepping:
        """Both sides read the prompt, as a coroutine (:data:`Stepping`), each side's time added to its
        reading: once for both (:func:`read_once`: the method's prefill, greedy's cache a copy of the
        method's) where they share a model, else each its own prefill."""
        if self.greedy.lm is self.decoder.lm and self.greedy.prompt == self.decoder.prompt:
            method, greedy = yield from read_once(self.decoder, self.greedy)
            self.reading = {"method": self.prepared["method"] + method, "greedy": self.prepared["greedy"] + greedy}
        else:  # each side its own prefill (a read that failed half-way is read again from the start)
            for name, dec in (("method", self.decoder), ("greedy", self.greedy)):
                self.reading[name] = self.prepared[name] + (yield from timed_prefill(dec))
        self.unread = False

    @property
    def done(self) -> bool:
        return self.decoder.done

    def step(self) -> Step:
        """One step of the method, greedy caught up with it: with the class's other waiting races where
        the race has a batcher (their forwards shared), else alone."""
        if self.batcher is not None:
            return self.batcher.step(self)
        return _one(step_races([self]))

    def stepping(self) -> Stepping:
        """One step as a coroutine (:data:`Stepping`; returns the method's ``Step``): greedy's first
        step (every other step; in a class, in the method's forward), the method's step, greedy's
        catch-up to the method's tokens, then the
        race's counters; a divergence from greedy is explained where it first appears.  A race that has
        not read its prompt yet reads it first."""
        if self.unread:
            yield from self.read_stepping()
        if self.rides_along():
            step, _ = yield from side_by_side(timed_stepping(self.decoder), self.greedy_stepping())
        else:
            if self.greedy_goes_first():
                yield from self.greedy_stepping()
            step = yield from timed_stepping(self.decoder)
        if len(self.decoder.steps) == 1:
            charge_reading(step, self.reading.get("method", 0.0))
        while not self.greedy.done and len(self.greedy.output) < len(self.decoder.output):
            yield from self.greedy_stepping()
        self.speedups.append(self.figures()["speedup"])
        g = self.greedy
        self.baseline.append({"tokens": len(g.output), "forwards": len(g.steps),
                              "seconds": sum(s.seconds for s in g.steps), "reading": self.reading.get("greedy", 0.0),
                              "alongside": sum(1 for s in g.steps if s.alongside)})
        if self.divergence is None and self.decoder.sampler is None and not self.figures()["identical"]:
            self.divergence = explain_divergence(self.decoder.lm, self.decoder.prompt, self.greedy.output,
                                                 self.decoder.output, step.forward_tokens)
        return step

    def greedy_needs_a_step(self) -> bool:
        """Whether greedy needs a step whatever the method commits: it is no further than the method,
        which commits at least one token."""
        return not self.greedy.done and len(self.greedy.output) <= len(self.decoder.output)

    def rides_along(self) -> bool:
        """Whether greedy's first step of this step runs in the method's forward: in a class (other races
        share the forwards, so each side is charged a shared forward anyway), where the two can share one.
        A race alone keeps its two sides' forwards apart, each timed on its own."""
        return (self.company and self.greedy_needs_a_step() and self.greedy.lm is self.decoder.lm
                and can_pack(self.decoder.lm))

    def greedy_goes_first(self) -> bool:
        """Whether this step's first timed forward is greedy's: every other step, where greedy needs a step
        whatever the method commits (:meth:`greedy_needs_a_step`).  The first forward after a pause (the
        page drawing, a person reading) can run slower than the ones that follow it; taking turns charges
        that to both sides alike."""
        return len(self.decoder.steps) % 2 == 1 and self.greedy_needs_a_step()

    def greedy_stepping(self) -> Stepping:
        """One timed step of greedy; its first carries its reading of the prompt."""
        step = yield from timed_stepping(self.greedy)
        if len(self.greedy.steps) == 1:
            charge_reading(step, self.reading.get("greedy", 0.0))

    def release_caches(self) -> bool:
        """Free both KV caches (a finished or idle race); True when there was one to free.  The next
        ``step`` rebuilds them from the committed tokens."""
        held = self.decoder.cache is not None or self.greedy.cache is not None
        self.decoder.release_cache()
        self.greedy.release_cache()
        return held

    def restore_caches(self) -> None:
        """Rebuild freed KV caches from the committed tokens (a race yet to read its prompt reads it whole)."""
        if self.unread:
            return
        self.decoder.restore_cache()
        self.greedy.restore_cache()

    def figures(self) -> dict:
        """Exact counters: tokens, forwards, MAT, tok/s (from each whole step's wall clock), speedup."""
        def side(dec: Decoder) -> dict:
            secs = sum(s.seconds for s in dec.steps)
            n = len(dec.output)
            return {"tokens": n, "forwards": len(dec.steps), "mat": n / len(dec.steps) if dec.steps else 0.0,
                    "tok_per_s": n / secs if secs else 0.0, "seconds": secs,
                    "alongside": sum(1 for s in dec.steps if s.alongside)}
        tr, g = side(self.decoder), side(self.greedy)
        n = min(len(self.decoder.output), len(self.greedy.output))
        return {"tr": tr, "greedy": g,
                "speedup": tr["tok_per_s"] / g["tok_per_s"] if g["tok_per_s"] else 0.0,
                "identical": self.decoder.output[:n] == self.greedy.output[:n], "compared": n}
