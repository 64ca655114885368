"""The forwards of several decoders' steps as one forward: a class of tabs verified together.

Each decoder drafts its step as it would alone (``prepare_step``), and each keeps its own KV cache,
matrix and planner.  Their inputs are packed one after another along the sequence of a single batch
row, so the linear layers (most of a small forward's cost: reading the weights) run once over every
tab's tokens::

    requests = [dec.prepare_step() for dec in decoders]
    for dec, request, logits in zip(decoders, requests, run_forwards(lm, requests)):
        dec.finish_step(request, logits)

Attention must not mix the tabs.  :class:`PackedCache` appends each request's new keys and values to
that request's own cache; the model's attention mask is block diagonal (each request's own mask in its
block, everything else masked); and the project's attention (:mod:`tr_core.attention`) reads
``segments`` and attends each request's queries to its own cache's keys alone, with the mask it would
have had alone.  So every request's logits are those of its own forward: same
keys, same mask, same kernels, and linear-layer rows that do not depend on their neighbours (checked
token for token against ``generate`` and against each decoder run alone, ``tests/test_batching.py``).

Across threads (a server's tabs), :class:`tr_core.rounds.Batcher` gathers whole steps into rounds whose
forwards run here.

Models that run on another attention (Gemma 2's eager one) would see the block-diagonal mask over every
tab's keys, which is right but not bit-identical; their requests run one forward each.
"""
from __future__ import annotations

from contextlib import ExitStack
from dataclasses import dataclass

import torch
from transformers import Cache

from .attention import ATTENTION
from .decoders.base import ForwardRequest, last_hidden_states, model_forward, run_forward, take_hidden
from .models import LoadedModel


@dataclass(frozen=True)
class Segment:
    """One request's place in a packed forward: its queries ``q0:q1``, its keys ``k0:k1`` (its cache
    and its new tokens), and whether it had a mask of its own (a one-token step alone has none)."""

    q0: int
    q1: int
    k0: int
    k1: int
    masked: bool


class PackedCache(Cache):
    """Several requests' caches seen by the model as one: ``update`` appends each request's slice of
    the new keys/values ``[1, kv_heads, Q, d]`` to its own cache and keeps each request's updated
    keys/values in ``parts`` for the attention (:func:`tr_core.attention.packed_attention`, which the
    forward hands this cache as ``packed``), so no layer copies every tab's cache into one tensor.
    What it returns to the layer (the new keys/values alone) is only passed on to that attention,
    which reads ``parts`` instead."""

    def __init__(self, caches: list, spans: list[tuple[int, int]]):
        super().__init__(layers=[])
        self.caches, self.spans = caches, spans
        self.parts: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.layer: int | None = None

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs):
        self.parts = [cache.update(key_states[:, :, a:b], value_states[:, :, a:b], layer_idx, *args, **kwargs)
                      for cache, (a, b) in zip(self.caches, self.spans)]
        self.layer = layer_idx  # whose keys ``parts`` hold (the attention that reads them checks)
        return key_states, value_states

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return sum(cache.get_seq_length(layer_idx) for cache in self.caches)


def can_pack(lm: LoadedModel) -> bool:
    """Whether ``lm`` runs on the project's attention, which keeps packed requests apart exactly."""
    return getattr(lm.model.config, "_attn_implementation", None) == ATTENTION


@torch.inference_mode()
def run_forwards(lm: LoadedModel, requests: list[ForwardRequest]) -> list[torch.Tensor]:
    """Every request's ``logits [q_i, vocab]``, from one forward where ``lm`` allows it (else one
    forward each).  Each request's clock records the whole forward as its ``"forward"`` phase: the
    time its tab waited for it."""
    if len(requests) <= 1 or not can_pack(lm):
        return [run_forward(lm, r) for r in requests]
    segments = pack_segments(requests, lm.layout.sliding)
    for r in requests:
        r.batch, r.batch_tokens = len(requests), segments[-1].q1
    masks = packed_masks(lm, requests, segments)
    cache = PackedCache([r.cache for r in requests], [(s.q0, s.q1) for s in segments])
    input_ids = torch.cat([r.input_ids for r in requests], dim=1)  # [1, Q]
    position_ids = torch.cat([r.position_ids for r in requests], dim=1)  # [1, Q]
    with ExitStack() as clocks:
        for r in requests:
            clocks.enter_context(r.clock.phase("forward"))
        found = clocks.enter_context(last_hidden_states(lm, any(r.hidden_rows is not None for r in requests)))
        keep, spans = kept_rows(requests, segments, input_ids.device)
        logits = model_forward(lm, input_ids, position_ids, masks, cache, keep, segments=tuple(segments),
                               packed=cache)  # [R, vocab]
    for r, s in zip(requests, segments):
        take_hidden(r, found, s.q0)
    # each its own rows (a view would keep every tab's logits alive for as long as one tab keeps its own)
    return [logits[a:b].clone() for a, b in spans]


def kept_rows(requests: list[ForwardRequest], segments: list[Segment], device) -> tuple:
    """(the positions of the packed forward whose logits are wanted: 0 for all, else ``[R]``; each
    request's ``(start, end)`` in those logits).  Where no request names its ``rows`` the head runs
    over every position."""
    if all(r.rows is None for r in requests):
        return 0, [(s.q0, s.q1) for s in segments]
    parts, spans, n = [], [], 0
    for r, s in zip(requests, segments):
        own = torch.arange(s.q1 - s.q0) if r.rows is None else r.rows
        parts.append(own + s.q0)
        spans.append((n, n + len(own)))
        n += len(own)
    return torch.cat(parts).to(device), spans


def pack_segments(requests: list[ForwardRequest], sliding: bool = False) -> list[Segment]:
    """Where each request sits; a request without a mask attends without one where it would alone (one
    token, or a prefill of an empty cache, causal by itself); a model with windows masks every token."""
    segments, q, k = [], 0, 0
    for r in requests:
        n = r.input_ids.shape[1]
        # alone, a request without a mask attends causally by itself (is_causal) where it starts the cache
        masked = r.attention_mask is not None or sliding or (n > 1 and r.past > 0)
        segments.append(Segment(q, q + n, k, k + r.past + n, masked))
        q, k = q + n, k + r.past + n
    return segments


def packed_masks(lm: LoadedModel, requests: list[ForwardRequest], segments: list[Segment]):
    """The block-diagonal additive mask ``[1, 1, Q, K]`` (or one per layer type): each request's own
    mask in its block (a causal one, with the layer's window, where it had none), the rest masked."""
    dtype = next((_first(r.attention_mask).dtype for r in requests if r.attention_mask is not None), lm.dtype)
    device = requests[0].input_ids.device
    q, k = segments[-1].q1, segments[-1].k1
    out = {}
    for kind, window in lm.layout.windows.items():
        mask = torch.full((1, 1, q, k), torch.finfo(dtype).min, dtype=dtype, device=device)
        for r, s in zip(requests, segments):
            own = r.attention_mask
            own = own[kind] if isinstance(own, dict) else own
            if own is None:
                own = causal_mask(r.past, s.q1 - s.q0, window, dtype, device)
            mask[:, :, s.q0:s.q1, s.k0:s.k1] = own
        out[kind] = mask
    return next(iter(out.values())) if len(out) == 1 else out


def causal_mask(past: int, q: int, window: int | None, dtype: torch.dtype, device) -> torch.Tensor:
    """``[1, 1, q, past + q]``: token ``i`` (at position ``past + i``) sees the cache and the tokens
    before it, within ``window`` positions where the layer has one."""
    query = torch.arange(past, past + q, device=device)[:, None]
    key = torch.arange(past + q, device=device)[None, :]
    hidden = key > query
    if window is not None:
        hidden |= query - key >= window
    mask = torch.zeros(1, 1, q, past + q, dtype=dtype, device=device)
    return mask.masked_fill_(hidden, torch.finfo(dtype).min)


def _first(mask):
    return next(iter(mask.values())) if isinstance(mask, dict) else mask
