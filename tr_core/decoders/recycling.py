"""Token Recycling (Luo et al., ACL 2025): drafts from a matrix of recycled top-k candidates.

Each step, in the paper's phases:
  1. retrieve  - BFS from the last committed token over a static tree shape, reading ``M``
     (optionally plus a prompt-lookup continuation grafted under the root: ``lookup`` > 0)
  2. forward   - root + tree in one forward with tree attention (position = prefix + depth)
  3. verify    - longest path whose tokens equal the model's argmax, plus the model's own token
  4. update    - ``M[token] = topk(logits)`` at *every* input, accepted or not (the recycling)
  5. prune     - keep only the accepted path's KV entries
"""
from __future__ import annotations

import torch

from ..lookup import graft_point, lookup_with_ngram
from ..matrix import AdjacencyMatrix
from ..models import LoadedModel
from ..planner import TreePlanner
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


class TokenRecyclingDecoder(TreeDecoder):
    """``matrix`` may be shared between decoders and requests: that is the hot start."""

    method = "tr"

    def __init__(self, lm: LoadedModel, tree: TreeShape | str | list | None = None, k: int = 8,
                 matrix: AdjacencyMatrix | None = None, max_new_tokens: int = 128, trace_rows: bool = True,
                 lookup: int | None = None, planner: TreePlanner | None = None,
                 sampling: SamplingConfig | None = None):
        """``tree``: a shape, a preset name, rank paths, or ``"auto"`` (the cost-aware tree, planned by
        ``planner``, which like ``matrix`` may be shared across requests).  ``lookup``: longest
        prompt-lookup continuation merged into each tree (0 = the paper's method alone; None = the
        device default).  ``sampling``: lossless sampling instead of greedy decoding."""
        super().__init__(lm, max_new_tokens, sampling)
        self.lookup = DEFAULT_LOOKUP if lookup is None else int(lookup)
        if tree is None or tree == "default":
            tree = DEFAULT_TREE
        self.planner = (planner or TreePlanner(lm, k=k)) if tree == "auto" else None
        if self.planner is not None:
            self.planner.use_temperature(sampling.temperature if sampling is not None else 0.0)
            tree = self.planner.tree
        if matrix is None:
            matrix = AdjacencyMatrix(lm.vocab_size, k, lm.device, lm.fingerprint)
        if matrix.fingerprint != lm.fingerprint or matrix.vocab_size != lm.vocab_size:
            raise ValueError("The matrix belongs to another vocabulary than the model.")
        self.matrix = matrix
        self.trace_rows = trace_rows
        self.set_tree(tree)

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
        """Run the prompt ``prefix [L]`` in one forward, as greedy decoding does, and seed ``M`` from it.

        Only the last occurrence of each token can survive in ``M`` (last write wins), so the output
        head and top-k run at those positions alone, ``chunk`` at a time (``hidden [L, d]`` ->
        ``logits [chunk, vocab]``): the same matrix as seeding from every position, for about half
        the head's work and a bounded amount of memory."""
        hidden = self.forward_hidden(prefix[None])  # [L, d]
        keep = last_occurrences(prefix).nonzero().squeeze(1)  # [u]
        head = self.lm.model.get_output_embeddings()
        with torch.inference_mode():
            for s in range(0, keep.shape[0], chunk):
                rows = keep[s:s + chunk]
                self.matrix.seed_from_prompt(prefix[rows], head(hidden[rows]))

    @torch.inference_mode()
    def step(self) -> Step:
        self._check_running()
        tree, clock = self.tree_t, PhaseClock(self.lm.device)
        with clock.phase("retrieve"):
            tokens = self.matrix.retrieve_draft_tree(self.last, tree)  # [q]
            empty = self.matrix.empty_rows(tokens[tree.parents[1:]]).tolist()  # drafted from a blank row
        shape, grafted, offered = self.tree, 0, None
        sources = ["root"] + ["empty" if e else "matrix" for e in empty]
        if self.lookup:
            with clock.phase("lookup"):
                tokens, tree, grafted, offered = self.graft_lookup(tokens, tree)
            sources += ["lookup"] * grafted
        logits, verdict, path = self.verify_tree(tokens, tree, clock)
        with clock.phase("update"):
            rows = self.matrix.recycle(tokens, logits, keep_old=self.trace_rows)
        if self.planner is not None:
            self.plan_next(shape, path, tokens, offered, clock.seconds["forward"])
        return self.finish_tree_step(tokens, tree, sources, verdict, path, clock,
                                     _row_updates(rows) if self.trace_rows else None)

    def graft_lookup(self, tokens: torch.Tensor, tree):
        """Merge the prompt-lookup continuation of the context under the root, skipping the part
        the matrix already drafted (with a planner: only as many tokens as are expected to pay).

        Returns (tokens [q'], tree tensors, grafted node count, what was offered: None, or the matched
        n-gram size and the continuation's tokens as far as they are drafted)."""
        chain, ngram = lookup_with_ngram(self.context_ids(), self.lookup)
        if not chain:
            return tokens, tree, 0, None
        attach, rest = graft_point(tokens.tolist(), self.tree.children, chain)
        offset = len(chain) - len(rest)
        if self.planner is not None:
            rest = rest[:self.planner.lookup_length(tokens.shape[0], ngram, offset, len(rest))]
        if not rest:
            return tokens, tree, 0, None
        grafted = torch.tensor(rest, dtype=tokens.dtype, device=tokens.device)
        return (torch.cat([tokens, grafted]), tree.graft_chain(attach, len(rest)), len(rest),
                (ngram, chain[:offset + len(rest)]))

    def plan_next(self, shape: TreeShape, path: list[int], tokens: torch.Tensor,
                  offered: tuple[int, list[int]] | None, forward_seconds: float) -> None:
        """Feed this step's acceptance (tree nodes, lookup tokens ``offered``) and forward time to the
        planner; switch trees when it re-plans."""
        accepted = [shape.paths[i - 1] for i in path[1:] if i <= shape.size]
        if offered is not None:
            ngram, chain = offered
            drafted = tokens[path[1:]].tolist()
            run = next((i for i, (a, b) in enumerate(zip(chain, drafted)) if a != b), min(len(chain), len(drafted)))
            self.planner.record_lookup(ngram, len(chain), run)
        new = self.planner.record(shape, accepted, tokens.shape[0], forward_seconds,
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
