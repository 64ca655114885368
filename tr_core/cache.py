"""Phase 5: keep only the accepted path's KV entries."""
from __future__ import annotations

import torch

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
