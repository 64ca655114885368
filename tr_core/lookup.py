"""Prompt lookup: continue the last n-gram of the context from its earliest earlier occurrence.

As Spec-Bench's PLD baseline and transformers' ``prompt_lookup_num_tokens``: try n = max..min,
take the first match whose continuation is non-empty, return up to ``max_draft`` tokens.
"""
from __future__ import annotations

import torch


def lookup_continuation(context: torch.Tensor, max_draft: int = 10, max_ngram: int = 3,
                        min_ngram: int = 1) -> list[int]:
    """``context [L]`` (CPU long) -> up to ``max_draft`` draft tokens (possibly none)."""
    return lookup_with_ngram(context, max_draft, max_ngram, min_ngram)[0]


def lookup_with_ngram(context: torch.Tensor, max_draft: int = 10, max_ngram: int = 3,
                      min_ngram: int = 1) -> tuple[list[int], int]:
    """As ``lookup_continuation``, also returning the n-gram size that matched (0: none)."""
    length = context.shape[0]
    for n in range(min(max_ngram, length - 1), min_ngram - 1, -1):
        windows = context[:-1].unfold(0, n, 1)  # [L - n, n], excludes the n-gram itself
        hits = (windows == context[-n:]).all(dim=1).nonzero().squeeze(1)
        if hits.numel():
            start = int(hits[0]) + n
            return context[start:start + max_draft].tolist(), n
    return [], 0


def graft_point(tokens: list[int], children: list[list[int]], chain: list[int]) -> tuple[int, list[int]]:
    """Walk ``chain`` down the drafted tree from the root while its tokens are already there.

    Returns the node to hang the rest under and the rest (deduplicated against the tree).
    """
    node = 0
    for i, tok in enumerate(chain):
        nxt = next((c for c in children[node] if tokens[c] == tok), None)
        if nxt is None:
            return node, chain[i:]
        node = nxt
    return node, []
