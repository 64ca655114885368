"""Tiny random models of the families users bring, built offline from transformers' configs.

Each has 2-4 layers of width 64, grouped-query heads and the 96-word test tokenizer; windowed
families get a sliding window of ``WINDOW`` tokens, so prompts of a few dozen tokens pass it.
"""
from __future__ import annotations

import torch

from tr_core.bench.random_models import WINDOW  # noqa: F401  (the windowed families' window)

from .conftest import TINY_VOCAB


def family_configs() -> dict:
    """name -> config, for the eight families the project supports (``tr_core.bench.random_models``),
    with the test tokenizer's vocabulary."""
    from tr_core.bench.random_models import family_configs as configs

    return configs(TINY_VOCAB)


def make_family_model(name: str, seed: int = 0):
    """A random model of family ``name`` whose output head is sharpened (as the tiny Llama's is),
    so greedy paths repeat and drafts get accepted."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(family_configs()[name]).eval()
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(8.0)
    model.generation_config.eos_token_id = 1
    model.generation_config.pad_token_id = 0
    return model
