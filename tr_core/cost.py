"""What one forward costs: seconds by query length and cache length, re-fitted while decoding.

    cost(q, L) = alpha * s(1)  +  beta * (s(q) - s(1))  +  gamma * q * (L - L0)  +  delta * (L - L0)

``s(q)`` is the shape measured once at load over a cache of ``L0`` tokens (kept as measured, not
smoothed: on a CPU it is not monotone, kernel choices change with the size, and the planner should
see exactly where those steps lie).  The three coefficients split a forward into

* a fixed part (``alpha``): what a one-token forward costs, overheads and weight reads included;
* a per-token part (``beta``): what every extra query token adds; load on a shared machine takes
  compute from big forwards more than from small ones, so ``beta`` can move apart from ``alpha``;
* a cache part (``gamma``): attention reads of every cached token, per query token;
* a fixed cache part (``delta``, measured, not refitted): what a masked forward pays per cached token
  whatever its size, e.g. transformers' copy of the cache to every query head of a grouped-query
  model on CUDA (``repeat_kv``); the part of a 1-token forward's growth with the cache that
  ``gamma`` does not explain.

Greedy decoding's own forward is a 1-token forward **without** a mask (transformers' fastest path,
e.g. grouped-query heads packed, no copy of the cache); a tree step's has one.  ``plain_ratio`` (the
mask-free 1-token forward over the masked one, measured with the curve) turns the curve's 1-token cost
into greedy's (:meth:`CostCurve.greedy`): the planner weighs every tree against that, so "no tree" is
never judged against a baseline slower than greedy's.

A uniform factor on every cost never changes which plan wins; these three can (a dearer extra
token, or a longer cache, favours a smaller tree).  Every forward seen while decoding is an
observation, and the coefficients are refitted by exponentially weighted least squares, shrunk
towards ``alpha = beta`` (one common load factor) and the measured ``gamma``: old observations fade,
so a curve measured while the machine was busy does not stick.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import torch

from .devices import synchronize
from .trees import TreeTensors

COST_LENGTHS = tuple(range(1, 17)) + (20, 24, 32, 48, 64, 81, 96)
PRIOR_WEIGHT = 2.0  # the prior (beta = alpha, gamma as measured) counts as this many observations
ANCHOR_WEIGHT = 0.05  # alpha = 1 (the curve as measured): only to decide where nothing was observed
DECAY = 0.98  # per observation: the fit follows the last few dozen forwards
TYPICAL_CACHE_FEATURE = 8 * 256  # q * (L - L0) of a typical step: scales gamma's prior weight


@dataclass
class CostCurve:
    """``cost(q, cache)`` in seconds (module doc); ``lengths``/``seconds`` the measured shape."""

    lengths: list[int]
    seconds: list[float]
    per_cache: float = 0.0  # measured gamma: seconds per query token per cached token beyond ``prefix``
    prefix: int = 128  # L0, the cache length of the measured shape
    decay: float = DECAY
    per_cache_fixed: float = 0.0  # measured delta: seconds per cached token beyond ``prefix``, any query size
    plain_ratio: float = 1.0  # greedy's mask-free 1-token forward over the masked one (at most 1)
    coef: np.ndarray = field(default=None)  # [alpha, beta, gamma]
    _gram: np.ndarray = field(default=None, repr=False)  # [3, 3] decayed sum of x x^T
    _moment: np.ndarray = field(default=None, repr=False)  # [3] decayed sum of x * seconds

    def __post_init__(self) -> None:
        self._table = [self._interpolate(q) for q in range(self.lengths[-1] + 1)]  # O(1) lookups
        if self.coef is None:
            self.coef = np.array([1.0, 1.0, self.per_cache])
        self._gram, self._moment = np.zeros((3, 3)), np.zeros(3)

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

    def features(self, q: int, cache: int | None) -> np.ndarray:
        """``[3]``: the fixed, per-token and cache parts of a forward, in measured seconds / tokens."""
        extra = 0 if cache is None else cache - self.prefix
        return np.array([self.shape(1), self.shape(q) - self.shape(1), q * extra])

    def fixed_cache(self, cache: int | None) -> float:
        """``delta * (L - L0)``, counted beyond the measured prefix only: below it the measured shape
        already holds the copy, and a negative part would make one-token forwards over short caches
        look nearly free (and every tree dear)."""
        return 0.0 if cache is None else self.per_cache_fixed * max(cache - self.prefix, 0)

    def __call__(self, q: int, cache: int | None = None) -> float:
        return max(float(self.features(q, cache) @ self.coef) + self.fixed_cache(cache), 1e-9)

    def greedy(self, cache: int | None = None) -> float:
        """Seconds of greedy decoding's own forward (one token, no mask) over ``cache`` cached tokens."""
        return self(1, cache) * min(self.plain_ratio, 1.0)

    def fresh(self) -> "CostCurve":
        """The measured curve again, with nothing observed since."""
        return CostCurve(list(self.lengths), list(self.seconds), self.per_cache, self.prefix, self.decay,
                         per_cache_fixed=self.per_cache_fixed, plain_ratio=self.plain_ratio)

    @property
    def scale(self) -> float:
        """The fixed part's factor: how much slower a one-token forward runs than when measured."""
        return float(self.coef[0])

    def observe(self, q: int, seconds: float, cache: int | None = None) -> None:
        """One forward of ``q`` tokens over ``cache`` cached tokens took ``seconds``: refit."""
        x = self.features(q, cache)
        seconds = seconds - self.fixed_cache(cache)  # the measured fixed cache part is not refitted
        self._gram = self.decay * self._gram + np.outer(x, x)
        self._moment = self.decay * self._moment + x * seconds
        self.coef = self.refit()

    def refit(self) -> np.ndarray:
        """Least squares on the faded observations plus the prior: ``(G + P) c = m + p``, with
        ``P`` pulling ``alpha`` to 1, ``beta`` to ``alpha`` and ``gamma`` to its measured value."""
        s1 = self.shape(1)
        w, wa = PRIOR_WEIGHT * s1 * s1, ANCHOR_WEIGHT * s1 * s1
        wg = PRIOR_WEIGHT * TYPICAL_CACHE_FEATURE ** 2
        d = np.array([-1.0, 1.0, 0.0])
        prior = np.diag([wa, 0.0, wg]) + w * np.outer(d, d)
        target = np.array([wa, 0.0, wg * self.per_cache])
        coef = np.linalg.solve(self._gram + prior, self._moment + target)
        return np.maximum(coef, [1e-3, 0.0, 0.0])  # no part of a forward is free or pays back

    @classmethod
    @torch.inference_mode()
    def measure(cls, lm, lengths=COST_LENGTHS, prefix: int = 128, repeats: int = 3,
                long_prefix: int = 512) -> "CostCurve":
        """Time ``model(q tokens)`` over a ``prefix``-token cache with an explicit attention mask, as
        tree steps run it: lengths interleaved round by round (so passing load hits all alike),
        median of ``repeats`` after a warm-up round; then 1 and 16 tokens over ``long_prefix`` for the
        cache part."""
        base = time_forwards(lm, lengths, prefix, repeats)
        ends = (1, min(16, max(lengths)))
        far = time_forwards(lm, ends, long_prefix, repeats)
        curve = cls.from_two_caches(lengths, base, prefix, dict(zip(ends, far)), long_prefix)
        masked, plain = time_forwards(lm, [1], prefix, repeats)[0], time_forwards(lm, [1], prefix, repeats, mask=False)[0]
        curve.plain_ratio = plain / masked if masked > 0 else 1.0
        return curve

    @classmethod
    def from_two_caches(cls, lengths, near: list[float], prefix: int, far: dict[int, float],
                        long_prefix: int) -> "CostCurve":
        """The curve ``near`` (seconds by ``lengths`` over ``prefix`` cached tokens), with its cache parts
        from 1 and 16 query tokens timed over ``prefix`` and over ``long_prefix`` (``far``: seconds by q):
        ``gamma`` from how much more the 16-token forward grows than the 1-token one, ``delta`` from the
        1-token forward's growth that ``gamma`` does not explain."""
        lengths = list(lengths)
        q = min(16, max(lengths))
        at = {n: near[lengths.index(n)] for n in (1, q)}
        span = long_prefix - prefix
        gamma = max(((far[q] - far[1]) - (at[q] - at[1])) / ((q - 1) * span), 0.0)
        delta = max((far[1] - at[1]) / span - gamma, 0.0)  # a 1-token masked forward, per cached token
        return cls(lengths, list(near), per_cache=gamma, prefix=prefix, per_cache_fixed=delta)


@dataclass
class HostCost:
    """What a step spends besides its forward, in seconds: ``a + b * q`` for ``q`` query tokens
    (drafting, lookup, masks, verification, the matrix update, pruning the cache, Python).

    Refitted from every step by exponentially weighted least squares (``decay`` per step), shrunk
    towards ``b = 0``: while the tree keeps one size the per-token part cannot be told from the fixed
    part, and a step's host work is then counted as fixed.  Nothing observed: 0."""

    decay: float = 0.95
    coef: np.ndarray = field(default_factory=lambda: np.zeros(2))  # [a, b]
    _gram: np.ndarray = field(default_factory=lambda: np.zeros((2, 2)), repr=False)
    _moment: np.ndarray = field(default_factory=lambda: np.zeros(2), repr=False)

    RIDGE = (1e-6, 4.0)  # ridge on a (just enough to solve) and on b (against the spread of q seen)

    def observe(self, q: int, seconds: float) -> None:
        x = np.array([1.0, float(q)])
        self._gram = self.decay * self._gram + np.outer(x, x)
        self._moment = self.decay * self._moment + x * max(seconds, 0.0)
        self.coef = self.refit()

    def refit(self) -> np.ndarray:
        """Ridge least squares with both parts kept non-negative: where one would fit below 0, it is
        0 and the other is refitted alone."""
        g = self._gram + np.diag(self.RIDGE)
        a, b = np.linalg.solve(g, self._moment)
        if b < 0:
            return np.array([max(self._moment[0] / g[0, 0], 0.0), 0.0])
        if a < 0:
            return np.array([0.0, max(self._moment[1] / g[1, 1], 0.0)])
        return np.array([a, b])

    def __call__(self, q: int) -> float:
        return float(self.coef[0] + self.coef[1] * q)


@torch.inference_mode()
def time_forwards(lm, lengths, prefix: int, repeats: int, mask: bool = True) -> list[float]:
    """Median seconds of one forward of each of ``lengths`` query tokens (a chain, with an explicit
    mask as tree steps run it; ``mask=False``: none, causal, as greedy and a prefill run it) over a
    ``prefix``-token cache of random tokens."""
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
            tree = chain.head(q)
            pos, masks = tree.position_ids(prefix), (lm.tree_masks(tree, prefix) if mask else None)
            sync()
            t0 = time.perf_counter()
            lm.model(input_ids=ids[:, prefix:prefix + q], position_ids=pos, attention_mask=masks, use_cache=True,
                     **{lm.cache_arg: cache})
            sync()
            if r:
                times[q].append(time.perf_counter() - t0)
            cache.crop(-q)
    return [sorted(times[q])[len(times[q]) // 2] for q in lengths]


def cost_curve_for(lm) -> CostCurve:
    """The model's cost curve, measured once and kept on the shared ``LoadedModel``.  Planners refit
    a copy of it (``CostCurve.fresh``, taken at their reset), never the shared curve itself, so one
    method's forwards never steer another's plans."""
    if lm.cost_curve is None:
        lm.cost_curve = CostCurve.measure(lm)
    return lm.cost_curve
