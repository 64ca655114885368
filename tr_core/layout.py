"""Which attention each layer runs, read from the model's config: what a tree step must know to
mask right, and which architectures a tree step cannot serve at all.

Tree decoding keeps every layer's KV entries for the whole context (``tr_core.cache.new_cache``): a
step appends a whole draft tree and then keeps only the accepted path, and a sliding-window layer
that evicted old entries while the tree came in could not give them back.  The window is applied by
the mask instead.  A node at position ``p`` (prefix length + depth) of a sliding layer with window
``W`` sees the entries at positions ``p - W + 1 .. p`` that are in the cache or are its ancestors,
which is exactly what plain decoding sees at that position (transformers' ``sliding_window_overlay``:
``kv_idx > q_idx - W``).  Models whose layers differ (Gemma 2/3: sliding and global layers
alternate) take one mask per layer type.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

ATTENTION_TYPES = ("full_attention", "sliding_attention")
# Families whose layers keep a recurrent or convolutional state instead of (or beside) a KV cache:
# that state cannot be pruned back to one path of a tree.
RECURRENT_MODEL_TYPES = frozenset({
    "mamba", "mamba2", "falcon_mamba", "rwkv", "jamba", "zamba", "zamba2", "bamba", "falcon_h1",
    "granitemoehybrid", "nemotron_h", "lfm2", "lfm2_moe", "recurrent_gemma", "xlstm", "qwen3_next",
    "minimax", "plamo2", "mllama"})


class UnsupportedArchitecture(ValueError):
    """A model whose cache cannot be pruned to a tree path; the message says what works instead."""


def _refuse(model_type: str, what: str) -> UnsupportedArchitecture:
    return UnsupportedArchitecture(
        f"This {model_type!r} model has {what}, whose state a tree step cannot prune back to the accepted "
        "path. Tree decoding (Token Recycling, PTD, prompt lookup) needs attention layers with a KV cache: "
        "use a transformer family (Llama, Qwen, Mistral, Gemma, Phi-3, OLMo...), or decode this model plainly "
        "with transformers' generate().")


@dataclass(frozen=True)
class AttentionLayout:
    """``windows``: layer type -> sliding window in tokens (None = full attention), for the types the
    model's layers use; more than one type means the model takes a dict of masks by type."""

    windows: dict

    @classmethod
    def from_config(cls, config) -> "AttentionLayout":
        """Read the layer types and window from a (text) config; raise ``UnsupportedArchitecture``
        for recurrent, linear-attention, chunked or other non-KV layers."""
        config = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
        model_type = getattr(config, "model_type", "?")
        window = getattr(config, "sliding_window", None)
        types = getattr(config, "layer_types", None)
        if not types:  # one kind of layer: Mistral and Phi-3 apply their window to all of them
            windowed = window is not None and getattr(config, "use_sliding_window", True) is not False
            types = ["sliding_attention" if windowed else "full_attention"]
        odd = sorted({t for t in types if t not in ATTENTION_TYPES})
        if odd:
            raise _refuse(model_type, f"{' and '.join(odd)} layers")
        if model_type in RECURRENT_MODEL_TYPES:
            raise _refuse(model_type, "recurrent (state-space or convolutional) layers")
        if getattr(config, "attention_chunk_size", None):
            raise _refuse(model_type, "chunked_attention layers")
        return cls({t: (int(window) if t == "sliding_attention" and window else None) for t in set(types)})

    @property
    def sliding(self) -> bool:
        return any(w is not None for w in self.windows.values())

    def tree_masks(self, tree, past: int) -> torch.Tensor | dict:
        """The additive mask(s) for a tree step over ``past`` cached tokens: one ``[1, 1, q, past + q]``
        tensor when every layer attends alike, else ``{layer type: mask}`` (see module doc)."""
        masks = {t: tree.attention_mask(past, window=w) for t, w in self.windows.items()}
        return next(iter(masks.values())) if len(masks) == 1 else masks

    def describe(self) -> str:
        """"full attention", "sliding window 4096", "sliding window 512 + full attention"."""
        parts = [f"sliding window {w}" if w else "full attention"
                 for t, w in sorted(self.windows.items(), key=lambda kv: kv[0] != "sliding_attention")]
        return " + ".join(parts)


def attention_implementation(config, preferred: str) -> str:
    """``preferred`` (our SDPA attention), or ``"eager"`` for models whose attention SDPA cannot
    compute (Gemma 2's soft-capped attention logits)."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    model_class = MODEL_FOR_CAUSAL_LM_MAPPING.get(type(config), None)
    if getattr(config, "attn_logit_softcapping", None) is not None or (
            model_class is not None and getattr(model_class, "_supports_sdpa", True) is False):
        return "eager"
    return preferred
