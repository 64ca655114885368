"""Tiny random models of the families users bring, built offline from transformers' configs.

Each has 2-4 layers of width 64, grouped-query heads and the 96-word test tokenizer; windowed
families get a sliding window of ``WINDOW`` tokens, so prompts of a few dozen tokens pass it.
"""
from __future__ import annotations

import torch

from .conftest import TINY_VOCAB

WINDOW = 12
COMMON = dict(vocab_size=TINY_VOCAB, hidden_size=64, intermediate_size=128, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=512, eos_token_id=1, bos_token_id=0,
              pad_token_id=0, tie_word_embeddings=False)


def family_configs() -> dict:
    """name -> config, for the eight families the project supports."""
    from transformers import (Gemma2Config, Gemma3TextConfig, LlamaConfig, MistralConfig, Olmo2Config,
                              Phi3Config, Qwen2Config, Qwen3Config)

    alternating = ["sliding_attention", "full_attention"] * 2
    return {
        "llama": LlamaConfig(num_hidden_layers=2, **COMMON),
        "qwen2": Qwen2Config(num_hidden_layers=2, **COMMON),
        "qwen3": Qwen3Config(num_hidden_layers=2, head_dim=16, **COMMON),
        "mistral": MistralConfig(num_hidden_layers=2, sliding_window=WINDOW, **COMMON),
        "gemma2": Gemma2Config(num_hidden_layers=4, head_dim=16, sliding_window=WINDOW, layer_types=alternating,
                               **COMMON),
        "gemma3": Gemma3TextConfig(num_hidden_layers=4, head_dim=16, sliding_window=WINDOW,
                                   layer_types=alternating, **COMMON),
        "phi3": Phi3Config(num_hidden_layers=2, sliding_window=WINDOW, **COMMON),
        "olmo2": Olmo2Config(num_hidden_layers=2, **COMMON),
    }


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
