"""A tree decoder and plain greedy decoding on the same prompt and model, advanced side by side.

At every step of the tree decoder, greedy decodes until it has at least as many tokens, one forward
at a time, in the same handler: the two never run at once, so neither slows the other.  Every other
step, greedy's first forward of the step runs before the method's, so that whatever slows a step's
first forward (a processor idle while the page drew) is charged to both sides alike.
"""
from __future__ import annotations

import gc
import time
from dataclasses import dataclass, field

from .decoders import Decoder, GreedyDecoder
from .devices import synchronize, wake
from .precision import Divergence, explain_divergence
from .trace import Step


def timed_step(dec: Decoder, forwards=None) -> Step:
    """``dec.step(forwards)`` timed as the benchmark times a run: the wall clock of the whole step
    (retrieve, lookup, forward, verify, update, prune, planning and host work), the device
    synchronised once at each end.  The step's ``seconds`` then read this time.  A step whose forward
    was batched with other tabs' (``forwards``) is charged the whole batched forward, which is what
    its tab waited for, but not the time it queued behind an earlier forward (``"queue"``)."""
    synchronize(dec.lm.device)
    t0 = time.perf_counter()
    step = dec.step(forwards)
    synchronize(dec.lm.device)
    step.wall = time.perf_counter() - t0 - step.timings.get("queue", 0.0)
    return step


def timed(start, prompt_ids, device) -> float:
    """Seconds of ``start(prompt_ids)`` (a decoder reading the prompt), the device synchronised at both ends."""
    synchronize(device)
    t0 = time.perf_counter()
    start(prompt_ids)
    synchronize(device)
    return time.perf_counter() - t0


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
    batcher: object = None  # a ``tr_core.batching.Batcher`` shared with other tabs' races (None: alone)
    reading: dict = field(default_factory=dict)  # each side's seconds reading the prompt (in its first step's)

    def start(self, prompt_ids: list[int]) -> None:
        """Both sides read the prompt (their prefill, and the method's own start: the prompt's logits
        recycled into its matrix), each timed; each side's first step is charged its reading, so the race
        times whole generations, as the benchmark and Spec-Bench do."""
        self.reading = self.on_model(self._read, prompt_ids)
        self.speedups, self.baseline, self.divergence = [], [], None

    def _read(self, prompt_ids: list[int]) -> dict:
        wake(self.decoder.lm.device)
        return {"method": timed(self.decoder.start, prompt_ids, self.decoder.lm.device),
                "greedy": timed(self.greedy.start, prompt_ids, self.greedy.lm.device)}

    def on_model(self, fn, /, *args, **kwargs):
        """``fn(*args, **kwargs)`` where the batcher runs its forwards (a server's model thread), else here."""
        return self.batcher.on_model(fn, *args, **kwargs) if self.batcher is not None else fn(*args, **kwargs)

    @property
    def done(self) -> bool:
        return self.decoder.done

    def step(self) -> Step:
        self.on_model(self.restore_caches)
        gc.collect(1)  # what the caller left to collect (e.g. drawing the last step) is not this step's work
        # nor is waking a CPU that idled while the page drew (the other side's steps follow at once); where
        # other tabs' forwards keep it busy, it has not idled
        idle = self.batcher.idle_seconds() if self.batcher is not None else None
        self.on_model(wake, self.decoder.lm.device, idle=idle)
        forwards = self.batcher.run if self.batcher is not None else None
        if self.greedy_goes_first():
            self.greedy_step(forwards)
        step = timed_step(self.decoder, forwards)
        if len(self.decoder.steps) == 1:
            charge_reading(step, self.reading.get("method", 0.0))
        while not self.greedy.done and len(self.greedy.output) < len(self.decoder.output):
            self.greedy_step(forwards)
        self.speedups.append(self.figures()["speedup"])
        g = self.greedy
        self.baseline.append({"tokens": len(g.output), "forwards": len(g.steps),
                              "seconds": sum(s.seconds for s in g.steps), "reading": self.reading.get("greedy", 0.0)})
        if self.divergence is None and self.decoder.sampler is None and not self.figures()["identical"]:
            self.divergence = self.on_model(explain_divergence, self.decoder.lm, self.decoder.prompt,
                                            self.greedy.output, self.decoder.output, step.forward_tokens)
        return step

    def greedy_goes_first(self) -> bool:
        """Whether this step's first timed forward is greedy's: every other step, where greedy needs a step
        whatever the method commits (it is no further than the method, which commits at least one token).
        The first forward after a pause (the page drawing, a person reading) can run slower than the ones
        that follow it; taking turns charges that to both sides alike."""
        return (len(self.decoder.steps) % 2 == 1 and not self.greedy.done
                and len(self.greedy.output) <= len(self.decoder.output))

    def greedy_step(self, forwards=None) -> None:
        """One timed step of greedy; its first carries its reading of the prompt."""
        step = timed_step(self.greedy, forwards)
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
        self.decoder.restore_cache()
        self.greedy.restore_cache()

    def figures(self) -> dict:
        """Exact counters: tokens, forwards, MAT, tok/s (from each whole step's wall clock), speedup."""
        def side(dec: Decoder) -> dict:
            secs = sum(s.seconds for s in dec.steps)
            n = len(dec.output)
            return {"tokens": n, "forwards": len(dec.steps), "mat": n / len(dec.steps) if dec.steps else 0.0,
                    "tok_per_s": n / secs if secs else 0.0, "seconds": secs}
        tr, g = side(self.decoder), side(self.greedy)
        n = min(len(self.decoder.output), len(self.greedy.output))
        return {"tr": tr, "greedy": g,
                "speedup": tr["tok_per_s"] / g["tok_per_s"] if g["tok_per_s"] else 0.0,
                "identical": self.decoder.output[:n] == self.greedy.output[:n], "compared": n}
