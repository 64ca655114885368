"""Random-weight models of real shapes, built from transformers' configs with no file read.

* the eight families the project supports, tiny (2-4 layers of width 64, grouped-query heads; the
  windowed ones with a window of ``WINDOW`` tokens);
* the embedded model's shape (SmolLM2-135M: 30 layers, width 576, 9 query and 3 KV heads);
* a 7B model's shape with grouped-query attention (Llama-3-8B: 32 layers, width 4096, 32 query and 8
  KV heads, a 128,256-token vocabulary).

Their output heads are sharpened (times ``SHARPEN``) so that greedy paths repeat and drafts get
accepted, as a trained model's do.
"""
from __future__ import annotations

import torch

WINDOW = 12
SHARPEN = 8.0


def family_configs(vocab: int = 96) -> dict:
    """name -> config, for the eight families the project supports."""
    from transformers import (Gemma2Config, Gemma3TextConfig, LlamaConfig, MistralConfig, Olmo2Config,
                              Phi3Config, Qwen2Config, Qwen3Config)

    common = dict(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=512, eos_token_id=1, bos_token_id=0,
                  pad_token_id=0, tie_word_embeddings=False)
    alternating = ["sliding_attention", "full_attention"] * 2
    return {
        "llama": LlamaConfig(num_hidden_layers=2, **common),
        "qwen2": Qwen2Config(num_hidden_layers=2, **common),
        "qwen3": Qwen3Config(num_hidden_layers=2, head_dim=16, **common),
        "mistral": MistralConfig(num_hidden_layers=2, sliding_window=WINDOW, **common),
        "gemma2": Gemma2Config(num_hidden_layers=4, head_dim=16, sliding_window=WINDOW, layer_types=alternating,
                               **common),
        "gemma3": Gemma3TextConfig(num_hidden_layers=4, head_dim=16, sliding_window=WINDOW,
                                   layer_types=alternating, **common),
        "phi3": Phi3Config(num_hidden_layers=2, sliding_window=WINDOW, **common),
        "olmo2": Olmo2Config(num_hidden_layers=2, **common),
    }


def smollm2_config():
    """SmolLM2-135M(-Instruct)'s shapes, as its config.json gives them."""
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                       num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=8192,
                       rope_theta=100000.0, rms_norm_eps=1e-5, tie_word_embeddings=True, bos_token_id=1,
                       eos_token_id=2, pad_token_id=2)


def llama3_8b_config():
    """Llama-3-8B's shapes: grouped-query attention, 4 query heads per KV head."""
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                       num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=8192,
                       rope_theta=500000.0, rms_norm_eps=1e-5, tie_word_embeddings=False)


def small_gqa_config():
    """A tiny model of the same kind as :func:`llama3_8b_config` (any machine, seconds)."""
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096)


def word_tokenizer(vocab: int):
    """A word-level tokenizer of ``vocab`` entries (``<unk>``, ``<eos>``, ``w0`` ...): what a random
    model needs to be wrapped (its ids are all the decoders use)."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace
    from transformers import PreTrainedTokenizerFast

    words = {"<unk>": 0, "<eos>": 1, **{f"w{i}": i + 2 for i in range(vocab - 2)}}
    tok = Tokenizer(WordLevel(words, unk_token="<unk>"))
    tok.pre_tokenizer = Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", eos_token="<eos>")


def random_model(config, device="cpu", dtype: torch.dtype = torch.float32, seed: int = 0, sharpen: float = SHARPEN):
    """A model of ``config`` with random weights, built on ``device`` in ``dtype`` (the project's
    attention), its output head times ``sharpen``."""
    from transformers import AutoModelForCausalLM

    from ..attention import register
    from ..layout import attention_implementation

    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype,
                                                 attn_implementation=attention_implementation(config, register()))
    model.eval()
    if sharpen != 1.0:
        with torch.no_grad():
            model.get_output_embeddings().weight.mul_(sharpen)
    eos = getattr(config, "eos_token_id", None)
    model.generation_config.eos_token_id = eos
    model.generation_config.pad_token_id = getattr(config, "pad_token_id", None) if eos is not None else None
    return model


def random_lm(config, device="cpu", dtype: torch.dtype = torch.float32, name: str = "random", seed: int = 0,
              sharpen: float = SHARPEN):
    """:func:`random_model` wrapped as a ``LoadedModel`` with a word-level tokenizer."""
    from ..models import wrap_model

    lm = wrap_model(random_model(config, device, dtype, seed, sharpen), word_tokenizer(config.vocab_size), name)
    if getattr(config, "eos_token_id", None) is None:
        lm.eos_token_ids = ()
    return lm
