"""Drafts copied from the context.

* ``lookup_continuation`` / ``lookup_with_ngram``: prompt lookup, as Spec-Bench's PLD baseline and
  transformers' ``prompt_lookup_num_tokens``: continue the last n-gram (n = max..min) from its earliest
  earlier occurrence (what ``pld`` runs);
* ``lookup_longest``: retrieval over the whole context, the continuation of the longest suffix match
  (what Token Recycling grafts into its tree);
* ``graft_point``: where a continuation joins a drafted tree;
* ``until_control``: a continuation cut before the chat template's control tokens (``control_tokens``).
"""
from __future__ import annotations

import numpy as np
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


MATCH_BUCKETS = (1, 2, 3, 4, 8, 16)  # matched suffix lengths the planner keeps statistics for


def match_bucket(n: int) -> int:
    """The statistics key of a suffix match of ``n`` tokens: the largest of ``MATCH_BUCKETS`` <= n."""
    return max((b for b in MATCH_BUCKETS if b <= n), default=0)


def lookup_longest(context: torch.Tensor, max_draft: int = 10, max_match: int = 32) -> tuple[list[int], int]:
    """Retrieval over the whole context: the earlier place whose preceding tokens agree longest
    with the context's end (a suffix match, up to ``max_match`` tokens; ties: the most recent place),
    and up to ``max_draft`` tokens that followed it there.

    ``context [L]`` (CPU long).  Returns the continuation and the match length (0: the last token
    occurs nowhere before).  Longer than a 3-gram lookup's match, it tells a copy (a quoted
    sentence, a repeated code line) from a common word, and the planner trusts it accordingly.
    """
    c = context.cpu().numpy()
    end = c.shape[0] - 1
    if end < 1:
        return [], 0
    places = np.flatnonzero(c[:end] == c[end])  # j: c[j] == the last token, j < end
    if places.size == 0:
        return [], 0
    length = 1
    while length < max_match:
        back = places - length
        ok = back >= 0
        ok[ok] = c[back[ok]] == c[end - length]
        if not ok.any():
            break
        places, length = places[ok], length + 1
    start = int(places[-1]) + 1  # the most recent of the longest matches
    text = c.tolist()
    for i in range(max_draft - (end + 1 - start)):  # the continuation runs into the end of the context:
        text.append(text[start + i])  # a loop of period end + 1 - start, which the copy goes on repeating
    return text[start:start + max_draft], length


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


def control_tokens(tokenizer) -> frozenset:
    """The tokenizer's special tokens: its named ones and every added token marked special (a chat
    template's ``<|start_header_id|>`` and the like); empty without a tokenizer."""
    named = set(getattr(tokenizer, "all_special_ids", None) or ())
    added = getattr(tokenizer, "added_tokens_decoder", None) or {}
    return frozenset(named | {int(i) for i, t in added.items() if getattr(t, "special", False)})


def until_control(chain: list[int], control: frozenset, eos: tuple[int, ...]) -> list[int]:
    """``chain`` up to its first control token (the chat template's ``<|im_start|>`` and the like, which a
    reply never holds), an end of turn (``eos``) kept as its last: a copy runs up to the end of a turn,
    never into the template's next one."""
    for i, t in enumerate(chain):
        if t in control:
            return chain[:i + 1] if t in eos else chain[:i]
    return chain
