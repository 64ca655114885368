"""Prompt lookup decoding (PLD), as Spec-Bench runs it: the continuation of the last 3- down to
1-gram's earliest earlier occurrence in the context, up to 10 tokens, verified as one chain."""
from __future__ import annotations

import torch

from ..lookup import lookup_continuation
from ..models import LoadedModel
from ..sampling import SamplingConfig
from ..trees import TreeShape
from .base import PhaseClock
from .tree_step import StepState, TreeDecoder


class PromptLookupDecoder(TreeDecoder):
    method = "pld"

    def __init__(self, lm: LoadedModel, max_new_tokens: int = 128, max_draft: int = 10, max_ngram: int = 3,
                 min_ngram: int = 1, sampling: SamplingConfig | None = None):
        super().__init__(lm, max_new_tokens, sampling)
        self.max_draft, self.max_ngram, self.min_ngram = max_draft, max_ngram, min_ngram
        self.lookahead = max_draft + 1
        self.root_only = TreeShape.empty().tensors(lm.device, lm.dtype)

    def draft(self, clock: PhaseClock) -> StepState:
        """The root, then the context's continuation as one chain: ``tokens [1 + n]``."""
        with clock.phase("lookup"):
            chain = lookup_continuation(self.context_ids(), self.max_draft, self.max_ngram, self.min_ngram)
            tree = self.root_only.graft_chain(0, len(chain)) if chain else self.root_only
            tokens = torch.cat([self.last.view(1), torch.tensor(chain, dtype=torch.long, device=self.lm.device)])
        return StepState(tokens, tree, ["root"] + ["lookup"] * len(chain))
