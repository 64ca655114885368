"""External peers run in the same process on the same model, timed like our decoders."""
from __future__ import annotations

import torch

from ..models import LoadedModel, greedy_generation_config


class HFPromptLookup:
    """transformers' own ``generate(prompt_lookup_num_tokens=N)``: no step trace."""

    method = "hf-pld"

    def __init__(self, lm: LoadedModel, max_new_tokens: int, num_tokens: int = 10, sampling=None):
        self.lm, self.max_new_tokens, self.num_tokens = lm, max_new_tokens, num_tokens
        self.sampling = sampling  # a tr_core.sampling.SamplingConfig, or None for greedy
        self.steps: list = []  # generate() does not expose its steps: MAT is not reported
        self.output: list[int] = []

    @torch.inference_mode()
    def generate(self, prompt_ids: list[int]) -> list[int]:
        x = torch.tensor([prompt_ids], device=self.lm.device)
        mode = self.sampling.generate_kwargs() if self.sampling is not None else {}
        if self.sampling is not None:
            torch.manual_seed(self.sampling.seed)
        config = greedy_generation_config(self.lm, self.max_new_tokens, prompt_lookup_num_tokens=self.num_tokens,
                                          **mode)
        out = self.lm.model.generate(x, attention_mask=torch.ones_like(x), generation_config=config)
        self.output = out[0, len(prompt_ids):].tolist()
        return self.output
