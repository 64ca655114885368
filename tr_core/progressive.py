"""Progressive Tree Drafting's state (arXiv 2607.10661): the evolving draft tree and the candidate tries.

Two structures live across steps, both small and on the host (they are decisions about a few
dozen token ids; the tensors of a step are built from them once per step):

* :class:`DraftForest`, the *draft tree*: first-level branches under a virtual root, each a
  token of the context followed by the model's own predictions.  It rides along with every
  verification forward; each of its nodes sees the cache and its own ancestors, the first
  level sitting at the position of the step's root, i.e. each branch is read as "the context,
  then this token, then ...".  After the forward, every node gains the model's argmax as a
  child (*progressive expansion*), so the tree grows one layer per step along the model's own
  predictions.  Width control: at most ``width`` children per node (a new prediction beyond
  that is dropped); the root keeps a window of ``root_window`` branches, adding one per step
  from the latest prediction (the step's bonus token) and dropping the oldest.  Depth control
  (*stepping*): a branch deeper than ``depth`` is re-rooted at its oldest child, whose subtree
  is kept while the stale first token and its other children are dropped.  ``max_nodes`` caps
  the tree's size (our addition: on a CPU every node costs forward time); where a planner sets
  the cap step by step, at most that many nodes ride (the first in BFS order) and the tree grows
  only while it is smaller than the cap.
* :class:`CandidateTries`: every path the draft tree grows is harvested as n-grams (``ngram``
  tokens, 4 by default) into a trie keyed by the n-gram's first token; each trie holds at most
  ``max_nodes`` nodes (60), the least recently refreshed leaves going first.  The trie keyed by
  the last committed token is the candidate tree verified in the next forward.  With
  ``harvest_context`` (our addition, the default) the context's own n-grams go in too: the
  prompt's at the start, each committed token's after its step.  Entries only the draft tree put
  there are marked, so the planner can tell what the draft tree's riding nodes bring.

Where the paper leaves a detail open, the choices above are ours and are documented in the README.
"""
from __future__ import annotations

import heapq
import random
from dataclasses import dataclass, field
from typing import NamedTuple

from .cost import HostCost
from .planner import DecayedRates


@dataclass
class PTDConfig:
    width: int = 4  # children per draft node
    root_window: int = 4  # first-level branches of the draft tree
    depth: int = 6  # depth of a branch before it is stepped
    ngram: int = 4  # harvested path length (first token = the trie's key)
    trie_nodes: int = 60  # nodes per candidate trie (= verified candidates per step, at most)
    max_nodes: int = 48  # draft tree nodes per forward
    seed_chain: int = 2  # prompt tokens per seed branch
    seed: int = 0  # random seed for the seed branches
    cost_aware: bool = False  # cut candidates and draft nodes to what pays on this device (PTDPlanner)
    harvest_context: bool = False  # also harvest the prompt's and the committed text's n-grams (our addition)
    min_draft: int = 0  # draft nodes that ride along even where the planner finds they do not pay

    @classmethod
    def paper(cls) -> "PTDConfig":
        """The paper's settings (plus our 48-node draft cap), for GPUs and for the table."""
        return cls()

    @classmethod
    def default(cls) -> "PTDConfig":
        """The default on every device: cost-aware (candidates and draft nodes cut to what pays by the
        cost curve measured where the model runs: all of them where extra tokens are nearly free),
        harvesting the context too (where few draft nodes ride, they harvest little on their own)."""
        return cls(cost_aware=True, harvest_context=True)


class _Node:
    __slots__ = ("children", "token")

    def __init__(self, token: int):
        self.token = token
        self.children: list[_Node] = []  # oldest first


@dataclass
class FlatForest:
    """The draft tree in BFS order: what one forward sees."""

    nodes: list[_Node]
    tokens: list[int]
    parents: list[int]  # -1 for first-level branches
    depths: list[int]  # 1 for first-level branches


class DraftForest:
    """The evolving draft tree (see the module doc)."""

    def __init__(self, config: PTDConfig):
        self.config = config
        self.branches: list[_Node] = []  # oldest first

    def seed(self, prompt: list[int]) -> None:
        """Start from ``root_window`` random stretches of the prompt (``seed_chain`` tokens each), in
        at most half of ``max_nodes`` (the rest is room for the first steps' expansion)."""
        cfg, rng = self.config, random.Random(self.config.seed)
        self.branches = []
        if not prompt:
            return
        room = cfg.max_nodes // 2
        for _ in range(cfg.root_window):
            start = rng.randrange(len(prompt))
            chain = prompt[start:start + min(cfg.seed_chain, room)]
            room -= len(chain)
            if not chain:
                break
            head = node = _Node(chain[0])
            for t in chain[1:]:
                child = _Node(t)
                node.children.append(child)
                node = child
            self.branches.append(head)

    def flatten(self, limit: int | None = None) -> FlatForest:
        """The tree in BFS order; ``limit``: only its first ``limit`` nodes (what rides along when the
        budget shrank below the tree's size; every parent still comes before its children)."""
        tokens, parents, depths, nodes = [], [], [], []
        frontier = [(b, -1, 1) for b in self.branches]
        while frontier:
            nxt = []
            for node, parent, depth in frontier:
                if limit is not None and len(nodes) >= limit:
                    return FlatForest(nodes, tokens, parents, depths)
                idx = len(nodes)
                nodes.append(node)
                tokens.append(node.token)
                parents.append(parent)
                depths.append(depth)
                nxt += [(c, idx, depth + 1) for c in node.children]
            frontier = nxt
        return FlatForest(nodes, tokens, parents, depths)

    def expand(self, flat: FlatForest, choices: list[int]) -> list[list[int]]:
        """Attach the model's argmax ``choices [n]`` (one per node of ``flat``) as children.

        Width and size limits drop the extras.  Returns the token path (from its first-level
        branch down) of every node added.
        """
        cfg = self.config
        total = len(flat.nodes)
        grown: list[list[int]] = []
        paths: list[list[int]] = []
        for i, (node, choice) in enumerate(zip(flat.nodes, choices)):
            parent = flat.parents[i]
            paths.append((paths[parent] if parent >= 0 else []) + [node.token])
            if total >= cfg.max_nodes or len(node.children) >= cfg.width:
                continue
            if any(c.token == choice for c in node.children):
                continue
            node.children.append(_Node(choice))
            total += 1
            grown.append(paths[i] + [choice])
        return grown

    def step_depth(self) -> list[int]:
        """Stepping: re-root every branch deeper than ``depth`` at its oldest child.

        Returns the indices (into the branch list before the call) of the branches stepped."""
        stepped = []
        for i, b in enumerate(self.branches):
            if _height(b) > self.config.depth:
                stepped.append(i)
                self.branches[i] = b.children[0]
        return stepped

    def add_branch(self, token: int) -> bool:
        """Root window: a new first-level branch for ``token`` (if new), dropping the oldest."""
        if any(b.token == token for b in self.branches):
            return False
        self.branches.append(_Node(token))
        if len(self.branches) > self.config.root_window:
            self.branches.pop(0)
        return True


def _height(node: _Node) -> int:
    """Levels in ``node``'s subtree, itself included."""
    return 1 + max((_height(c) for c in node.children), default=0)


class Candidates(NamedTuple):
    """A candidate tree under a root, in BFS order (node indices count the root as 0)."""

    tokens: list[int]
    parents: list[int]  # 0 = the root
    depths: list[int]  # 1 = a child of the root
    drafted: list[bool]  # put in the trie by the draft tree alone (not also found in the context)

    def keep(self, indices: list[int]) -> "Candidates":
        """Only the candidates ``indices`` (a parent before its children), parents re-indexed."""
        index = {i + 1: n + 1 for n, i in enumerate(indices)}
        index[0] = 0
        return Candidates([self.tokens[i] for i in indices], [index[self.parents[i]] for i in indices],
                          [self.depths[i] for i in indices], [self.drafted[i] for i in indices])


class CandidateTries:
    """Per-first-token tries of harvested n-grams, each capped at ``max_nodes`` nodes."""

    def __init__(self, max_nodes: int = 60, ngram: int = 4):
        self.max_nodes, self.ngram = max_nodes, ngram
        self.tries: dict[int, dict[tuple[int, ...], int]] = {}  # key token -> {suffix path: last touched}
        self.children: dict[int, dict[tuple[int, ...], int]] = {}  # key token -> {suffix path: children}
        self.drafted: set[tuple[int, tuple[int, ...]]] = set()  # (key, path) put there by the draft tree only
        self.clock = 0

    def harvest(self, path: list[int], drafted: bool = False) -> None:
        """Insert the n-gram ending at ``path``'s last token (shorter where the path is): keyed by its
        first token, the rest as a path in that trie.  ``drafted``: the path comes from the draft tree."""
        if len(path) < 2:
            return
        gram = path[-self.ngram:]
        self.insert(gram[0], gram[1:], drafted)

    def insert(self, key: int, suffix: list[int], drafted: bool = False) -> None:
        self.clock += 1
        trie, kids = self.tries.setdefault(key, {}), self.children.setdefault(key, {})
        for n in range(1, len(suffix) + 1):
            p = tuple(suffix[:n])
            if p not in trie:
                kids[p] = 0
                if n > 1:
                    kids[p[:-1]] += 1
                if drafted:
                    self.drafted.add((key, p))
            elif not drafted:
                self.drafted.discard((key, p))  # the context has it too
            trie[p] = self.clock
        while len(trie) > self.max_nodes:
            old = min((p for p, k in kids.items() if not k), key=trie.get)  # the stalest leaf
            del trie[old], kids[old]
            self.drafted.discard((key, old))
            if len(old) > 1:
                kids[old[:-1]] -= 1

    def candidates(self, key: int) -> Candidates:
        """The trie of ``key`` as a tree under a root, newest first per level."""
        trie = self.tries.get(key, {})
        order = sorted(trie, key=lambda p: (len(p), -trie[p]))
        index = {p: i + 1 for i, p in enumerate(order)}
        return Candidates([p[-1] for p in order], [index.get(p[:-1], 0) for p in order], [len(p) for p in order],
                          [(key, p) in self.drafted for p in order])

    def __len__(self) -> int:
        return sum(len(t) for t in self.tries.values())


# ---- cost awareness (our addition: on a CPU every verified or riding token costs forward time) ----
PRIOR_ACCEPT = 0.3  # prior P(a depth-1 candidate is accepted); each level deeper multiplies by PRIOR_DECAY
PRIOR_DECAY = 0.6
# Prior tokens accepted, per draft node that rode along, from n-grams only the draft tree harvested.
# A round guess, not fitted: what the draft tree brings is measured online (DraftYield).
PRIOR_DRAFT_YIELD = 0.01
DRAFT_PRIOR_NODES = 100.0  # the prior counts as this many riding nodes


@dataclass
class CandidateRates(DecayedRates):
    """Online acceptance of verified candidates by ``(depth, sibling rank)``."""

    weight: float = 8.0
    decay: float = 0.97
    trials: dict = field(default_factory=dict)
    hits: dict = field(default_factory=dict)


@dataclass
class DraftYield:
    """What the draft tree brings: tokens accepted from n-grams only it harvested, per draft node
    that rode along, both faded by ``decay`` every step and shrunk towards ``PRIOR_DRAFT_YIELD``.
    (Its n-grams are verified steps after they were grown, so this is a rate over recent steps,
    not a per-step credit.  Not a :class:`DecayedRates`: a step brings many trials, one per riding
    node, and one rate for all of them.)  Measured only while nodes ride: when none do, it fades back
    to the prior, so where the prior pays the draft tree is tried again now and then."""

    decay: float = 0.97
    nodes: float = 0.0
    tokens: float = 0.0

    def count(self, riding: int, tokens: int) -> None:
        self.nodes = self.decay * self.nodes + riding
        self.tokens = self.decay * self.tokens + tokens

    @property
    def rate(self) -> float:
        return (self.tokens + DRAFT_PRIOR_NODES * PRIOR_DRAFT_YIELD) / (self.nodes + DRAFT_PRIOR_NODES)


def candidate_keys(parents: list[int], depths: list[int]) -> list[tuple[int, int]]:
    """``(depth, rank among its siblings)`` of every candidate (parents index the root as 0): what
    its acceptance is estimated by."""
    seen: dict[int, int] = {}
    keys = []
    for parent, depth in zip(parents, depths):
        rank = seen.get(parent, 0)
        seen[parent] = rank + 1
        keys.append((depth, min(rank, 3)))
    return keys


class PTDPlanner:
    """How many candidates to verify and draft nodes to carry, from what a forward costs now.

    Candidates are taken best-first by their estimated acceptance (online by depth and sibling
    rank, faded, shrunk towards a geometric prior; a parent before its children) while they raise
    expected tokens per second, ``(1 + sum of p) / cost(1 + candidates + draft nodes)``, as TR's
    planner grows its tree.  The draft tree rides along with as many nodes ``d`` as maximise
    ``(1 + gain + y d) / cost(1 + candidates + d)``, ``y`` being what a riding node has brought lately
    (:class:`DraftYield`): all of them where extra tokens are free, none where they cost more than
    they bring."""

    def __init__(self, cost, max_nodes: int):
        """``cost``: the measured cost curve; reset() takes this planner's own copy to refit."""
        self.cost = cost
        self.max_nodes = max_nodes
        self.reset()

    def reset(self) -> None:
        """Back to the prior: no acceptance seen, the measured cost curve, greedy decoding."""
        self.cost = self.cost.fresh()
        self.host = HostCost()
        self.by_temperature: dict[float, tuple[CandidateRates, DraftYield]] = {}
        self.cache: int | None = None
        self.use_temperature(0.0)

    def use_temperature(self, temperature: float) -> None:
        """Acceptance is kept per temperature (0: greedy): random draws match drafts less often."""
        key = round(float(temperature), 2)
        self.rates, self.drafts = self.by_temperature.setdefault(key, (CandidateRates(), DraftYield()))

    def step_cost(self, q: int) -> float:
        """Seconds of a step of ``q`` query tokens: its forward at the cache length last seen and the
        host work around it (``tr_core.cost.HostCost``, measured on this machine's steps)."""
        return self.cost(q, self.cache) + self.host(q)

    def record_host(self, q: int, seconds: float) -> None:
        """A step of ``q`` query tokens spent ``seconds`` outside its forward."""
        self.host.observe(q, seconds)

    def draft_budget(self, verified: int = 0, gain: float = 0.0) -> int:
        """Draft nodes to carry (0 to ``max_nodes``) next to ``verified`` candidates expected to add
        ``gain`` tokens: the fewest that maximise ``(1 + gain + y d) / cost(1 + verified + d)``."""
        y, q = self.drafts.rate, 1 + verified
        best, best_d = (1.0 + gain) / self.step_cost(q), 0
        for d in range(1, self.max_nodes + 1):
            rate = (1.0 + gain + y * d) / self.step_cost(q + d)
            if rate > best:
                best, best_d = rate, d
        return best_d

    def plan(self, parents: list[int], depths: list[int], min_riding: int = 0,
             available: int | None = None) -> tuple[list[int], int]:
        """The candidates to verify (indices, as :meth:`cut`) and the draft tree's size, together:
        draft nodes pay only for the cost they add on top of the candidates.  ``available``: the draft
        tree's nodes now (the candidates are cut for what really rides along; the size may be more,
        room for the tree to grow); ``min_riding``: draft nodes carried whether they pay or not.
        One pass: the candidates are cut again for the chosen size, the size is not re-chosen."""
        min_riding = min(min_riding, self.max_nodes)
        riding = lambda d: d if available is None else min(d, available)  # noqa: E731
        keep = self.cut(parents, depths, riding=riding(min_riding))
        keys = candidate_keys(parents, depths)
        size = max(self.draft_budget(len(keep), sum(self.estimate(keys[i]) for i in keep)), min_riding)
        if riding(size) != riding(min_riding):
            keep = self.cut(parents, depths, riding=riding(size))
        return keep, size

    def estimate(self, key: tuple[int, int]) -> float:
        depth, rank = key
        return self.rates.rate(key, PRIOR_ACCEPT * PRIOR_DECAY ** (depth - 1 + rank))

    def cut(self, parents: list[int], depths: list[int], riding: int) -> list[int]:
        """Indices of the candidates to verify, in their original (BFS) order."""
        keys = candidate_keys(parents, depths)
        children: dict[int, list[int]] = {}
        for i, p in enumerate(parents):
            children.setdefault(p, []).append(i)
        frontier = [(-self.estimate(keys[i]), i) for i in children.get(0, [])]
        heapq.heapify(frontier)
        chosen, gain, best_n = [], 0.0, 0
        best = 1.0 / self.step_cost(1 + riding)
        while frontier:
            neg, i = heapq.heappop(frontier)
            chosen.append(i)
            gain -= neg
            rate = (1.0 + gain) / self.step_cost(1 + len(chosen) + riding)
            if rate > best:
                best, best_n = rate, len(chosen)
            for c in children.get(i + 1, []):
                heapq.heappush(frontier, (-self.estimate(keys[c]), c))
        return sorted(chosen[:best_n])

    def record(self, keys: list[tuple[int, int]], accepted: list[int], forward_tokens: int, seconds: float,
               cache: int, riding: int = 0, drafted_hits: int = 0) -> None:
        """One step: every verified candidate's key a trial, the accepted ones' (indices) hits;
        ``riding`` draft nodes rode along and ``drafted_hits`` accepted tokens came from n-grams only
        the draft tree had harvested."""
        self.rates.count(keys, [keys[i] for i in accepted])
        self.drafts.count(riding, drafted_hits)
        self.cache = cache
        self.cost.observe(forward_tokens, seconds, cache)
