"""External peers: transformers' own ``generate`` on the model exactly as transformers loads it.

Nothing of ours is applied to that copy: no pre-packed linear layers, no custom attention.  The
bench loads it beside the model our decoders run on (:func:`load_untouched`), so the peers are the
reference a user would compare with, timed like our decoders."""
from __future__ import annotations

import torch

from ..devices import free_memory
from ..models import LoadedModel, greedy_generation_config, wrap_model


def model_bytes(lm) -> int:
    return sum(p.numel() * p.element_size() for p in lm.model.parameters())


def second_copy_fits(lm, share: float = 0.8) -> bool:
    """Whether an untouched second copy of ``lm`` fits beside it (on a GPU: within ``share`` of what is
    free now; on a CPU it is host memory, assumed to fit)."""
    free = free_memory(lm.device)
    return lm.device.type != "cuda" or (free is not None and model_bytes(lm) <= share * free)


def load_untouched(spec: str | None, device: torch.device, dtype: torch.dtype) -> LoadedModel:
    """A second copy of model ``spec``, as ``AutoModelForCausalLM.from_pretrained`` gives it."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ..models import EMBEDDED, HUB_FALLBACK, _source, embedded_installed

    if spec in (None, "", EMBEDDED) and not embedded_installed():
        spec = HUB_FALLBACK  # where load_model took the default model from
    path, extra, name = _source(spec)
    tokenizer = AutoTokenizer.from_pretrained(path, **extra)
    from ..devices import load_straight_to_device

    direct = {"device_map": {"": device}} if load_straight_to_device() and not extra else {}
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, **extra, **direct).to(device).eval()
    return wrap_model(model, tokenizer, name=f"{name} (untouched)")


class HFGenerate:
    """``generate()`` with an explicit greedy config plus ``extra`` settings; no step trace."""

    method = "hf-greedy"

    def __init__(self, lm: LoadedModel, max_new_tokens: int, sampling=None, **extra):
        self.lm, self.max_new_tokens, self.extra = lm, max_new_tokens, extra
        self.sampling = sampling  # a tr_core.sampling.SamplingConfig, or None for greedy
        self.steps: list = []  # generate() does not expose its steps: MAT is not reported
        self.output: list[int] = []

    @torch.inference_mode()
    def generate(self, prompt_ids: list[int]) -> list[int]:
        x = torch.tensor([prompt_ids], device=self.lm.device)
        mode = self.sampling.generate_kwargs() if self.sampling is not None else {}
        if self.sampling is not None:
            torch.manual_seed(self.sampling.seed)
        config = greedy_generation_config(self.lm, self.max_new_tokens, **self.extra, **mode)
        out = self.lm.model.generate(x, attention_mask=torch.ones_like(x), generation_config=config)
        self.output = out[0, len(prompt_ids):].tolist()
        return self.output


class HFPromptLookup(HFGenerate):
    """transformers' own ``generate(prompt_lookup_num_tokens=N)``."""

    method = "hf-pld"

    def __init__(self, lm: LoadedModel, max_new_tokens: int, num_tokens: int = 10, sampling=None):
        super().__init__(lm, max_new_tokens, sampling, prompt_lookup_num_tokens=num_tokens)
