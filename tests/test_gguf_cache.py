"""The embedded GGUF file is dequantised once into a model folder in the local cache; a load from that
folder is the same model as a load from the GGUF file, and a damaged folder is never used."""
from __future__ import annotations

import os

import pytest
import torch

from tr_core import gguf_cache
from tr_core.models import embedded_gguf_path, embedded_installed, load_model

pytestmark = pytest.mark.skipif(not embedded_installed(), reason="the embedded model is not installed")


def test_a_damaged_conversion_is_dropped_and_the_gguf_file_gives_the_same_model(embedded_lm, tmp_path, monkeypatch):
    """The suite's model (``embedded_lm``) was read through the cache; a load whose cached folder is
    damaged reads the GGUF file itself, removes the folder, and gives the very same weights, config and
    tokenizer."""
    gguf = embedded_gguf_path()
    assert (gguf_cache.converted_folder(gguf) / gguf_cache.DONE).is_file(), "the suite's load left no conversion"
    monkeypatch.setenv("TR_CACHE", str(tmp_path))
    folder = gguf_cache.converted_folder(gguf)
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{ not json")
    (folder / gguf_cache.DONE).write_text("damaged\n")

    direct = load_model(device=str(embedded_lm.device), prepack=False)  # the weights as read; no kernel timing

    assert not folder.exists(), "the damaged folder was kept"
    cached = embedded_lm.model.state_dict()
    own = direct.model.state_dict()
    assert sorted(own) == sorted(cached)
    assert all(torch.equal(own[k], cached[k]) for k in own)
    for name in ("fingerprint", "eos_token_ids", "max_context", "vocab_size", "dtype"):
        assert getattr(direct, name) == getattr(embedded_lm, name), name
    text = "Write a haiku about recycled tokens."
    ids = direct.encode_prompt(text)
    assert ids == embedded_lm.encode_prompt(text)
    config = {k: v for k, v in direct.model.config.to_dict().items() if k not in ("quantization_config", "_name_or_path")}
    assert config == {k: v for k, v in embedded_lm.model.config.to_dict().items() if k not in ("quantization_config", "_name_or_path")}


def test_the_cache_can_be_turned_off_and_a_failed_conversion_reads_the_file(tmp_path, monkeypatch):
    gguf = embedded_gguf_path()
    monkeypatch.setenv("TR_CACHE", str(tmp_path))
    monkeypatch.setenv("TR_GGUF_CACHE", "0")
    assert gguf_cache.cached(gguf) is None
    monkeypatch.delenv("TR_GGUF_CACHE")

    def fails(*_):
        raise OSError("No space left on device")

    monkeypatch.setattr(gguf_cache, "convert", fails)
    assert gguf_cache.cached(gguf) is None
    assert not any(tmp_path.rglob(gguf_cache.DONE))


def test_a_conversion_is_written_whole_or_not_at_all(tmp_path, monkeypatch):
    """A conversion that fails half-way leaves no folder behind (it is written aside and renamed)."""
    gguf = embedded_gguf_path()
    monkeypatch.setenv("TR_CACHE", str(tmp_path))

    def half(model, tokenizer, folder):
        (folder / "config.json").write_text("{}")
        raise OSError("No space left on device")

    monkeypatch.setattr(gguf_cache, "write_folder", half)
    monkeypatch.setattr("transformers.AutoModelForCausalLM.from_pretrained", lambda *a, **k: None)
    monkeypatch.setattr("transformers.AutoTokenizer.from_pretrained", lambda *a, **k: None)
    assert gguf_cache.cached(gguf) is None
    assert os.listdir(tmp_path / "gguf") == []
