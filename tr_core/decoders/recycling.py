"""Token Recycling (Luo et al., ACL 2025): drafts from a matrix of recycled top-k candidates.

Each step, in the paper's phases:
  1. retrieve  - BFS from the last committed token over a static tree shape, reading ``M``
  2. forward   - root + tree in one forward with tree attention (position = prefix + depth)
  3. verify    - longest path whose tokens equal the model's argmax, plus the model's own token
  4. update    - ``M[token] = topk(logits)`` at *every* input, accepted or not (the recycling)
  5. prune     - keep only the accepted path's KV entries
"""
from __future__ import annotations

import torch

from ..cache import keep_accepted_kv
from ..matrix import AdjacencyMatrix
from ..models import LoadedModel
from ..trace import DraftTree, RowUpdate, Step
from ..trees import TreeShape, load_tree
from ..verify import verify_greedy
from .base import Decoder, PhaseClock

GPU_DEFAULT_TREE = "paper-80"
CPU_DEFAULT_TREE = "tr-16"


def default_tree_name(device: torch.device) -> str:
    return GPU_DEFAULT_TREE if device.type == "cuda" else CPU_DEFAULT_TREE


class TokenRecyclingDecoder(Decoder):
    """``matrix`` may be shared between decoders and requests: that is the hot start."""

    method = "tr"

    def __init__(self, lm: LoadedModel, tree: TreeShape | str | list | None = None, k: int = 8,
                 matrix: AdjacencyMatrix | None = None, max_new_tokens: int = 128, trace_rows: bool = True):
        super().__init__(lm, max_new_tokens)
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
        self.lookahead = shape.depth + 1

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
        shape = self.tree
        return self.record(Step(
            index=len(self.steps) + 1, method=self.method,
            tree=DraftTree(tokens=token_list, parents=list(shape.parents), depths=list(shape.depths),
                           ranks=list(shape.ranks), sources=["root"] + ["matrix"] * shape.size),
            accepted_path=path, committed=committed, model_choices=verdict.choices.tolist(),
            rows_written=_row_updates(rows) if self.trace_rows else [],
            forward_tokens=len(token_list), cache_length=past, timings=clock.seconds))


def _row_updates(rows) -> list[RowUpdate]:
    return [RowUpdate(token=t, old=o, new=n)
            for t, o, n in zip(rows.tokens.tolist(), rows.old.tolist(), rows.new.tolist())]
