"""The cost-aware tree: pick the draft tree that maximises expected tokens per second.

    throughput(tree) = (1 + sum of p(node) over the tree's nodes) / cost(1 + |tree|)

where ``p(node)`` is how often that node was accepted (online statistics by rank path, starting
from a prior) and ``cost(q)`` the measured time of one forward with ``q`` query tokens on this
model and device.  A node counts once when accepted, so the expected tokens of a step are exactly
1 + the sum of its nodes' acceptance probabilities.  When no tree pays, the plan is empty and a
step is a plain one-token forward: never worse than greedy by more than noise.

A prompt-lookup continuation grafted into the tree is cut by the same rule: its i-th token adds its
acceptance rate (``ChainStats``, by matched n-gram size) and costs one more query token.
"""
from __future__ import annotations

import heapq
import time
from dataclasses import dataclass, field

import torch

from .models import synchronize
from .trees import TreeShape, TreeTensors, load_tree, tree_prior

COST_LENGTHS = tuple(range(1, 17)) + (20, 24, 32, 48, 64, 81, 96)


@dataclass
class CostCurve:
    """Seconds of one forward by query length, over a cache of ``prefix`` tokens.

    ``seconds`` is the measured shape, ``scale`` follows the machine's load and the context's growth
    (``observe``): ``cost(q) = scale * interpolated seconds``.  The shape is kept as measured, not
    smoothed: on a CPU it is not monotone (measured on the embedded model, 2 query tokens cost 15% more
    than 4 to 6, which cost no more than 1, and 7 cost 15% more than 6: kernel choices by size), and
    the planner should see exactly where those steps lie."""

    lengths: list[int]
    seconds: list[float]
    scale: float = 1.0

    def __post_init__(self) -> None:
        self._table = [self._interpolate(q) for q in range(self.lengths[-1] + 1)]  # O(1) lookups

    def _interpolate(self, q: int) -> float:
        xs, ys = self.lengths, self.seconds
        if q <= xs[0]:
            return ys[0]
        for (x0, y0), (x1, y1) in zip(zip(xs, ys), zip(xs[1:], ys[1:])):
            if q <= x1:
                return y0 + (y1 - y0) * (q - x0) / (x1 - x0)
        slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])
        return ys[-1] + slope * (q - xs[-1])

    def shape(self, q: int) -> float:
        """The measured seconds at ``q`` query tokens (interpolated between grid points)."""
        return self._table[q] if 0 <= q < len(self._table) else self._interpolate(q)

    def __call__(self, q: int) -> float:
        return self.scale * self.shape(q)

    def observe(self, q: int, seconds: float, rate: float = 0.05) -> None:
        """Blend a forward time seen while decoding into ``scale`` (the ratio of seen to measured
        time), so the curve follows the machine's real load and the cache's growth."""
        self.scale += rate * (seconds / max(self.shape(q), 1e-12) - self.scale)

    @classmethod
    @torch.inference_mode()
    def measure(cls, lm, lengths=COST_LENGTHS, prefix: int = 128, repeats: int = 3) -> "CostCurve":
        """Time ``model(q tokens)`` over a ``prefix``-token cache with an explicit attention mask, as
        tree steps run it: lengths interleaved round by round (so passing load hits all alike),
        median of ``repeats`` after a warm-up round."""
        gen = torch.Generator().manual_seed(0)
        dev = lm.device
        low = min(100, lm.vocab_size - 1)  # skip the special tokens at the start of most vocabularies
        ids = torch.randint(low, lm.vocab_size, (1, prefix + max(lengths)), generator=gen).to(dev)
        sync = lambda: synchronize(dev)  # noqa: E731
        cache = lm.new_cache()
        lm.model(input_ids=ids[:, :prefix], use_cache=True, logits_to_keep=1, **{lm.cache_arg: cache})
        n = max(lengths)  # a chain: every query token sees the cache and the ones before it
        chain = TreeTensors.from_parents(list(range(-1, n - 1)), list(range(n)), dev, lm.dtype)
        times: dict[int, list[float]] = {q: [] for q in lengths}
        for r in range(repeats + 1):
            for q in lengths:
                x = ids[:, prefix:prefix + q]
                tree = chain.head(q)
                pos, mask = tree.position_ids(prefix), lm.tree_masks(tree, prefix)
                sync()
                t0 = time.perf_counter()
                lm.model(input_ids=x, position_ids=pos, attention_mask=mask, use_cache=True,
                         **{lm.cache_arg: cache})
                sync()
                if r:
                    times[q].append(time.perf_counter() - t0)
                cache.crop(-q)
        return cls(list(lengths), [sorted(times[q])[len(times[q]) // 2] for q in lengths])


def cost_curve_for(lm) -> CostCurve:
    """The model's cost curve, measured once and kept on the shared ``LoadedModel``."""
    if lm.cost_curve is None:
        lm.cost_curve = CostCurve.measure(lm)
    return lm.cost_curve


class DecayedRates:
    """Trials and hits per key, faded by ``decay`` at every count and shrunk towards a prior that
    counts as ``weight`` trials (the shared mechanics of the planner's statistics)."""

    weight: float
    decay: float
    trials: dict
    hits: dict

    def count(self, tried, hit) -> None:
        """One round: older counts fade, then every key of ``tried`` is a trial and of ``hit`` a hit."""
        for key in self.trials:
            self.trials[key] *= self.decay
            self.hits[key] = self.hits.get(key, 0.0) * self.decay
        for key in tried:
            self.trials[key] = self.trials.get(key, 0.0) + 1.0
        for key in hit:
            self.hits[key] = self.hits.get(key, 0.0) + 1.0

    def rate(self, key, prior: float) -> float:
        return (self.hits.get(key, 0.0) + self.weight * prior) / (self.trials.get(key, 0.0) + self.weight)


@dataclass
class AcceptanceStats(DecayedRates):
    """Online acceptance counts per node of a universe tree, shrunk towards a prior."""

    universe: TreeShape
    prior: dict[tuple[int, ...], float]
    weight: float = 16.0  # the prior counts as this many trials
    decay: float = 0.97  # per step: recent steps weigh most, so the plan follows the current text
    trials: dict[tuple[int, ...], float] = field(default_factory=dict)
    hits: dict[tuple[int, ...], float] = field(default_factory=dict)

    def record(self, used: TreeShape, accepted: list[tuple[int, ...]]) -> None:
        """One step: every node of ``used`` was a trial.  Older counts fade by ``decay``, so the
        estimates follow the text at hand and drift back to the prior for nodes no longer drafted
        (which are then tried again: a cold start cannot shut the tree for good)."""
        self.count(used.paths, accepted)

    def estimate(self, p: tuple[int, ...]) -> float:
        return self.rate(p, self.prior.get(p, 0.0))


@dataclass
class ChainStats(DecayedRates):
    """P(the i-th token of a prompt-lookup continuation is accepted), by matched n-gram size.

    Online counts per position, faded by ``decay`` and shrunk towards a geometric prior
    ``PRIOR_RATE[n] ** (i + 1)`` (longer matches continue further)."""

    PRIOR_RATE = {1: 0.35, 2: 0.5, 3: 0.67}
    weight: float = 8.0
    decay: float = 0.97
    trials: dict[tuple[int, int], float] = field(default_factory=dict)
    hits: dict[tuple[int, int], float] = field(default_factory=dict)

    def record(self, ngram: int, offered: int, accepted: int) -> None:
        self.count([(ngram, i) for i in range(offered)], [(ngram, i) for i in range(min(accepted, offered))])

    def estimate(self, ngram: int, i: int) -> float:
        return self.rate((ngram, i), self.PRIOR_RATE.get(ngram, 0.35) ** (i + 1))


def plan_tree(universe: TreeShape, estimate, cost: CostCurve, extra: int = 0) -> tuple[TreeShape, float]:
    """Best-first growth from the root by estimated acceptance; keep the size with the best throughput.

    Returns the tree and its expected committed tokens per step (1 + sum of the nodes' estimates).
    """
    children: dict[tuple, list[tuple]] = {}
    for p in universe.paths:
        children.setdefault(p[:-1], []).append(p)
    frontier = [(-estimate(p), p) for p in children.get((), [])]
    heapq.heapify(frontier)
    chosen, gain = [], 0.0
    best_n, best_gain, best_rate = 0, 0.0, 1.0 / cost(1 + extra)
    while frontier:
        neg, p = heapq.heappop(frontier)
        chosen.append(p)
        gain += -neg
        rate = (1.0 + gain) / cost(1 + len(chosen) + extra)
        if rate > best_rate:
            best_n, best_gain, best_rate = len(chosen), gain, rate
        for c in children.get(p, []):
            heapq.heappush(frontier, (-estimate(c), c))
    picked = chosen[:best_n]
    return universe.subtree(picked, name=f"auto-{best_n}"), 1.0 + best_gain


class TreePlanner:
    """Re-plans the tree every ``every`` steps from the acceptance seen lately."""

    def __init__(self, lm, universe: str = "paper-80", every: int = 4, k: int = 8):
        """Plans sub-trees of ``universe`` that use only ranks below ``k``."""
        self.universe_name = universe
        full = load_tree(universe)
        self.universe = full.subtree([p for p in full.paths if max(p) < k], name=universe)
        self.cost = cost_curve_for(lm)
        self.every, self.k = every, k
        self.reset()

    def reset(self) -> None:
        """Back to the prior: no statistics, the initial plan."""
        self.stats = AcceptanceStats(self.universe, tree_prior(self.universe_name) or {})
        self.steps = 0
        self.tree, self.expected = plan_tree(self.universe, self.stats.estimate, self.cost)
        self.chain = ChainStats()  # how far prompt-lookup continuations get accepted

    def record_lookup(self, ngram: int, offered: int, accepted: int) -> None:
        """A lookup continuation of ``offered`` tokens had its first ``accepted`` accepted."""
        self.chain.record(ngram, offered, accepted)

    def lookup_length(self, q: int, ngram: int, offset: int, available: int) -> int:
        """How many of the ``available`` lookup tokens to add to a forward of ``q`` tokens: the prefix
        that maximises expected tokens per second (0 when none pays).  The first ``offset`` tokens
        of the continuation are already in the drafted tree."""
        best_n, best_rate, gain = 0, self.expected / self.cost(q), 0.0
        for n in range(1, available + 1):
            gain += self.chain.estimate(ngram, offset + n - 1)
            rate = (self.expected + gain) / self.cost(q + n)
            if rate > best_rate:
                best_n, best_rate = n, rate
        return best_n

    def record(self, used: TreeShape, accepted: list[tuple[int, ...]], forward_tokens: int = 0,
               forward_seconds: float = 0.0) -> TreeShape | None:
        """Count one step (and its forward's time); returns a new tree when it is time to re-plan
        and the plan changed."""
        self.stats.record(used, accepted)
        if forward_tokens:
            self.cost.observe(forward_tokens, forward_seconds)
        self.steps += 1
        if self.steps % self.every:
            return None
        tree, self.expected = plan_tree(self.universe, self.stats.estimate, self.cost)
        if tree.paths == self.tree.paths:
            return None
        self.tree = tree
        return tree
