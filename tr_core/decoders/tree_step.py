"""What every tree-drafting decoder does after drafting: one forward with tree attention, greedy
verification, pruning the KV cache to the accepted path, and the step record."""
from __future__ import annotations

import torch

from ..cache import keep_accepted_kv
from ..trace import DraftTree, RowUpdate, Step
from ..trees import TreeTensors
from ..verify import Verdict, verify_greedy
from .base import Decoder, PhaseClock


class TreeDecoder(Decoder):
    """Subclasses draft ``tokens [q]`` over ``tree`` (root first), then call these two in order."""

    def verify_tree(self, tokens: torch.Tensor, tree: TreeTensors, clock: PhaseClock):
        """Returns ``logits [q, vocab]``, the verdict and the accepted path as a list."""
        past = self.cache_length
        with clock.phase("prepare"):
            positions = tree.position_ids(past)  # [1, q]
            mask = tree.attention_mask(past)  # [1, 1, q, past + q]
        with clock.phase("forward"):
            logits = self.forward(tokens[None], positions, mask)  # [q, vocab]
        with clock.phase("verify"):
            verdict = verify_greedy(tokens, logits, tree)
            path = verdict.path.tolist()
        return logits, verdict, path

    def finish_tree_step(self, tokens: torch.Tensor, tree: TreeTensors, sources: list[str], verdict: Verdict,
                         path: list[int], clock: PhaseClock, rows: list[RowUpdate] | None = None) -> Step:
        """Prune the cache to the accepted path, commit its tokens + the model's own, record the step."""
        past = self.cache_length - tokens.shape[0]
        with clock.phase("prune"):
            keep_accepted_kv(self.cache, past, path)
        token_list = tokens.tolist()
        self.last = verdict.bonus
        committed = self.commit([token_list[i] for i in path[1:]] + [int(verdict.bonus)])
        parents = tree.parents.tolist()
        parents[0] = -1
        return self.record(Step(
            index=len(self.steps) + 1, method=self.method,
            tree=DraftTree(tokens=token_list, parents=parents, depths=tree.depths.tolist(),
                           ranks=tree.ranks.tolist(), sources=sources),
            accepted_path=path, committed=committed, model_choices=verdict.choices.tolist(),
            rows_written=rows or [], forward_tokens=len(token_list), cache_length=past,
            timings=clock.seconds))
