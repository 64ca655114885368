"""The cost-aware tree: pick the draft tree that maximises expected tokens per second.

    throughput(tree) = (1 + sum of p(node) over the tree's nodes) / cost(1 + |tree|)

where ``p(node)`` is how often that node was accepted (online statistics by rank path, starting
from a prior) and ``cost(q)`` the time of one step with ``q`` query tokens on this model and
device at the current cache length, as the machine runs it now (its forward, ``tr_core.cost``, and
the host work around it).  A node counts once when accepted, so the expected tokens of a step are exactly
1 + the sum of its nodes' acceptance probabilities.  When no tree pays, the plan is empty and a
step is a plain one-token forward: never worse than greedy by more than noise.

A retrieval continuation grafted into the tree is cut by the same rule: its i-th token adds its
acceptance rate (``ChainStats``, by match length, ``tr_core.lookup.MATCH_BUCKETS``) and costs one
more query token.  ``cost(q)`` is the whole step's: the forward's curve plus the host work measured
around it (``HostCost``).
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass, field

from .cost import COST_LENGTHS, CostCurve, HostCost, cost_curve_for  # noqa: F401  (re-exported)
from .trees import TreeShape, load_tree, preset_data, tree_prior

UNIFORM_RATE = 0.1  # the "no priors" ablation: every node of the universe starts at this rate

RATE_FLOOR = 0.002  # no prior is taken below this: a hard 0 would mean "never draft this again"


class DecayedRates:
    """Trials and hits per key, faded by ``decay`` at every count and shrunk towards a prior that
    counts as ``weight`` trials (the shared mechanics of the planner's statistics).  Priors below
    ``RATE_FLOOR`` count as ``RATE_FLOOR``."""

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
        prior = max(prior, RATE_FLOOR)
        return (self.hits.get(key, 0.0) + self.weight * prior) / (self.trials.get(key, 0.0) + self.weight)


@dataclass
class AcceptanceStats(DecayedRates):
    """Online acceptance counts per node of a universe tree, shrunk towards a prior."""

    universe: TreeShape
    prior: dict[tuple[int, ...], float]
    weight: float = 4.0  # the prior counts as this many trials: evidence outweighs it within a few steps
    decay: float = 0.97  # per step: recent steps weigh most, so the plan follows the current text
    trials: dict[tuple[int, ...], float] = field(default_factory=dict)
    hits: dict[tuple[int, ...], float] = field(default_factory=dict)
    level_hits: float = 0.0  # faded: drafts accepted ...
    level_expected: float = 0.0  # ... and how many the prior expected of the same nodes

    LEVEL_PSEUDO = 2.0  # expected accepted drafts the level starts from (level 1: the prior as is)

    def record(self, used, accepted: list[tuple[int, ...]]) -> None:
        """One step: every node of ``used`` (a shape, or the rank paths drafted) was a trial.  Older
        counts fade by ``decay``, so the estimates follow the text at hand and drift back to the
        prior for nodes no longer drafted (which are then tried again: a cold start cannot shut the
        tree for good)."""
        paths = used.paths if isinstance(used, TreeShape) else used
        self.level_hits = self.decay * self.level_hits + len(accepted)
        self.level_expected = self.decay * self.level_expected + sum(
            max(self.prior.get(p, 0.0), RATE_FLOOR) for p in paths)
        self.count(paths, accepted)

    @property
    def level(self) -> float:
        """How well this text's drafts do against the prior, over the recent steps: accepted drafts
        over what the prior expected of them (shrunk towards 1).  It scales the prior of every node,
        tried or not: on text where drafts miss (chat), the untried nodes are not trusted at their
        prior either, and the plan shrinks to no tree within a few steps."""
        p = self.LEVEL_PSEUDO
        return min(max((self.level_hits + p) / (self.level_expected + p), 0.05), 4.0)

    def estimate(self, p: tuple[int, ...]) -> float:
        return self.rate(p, min(self.prior.get(p, 0.0) * self.level, 0.95))


LOOKUP_STATES = ("cold", "hot")  # the previous lookup continuation: short-lived, or accepted at length
HOT_RUN = 4  # accepted continuation tokens that make the next lookup "hot" (the text is being copied)


def is_hot(offered: int, accepted: int) -> bool:
    """Whether a lookup continuation of ``offered`` tokens, of which the first ``accepted`` were
    accepted, makes the next one hot: at least ``HOT_RUN`` accepted, or all of a shorter one.  The
    calibration replay and the planner use this same rule."""
    return offered > 0 and accepted >= min(HOT_RUN, offered)


def lookup_prior(universe: str) -> dict:
    """``{(match, hot, i): rate}`` (``match``: the match-length key) stored beside ``universe`` by ``python -m tr_core.bench.calibrate``
    (``"lookup_acceptance"``); empty where there is none."""
    table = preset_data(universe).get("lookup_acceptance", {})
    return {(int(n), state == "hot", i): r for n, by_state in table.items() for state, rates in by_state.items()
            for i, r in enumerate(rates) if r is not None}


@dataclass
class ChainStats(DecayedRates):
    """P(the i-th token of a retrieval continuation is accepted), by match length (bucketed) and by
    whether the previous continuation was accepted at length (:func:`is_hot`; ``hot``: the output
    is copying the context, and the next continuation is likely to run long too) or not.

    Online counts per key, faded by ``decay`` and shrunk towards the calibrated prior (``prior``,
    from :func:`lookup_prior`), else a geometric ``PRIOR_RATE[n] ** (i + 1)``."""

    PRIOR_RATE = {1: 0.35, 2: 0.5, 3: 0.67, 4: 0.72, 8: 0.8, 16: 0.85}  # by match length (lookup.MATCH_BUCKETS)
    prior: dict = field(default_factory=dict)
    weight: float = 8.0
    decay: float = 0.97
    trials: dict[tuple[int, bool, int], float] = field(default_factory=dict)  # by (match, hot, i)
    hits: dict[tuple[int, bool, int], float] = field(default_factory=dict)

    def record(self, match: int, offered: int, accepted: int, hot: bool = False) -> None:
        self.count([(match, hot, i) for i in range(offered)],
                   [(match, hot, i) for i in range(min(accepted, offered))])

    def estimate(self, match: int, i: int, hot: bool = False) -> float:
        key = (match, hot, i)
        prior = self.prior.get(key)
        if prior is None:
            prior = self.PRIOR_RATE.get(match, 0.35) ** (i + 1)
        return self.rate(key, prior)


def plan_tree(universe: TreeShape, estimate, cost, extra: int = 0, min_nodes: int = 0,
              baseline: float | None = None) -> tuple[TreeShape, float]:
    """Best-first growth from the root by estimated acceptance; keep the size with the best throughput
    (``cost(q)``: seconds of a step of ``q`` query tokens), at least ``min_nodes`` nodes.  ``baseline``:
    seconds of the step without a tree (default ``cost(1 + extra)``); the planner passes greedy's own
    mask-free forward, so a tree is kept only where it beats plain greedy decoding.

    Returns the tree and its expected committed tokens per step (1 + sum of the nodes' estimates).
    """
    children: dict[tuple, list[tuple]] = {}
    for p in universe.paths:
        children.setdefault(p[:-1], []).append(p)
    frontier = [(-estimate(p), p) for p in children.get((), [])]
    heapq.heapify(frontier)
    chosen, gain = [], 0.0
    if baseline is None:
        baseline = cost(1 + extra)
    best_n, best_gain, best_rate = 0, 0.0, (1.0 / baseline if min_nodes == 0 else 0.0)
    while frontier:
        neg, p = heapq.heappop(frontier)
        chosen.append(p)
        gain += -neg
        rate = (1.0 + gain) / cost(1 + len(chosen) + extra)
        if rate > best_rate and len(chosen) >= min_nodes:
            best_n, best_gain, best_rate = len(chosen), gain, rate
        for c in children.get(p, []):
            heapq.heappush(frontier, (-estimate(c), c))
    picked = chosen[:best_n]
    return universe.subtree(picked, name=f"auto-{best_n}"), 1.0 + best_gain


def allocate(estimates: list[float], parents: list[int], budget: int) -> list[int]:
    """A step's ``budget`` draft nodes, the best by estimated acceptance: best-first from the root
    over a candidate tree (node ``i`` > 0: ``estimates[i - 1]``, parent ``parents[i]``; parents
    precede children).  Every node counts once when accepted, so where estimates do not rise from a
    node to its children (as acceptance rates of a path do not) the kept set has the largest expected
    tokens of any parent-closed set of that size; elsewhere, of those grown best-first.

    Returns the kept nodes, root first, in order."""
    children: dict[int, list[int]] = {}
    for i in range(1, len(parents)):
        children.setdefault(parents[i], []).append(i)
    frontier = [(-estimates[c - 1], c) for c in children.get(0, [])]
    heapq.heapify(frontier)
    kept = [0]
    while frontier and len(kept) <= budget:
        _, i = heapq.heappop(frontier)
        kept.append(i)
        for c in children.get(i, []):
            heapq.heappush(frontier, (-estimates[c - 1], c))
    return sorted(kept)


class TreePlanner:
    """Re-plans the tree every ``every`` steps from the acceptance seen lately and the forward costs
    seen lately, at the current cache length.

    When the plan has been no tree at all for ``explore`` re-plans in a row, one plan of at least
    ``EXPLORE_NODES`` nodes is tried: its forwards are what tells the cost model whether extra
    tokens still cost what they did (a curve measured while the machine was busy must not shut
    the tree for good)."""

    EXPLORE_NODES = 4

    def __init__(self, lm, universe: str = "paper-80", every: int = 4, k: int = 8, explore: int = 8,
                 uniform_prior: bool = False, budget: int | None = None):
        """Plans sub-trees of ``universe`` that use only ranks below ``k``; ``uniform_prior``: start from
        the same acceptance for every node and the geometric lookup prior (the "no priors" ablation).
        ``budget``: a fixed number of draft nodes a step instead of the cost model (a GPU's budget,
        where extra tokens are nearly free): the plan is then the whole universe, and each step keeps
        its best ``budget`` nodes of the drafted tree and the retrieved continuation (:func:`allocate`)."""
        self.universe_name, self.budget = universe, budget
        full = load_tree(universe)
        self.universe = full.subtree([p for p in full.paths if max(p) < k], name=universe)
        self.cost = cost_curve_for(lm)  # reset() takes this planner's own copy to refit
        self.every, self.k, self.explore, self.uniform_prior = every, k, explore, uniform_prior
        self.reset()

    def reset(self) -> None:
        """Back to the prior: no statistics, the measured cost curve (this planner's own copy), the
        initial plan."""
        self.cost = self.cost.fresh()
        self.host = HostCost()
        self.by_temperature: dict[float, tuple[AcceptanceStats, ChainStats]] = {}
        self.temperature = None
        self.steps, self.idle, self.cache, self.hot = 0, 0, None, False
        self.batch = 1.0  # requests in this decoder's forwards lately (tr_core.batching): 1 alone
        self.use_temperature(0.0)

    def use_temperature(self, temperature: float) -> None:
        """Plan for decoding at ``temperature`` (0: greedy) from here on.  Acceptance is kept per
        temperature: drafts match random draws less often than the argmax, so sampled acceptance
        starts from the greedy prior at a quarter of its weight and follows what is seen."""
        key = round(float(temperature), 2)
        if key == self.temperature:
            return
        if key not in self.by_temperature:
            prior = tree_prior(self.universe_name) or {}
            if self.uniform_prior:
                prior = {p: UNIFORM_RATE for p in self.universe.paths}
            stats = AcceptanceStats(self.universe, prior)
            chain = ChainStats(prior={} if self.uniform_prior else lookup_prior(self.universe_name))
            if key > 0:
                stats.weight, chain.weight = stats.weight / 4, chain.weight / 4
            self.by_temperature[key] = (stats, chain)
        self.temperature = key
        self.stats, self.chain = self.by_temperature[key]
        self.tree, self.expected = plan_tree(self.universe, self.stats.estimate, self.step_cost,
                                             baseline=self.greedy_cost())

    def begin_text(self) -> None:
        """A new request starts: what described the previous text (the lookup state, the run of idle
        plans) goes; what describes the model and the machine (acceptance, costs) stays."""
        self.hot, self.idle = False, 0

    def step_cost(self, q: int) -> float:
        """Seconds of a step of ``q`` query tokens at the cache length last seen: its forward, and
        the host work around it (``HostCost``, measured on this machine's steps).  Under a node
        ``budget``, every size costs the same: the plan is the whole universe.

        In a class (``batch`` requests share each forward, :mod:`tr_core.batching`) the tree is sized
        for the batch: as if every tab in it sent ``q`` tokens too, a step's share is the forward of
        ``batch * q`` tokens divided among them (the cost curve is fitted on the batches' total
        tokens), and greedy's is that of ``batch`` single tokens.  Alone, the two are as before."""
        if self.budget is not None:
            return 1.0
        b = self.batch
        if b <= 1.0:
            return self.cost(q, self.cache) + self.host(q)
        return self.cost(round(q * b), self.cache) / b + self.host(q)

    def greedy_cost(self) -> float:
        """Seconds of a plain greedy step at the cache length last seen: its mask-free 1-token forward
        (``CostCurve.greedy``) and the host work of a 1-token step; what every plan must beat."""
        if self.budget is not None:
            return 1.0
        b = self.batch
        if b <= 1.0:
            return self.cost.greedy(self.cache) + self.host(1)
        return self.cost(round(b), self.cache) / b + self.host(1)

    def record_host(self, q: int, seconds: float) -> None:
        """A step of ``q`` query tokens spent ``seconds`` outside its forward."""
        self.host.observe(q, seconds)

    def record_lookup(self, match: int, offered: int, accepted: int) -> None:
        """A continuation of ``offered`` tokens (match key ``match``) had its first ``accepted`` accepted."""
        self.chain.record(match, offered, accepted, self.hot)
        self.hot = is_hot(offered, accepted)

    def lookup_length(self, q: int, match: int, offset: int, available: int,
                      drafted: list[tuple[int, ...]] | None = None) -> int:
        """How many of the ``available`` continuation tokens to add to a forward of ``q`` tokens: the
        prefix that maximises expected tokens per second (0 when none pays).  ``match``: the match's
        statistics key (``lookup.match_bucket``); the first ``offset`` tokens of the continuation are
        already in the drafted tree; ``drafted``: the tree's nodes that were drafted (default: the
        whole plan; fewer where blank drafts were left out)."""
        expected = self.expected if drafted is None else 1.0 + sum(self.stats.estimate(p) for p in drafted)
        best_n, best_rate, gain = 0, expected / self.step_cost(q), 0.0
        for n in range(1, available + 1):
            gain += self.chain.estimate(match, offset + n - 1, self.hot)
            rate = (expected + gain) / self.step_cost(q + n)
            if rate > best_rate:
                best_n, best_rate = n, rate
        return best_n

    def record(self, used, accepted: list[tuple[int, ...]], forward_tokens: int = 0,
               forward_seconds: float = 0.0, cache_length: int | None = None, batch: int = 1,
               batch_tokens: int = 0) -> TreeShape | None:
        """Count one step (its forward's size, time and cache length too; in a batched forward, the
        requests and query tokens of the whole forward); returns a new tree when it is time to
        re-plan and the plan changed."""
        self.stats.record(used, accepted)
        if cache_length is not None:
            self.cache = cache_length
        if forward_tokens:
            self.cost.observe(max(batch_tokens, forward_tokens), forward_seconds, self.cache)
        self.batch = 1.0 if batch <= 1 and self.batch < 1.5 else 0.7 * self.batch + 0.3 * batch
        self.steps += 1
        if self.steps % self.every:
            return None
        self.idle = self.idle + 1 if self.tree.size == 0 else 0
        floor = self.EXPLORE_NODES if self.explore and self.idle >= self.explore else 0
        tree, self.expected = plan_tree(self.universe, self.stats.estimate, self.step_cost, min_nodes=floor,
                                        baseline=self.greedy_cost())
        if floor:
            self.idle = 0
        if tree.paths == self.tree.paths:
            return None
        self.tree = tree
        return tree
