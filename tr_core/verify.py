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
    choices: torch.Tensor  # [q] long: the model's token after each input (argmax, or the draw when sampling)


def verify_greedy(tokens: torch.Tensor, logits: torch.Tensor, tree: TreeTensors) -> Verdict:
    """Accept the longest root-to-node path whose tokens equal the argmax at their parent.

    ``tokens [q]`` (root first), ``logits [q, vocab]``.  A node is *alive* when it and all its
    ancestors match; the deepest alive node wins (ties: the lowest index, i.e. the best ranks).
    """
    return accept_path(tokens, logits.argmax(dim=-1), tree)


def verify_sampled(tokens: torch.Tensor, logits: torch.Tensor, tree: TreeTensors, sampler,
                   positions: torch.Tensor) -> Verdict:
    """Lossless sampling (see ``tr_core.sampling``): a draw at every node (``positions [q]``: each
    node's position, which picks its uniform); walk from the root to the child equal to the draw,
    while there is one; commit the draws along the walk.

    Children with a token equal to an earlier sibling's are skipped, so that at most one child
    can match a draw and the walk never looks at draws below it to choose a branch (which would
    bias the output towards drafted tokens)."""
    draws = sampler.draw(logits, positions)  # [q]
    q = tokens.shape[0]
    idx = torch.arange(q, device=tokens.device)
    twin = (tree.parents[:, None] == tree.parents[None, :]) & (tokens[:, None] == tokens[None, :]) \
        & (idx[None, :] < idx[:, None]) & (idx[None, :] > 0)  # [q, q]: j is an earlier sibling of i, same token
    return accept_path(tokens, draws, tree, skip=twin.any(dim=1))


def accept_path(tokens: torch.Tensor, choices: torch.Tensor, tree: TreeTensors,
                skip: torch.Tensor | None = None) -> Verdict:
    """The deepest node whose path from the root matches ``choices [q]`` (the model's token after
    each node) at every level; ``skip [q]`` bool marks nodes never to accept."""
    match = tokens == choices[tree.parents.clamp(min=0)]  # [q]; the root (parent -1) is forced True below
    if skip is not None:
        match &= ~skip
    match[0] = True
    alive = ~(tree.ancestors & ~match[None, :]).any(dim=1)  # [q]
    best = torch.where(alive, tree.depths, -1).argmax()
    path = tree.ancestors[best].nonzero().squeeze(1)  # BFS order = depth order
    return Verdict(path=path, bonus=choices[best], choices=choices)
