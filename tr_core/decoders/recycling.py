"""Token Recycling (Luo et al., ACL 2025): drafts from a matrix of recycled top-k candidates.

Each step, in the paper's phases:
  1. retrieve  - BFS from the last committed token over a static tree shape, reading ``M`` (a node's
     pair row instead, ``P[(parent, node)]``, where that pair was seen: ``tr_core.pairs``); nodes
     drafted from rows never written are left out (optionally plus the continuation of the longest
     suffix match over the context, joined to the tree where its tokens are drafted: ``lookup`` > 0)
  2. forward   - root + tree in one forward with tree attention (position = prefix + depth)
  3. verify    - longest path whose tokens equal the model's argmax, plus the model's own token
  4. update    - ``M[token] = topk(logits)`` at *every* input, accepted or not (the recycling), and
     ``P[(parent, token)]`` alike; where a token occurs twice, the row from the committed text wins
  5. prune     - keep only the accepted path's KV entries
"""
from __future__ import annotations

import time
from typing import ClassVar

import torch

from ..lookup import control_tokens, graft_point, lookup_longest, lookup_with_ngram, match_bucket, until_control
from ..matrix import AdjacencyMatrix
from ..models import LoadedModel
from ..planner import TreePlanner, allocate
from ..sampling import SamplingConfig
from ..trace import RowUpdate, Step
from ..trees import TreeShape, load_tree
from .base import PhaseClock
from .tree_step import TreeDecoder

# The same defaults on every device: the cost-aware tree, planned from the cost curve measured where
# the model runs, so a GPU whose extra tokens are nearly free gets a large tree and a CPU a small one.
# ``paper-80`` (the paper's tree) stays a named preset.
DEFAULT_TREE = "auto"
DEFAULT_LOOKUP = 24  # the planner cuts each continuation to what pays (long while copying)
RETRIEVALS = {"suffix": lookup_longest, "ngram": lookup_with_ngram}  # how the context continuation is found


class TokenRecyclingDecoder(TreeDecoder):
    """``matrix`` may be shared between decoders and requests: that is the hot start."""

    method = "tr"

    def __init__(self, lm: LoadedModel, tree: TreeShape | str | list | None = None, k: int = 8,
                 matrix: AdjacencyMatrix | None = None, max_new_tokens: int = 128, trace_rows: bool = True,
                 lookup: int | None = None, planner: TreePlanner | None = None,
                 sampling: SamplingConfig | None = None, verified_rows: bool = True,
                 drop_blank: bool = True, retrieval: str = "suffix", node_budget: int | None = None,
                 pair_rows: bool = True):
        """``tree``: a shape, a preset name, rank paths, or ``"auto"`` (the cost-aware tree, planned by
        ``planner``, which like ``matrix`` may be shared across requests).  ``lookup``: longest
        continuation retrieved from the context and merged into each tree (0 = none; None = the
        default; 0 with ``drop_blank``, ``verified_rows`` and ``pair_rows`` off is the paper's method
        alone: :meth:`paper`).  ``sampling``: lossless sampling instead of greedy decoding.
        ``verified_rows``: where a token occurs twice in a tree, the row written is the one from the
        committed text (:meth:`verified_first`); False: the paper's last-write-wins.  ``drop_blank``:
        no forward tokens for drafts from rows never written (:meth:`drop_blank_drafts`); False: the
        paper's full shape.  ``retrieval``: ``"suffix"`` (the longest suffix match over the whole
        context) or ``"ngram"`` (prompt lookup's 3..1-gram) for the grafted continuation.
        These settings, with ``pair_rows`` and ``node_budget``, are the rows of ``python -m tr_core.bench.ablate``.
        ``node_budget``: at most this many draft nodes a step, tree and continuation together, the
        best by the planner's estimates (a GPU's fixed budget, e.g. the paper's 80); the tree is then
        ``"auto"``'s universe, drafted in full and cut each step (:func:`tr_core.planner.allocate`).
        ``pair_rows``: draft a node's children from the row of the pair (its parent, itself) where that
        pair was seen, and write pair rows with ``M``'s (``tr_core.pairs``); False: ``M``'s rows alone,
        as the paper."""
        super().__init__(lm, max_new_tokens, sampling)
        self.lookup = DEFAULT_LOOKUP if lookup is None else int(lookup)
        if tree is None or tree == "default" or node_budget is not None:
            tree = DEFAULT_TREE
        if node_budget is not None and node_budget < 1:
            raise ValueError("node_budget must be at least 1")
        if planner is not None and planner.budget != node_budget:  # else the budget would plan unchecked
            raise ValueError(f"the planner's budget ({planner.budget}) and node_budget ({node_budget}) must agree")
        self.node_budget = node_budget
        self.planner = (planner or TreePlanner(lm, k=k, budget=node_budget)) if tree == "auto" else None
        if self.planner is not None:
            self.planner.use_temperature(sampling.temperature if sampling is not None else 0.0)
            tree = self.planner.tree
        if matrix is None:
            matrix = AdjacencyMatrix(lm.vocab_size, k, lm.device, lm.fingerprint)
        if matrix.fingerprint != lm.fingerprint or matrix.vocab_size != lm.vocab_size:
            raise ValueError("The matrix belongs to another vocabulary than the model.")
        self.matrix = matrix
        self.trace_rows = trace_rows
        if retrieval not in RETRIEVALS:
            raise ValueError(f"retrieval must be one of {', '.join(RETRIEVALS)} (got {retrieval!r})")
        self.verified_rows, self.drop_blank, self.retrieve_context = verified_rows, drop_blank, RETRIEVALS[retrieval]
        self.pair_rows = pair_rows
        self.control_ids = control_tokens(lm.tokenizer)  # where a retrieved copy stops
        self.set_tree(tree)

    PAPER: ClassVar[dict] = {"lookup": 0, "drop_blank": False, "verified_rows": False,
                             "pair_rows": False}  # the paper's method exactly

    @classmethod
    def paper(cls, lm: LoadedModel, tree: TreeShape | str | list = "paper-80", **kw) -> TokenRecyclingDecoder:
        """The paper's method exactly, on ``tree``: the full shape every step (blank drafts included),
        last write wins, rows by token alone, no retrieval branch."""
        return cls(lm, tree=tree, **cls.PAPER, **kw)

    def set_tree(self, tree: TreeShape | str | list | None) -> None:
        """Use another tree shape from the next step on."""
        if tree is None or tree == "default":
            tree = DEFAULT_TREE
        shape = tree if isinstance(tree, TreeShape) else load_tree(tree, k=self.matrix.k)
        if shape.max_rank >= self.matrix.k:
            raise ValueError(f"Tree {shape.name!r} needs rank {shape.max_rank}, but k={self.matrix.k}.")
        self.tree = shape
        self.tree_t = shape.tensors(self.lm.device, self.lm.dtype)
        deepest = self.planner.universe.depth if self.planner is not None else shape.depth
        self.lookahead = max(deepest, self.lookup) + 1

    def start(self, prompt_ids) -> None:
        """As every decoder; the planner (shared across requests) forgets the previous text's state."""
        if self.planner is not None:
            self.planner.begin_text()
        super().start(prompt_ids)

    def prefill(self, prefix: torch.Tensor, chunk: int = 256) -> None:
        """Run the prompt ``prefix [L]`` (all but its last token) into the cache, and seed ``M`` (and
        the pair rows) from the whole prompt.

        The forward takes the last prompt token too, so ``M[last]`` (and its pair row) holds the
        model's own top-k for the first new token: step 1's first drafts are exact.  That token's KV
        entry is then cropped, so the cache ends where every decoder's does and step 1 runs the last
        token as its root.  The output head and top-k run ``chunk`` positions at a time
        (``hidden [L + 1, d]`` -> ``logits [chunk, vocab]``), a bounded amount of memory.  Pair rows
        are seeded from every position (position ``i``'s pair is ``(prompt[i-1], prompt[i])``).
        Without them only the last occurrence of each token can survive in ``M`` (last write wins),
        so the head runs at those positions alone: the same matrix, for about half the head's work."""
        prompt = torch.cat([prefix, torch.tensor([self.prompt[-1]], dtype=prefix.dtype, device=prefix.device)])
        hidden = self.forward_hidden(prompt[None])  # [L + 1, d]
        self.cache.crop(-1)  # the last prompt token is step 1's root
        pairs = self.pair_rows
        positions = torch.arange(prompt.shape[0]) if pairs else last_occurrences(prompt).nonzero().squeeze(1)  # [u]
        head = self.lm.model.get_output_embeddings()
        with torch.inference_mode():
            for s in range(0, positions.shape[0], chunk):
                rows = positions[s:s + chunk].to(prompt.device)
                before = torch.where(rows > 0, prompt[(rows - 1).clamp(min=0)], -1) if pairs else None  # -1: no pair
                self.matrix.seed_from_prompt(prompt[rows], head(hidden[rows]), before)

    @torch.inference_mode()
    def step(self) -> Step:
        self._check_running()
        started = time.perf_counter()
        tree, clock = self.tree_t, PhaseClock(self.lm.device)
        before = self.before_root()
        with clock.phase("retrieve"):
            tokens = self.matrix.retrieve_draft_tree(self.last, tree, before)  # [q]
            paired = self.matrix.from_pairs(tokens, tree, before) if before is not None else None  # [q]
            tokens, tree, kept, blank_parents = self.drop_blank_drafts(tokens, tree, paired)
            sources = ["root"] + self.draft_sources(tokens, tree, None if paired is None else paired[kept])
        shape, grafted, offered, blank = self.tree, 0, None, self.tree.size + 1 - len(kept)
        drafted = [shape.paths[i - 1] for i in kept[1:]] if self.planner is not None else None  # rank paths
        if self.node_budget is not None:
            with clock.phase("lookup"):
                tokens, tree, kept, drafted, sources, grafted, offered = self.fill_budget(
                    tokens, tree, kept, drafted, sources)
        elif self.lookup:
            with clock.phase("lookup"):
                tokens, tree, grafted, offered = self.graft_lookup(tokens, tree, kept, drafted)
        sources += ["lookup"] * grafted
        logits, verdict, path = self.verify_tree(tokens, tree, clock)
        with clock.phase("update"):
            rows = self.matrix.recycle(tokens, logits, keep_old=self.trace_rows,
                                       priority=self.verified_first(tokens, path),
                                       before=self.tokens_before(tokens, tree, before))
        if self.planner is not None:
            self.plan_next(shape, kept, drafted, path, tokens, offered, clock.seconds["forward"])
        step = self.finish_tree_step(tokens, tree, sources, verdict, path, clock,
                                     _row_updates(rows) if self.trace_rows else None)
        step.blank_drafts = blank
        index = {shape_node: i for i, shape_node in enumerate(kept)}  # the verified tree's node of each kept one
        step.blank_under = sorted({index[p] for p in blank_parents if p in index})
        if self.planner is not None:
            self.planner.record_host(tokens.shape[0], time.perf_counter() - started - clock.seconds["forward"])
        return step

    def before_root(self) -> int | None:
        """The token committed before the root, which keys the root's pair row (None without pair rows
        or before a second token)."""
        if not self.pair_rows:
            return None
        if len(self.output) >= 2:
            return self.output[-2]
        return (self.prompt + self.output)[-2] if len(self.prompt) + len(self.output) >= 2 else None

    def tokens_before(self, tokens: torch.Tensor, tree, before: int | None) -> torch.Tensor | None:
        """``[q]``: the token before each input (its parent's; the root's: ``before``), which keys the
        pair row its logits write; None without pair rows."""
        if before is None:
            return None
        prior = tokens[tree.parents]
        prior[0] = before
        return prior

    def drop_blank_drafts(self, tokens: torch.Tensor, tree, paired: torch.Tensor | None = None):
        """Phase 1's last part: no forward tokens for nodes drafted from a row never written (their
        tokens are the row's zeros, not predictions) nor for anything below them; ``paired [q]``:
        the nodes a pair row drafted (never blank).

        Returns (tokens [q'], tree tensors [q'], the kept nodes' indices in the static shape, the
        indices in the static shape of the kept nodes whose children were left out)."""
        blank = self.matrix.blank_drafts(tokens, tree, paired) if self.drop_blank else None  # [q]
        if blank is None or not bool(blank.any()):
            return tokens, tree, list(range(tokens.shape[0])), []
        keep = ~blank
        sub = tree.select(keep)
        parents = tree.parents.clamp(min=0)
        tops = blank & keep[parents]  # a blank draft under a kept node: the top of a left-out branch
        return tokens[keep], sub, sub.kept.tolist(), sorted(set(parents[tops].tolist()))

    def draft_sources(self, tokens: torch.Tensor, tree, paired: torch.Tensor | None = None) -> list[str]:
        """Each draft node's source: ``"matrix"``, ``"pair"`` where its parent's pair row drafted it
        (``paired [q]``), or ``"empty"`` where it was drafted from a row never written (only where
        blank drafts are kept, the paper's method: else none are left)."""
        if tokens.shape[0] == 1:
            return []
        pair = paired[1:].tolist() if paired is not None else None
        empty = None if self.drop_blank else self.matrix.empty_rows(tokens[tree.parents[1:]]).tolist()
        return ["pair" if pair and pair[i] else "empty" if empty and empty[i] else "matrix"
                for i in range(tokens.shape[0] - 1)]

    def verified_first(self, tokens: torch.Tensor, path: list[int]):
        """``[q]`` long write priorities for phase 4, or None for the paper's rule (last write wins).

        Where a token occurs twice in the tree, the row written is the one from the accepted path
        (root included), whose logits saw the text as it is, not one from a rejected branch."""
        if not self.verified_rows:
            return None
        priority = torch.zeros(tokens.shape[0], dtype=torch.long, device=tokens.device)
        priority[path] = 1
        return priority

    def graft_lookup(self, tokens: torch.Tensor, tree, kept: list[int], drafted: list | None = None):
        """Merge the continuation retrieved from the context (``retrieval``: the longest suffix match,
        or prompt lookup's n-gram) into the tree: it joins the tree where the drafted tokens already
        follow it (``graft_point``) and runs on from there (with a planner: only as many tokens as
        are expected to pay).  ``kept``: the drafted nodes' indices in the static shape, ``drafted``
        their rank paths (with a planner).

        Returns (tokens [q'], tree tensors, grafted node count, what was offered: None, or the match's
        statistics key and the continuation's tokens as far as they are drafted)."""
        chain, attach, rest, key = self.retrieve_continuation(tokens, tree, kept)
        if not chain:
            return tokens, tree, 0, None
        offset = len(chain) - len(rest)
        if self.planner is not None:
            pruned = len(kept) < self.tree.size + 1  # else the plan's own expectation holds
            rest = rest[:self.planner.lookup_length(tokens.shape[0], key, offset, len(rest),
                                                    drafted if pruned else None)]
        if not rest:
            return tokens, tree, 0, None
        grafted = torch.tensor(rest, dtype=tokens.dtype, device=tokens.device)
        return (torch.cat([tokens, grafted]), tree.graft_chain(attach, len(rest)), len(rest),
                (key, chain[:offset + len(rest)]))

    def fill_budget(self, tokens: torch.Tensor, tree, kept: list[int], drafted: list, sources: list[str]):
        """Phase 1 under a node budget: the drafted nodes (``kept``, by index in the static shape;
        ``drafted``, their rank paths) and the continuation retrieved from the context (joined to the
        tree where its tokens are already drafted) compete for ``node_budget`` draft nodes, the best
        by estimated acceptance (:func:`tr_core.planner.allocate`): where drafts were blank or the
        tree's deep nodes unlikely, a long copy takes their place.

        Returns (tokens [q'], tree tensors, kept, drafted, the tree nodes' sources, grafted count,
        offered: as ``graft_lookup``'s)."""
        planner, n_tree = self.planner, tokens.shape[0]
        estimates = [planner.stats.estimate(p) for p in drafted]  # [n_tree - 1]
        parents = tree.parents.tolist()
        chain, attach, rest, key = self.retrieve_continuation(tokens, tree, kept) if self.lookup else ([], 0, [], 0)
        offset = len(chain) - len(rest)
        estimates += [planner.chain.estimate(key, offset + j, planner.hot) for j in range(len(rest))]
        parents += [n_tree + j - 1 if j else attach for j in range(len(rest))]
        nodes = allocate(estimates, parents, self.node_budget)  # tree nodes first, then the chain's
        kept, sources = [kept[i] for i in nodes if i < n_tree], [sources[i] for i in nodes if i < n_tree]
        drafted, grafted = [drafted[i - 1] for i in nodes[1:] if i < n_tree], len(nodes) - len(kept)
        if grafted:
            tokens = torch.cat([tokens, torch.tensor(rest, dtype=tokens.dtype, device=tokens.device)])
            tree = tree.graft_chain(attach, len(rest))
        if len(nodes) < tokens.shape[0]:
            keep = torch.zeros(tokens.shape[0], dtype=torch.bool, device=tokens.device)
            keep[nodes] = True
            tokens, tree = tokens[keep], tree.select(keep)
        return tokens, tree, kept, drafted, sources, grafted, (key, chain[:offset + grafted]) if grafted else None

    def retrieve_continuation(self, tokens: torch.Tensor, tree, kept: list[int]):
        """The context's continuation (``retrieval``, up to ``lookup`` tokens) and where it joins the
        drafted tree (``tokens [q]``; ``kept``: the drafted nodes' indices in the static shape).

        Returns (the continuation, the node to hang its rest under, the rest not already drafted,
        the match's statistics key); an empty continuation where the context has none."""
        chain, match = self.retrieve_context(self.context_ids(), self.lookup)
        chain = until_control(chain, self.control_ids, self.lm.eos_token_ids)
        if not chain:
            return [], 0, [], 0
        children = self.tree.children if len(kept) == self.tree.size + 1 else tree.children()
        attach, rest = graft_point(tokens.tolist(), children, chain)
        return chain, attach, rest, match_bucket(match)

    def plan_next(self, shape: TreeShape, kept: list[int], drafted: list, path: list[int], tokens: torch.Tensor,
                  offered: tuple[int, list[int]] | None, forward_seconds: float) -> None:
        """Feed this step's acceptance (the drafted nodes of ``shape``: ``kept`` by index, ``drafted``
        by rank path; lookup tokens ``offered``) and forward time to the planner; switch trees when it
        re-plans."""
        accepted = [shape.paths[kept[i] - 1] for i in path[1:] if i < len(kept)]
        if offered is not None:
            key, chain = offered
            along = tokens[path[1:]].tolist()
            run = next((i for i, (a, b) in enumerate(zip(chain, along)) if a != b), min(len(chain), len(along)))
            self.planner.record_lookup(key, len(chain), run)
        new = self.planner.record(drafted, accepted, tokens.shape[0], forward_seconds,
                                   self.cache_length - tokens.shape[0])
        if new is not None:
            self.set_tree(new)


def last_occurrences(tokens: torch.Tensor) -> torch.Tensor:
    """``[L] bool``: True where ``tokens[i]`` does not occur again later in ``tokens [L]``."""
    n = tokens.shape[0]
    pos = torch.arange(n, device=tokens.device)
    latest = torch.full((int(tokens.max()) + 1,), -1, dtype=torch.long, device=tokens.device)
    latest.scatter_reduce_(0, tokens, pos, reduce="amax")
    return latest[tokens] == pos


def _row_updates(rows) -> list[RowUpdate]:
    return [RowUpdate(token=t, old=o, new=n)
            for t, o, n in zip(rows.tokens.tolist(), rows.old.tolist(), rows.new.tolist())]
