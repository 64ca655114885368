"""The KV cache of a tree step: grown in place, and pruned to the accepted path (phase 5)."""
from __future__ import annotations

import torch
from transformers import DynamicLayer
from transformers.cache_utils import Cache

GROW_TOKENS = 128  # the least a layer's buffer grows by (its tokens); else a quarter of what it holds


class GrowingLayer(DynamicLayer):
    """A full layer of keys and values ``[batch, kv_heads, seq, d]`` written into spare room of a
    buffer instead of concatenated into a new tensor at every forward (transformers' ``DynamicLayer``
    copies the whole cache each time: a tree step then pays for the context twice, once for its
    keys and once for its values, on every layer).

    ``keys`` and ``values`` stay what ``DynamicLayer`` offers, the first ``seq`` entries, as views of
    the buffers; ``crop`` only shortens the views.  The attention reads the same numbers through a
    view as through a copy (bit for bit: ``tests/test_cache.py``).  The buffers grow by
    ``max(GROW_TOKENS, seq / 4)`` tokens when full, so about that much room is held spare (plus, after
    a tree step is cropped to its accepted path, the rest of the tree's room)."""

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        super().lazy_initialization(key_states, value_states)
        self.key_buffer = self.value_buffer = None
        self.length = 0

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        """Append ``[batch, kv_heads, q, d]`` new keys/values; -> the cache's keys/values with them."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        end = self.length + key_states.shape[-2]
        if self.key_buffer is None or end > self.key_buffer.shape[-2]:
            self._grow(key_states, value_states, end)
        self.key_buffer[..., self.length:end, :] = key_states
        self.value_buffer[..., self.length:end, :] = value_states
        self._view(end)
        return self.keys, self.values

    def _grow(self, key_states: torch.Tensor, value_states: torch.Tensor, end: int) -> None:
        room = end + max(GROW_TOKENS, end // 4)
        keys = key_states.new_empty(*key_states.shape[:-2], room, key_states.shape[-1])
        values = value_states.new_empty(*value_states.shape[:-2], room, value_states.shape[-1])
        if self.length:
            keys[..., :self.length, :] = self.keys
            values[..., :self.length, :] = self.values
        self.key_buffer, self.value_buffer = keys, values

    def _view(self, length: int) -> None:
        self.length = length
        self.keys = self.key_buffer[..., :length, :]
        self.values = self.value_buffer[..., :length, :]

    def crop(self, tokens_to_remove: int) -> None:
        """Drop the last ``-tokens_to_remove`` entries (a negative count, as ``DynamicLayer`` takes it)."""
        if tokens_to_remove > 0:
            raise ValueError(f"crop takes the (negative) number of entries to remove, not {tokens_to_remove}")
        if tokens_to_remove and self.is_initialized and self.key_buffer is not None:
            self._view(max(0, self.length + tokens_to_remove))

    def reset(self) -> None:
        super().reset()
        self.key_buffer = self.value_buffer = None
        self.length = 0

    def batch_repeat_interleave(self, repeats: int) -> None:
        super().batch_repeat_interleave(repeats)
        self._adopt()

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        super().batch_select_indices(indices)
        self._adopt()

    def _adopt(self) -> None:
        """After ``DynamicLayer`` replaced ``keys``/``values`` by new tensors: they become the buffers."""
        if self.is_initialized and self.keys is not None and self.keys.numel():
            self.key_buffer, self.value_buffer = self.keys, self.values
            self.length = self.keys.shape[-2]


def new_cache() -> Cache:
    """An empty cache for tree decoding: a full :class:`GrowingLayer` for every layer (sliding-window
    layers too: :mod:`tr_core.layout` says why the window is applied by the mask instead)."""
    return Cache(layer_class_to_replicate=GrowingLayer)


@torch.inference_mode()
def copy_cache(cache: Cache, into: Cache) -> Cache:
    """``into`` (an empty cache) given a copy of every layer's keys and values ``[batch, kv_heads, seq, d]``
    of ``cache``; returns ``into``.  Two decoders of one prompt on one model: the second starts where the
    first one's prefill left its cache, the entries its own prefill would have written."""
    for index, layer in enumerate(cache.layers):
        if layer.is_initialized and layer.keys is not None:
            into.update(layer.keys, layer.values, index)  # written into ``into``'s own buffers
    return into


@torch.inference_mode()
def keep_accepted_kv(cache, start: int, keep: list[int]) -> None:
    """Compact a step's KV entries to the accepted ones.

    Before: every layer holds ``start + q`` entries, the last ``q`` from this step's inputs.
    ``keep [a]`` (ascending indices into the step's inputs) are moved to slots
    ``start .. start + a - 1``; the rest is cropped.  Keys/values are ``[batch, heads, seq, dim]``.
    """
    total = cache.get_seq_length()
    a = len(keep)
    if keep[-1] != a - 1:  # otherwise keep == arange(a): nothing to move
        device = cache.layers[0].keys.device
        src = torch.tensor(keep, dtype=torch.long, device=device) + start
        for layer in cache.layers:
            layer.keys[:, :, start:start + a] = layer.keys.index_select(2, src)
            layer.values[:, :, start:start + a] = layer.values.index_select(2, src)
    removed = total - start - a
    if removed:
        cache.crop(-removed)
