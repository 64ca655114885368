"""Tree attention without copying the KV cache: transformers' SDPA attention, but grouped-query
heads stay shared inside PyTorch's kernel also when a mask is given.

For a forward with an explicit mask (every tree step), transformers expands the key/value heads of a
grouped-query model to all query heads first (``repeat_kv``), because CUDA's fused kernels take
either a mask or grouped heads, not both.  That is a copy of the whole cache, every layer, every
step: on this CPU, with SmolLM2's 3 KV heads for 9 query heads and a 770-token context, about 10 ms
of a 65 ms tree forward.  PyTorch's CPU flash-attention kernel takes both (``enable_gqa=True``) and
gives bit-identical outputs, so on CPU a masked forward skips the copy.  On CUDA, ``enable_gqa`` with
a mask falls back to PyTorch's math kernel (itself a copy, and slower), so there the query heads of a
group are folded into the query length instead (``fold``: ``[b, kv_heads, groups * q, d]`` against the
shared keys, the mask repeated per group, a few kilobytes), which the memory-efficient kernel runs as
is: transformers does the same for one query token (``pack_gqa``).  A one-token step without a mask
makes here the very call transformers would make, where transformers would make it (its own
``use_gqa_in_sdpa`` decides), so that a packed forward (many tabs' steps, :func:`packed_attention`)
lays its requests' outputs out once per layer, not once per request.  Everything else (models without
grouped heads, several queries without a mask, models with biases or sinks, per-head masks, devices
of ``repeat_kv``) goes to transformers' own function.

``MASKED_GQA`` picks the way per device type (the GPU check times each: ``repeat_kv`` is
transformers' own).

Registered through transformers' ``AttentionInterface`` under ``ATTENTION``; ``load_model`` selects it.
"""
from __future__ import annotations

import inspect
from functools import lru_cache

import torch
import torch.nn.functional as F

ATTENTION = "sdpa_shared_kv"
_EXTRAS = ("position_bias", "s_aux", "sinks", "softcap")  # features left to transformers' own path
MASKED_GQA = {"cpu": "enable_gqa", "cuda": "fold"}  # device type -> way; others: "repeat_kv" (transformers')


def sdpa_shared_kv(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                   attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                   is_causal: bool | None = None, **kwargs) -> tuple[torch.Tensor, None]:
    """``query [b, heads, q, d]``, ``key``/``value [b, kv_heads, kv, d]``, ``attention_mask
    [b, 1, q, kv]`` -> (``[b, q, heads, d]``, None), as transformers' ``sdpa_attention_forward``."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    segments, packed = kwargs.pop("segments", None), kwargs.pop("packed", None)
    if segments:
        return packed_attention(module, query, attention_mask, segments, packed, dropout, scaling, **kwargs), None
    out = shared_kv_heads_first(module, query, key, value, attention_mask, dropout, scaling, **kwargs)
    if out is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, is_causal=is_causal, **kwargs)
    return out.transpose(1, 2).contiguous(), None


def shared_kv_heads_first(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                          mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                          **kwargs) -> torch.Tensor | None:
    """Grouped-query attention in one kernel call with the key/value heads shared.  ``query [b, heads,
    q, d]``, ``key``/``value [b, kv_heads, kv, d]``, ``mask [b, 1, q, kv]`` or None -> ``[b, heads, q,
    d]`` (heads first, as the kernel gives it); None where transformers' own function is the way (no
    groups, a per-head mask, biases or sinks, ``repeat_kv`` devices, several queries without a mask, or
    one query where transformers itself would not share the heads)."""
    groups = getattr(module, "num_key_value_groups", 1)
    way = MASKED_GQA.get(query.device.type, "repeat_kv")
    if groups == 1 or way == "repeat_kv" or any(kwargs.get(name) is not None for name in _EXTRAS):
        return None
    if mask is None:  # transformers' own call, where transformers makes it (``use_gqa_in_sdpa``)
        if query.shape[2] != 1 or not transformers_shares_heads(key, value):
            return None
        return F.scaled_dot_product_attention(query, key, value, dropout_p=dropout, scale=scaling, enable_gqa=True)
    if mask.shape[1] != 1:
        return None
    if way == "fold":
        return folded_heads_first(query, key, value, mask, dropout, scaling)
    return F.scaled_dot_product_attention(query, key, value, attn_mask=mask, dropout_p=dropout, scale=scaling,
                                          enable_gqa=True)


def transformers_shares_heads(key: torch.Tensor, value: torch.Tensor) -> bool:
    """Whether transformers' own SDPA function, given no mask, keeps the key/value heads shared
    (``enable_gqa``) for these keys and values on this machine: its own ``use_gqa_in_sdpa``."""
    rule = _gqa_rule()
    return rule is not None and bool(rule(key, value))


@lru_cache(maxsize=1)
def _gqa_rule():
    """transformers' ``use_gqa_in_sdpa`` without a mask, as ``(key, value) -> bool`` whichever of its
    signatures this version has; None where it has none (then transformers' function does the work)."""
    try:
        from transformers.integrations.sdpa_attention import use_gqa_in_sdpa
    except ImportError:
        return None
    if "value" in inspect.signature(use_gqa_in_sdpa).parameters:
        return lambda key, value: use_gqa_in_sdpa(None, key, value)
    return lambda key, value: use_gqa_in_sdpa(None, key)


def packed_attention(module: torch.nn.Module, query: torch.Tensor, mask: torch.Tensor, segments, packed,
                     dropout: float = 0.0, scaling: float | None = None, **kwargs) -> torch.Tensor:
    """Several requests packed in one forward (:mod:`tr_core.batching`): each segment's queries
    ``q0:q1`` attend to its own request's keys alone (``packed.parts``: each request's cache after this
    layer's update, :class:`tr_core.batching.PackedCache`), with its block of the mask (or none, where
    it had none alone), exactly as its own forward would.  The segments' outputs are joined heads first
    and laid out once for the layer.  ``query [1, heads, Q, d]``, ``mask [1, 1, Q, K]`` (every request's
    block) -> ``[1, Q, heads, d]``."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if getattr(module, "layer_idx", packed.layer) != packed.layer:
        raise RuntimeError(f"layer {module.layer_idx} attends without updating the packed cache (it holds layer "
                           f"{packed.layer}'s keys): a model whose layers share keys cannot be packed")
    outs = []
    for s, (keys, values) in zip(segments, packed.parts):
        own = mask[:, :, s.q0:s.q1, s.k0:s.k1] if s.masked else None
        queries = query[:, :, s.q0:s.q1]
        out = shared_kv_heads_first(module, queries, keys, values, own, dropout, scaling, **kwargs)
        if out is None:  # [1, q, heads, d] from transformers, seen heads first again (no copy)
            out = sdpa_attention_forward(module, queries, keys, values, own, dropout=dropout, scaling=scaling,
                                         **kwargs)[0].transpose(1, 2)
        outs.append(out)
    return torch.cat(outs, dim=2).transpose(1, 2).contiguous()


def folded_heads_first(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor,
                       dropout: float = 0.0, scaling: float | None = None) -> torch.Tensor:
    """Grouped-query attention with a mask and no copy of the keys and values: the ``groups`` query
    heads that share a KV head become ``groups * q`` query rows of that head (the mask repeated for
    each).  ``query [b, heads, q, d]``, ``key``/``value [b, kv_heads, kv, d]``, ``mask [b, 1, q, kv]``
    -> ``[b, heads, q, d]``."""
    b, heads, q, d = query.shape
    kv_heads = key.shape[1]
    groups = heads // kv_heads
    folded = query.reshape(b, kv_heads, groups * q, d)  # head h = kv head h // groups, as repeat_kv pairs them
    mask = mask.expand(b, 1, q, mask.shape[-1])[:, :, None].expand(b, 1, groups, q, mask.shape[-1])
    out = F.scaled_dot_product_attention(folded, key, value, attn_mask=mask.reshape(b, 1, groups * q, -1),
                                         dropout_p=dropout, scale=scaling)
    return out.reshape(b, heads, q, value.shape[-1])


def folded_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor,
                     dropout: float = 0.0, scaling: float | None = None) -> torch.Tensor:
    """:func:`folded_heads_first` laid out as transformers' attention functions give it: ``[b, q, heads, d]``."""
    return folded_heads_first(query, key, value, mask, dropout, scaling).transpose(1, 2).contiguous()


def register() -> str:
    """Make ``ATTENTION`` known to transformers (attention and mask functions); returns its name."""
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.masking_utils import sdpa_mask

    AttentionInterface.register(ATTENTION, sdpa_shared_kv)
    AttentionMaskInterface.register(ATTENTION, sdpa_mask)
    return ATTENTION
