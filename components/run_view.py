"""What every panel draws from: a run's Step records, live or opened from a file, at any step.

A live race and a replayed run file look the same here, so the history slider, Teach mode and
all panels work for both, with or without a model.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable

from tr_core.runs import Run, make_run, special_ids
from tr_core.trace import Step

METHOD_LABELS = {"tr": "Token Recycling", "ptd": "Progressive Tree Drafting", "pld": "Prompt lookup",
                 "greedy": "Greedy"}


@dataclass
class RunView:
    steps: list[Step]
    baseline: list[dict]  # greedy's tokens, forwards and seconds after each step
    output: list[int]  # the method's output so far
    baseline_output: list[int]
    token_text: Callable[[int], str]
    special: set[int] = field(default_factory=set)
    header: dict = field(default_factory=dict)
    lookahead: int = 7
    replayed: bool = False  # opened from a run file
    timed_here: bool = True  # its times were measured on this server (False: a run file's, from elsewhere)

    @classmethod
    def of_race(cls, race, header: dict) -> "RunView":
        dec, lm = race.decoder, race.decoder.lm
        if race.divergence is not None:  # kept in the header, so that a saved run explains it too
            header["divergence"] = race.divergence.to_json()
        return cls(dec.steps, race.baseline, dec.output, race.greedy.output, lm.token_text,
                   special_ids(lm), header, dec.lookahead)

    @classmethod
    def of_run(cls, run: Run, timed_here: bool = False) -> "RunView":
        """A run file's view (``replayed``); ``timed_here``: its times are this server's (a run it recorded)."""
        depth = max((max(s.tree.depths, default=0) for s in run.steps), default=6)
        return cls(run.steps, run.baseline, run.outputs.get("method", []), run.outputs.get("baseline", []),
                   run.token_text, run.special, run.header, depth + 1, replayed=True, timed_here=timed_here)

    def first(self, n: int) -> "RunView":
        """The run as far as its first ``n`` steps: a recorded run, shown step by step (ZeroGPU)."""
        steps, baseline = self.steps[:n], self.baseline[:n]
        tokens = sum(len(s.committed) for s in steps)
        return replace(self, steps=steps, baseline=baseline, output=self.output[:tokens],
                       baseline_output=self.baseline_output[:baseline[-1]["tokens"] if baseline else 0])

    def to_run(self) -> Run:
        return make_run(self.header, self.steps, self.baseline,
                        {"method": self.output, "baseline": self.baseline_output}, self.token_text, self.special)

    # ---- at step n (1-based) ---------------------------------------------------------------
    @property
    def method(self) -> str:
        return self.steps[0].method if self.steps else self.header.get("method", "tr")

    @property
    def sampled(self) -> bool:
        return bool(self.steps and self.steps[0].sampled)

    def clamp(self, n: int | None) -> int:
        return len(self.steps) if n is None else max(min(int(n), len(self.steps)), 0)

    def step(self, n: int) -> Step | None:
        return self.steps[n - 1] if 0 < n <= len(self.steps) else None

    def tokens_until(self, n: int) -> int:
        return sum(len(s.committed) for s in self.steps[:n])

    def figures(self, n: int) -> dict | None:
        """The counters after step ``n``: tokens, forwards, MAT, tok/s, speedup, identical so far."""
        if n < 1 or n > len(self.baseline):
            return None
        secs = sum(s.seconds for s in self.steps[:n])
        tokens = self.tokens_until(n)
        tr = {"tokens": tokens, "forwards": n, "mat": tokens / n, "tok_per_s": tokens / secs if secs else 0.0,
              "seconds": secs, "alongside": sum(1 for s in self.steps[:n] if s.alongside)}
        b = self.baseline[n - 1]
        g = {"tokens": b["tokens"], "forwards": b["forwards"], "mat": b["tokens"] / max(b["forwards"], 1),
             "tok_per_s": b["tokens"] / b["seconds"] if b["seconds"] else 0.0, "seconds": b["seconds"],
             "alongside": b.get("alongside", 0)}
        both = min(tokens, b["tokens"])
        return {"tr": tr, "greedy": g, "speedup": tr["tok_per_s"] / g["tok_per_s"] if g["tok_per_s"] else 0.0,
                "identical": self.output[:both] == self.baseline_output[:both], "compared": both}

    def divergence(self, n: int) -> dict | None:
        """Where and why the outputs first parted (``tr_core.precision.Divergence`` as a dict), once
        step ``n`` has reached that position; None while they agree."""
        div = self.header.get("divergence")
        return div if div and div.get("position", 0) < self.tokens_until(n) else None

    def speedups(self, n: int) -> list[float]:
        return [self.figures(i)["speedup"] for i in range(1, n + 1)]

    def step_of_token(self, position: int) -> int:
        """The step that committed output token ``position`` (0-based)."""
        seen = 0
        for s in self.steps:
            seen += len(s.committed)
            if position < seen:
                return s.index
        return len(self.steps)

