"""The forwards of several decoders' steps as one forward: a class of tabs verified together.

Each decoder drafts its step as it would alone (``prepare_step``), and each keeps its own KV cache,
matrix and planner.  Their inputs are packed one after another along the sequence of a single batch
row, so the linear layers (most of a small forward's cost: reading the weights) run once over every
tab's tokens::

    requests = [dec.prepare_step() for dec in decoders]
    for dec, request, logits in zip(decoders, requests, run_forwards(lm, requests)):
        dec.finish_step(request, logits)

Attention must not mix the tabs.  :class:`PackedCache` appends each request's new keys and values to
that request's own cache and hands the layer their concatenation; the model's attention mask is block
diagonal (each request's own mask in its block, everything else masked); and the project's attention
(:mod:`tr_core.attention`) reads ``segments`` and attends each request's queries to its own keys alone,
with the mask it would have had alone.  So every request's logits are those of its own forward: same
keys, same mask, same kernels, and linear-layer rows that do not depend on their neighbours (checked
token for token against ``generate`` and against each decoder run alone, ``tests/test_batching.py``).

Models that run on another attention (Gemma 2's eager one) would see the block-diagonal mask over every
tab's keys, which is right but not bit-identical; their requests run one forward each.
"""
from __future__ import annotations

import threading
import time
from collections import deque
from contextlib import ExitStack
from dataclasses import dataclass

import torch
from transformers import Cache

from .attention import ATTENTION
from .decoders.base import ForwardRequest, model_forward, run_forward
from .models import LoadedModel

SIZES_KEPT = 10_000  # a server runs for days: only the last forwards' sizes are kept


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
    the new keys/values ``[1, kv_heads, Q, d]`` to its own cache and returns the concatenation of
    the updated caches ``[1, kv_heads, sum(past + q), d]``, in request order."""

    def __init__(self, caches: list, spans: list[tuple[int, int]]):
        super().__init__(layers=[])
        self.caches, self.spans = caches, spans

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs):
        keys, values = [], []
        for cache, (a, b) in zip(self.caches, self.spans):
            k, v = cache.update(key_states[:, :, a:b], value_states[:, :, a:b], layer_idx, *args, **kwargs)
            keys.append(k)
            values.append(v)
        return torch.cat(keys, dim=2), torch.cat(values, dim=2)

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
        logits = model_forward(lm, input_ids, position_ids, masks, cache, segments=tuple(segments))  # [Q, vocab]
    # each its own rows (a view would keep every tab's logits alive for as long as one tab keeps its own)
    return [logits[s.q0:s.q1].clone() for s in segments]


def pack_segments(requests: list[ForwardRequest], sliding: bool = False) -> list[Segment]:
    """Where each request sits; a one-token request without a mask attends without one, as it would
    alone (a model with windows masks every token)."""
    segments, q, k = [], 0, 0
    for r in requests:
        n = r.input_ids.shape[1]
        segments.append(Segment(q, q + n, k, k + r.past + n, r.attention_mask is not None or n > 1 or sliding))
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


class Batcher:
    """Gathers the forwards that concurrent callers (a server's tabs, each in its own thread) ask for,
    and runs each gathering as one forward (:func:`run_forwards`).

    Nothing waits on purpose: a caller that finds no forward running runs its own at once (a tab alone
    steps exactly as without a batcher); callers that arrive while a forward runs queue, and when it
    ends the first of them leads the next forward with every queued request of the same model, up to
    ``max_tokens`` query tokens.  The seconds a request spent queued behind an earlier forward are kept
    on its clock as ``"queue"`` (a step's timing leaves them out: :func:`tr_core.race.timed_step`).
    """

    def __init__(self, max_tokens: int = 2048, run_on=None):
        """``run_on(fn, *args)``: where each forward runs (e.g. a ``ModelThread``'s ``run``: every forward on
        one thread, whichever tab leads it); default the leading caller's thread."""
        self.max_tokens, self.run_on = max_tokens, run_on
        self._lock = threading.Lock()
        self._queue: list[_Job] = []
        self._busy = False
        self.sizes: deque[int] = deque(maxlen=SIZES_KEPT)  # requests per forward lately (tests, benchmarks)
        self._ended = float("-inf")  # when the last forward ended

    def on_model(self, fn, /, *args, **kwargs):
        """``fn(*args, **kwargs)`` where this batcher runs its forwards (``run_on``), else on the caller's thread."""
        return self.run_on(fn, *args, **kwargs) if self.run_on is not None else fn(*args, **kwargs)

    def idle_seconds(self) -> float:
        """Seconds since the last forward ended (0 while one runs or waits): whether the machine idled."""
        with self._lock:
            return 0.0 if self._busy else time.perf_counter() - self._ended

    def run(self, lm: LoadedModel, requests: list[ForwardRequest]) -> list[torch.Tensor]:
        """``run_forwards(lm, requests)``, in one forward with whatever else is waiting."""
        job = _Job(lm, list(requests))
        with self._lock:
            self._queue.append(job)
            job.lead, self._busy = not self._busy, True
        if not job.lead:
            job.ready.wait()
        if job.lead:
            self._lead()
        if job.error is not None:
            raise job.error
        return job.logits

    def _take(self) -> list["_Job"]:
        """The next forward's jobs: the first queued one's model, in arrival order, within the budget."""
        with self._lock:
            lm, batch, tokens = self._queue[0].lm, [], 0
            for job in self._queue:
                n = job.tokens
                if job.lm is lm and (not batch or tokens + n <= self.max_tokens):
                    batch.append(job)
                    tokens += n
            self._queue = [j for j in self._queue if j not in batch]
        return batch

    def _lead(self) -> None:
        batch = self._take()
        self._forward(batch)
        with self._lock:
            after = self._queue[0] if self._queue else None
            self._busy, self._ended = after is not None, time.perf_counter()
            if after is not None:
                after.lead = True
        for job in batch:
            job.ready.set()
        if after is not None:
            after.ready.set()

    def _forward(self, batch: list["_Job"]) -> None:
        """One forward of every request of ``batch``; each job gets its logits, or the error."""
        started = time.perf_counter()
        requests = [r for job in batch for r in job.requests]
        for job in batch:
            for r in job.requests:
                r.clock.add("queue", started - job.queued)
        try:
            logits = self.on_model(run_forwards, batch[0].lm, requests)
            for job in batch:
                job.logits, logits = logits[:len(job.requests)], logits[len(job.requests):]
        except BaseException as err:  # out of memory, a device error: every tab in it hears of it
            for job in batch:
                job.error = err
        self.sizes.append(len(requests))


class _Job:
    def __init__(self, lm: LoadedModel, requests: list[ForwardRequest]):
        self.lm, self.requests = lm, requests
        self.tokens = sum(r.input_ids.shape[1] for r in requests)
        self.queued = time.perf_counter()
        self.ready = threading.Event()
        self.lead = False
        self.logits: list[torch.Tensor] | None = None
        self.error: BaseException | None = None
