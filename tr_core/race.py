"""A tree decoder and plain greedy decoding on the same prompt and model, advanced side by side.

After every step of the tree decoder, greedy decodes until it has at least as many tokens, one
forward at a time, in the same handler: the two never run at once, so neither slows the other.
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


@dataclass
class Race:
    decoder: Decoder
    greedy: GreedyDecoder
    speedups: list[float] = field(default_factory=list)  # cumulative speedup after each step
    baseline: list[dict] = field(default_factory=list)  # greedy's tokens, forwards, seconds after each step
    divergence: Divergence | None = None  # where and why the outputs first parted (greedy decoding only)
    forwards: object = None  # runs each forward (None: alone; a Batcher's ``run``: with other tabs' steps)

    def start(self, prompt_ids: list[int]) -> None:
        self.decoder.start(prompt_ids)
        self.greedy.start(prompt_ids)
        self.speedups, self.baseline, self.divergence = [], [], None

    @property
    def done(self) -> bool:
        return self.decoder.done

    def step(self) -> Step:
        self.restore_caches()
        gc.collect(1)  # what the caller left to collect (e.g. drawing the last step) is not this step's work
        wake(self.decoder.lm.device)  # nor is waking a CPU that idled while the page drew: greedy's steps follow at once
        step = timed_step(self.decoder, self.forwards)
        while not self.greedy.done and len(self.greedy.output) < len(self.decoder.output):
            timed_step(self.greedy, self.forwards)
        self.speedups.append(self.figures()["speedup"])
        g = self.greedy
        self.baseline.append({"tokens": len(g.output), "forwards": len(g.steps),
                              "seconds": sum(s.seconds for s in g.steps)})
        if self.divergence is None and self.decoder.sampler is None and not self.figures()["identical"]:
            self.divergence = explain_divergence(self.decoder.lm, self.decoder.prompt, self.greedy.output,
                                                 self.decoder.output, step.forward_tokens)
        return step

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
