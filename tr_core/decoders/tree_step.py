"""What every tree-drafting decoder does after drafting: one forward with tree attention,
verification (greedy, or the lossless sampling walk), pruning the KV cache to the accepted path,
and the step record."""
from __future__ import annotations

import torch

from ..cache import keep_accepted_kv
from ..trace import DraftTree, RowUpdate, Step
from ..trees import TreeTensors
from ..verify import Verdict, verify_greedy, verify_sampled
from .base import Decoder, PhaseClock


class TreeDecoder(Decoder):
    """Subclasses draft ``tokens [q]`` over ``tree`` (root first), then call these two in order."""

    def verify_tree(self, tokens: torch.Tensor, tree: TreeTensors, clock: PhaseClock, verified: int | None = None):
        """Returns ``logits [q, vocab]``, the verdict and the accepted path as a list.

        ``verified``: only the first that many inputs form the tree that is verified (PTD's draft
        nodes ride along behind it); the verdict's ``choices`` cover those.  With sampling on, the
        verdict follows the draws (``verify_sampled``), else the argmax (``verify_greedy``)."""
        past = self.cache_length
        with clock.phase("prepare"):
            positions = tree.position_ids(past)  # [1, q]
            mask = self.lm.tree_masks(tree, past)  # [1, 1, q, past + q] (or one per layer type)
        with clock.phase("forward"):
            logits = self.forward(tokens[None], positions, mask)  # [q, vocab]
        with clock.phase("verify"):
            m = tokens.shape[0] if verified is None else verified
            head = tree if m == tokens.shape[0] else tree.head(m)
            if self.sampler is not None:
                verdict = verify_sampled(tokens[:m], logits[:m], head, self.sampler, positions[0, :m])
            else:
                verdict = verify_greedy(tokens[:m], logits[:m], head)
            path = verdict.path.tolist()
        return logits, verdict, path

    def finish_tree_step(self, tokens: torch.Tensor, tree: TreeTensors, sources: list[str], verdict: Verdict,
                         path: list[int], clock: PhaseClock, rows: list[RowUpdate] | None = None,
                         verified: int | None = None) -> Step:
        """Prune the cache to the accepted path, commit its tokens + the model's own, record the step.

        The step's tree is the first ``verified`` inputs (default: all)."""
        q = tokens.shape[0]
        past = self.cache_length - q
        m = q if verified is None else verified
        with clock.phase("prune"):
            keep_accepted_kv(self.cache, past, path)
        token_list = tokens[:m].tolist()
        self.last = verdict.bonus
        committed = self.commit([token_list[i] for i in path[1:]] + [int(verdict.bonus)])
        parents = tree.parents[:m].tolist()
        parents[0] = -1
        return self.record(Step(
            index=len(self.steps) + 1, method=self.method,
            tree=DraftTree(tokens=token_list, parents=parents, depths=tree.depths[:m].tolist(),
                           ranks=tree.ranks[:m].tolist(), sources=sources),
            accepted_path=path, committed=committed, model_choices=verdict.choices.tolist(),
            sampled=self.sampler is not None,
            rows_written=rows or [], forward_tokens=q, cache_length=past,
            timings=clock.seconds))
