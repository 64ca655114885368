"""Pair rows: the top-k next tokens last seen after a *pair* of tokens, beside ``M``'s rows by token.

``M[t]`` forgets what came before ``t``: after "of the" and after "in the" it drafts the same
continuation.  A pair row ``P[(s, t)]`` holds the top-k seen after ``s`` followed by ``t``, written
from the same logits as ``M[t]`` (the recycling of every tree node: a node's parent is ``s``, the
node ``t``).  Retrieval drafts a node's children from its pair row where that pair has been seen,
else from ``M[t]``: an unseen pair falls back to ``M``, so pair rows never make a node blank.

The rows live in a fixed-size hash table on the model's device (``slots x k`` int32, with the
pair's key per slot), so its memory is bounded however long a server runs: where two pairs share a
slot, the last write wins, as in ``M``.  Decoding stays lossless whatever the table holds: rows
only propose drafts, the model verifies them.
"""
from __future__ import annotations

import torch

SLOTS = 1 << 18  # 262,144 pairs: 8 MiB of rows at k = 8, plus 2 MiB of keys (fewer for a tiny vocabulary)
_MIX = 0x9E3779B97F4A7C15 - (1 << 64)  # Fibonacci hashing's odd constant, as a signed 64-bit integer


def default_slots(vocab_size: int) -> int:
    """``SLOTS``, or fewer where the vocabulary makes fewer pairs (below about 360 tokens): a small
    model's table then has room for every pair twice over."""
    return min(SLOTS, 1 << (2 * vocab_size * vocab_size - 1).bit_length())


class PairRows:
    """``rows [slots, k]`` int32 token ids and ``keys [slots]`` int64 (``-1``: never written)."""

    def __init__(self, vocab_size: int, k: int, device: torch.device | str = "cpu", slots: int | None = None):
        """``slots``: a power of two (default: :func:`default_slots`)."""
        slots = default_slots(vocab_size) if slots is None else slots
        if slots < 2 or slots & (slots - 1):
            raise ValueError("slots must be a power of two, at least 2")
        self.vocab_size = vocab_size
        self.rows = torch.zeros(slots, k, dtype=torch.int32, device=device)
        self.keys = torch.full((slots,), -1, dtype=torch.long, device=device)

    @property
    def nbytes(self) -> int:
        return self.rows.numel() * self.rows.element_size() + self.keys.numel() * self.keys.element_size()

    @property
    def written(self) -> int:
        """Slots holding a pair's row."""
        return int((self.keys >= 0).sum())

    def reset(self) -> None:
        self.rows.zero_()
        self.keys.fill_(-1)

    def _locate(self, before: torch.Tensor, token: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Each pair's key and slot (``before [n]``, ``token [n]`` long)."""
        key = before * self.vocab_size + token  # [n], unique per pair
        shift = 64 - (self.keys.shape[0].bit_length() - 1)
        slot = ((key * _MIX) >> shift) & (self.keys.shape[0] - 1)  # the product's top bits (it wraps)
        return key, slot

    def lookup(self, before: torch.Tensor, token: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The rows of the pairs ``(before[i], token[i])``: ``(rows [n, k], seen [n] bool)``; a row is
        meaningful only where ``seen``."""
        key, slot = self._locate(before, token)
        return self.rows[slot], (self.keys[slot] == key) & (key >= 0)

    def write(self, before: torch.Tensor, token: torch.Tensor, top: torch.Tensor) -> None:
        """``P[(before[i], token[i])] = top[i]`` (``top [n, k]``, already in write order: where two
        entries share a slot, the later wins); entries whose ``before`` is negative have no pair
        (the text's first token) and are skipped."""
        valid = before >= 0
        key, slot = self._locate(before[valid], token[valid])
        keep = last_of_each(slot)  # [n'] bool: O(n log n), however many pairs a file restores at once
        self.rows[slot[keep]] = top[valid][keep].to(torch.int32)
        self.keys[slot[keep]] = key[keep]

    def written_tensors(self) -> dict[str, torch.Tensor]:
        """The written pairs alone, on the host, for a file or a pickle (a warmed table is mostly
        empty): ``pair_keys [w]`` and ``pair_rows [w, k]``; the slots follow from the keys."""
        slots = (self.keys >= 0).nonzero().squeeze(1)
        return {"pair_keys": self.keys[slots].cpu().contiguous(), "pair_rows": self.rows[slots].cpu().contiguous()}

    def load_written(self, saved: dict[str, torch.Tensor]) -> None:
        """Restore what ``written_tensors`` gave (into a table of any size: each pair is hashed
        again); ``ValueError`` where it does not fit this vocabulary or ``k``."""
        try:
            keys, rows = saved["pair_keys"], saved["pair_rows"]
        except KeyError as err:
            raise ValueError(f"{err.args[0]} is missing") from None
        if keys.dtype != torch.long or rows.dtype != torch.int32 or keys.dim() != 1 or rows.dim() != 2:
            raise ValueError("shapes or types of another table")
        if rows.shape != (keys.shape[0], self.rows.shape[1]):
            raise ValueError(f"{rows.shape[0]} rows of {rows.shape[1]} for {keys.shape[0]} keys and k = {self.rows.shape[1]}")
        if keys.shape[0] and not (0 <= int(rows.min()) and int(rows.max()) < self.vocab_size
                                  and 0 <= int(keys.min()) and int(keys.max()) < self.vocab_size ** 2):
            raise ValueError("keys or token ids out of range")
        self.reset()
        keys, rows = keys.to(self.keys.device), rows.to(self.rows.device)
        self.write(keys // self.vocab_size, keys % self.vocab_size, rows)

    def __getstate__(self) -> dict:
        """Pickled (a ZeroGPU call's arguments and results) as its written pairs alone."""
        return {"vocab_size": self.vocab_size, "k": self.rows.shape[1], "slots": self.keys.shape[0],
                "device": str(self.keys.device), **self.written_tensors()}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["vocab_size"], state["k"], state["device"], state["slots"])
        self.load_written(state)

    def to(self, device) -> "PairRows":
        out = PairRows.__new__(PairRows)
        out.vocab_size, out.rows, out.keys = self.vocab_size, self.rows.to(device), self.keys.to(device)
        return out

    def narrowed(self, k: int) -> "PairRows":
        """A copy holding each row's first ``k`` candidates."""
        out = PairRows.__new__(PairRows)
        out.vocab_size, out.rows, out.keys = self.vocab_size, self.rows[:, :k].clone(), self.keys.clone()
        return out


def last_of_each(values: torch.Tensor) -> torch.Tensor:
    """``[n] bool``: True at the last occurrence of each value in ``values [n]`` (a stable sort groups
    equal values in their order; the last of each group is kept)."""
    order = torch.argsort(values, stable=True)
    grouped = values[order]
    last = torch.ones_like(grouped, dtype=torch.bool)
    last[:-1] = grouped[1:] != grouped[:-1]
    keep = torch.zeros_like(last)
    keep[order[last]] = True
    return keep
