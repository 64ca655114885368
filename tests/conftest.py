"""Fixtures: a tiny Llama built from a config (random weights, a few hundred KB) and the embedded model."""
from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

TINY_VOCAB = 96
# The embedded-model tests pin their device (and the default dtype rule then gives float32 there):
# on a GPU host the suite still checks what it checks on a CPU.  The GPU has its own check:
# ``python -m tr_core.bench.gpu_check``.
DEVICE = os.environ.get("TR_TEST_DEVICE", "cpu")


def make_tiny_tokenizer():
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<eos>": 1, **{f"w{i}": i + 2 for i in range(TINY_VOCAB - 2)}}
    tok = Tokenizer(WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", eos_token="<eos>")


def make_tiny_model(seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=TINY_VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                         eos_token_id=1, bos_token_id=0, pad_token_id=0, tie_word_embeddings=False)
    model = LlamaForCausalLM(config).eval()
    # Sharpen the output distribution so greedy paths repeat often and drafts get accepted.
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)
    model.generation_config.eos_token_id = 1
    model.generation_config.pad_token_id = 0
    return model


@pytest.fixture(scope="session")
def tiny_lm():
    from tr_core import wrap_model

    return wrap_model(make_tiny_model(), make_tiny_tokenizer(), name="tiny-llama")


@pytest.fixture(scope="session")
def embedded_lm():
    from tr_core import load_model

    return load_model(device=DEVICE)


def reference_greedy(lm, ids: list[int], max_new_tokens: int) -> list[int]:
    """``model.generate(do_sample=False)``, with an explicit greedy generation config (the model's own
    ``generation_config.json`` cannot change it): the ground truth of losslessness."""
    from tr_core.models import greedy_generation_config

    x = torch.tensor([ids], device=lm.device)
    with torch.inference_mode():
        out = lm.model.generate(x, attention_mask=torch.ones_like(x),
                                generation_config=greedy_generation_config(lm, max_new_tokens))
    return out[0, len(ids):].tolist()


def decode_losslessly(lm, make, prompts, max_new_tokens: int) -> list:
    """Run ``make()`` (a fresh decoder) on each prompt, assert its output is greedy's; the decoders."""
    decoders = []
    for ids in prompts:
        dec = make()
        assert dec.generate(ids) == reference_greedy(lm, ids, max_new_tokens), f"mismatch on {ids}"
        decoders.append(dec)
    return decoders


def pytest_configure(config):
    config.addinivalue_line("markers", "browser: drives the page in a real browser (Debian's chromium)")
    config.addinivalue_line("markers", "slow: takes minutes on two cores")
