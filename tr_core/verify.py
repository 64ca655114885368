"""Phase 3: verify a draft tree against the model's greedy choices."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .trees import TreeTensors


@dataclass
class Verdict:
    """The longest accepted path (node indices, root first), the bonus token and the model's choices."""

    path: torch.Tensor  # [a + 1] long, node 0 (root) then the accepted draft nodes in depth order
    bonus: torch.Tensor  # 0-d long: the model's own next token after the last accepted node
    choices: torch.Tensor  # [q] long: argmax of the logits at each input


def verify_greedy(tokens: torch.Tensor, logits: torch.Tensor, tree: TreeTensors) -> Verdict:
    """Accept the longest root-to-node path whose tokens equal the argmax at their parent.

    ``tokens [q]`` (root first), ``logits [q, vocab]``.  A node is *alive* when it and all its
    ancestors match; the deepest alive node wins (ties: the lowest index, i.e. the best ranks).
    """
    choices = logits.argmax(dim=-1)  # [q]
    match = tokens == choices[tree.parents]  # [q]; node 0 compares with itself, forced True below
    match[0] = True
    alive = ~(tree.ancestors & ~match[None, :]).any(dim=1)  # [q]
    best = torch.where(alive, tree.depths, -1).argmax()
    path = tree.ancestors[best].nonzero().squeeze(1)  # BFS order = depth order
    return Verdict(path=path, bonus=choices[best], choices=choices)
