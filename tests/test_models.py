import pytest
import torch

from tr_core.models import ModelLoadError, load_model, pick_device, pick_dtype


def test_unknown_model_id_offline_is_a_clear_error():
    with pytest.raises(ModelLoadError, match="Could not load model 'no-such-org/no-such-model-xyz'"):
        load_model("no-such-org/no-such-model-xyz", device="cpu")


def test_missing_gguf_file():
    with pytest.raises(ModelLoadError, match="No GGUF file"):
        load_model("/nonexistent/model.gguf", device="cpu")


def test_not_a_causal_lm_is_refused(tmp_path):
    from transformers import ViTConfig

    ViTConfig(hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
              intermediate_size=32).save_pretrained(tmp_path)
    with pytest.raises(ModelLoadError, match="not a causal language model"):
        load_model(str(tmp_path), device="cpu")


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_cuda_asked_without_cuda():
    with pytest.raises(ModelLoadError, match="no CUDA GPU"):
        pick_device("cuda")


def test_dtype_defaults():
    assert pick_dtype(None, torch.device("cpu")) == torch.float32
    assert pick_dtype(None, torch.device("cuda")) == torch.bfloat16
    assert pick_dtype("fp16", torch.device("cpu")) == torch.float16
    with pytest.raises(ModelLoadError, match="Unknown dtype"):
        pick_dtype("int3", torch.device("cpu"))


def test_local_folder_loads(tmp_path, tiny_lm):
    tiny_lm.model.save_pretrained(tmp_path)
    tiny_lm.tokenizer.save_pretrained(tmp_path)
    lm = load_model(str(tmp_path), device="cpu")
    assert lm.vocab_size == tiny_lm.vocab_size and lm.fingerprint == tiny_lm.fingerprint
    assert lm.eos_token_ids == (1,) and lm.dtype == torch.float32
