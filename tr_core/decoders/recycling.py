"""Token Recycling with our additions: the paper's method (``paper.py``) plus stages that plug into
its pipeline by name.  Each is one row of ``python -m tr_core.bench.ablate``; all off
(:meth:`Additions.none`) is the paper's method again.

* draft    - rows by token, or by pair (:class:`RowsByPair`: a node's children come from the row of
             the pair (its parent, itself) where that pair was seen, ``tr_core.pairs``), then the
             drafting stages in order: :class:`DropBlankDrafts` (no forward tokens for drafts from
             rows never written), then :class:`GraftContinuation` (the context's continuation joined
             to the tree where its tokens are drafted) or :class:`FillBudget` (the best
             ``node_budget`` nodes of the tree and the continuation, by estimated acceptance)
* forward, verify, prune - the paper's
* recycle  - rows by token and by pair; where a token occurs twice, the row of the accepted path's
             node wins (:func:`verified_first`) rather than the last written (:func:`last_write_wins`)
* plan     - the cost-aware tree (``tree="auto"``, ``tr_core.planner``) learns this step's
             acceptance and cost, and re-plans the shape
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch

from ..lookup import control_tokens, graft_point, lookup_longest, lookup_with_ngram, match_bucket, until_control
from ..matrix import AdjacencyMatrix, RowsWritten
from ..models import LoadedModel
from ..planner import TreePlanner, allocate
from ..sampling import SamplingConfig
from ..trace import RowUpdate, Step
from ..trees import TreeShape
from .base import ForwardRequest, PhaseClock
from .paper import PAPER_TREE, PaperTokenRecycling, last_occurrences
from .tree_step import StepState

# The same defaults on every device: the cost-aware tree, planned from the cost curve measured where
# the model runs, so a GPU whose extra tokens are nearly free gets a large tree and a CPU a small one.
# ``paper-80`` (the paper's tree) stays a named preset.
DEFAULT_TREE = "auto"
DEFAULT_LOOKUP = 24  # the planner cuts each continuation to what pays (long while copying)
RETRIEVALS = {"suffix": lookup_longest, "ngram": lookup_with_ngram}  # how the context continuation is found


@dataclass(frozen=True)
class Additions:
    """Our additions to the paper's method, each on its own switch.

    ``lookup``: longest continuation retrieved from the context and merged into each tree (0: none);
    ``retrieval``: ``"suffix"`` (the longest suffix match over the whole context) or ``"ngram"``
    (prompt lookup's 3..1-gram); ``drop_blank``: no forward tokens for drafts from rows never
    written; ``verified_rows``: where a token occurs twice in a tree, its row is written from the
    committed text; ``pair_rows``: rows by pair beside rows by token; ``node_budget``: at most this
    many draft nodes a step, tree and continuation together, the best by the planner's estimates (a
    GPU's fixed budget, e.g. the paper's 80).  A budget is filled from the auto tree's universe
    drafted in full, so it needs ``tree="auto"``."""

    lookup: int = DEFAULT_LOOKUP
    retrieval: str = "suffix"
    drop_blank: bool = True
    verified_rows: bool = True
    pair_rows: bool = True
    node_budget: int | None = None

    @classmethod
    def none(cls) -> "Additions":
        """Every addition off: the paper's method."""
        return cls(lookup=0, drop_blank=False, verified_rows=False, pair_rows=False)

    def check(self, tree) -> None:
        """``ValueError`` in plain words where these settings cannot run on ``tree``."""
        if self.retrieval not in RETRIEVALS:
            raise ValueError(f"retrieval must be one of {', '.join(RETRIEVALS)} (got {self.retrieval!r})")
        if self.lookup < 0:
            raise ValueError("lookup must be at least 0")
        if self.node_budget is not None and self.node_budget < 1:
            raise ValueError("node_budget must be at least 1")
        if self.node_budget is not None and tree != "auto":
            raise ValueError(f"node_budget fills each step from the auto tree's universe: use tree='auto' "
                             f"(got tree={tree if isinstance(tree, str) else getattr(tree, 'name', 'a shape')!r})")


@dataclass
class Continuation:
    """The context's continuation (``chain``) and where it joins the drafted tree: its first
    ``offset`` tokens are drafted already, down to node ``attach``; ``rest`` hangs below it.
    ``key``: the match's statistics key (``lookup.match_bucket``)."""

    chain: list[int]
    attach: int
    rest: list[int]
    key: int

    @property
    def offset(self) -> int:
        return len(self.chain) - len(self.rest)


@dataclass
class Offer:
    """What a step grafted from the context: the match's key and the continuation as far as drafted."""

    key: int
    tokens: list[int]


@dataclass
class RecyclingState(StepState):
    """A Token Recycling step.  ``shape``: the static shape drafted from; ``kept``: each node's
    index in it (root 0; a grafted node has none); ``before``: the token committed before the root
    (keys its pair row; None: rows by token); ``paired [q]`` bool: the nodes a pair row drafted;
    ``blank_drafts``: the shape's nodes left out as blank; ``blank_parents``: the shape's nodes whose
    children were left out; ``grafted``: continuation nodes appended; ``offer``: what they were."""

    shape: TreeShape | None = None
    kept: list[int] = field(default_factory=list)
    before: int | None = None
    paired: torch.Tensor | None = None
    blank_drafts: int = 0
    blank_parents: list[int] = field(default_factory=list)
    grafted: int = 0
    offer: Offer | None = None

    def drafted(self) -> list[tuple[int, ...]]:
        """The drafted nodes' rank paths in ``shape`` (the root not counted)."""
        return [self.shape.paths[i - 1] for i in self.kept[1:]]

    def keep(self, keep: torch.Tensor) -> None:
        """Only the nodes where ``keep [q]`` (bool, closed under ancestors; the shape's nodes first)."""
        flags = keep.tolist()
        self.tokens, self.tree = self.tokens[keep], self.tree.select(keep)
        self.kept = [k for k, f in zip(self.kept, flags) if f]
        self.sources = [s for s, f in zip(self.sources, flags) if f]

    def graft(self, cont: Continuation, n: int) -> None:
        """Append the first ``n`` tokens of ``cont.rest`` as a chain under ``cont.attach``."""
        copied = torch.tensor(cont.rest[:n], dtype=self.tokens.dtype, device=self.tokens.device)  # [n]
        self.tokens, self.tree = torch.cat([self.tokens, copied]), self.tree.graft_chain(cont.attach, n)
        self.sources = self.sources + ["lookup"] * n
        self.grafted, self.offer = n, Offer(cont.key, cont.chain[:cont.offset + n])


# ---- where a node's row comes from -------------------------------------------------------------
class RowsByToken:
    """The paper's rows: ``M[token]`` alone."""

    def before_root(self, dec) -> int | None:
        return None

    def before_each(self, state: RecyclingState) -> torch.Tensor | None:
        return None

    def seed_positions(self, prompt: torch.Tensor):
        """Each token's last occurrence (as ``PaperTokenRecycling.seed_positions``), no keys."""
        return last_occurrences(prompt).nonzero().squeeze(1), None


class RowsByPair(RowsByToken):
    """Pair rows beside ``M``'s (``tr_core.pairs``): drafted from where the pair was seen, written
    from every input's logits keyed by (the token before it, itself)."""

    def before_root(self, dec) -> int | None:
        """The token committed before the root (None before a second token)."""
        if len(dec.output) >= 2:
            return dec.output[-2]
        return (dec.prompt + dec.output)[-2] if len(dec.prompt) + len(dec.output) >= 2 else None

    def before_each(self, state: RecyclingState) -> torch.Tensor | None:
        """``[q]``: the token before each input (its parent's; the root's: ``state.before``)."""
        if state.before is None:
            return None
        prior = state.tokens[state.tree.parents.clamp(min=0)]
        prior[0] = state.before
        return prior

    def seed_positions(self, prompt: torch.Tensor):
        """Every prompt position, each keyed by the token before it (-1: the first has none)."""
        before = torch.cat([torch.tensor([-1], dtype=prompt.dtype, device=prompt.device), prompt[:-1]])
        return torch.arange(prompt.shape[0], device=prompt.device), before


# ---- which row a token drafted twice keeps -----------------------------------------------------
def last_write_wins(state: RecyclingState) -> None:
    """The paper's rule: no priorities."""
    return None


def verified_first(state: RecyclingState) -> torch.Tensor:
    """``[q]`` long write priorities: the accepted path's nodes (root included), whose logits saw
    the text as it is, over the rejected branches'."""
    priority = torch.zeros(state.size, dtype=torch.long, device=state.tokens.device)
    priority[state.path] = 1
    return priority


# ---- drafting stages ---------------------------------------------------------------------------
class DropBlankDrafts:
    """No forward tokens for nodes drafted from a row never written (their tokens are the row's
    zeros, not predictions) nor for anything below them."""

    phase = "retrieve"

    def __call__(self, dec: TokenRecyclingDecoder, state: RecyclingState) -> None:
        blank = dec.matrix.blank_drafts(state.tokens, state.tree, state.paired)  # [q]
        if not bool(blank.any()):
            return
        keep = ~blank
        parents = state.tree.parents.clamp(min=0)
        tops = blank & keep[parents]  # a blank draft under a kept node: the top of a left-out branch
        state.blank_parents = sorted(set(parents[tops].tolist()))
        state.keep(keep)
        state.blank_drafts = state.shape.size + 1 - len(state.kept)


class GraftContinuation:
    """The context's continuation (``retrieve``, up to ``length`` tokens) joins the tree where its
    tokens are already drafted and runs on from there; with a planner, only as far as it pays."""

    phase = "lookup"

    def __init__(self, retrieve, length: int):
        self.retrieve, self.length = retrieve, length

    def __call__(self, dec: TokenRecyclingDecoder, state: RecyclingState) -> None:
        cont = find_continuation(dec, state, self.retrieve, self.length)
        if cont is None:
            return
        n = len(cont.rest)
        if dec.planner is not None:
            pruned = len(state.kept) < state.shape.size + 1  # else the plan's own expectation holds
            n = dec.planner.lookup_length(state.size, cont.key, cont.offset, n, state.drafted() if pruned else None)
        if n:
            state.graft(cont, n)


class FillBudget:
    """The drafted nodes and the context's continuation compete for ``budget`` draft nodes, the
    best by estimated acceptance (:func:`tr_core.planner.allocate`): where drafts were blank or the
    tree's deep nodes unlikely, a long copy takes their place."""

    phase = "lookup"

    def __init__(self, budget: int, retrieve, length: int):
        self.budget, self.retrieve, self.length = budget, retrieve, length

    def __call__(self, dec: TokenRecyclingDecoder, state: RecyclingState) -> None:
        planner, n_tree = dec.planner, state.size
        estimates = [planner.stats.estimate(p) for p in state.drafted()]  # [n_tree - 1]
        parents = state.tree.parents.tolist()
        cont = find_continuation(dec, state, self.retrieve, self.length) if self.length else None
        rest = cont.rest if cont is not None else []
        estimates += [planner.chain.estimate(cont.key, cont.offset + j, planner.hot) for j in range(len(rest))]
        parents += [n_tree + j - 1 if j else cont.attach for j in range(len(rest))]
        nodes = allocate(estimates, parents, self.budget)  # tree nodes first, then the chain's
        grafted = sum(i >= n_tree for i in nodes)
        if grafted:
            state.graft(cont, len(rest))
        if len(nodes) < state.size:
            keep = torch.zeros(state.size, dtype=torch.bool, device=state.tokens.device)
            keep[nodes] = True
            state.keep(keep)
        if grafted:
            state.grafted, state.offer = grafted, Offer(cont.key, cont.chain[:cont.offset + grafted])


def find_continuation(dec: TokenRecyclingDecoder, state: RecyclingState, retrieve, length: int) -> Continuation | None:
    """The context's continuation (up to ``length`` tokens, cut before the chat template's control
    tokens) and where it joins the drafted tree; None where the context has none."""
    chain, match = retrieve(dec.context_ids(), length)
    chain = until_control(chain, dec.control_ids, dec.lm.eos_token_ids)
    if not chain:
        return None
    whole = len(state.kept) == state.shape.size + 1 and not state.grafted
    children = state.shape.children if whole else state.tree.children()
    attach, rest = graft_point(state.tokens.tolist(), children, chain)
    return Continuation(chain, attach, rest, match_bucket(match))


def drafting_stages(additions: Additions) -> list:
    """The drafting stages ``additions`` switch on, in the order they run."""
    stages: list = [DropBlankDrafts()] if additions.drop_blank else []
    retrieve = RETRIEVALS[additions.retrieval]
    if additions.node_budget is not None:
        stages.append(FillBudget(additions.node_budget, retrieve, additions.lookup))
    elif additions.lookup:
        stages.append(GraftContinuation(retrieve, additions.lookup))
    return stages


class TokenRecyclingDecoder(PaperTokenRecycling):
    """The paper's method with ``additions`` (default: all of ours, the auto tree)."""

    def __init__(self, lm: LoadedModel, tree: TreeShape | str | list | None = None, k: int = 8,
                 matrix: AdjacencyMatrix | None = None, max_new_tokens: int = 128,
                 sampling: SamplingConfig | None = None, trace_rows: bool = True,
                 planner: TreePlanner | None = None, additions: Additions | None = None, **changes):
        """``tree``: a shape, a preset name, rank paths, or ``"auto"`` (the default: the cost-aware
        tree, planned by ``planner``, which like ``matrix`` may be shared across requests).
        ``additions``: which of ours run (default :class:`Additions`); ``changes``: any of its
        fields by name, e.g. ``lookup=0`` (``TypeError`` for another name).  Other arguments as
        :class:`PaperTokenRecycling`."""
        additions = replace(additions or Additions(), **changes)
        tree = DEFAULT_TREE if tree is None or tree == "default" else tree
        additions.check(tree)
        self.additions = additions
        self.planner = self.make_planner(lm, tree, k, planner, sampling)
        self.rows = RowsByPair() if additions.pair_rows else RowsByToken()
        self.write_rule = verified_first if additions.verified_rows else last_write_wins
        self.stages = drafting_stages(additions)
        self.control_ids = control_tokens(lm.tokenizer)  # where a retrieved copy stops
        super().__init__(lm, self.planner.tree if self.planner is not None else tree, k, matrix, max_new_tokens,
                         sampling, trace_rows)

    @classmethod
    def paper(cls, lm: LoadedModel, tree: TreeShape | str | list = PAPER_TREE, **kw) -> PaperTokenRecycling:
        """The paper's method exactly, on ``tree`` (:class:`PaperTokenRecycling`)."""
        return PaperTokenRecycling(lm, tree, **kw)

    def make_planner(self, lm, tree, k: int, planner: TreePlanner | None, sampling) -> TreePlanner | None:
        """The cost-aware tree's planner (``tree == "auto"``: ``planner``, or a new one), else None."""
        budget = self.additions.node_budget
        if planner is not None and planner.budget != budget:  # else the budget would plan unchecked
            raise ValueError(f"the planner's budget ({planner.budget}) and node_budget ({budget}) must agree")
        if tree != "auto":
            return None
        planner = planner or TreePlanner(lm, k=k, budget=budget)
        planner.use_temperature(sampling.temperature if sampling is not None else 0.0)
        return planner

    @property
    def lookup(self) -> int:
        return self.additions.lookup

    def set_tree(self, tree: TreeShape | str | list | None) -> None:
        """Use another tree shape from the next step on."""
        super().set_tree(DEFAULT_TREE if tree is None or tree == "default" else tree)
        deepest = self.planner.universe.depth if self.planner is not None else self.tree.depth
        self.lookahead = max(deepest, self.lookup) + 1

    def prepare_start(self, prompt_ids) -> bool:
        """As every decoder; the planner (shared across requests) forgets the previous text's state."""
        if self.planner is not None:
            self.planner.begin_text()
        return super().prepare_start(prompt_ids)

    def seed_positions(self, prompt: torch.Tensor):
        return self.rows.seed_positions(prompt)

    # ---- the step: the paper's, with our stages --------------------------------------------
    def draft(self, clock: PhaseClock) -> RecyclingState:
        """The rows' BFS over the shape, then each drafting stage in its timing phase."""
        with clock.phase("retrieve"):
            state = self.retrieve()
        for stage in self.stages:
            with clock.phase(stage.phase):
                stage(self, state)
        return state

    def retrieve(self) -> RecyclingState:
        """``tokens [q]`` by BFS from the root over the current shape, from pair rows where seen."""
        tree, before = self.tree_t, self.rows.before_root(self)
        tokens = self.matrix.retrieve_draft_tree(self.last, tree, before)  # [q]
        paired = self.matrix.from_pairs(tokens, tree, before) if before is not None else None  # [q]
        pair = paired[1:].tolist() if paired is not None else [False] * (tokens.shape[0] - 1)
        empty = self.matrix.empty_rows(tokens[tree.parents[1:]]).tolist()
        sources = ["root"] + ["pair" if p else "empty" if e else "matrix" for p, e in zip(pair, empty)]
        return RecyclingState(tokens, tree, sources, shape=self.tree, kept=list(range(tokens.shape[0])),
                              before=before, paired=paired)

    def recycle(self, state: RecyclingState, logits: torch.Tensor, clock: PhaseClock) -> RowsWritten:
        """Rows by token (and by pair), every input's; a twice-drafted token keeps ``write_rule``'s row."""
        with clock.phase("update"):
            return self.matrix.recycle(state.tokens, logits, keep_old=self.trace_rows,
                                       priority=self.write_rule(state), before=self.rows.before_each(state))

    @torch.inference_mode()
    def finish_step(self, request: ForwardRequest, logits: torch.Tensor) -> Step:
        """The paper's verify, recycle, prune and record, then plan."""
        step = super().finish_step(request, logits)
        self.plan(request.draft, request)
        return step

    def to_step(self, state: RecyclingState, request: ForwardRequest, rows: list[RowUpdate] | None = None) -> Step:
        step = super().to_step(state, request, rows)
        step.blank_drafts = state.blank_drafts
        index = {node: i for i, node in enumerate(state.kept)}  # the verified tree's node of each kept one
        step.blank_under = sorted({index[p] for p in state.blank_parents if p in index})
        return step

    def plan(self, state: RecyclingState, request: ForwardRequest) -> None:
        """Feed the planner this step's acceptance (drafted nodes by rank path, the continuation
        offered), forward size and time, and host time; switch trees when it re-plans."""
        if self.planner is None:
            return
        forward = request.clock.seconds["forward"]
        accepted = [state.shape.paths[state.kept[i] - 1] for i in state.path[1:] if i < len(state.kept)]
        if state.offer is not None:
            along, chain = state.tokens[state.path[1:]].tolist(), state.offer.tokens
            run = next((i for i, (a, b) in enumerate(zip(chain, along)) if a != b), min(len(chain), len(along)))
            self.planner.record_lookup(state.offer.key, len(chain), run)
        new = self.planner.record(state.drafted(), accepted, state.size, forward, request.past,
                                  request.batch, request.batch_tokens)
        if new is not None:
            self.set_tree(new)
        self.planner.record_host(state.size, request.own_host_seconds())
