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

from ..cache import keep_accepted_kv
from ..lookup import graft_point, lookup_continuation
from ..matrix import AdjacencyMatrix
from ..models import LoadedModel
from ..trace import DraftTree, RowUpdate, Step
from ..trees import TreeShape, load_tree
from ..verify import verify_greedy
from .base import Decoder, PhaseClock

GPU_DEFAULT_TREE = "paper-80"
CPU_DEFAULT_TREE = "tr-16"
CPU_DEFAULT_LOOKUP = 10


def default_tree_name(device: torch.device) -> str:
    return GPU_DEFAULT_TREE if device.type == "cuda" else CPU_DEFAULT_TREE


class TokenRecyclingDecoder(Decoder):
    """``matrix`` may be shared between decoders and requests: that is the hot start."""

    method = "tr"

    def __init__(self, lm: LoadedModel, tree: TreeShape | str | list | None = None, k: int = 8,
                 matrix: AdjacencyMatrix | None = None, max_new_tokens: int = 128, trace_rows: bool = True,
                 lookup: int | None = None):
        """``lookup``: longest prompt-lookup continuation merged into each tree (0 = the paper's
        method alone; None = the device default)."""
        super().__init__(lm, max_new_tokens)
        self.lookup = default_lookup(lm.device) if lookup is None else int(lookup)
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
            tree = default_tree_name(self.lm.device)
        shape = tree if isinstance(tree, TreeShape) else load_tree(tree, k=self.matrix.k)
        if shape.max_rank >= self.matrix.k:
            raise ValueError(f"Tree {shape.name!r} needs rank {shape.max_rank}, but k={self.matrix.k}.")
        self.tree = shape
        self.tree_t = shape.tensors(self.lm.device, self.lm.dtype)
        self.lookahead = max(shape.depth, getattr(self, "lookup", 0)) + 1

    def prefill(self, prefix: torch.Tensor) -> None:
        """Run the prompt and seed ``M`` from its logits (``prefix [L]``)."""
        logits = self.forward(prefix[None])  # [L, vocab]
        self.matrix.seed_from_prompt(prefix, logits)

    @torch.inference_mode()
    def step(self) -> Step:
        self._check_running()
        tree, clock, past = self.tree_t, PhaseClock(self.lm.device), self.cache_length
        with clock.phase("retrieve"):
            tokens = self.matrix.retrieve_draft_tree(self.last, tree)  # [q]
        sources = ["root"] + ["matrix"] * self.tree.size
        if self.lookup:
            with clock.phase("lookup"):
                tokens, tree, grafted = self.graft_lookup(tokens, tree)
            sources += ["lookup"] * grafted
        with clock.phase("prepare"):
            positions = tree.position_ids(past)  # [1, q]
            mask = tree.attention_mask(past)  # [1, 1, q, past + q]
        with clock.phase("forward"):
            logits = self.forward(tokens[None], positions, mask)  # [q, vocab]
        with clock.phase("verify"):
            verdict = verify_greedy(tokens, logits, tree)
            path = verdict.path.tolist()
            bonus = int(verdict.bonus)
        with clock.phase("update"):
            rows = self.matrix.recycle(tokens, logits, keep_old=self.trace_rows)
        with clock.phase("prune"):
            keep_accepted_kv(self.cache, past, path)

        token_list = tokens.tolist()
        self.last = verdict.bonus
        committed = self.commit([token_list[i] for i in path[1:]] + [bonus])
        parents = tree.parents.tolist()
        parents[0] = -1
        return self.record(Step(
            index=len(self.steps) + 1, method=self.method,
            tree=DraftTree(tokens=token_list, parents=parents, depths=tree.depths.tolist(),
                           ranks=tree.ranks.tolist(), sources=sources),
            accepted_path=path, committed=committed, model_choices=verdict.choices.tolist(),
            rows_written=_row_updates(rows) if self.trace_rows else [],
            forward_tokens=len(token_list), cache_length=past, timings=clock.seconds))


    def graft_lookup(self, tokens: torch.Tensor, tree):
        """Merge the prompt-lookup continuation of the context under the root, skipping the part
        the matrix already drafted.  Returns (tokens [q'], tree tensors, grafted node count)."""
        context = torch.tensor(self.prompt + self.output)
        chain = lookup_continuation(context, self.lookup)
        if not chain:
            return tokens, tree, 0
        attach, rest = graft_point(tokens.tolist(), self.tree.children, chain)
        if not rest:
            return tokens, tree, 0
        grafted = torch.tensor(rest, dtype=tokens.dtype, device=tokens.device)
        return torch.cat([tokens, grafted]), tree.graft_chain(attach, len(rest)), len(rest)


def default_lookup(device: torch.device) -> int:
    """Prompt lookup merged into the tree: on by default where a forward's extra tokens cost."""
    return 0 if device.type == "cuda" else CPU_DEFAULT_LOOKUP


def _row_updates(rows) -> list[RowUpdate]:
    return [RowUpdate(token=t, old=o, new=n)
            for t, o, n in zip(rows.tokens.tolist(), rows.old.tolist(), rows.new.tolist())]
