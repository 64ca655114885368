"""A static draft-tree shape as data.

A tree is a list of *rank paths*: ``[0, 2]`` is the third candidate under the first candidate of
the root.  Node ``[a, b, c]`` holds ``M[M[M[root][a]][b]][c]``.  In tensors the root is node 0 and
the draft nodes follow in BFS order (by depth, then by path), so every parent precedes its children
and each depth is one contiguous slice.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cached_property, lru_cache
from pathlib import Path

import torch

PRESET_DIR = Path(__file__).with_name("tree_presets")
MAX_DEPTH = 16
MAX_NODES = 512


class TreeError(ValueError):
    """An invalid tree definition."""


@dataclass(frozen=True)
class TreeShape:
    """A validated tree shape: ``paths[i]`` is the rank path of draft node ``i + 1``."""

    name: str
    paths: tuple[tuple[int, ...], ...]

    @classmethod
    def from_paths(cls, paths, name: str = "custom", k: int | None = None) -> "TreeShape":
        """Validate rank paths (no duplicates, parents present, depth and rank bounds) and sort to BFS."""
        if not isinstance(paths, (list, tuple)) or not paths:
            raise TreeError("A tree needs at least one node (a non-empty list of rank paths).")
        if len(paths) > MAX_NODES:
            raise TreeError(f"A tree may have at most {MAX_NODES} nodes; this one has {len(paths)}.")
        seen: set[tuple[int, ...]] = set()
        for raw in paths:
            if not isinstance(raw, (list, tuple)) or not raw:
                raise TreeError(f"Each node must be a non-empty list of ranks, got {raw!r}.")
            if not all(isinstance(r, int) and not isinstance(r, bool) and r >= 0 for r in raw):
                raise TreeError(f"Ranks must be non-negative integers, got {list(raw)!r}.")
            path = tuple(raw)
            if path in seen:
                raise TreeError(f"Duplicate node {list(path)!r}.")
            if len(path) > MAX_DEPTH:
                raise TreeError(f"Node {list(path)!r} is deeper than the limit of {MAX_DEPTH}.")
            if k is not None and max(path) >= k:
                raise TreeError(f"Node {list(path)!r} uses rank {max(path)}, but rows hold only k={k} candidates.")
            seen.add(path)
        for path in seen:
            if len(path) > 1 and path[:-1] not in seen:
                raise TreeError(f"Node {list(path)!r} has no parent {list(path[:-1])!r} in the tree.")
        return cls(name=name, paths=tuple(sorted(seen, key=lambda p: (len(p), p))))

    @classmethod
    def empty(cls) -> "TreeShape":
        """No draft nodes: a step is then a plain one-token forward (the planner's fallback)."""
        return cls(name="none", paths=())

    def subtree(self, paths, name: str) -> "TreeShape":
        """A parent-closed subset of this tree's nodes."""
        return TreeShape.from_paths([list(p) for p in paths], name=name) if paths else TreeShape.empty()

    # ---- plain facts (root = node 0) -------------------------------------------------
    @property
    def size(self) -> int:
        """Number of draft nodes (the root not counted)."""
        return len(self.paths)

    @property
    def depth(self) -> int:
        return len(self.paths[-1]) if self.paths else 0

    @property
    def max_rank(self) -> int:
        return max((max(p) for p in self.paths), default=-1)

    @cached_property
    def parents(self) -> tuple[int, ...]:
        index = {p: i + 1 for i, p in enumerate(self.paths)}
        return (-1,) + tuple(index.get(p[:-1], 0) for p in self.paths)

    @property
    def depths(self) -> tuple[int, ...]:
        return (0,) + tuple(len(p) for p in self.paths)

    @property
    def ranks(self) -> tuple[int, ...]:
        return (0,) + tuple(p[-1] for p in self.paths)

    @cached_property
    def children(self) -> tuple[tuple[int, ...], ...]:
        """Child node indices of every node (root = 0)."""
        out: list[list[int]] = [[] for _ in range(self.size + 1)]
        for i, p in enumerate(self.parents[1:], start=1):
            out[p].append(i)
        return tuple(tuple(c) for c in out)

    def nodes_per_depth(self) -> list[int]:
        counts = [0] * self.depth
        for p in self.paths:
            counts[len(p) - 1] += 1
        return counts

    def to_json(self) -> dict:
        return {"name": self.name, "nodes": [list(p) for p in self.paths]}

    def tensors(self, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32) -> "TreeTensors":
        return TreeTensors.build(self, torch.device(device), dtype)


@dataclass(frozen=True)
class TreeTensors:
    """Everything a step needs about a shape, precomputed once on the model's device.

    ``n`` = draft nodes, ``q = n + 1`` = query tokens of a step (root first).
    """

    shape: TreeShape | None  # None for trees built at run time (PTD's tries)
    parents: torch.Tensor  # [q] long, -1 for the root (and for the top of any other tree of a forest)
    depths: torch.Tensor  # [q] long
    ranks: torch.Tensor  # [q] long
    ancestors: torch.Tensor  # [q, q] bool, ancestors[i, j] = j is i or an ancestor of i
    attn_bias: torch.Tensor  # [q, q] float, 0 where ancestors else the dtype's minimum
    levels: tuple[tuple[int, int], ...]  # (start, end) node slice of each depth 1..D
    kept: torch.Tensor | None = None  # [q] long, after ``select``: each node's index in the tree it came from

    @classmethod
    def build(cls, shape: TreeShape, device: torch.device, dtype: torch.dtype) -> TreeTensors:
        levels, start = [], 1
        for count in shape.nodes_per_depth():
            levels.append((start, start + count))
            start += count
        return cls.from_parents(list(shape.parents), list(shape.depths), device, dtype,
                                ranks=list(shape.ranks), shape=shape, levels=tuple(levels))

    @classmethod
    def from_parents(cls, parents: list[int], depths: list[int], device: torch.device, dtype: torch.dtype,
                     ranks: list[int] | None = None, shape: TreeShape | None = None,
                     levels: tuple = ()) -> TreeTensors:
        """Tensors of any forest given as ``parents [q]`` (parents before children; node 0 is the
        root, its parent -1).  A node with parent -1 (besides the root) starts a tree of its own that
        sees only the cache: PTD's draft branches ride along in the same forward that way.  ``depths``
        give the positions (prefix length + depth)."""
        q = len(parents)
        anc = torch.eye(q, dtype=torch.bool)
        for below, above in generations(parents):  # a node's row: itself and its parent's row
            anc[below] |= anc[above]
        bias = torch.zeros(q, q, dtype=dtype)
        bias.masked_fill_(~anc, torch.finfo(dtype).min)
        as_long = lambda xs: torch.tensor(xs, dtype=torch.long, device=device)  # noqa: E731
        return cls(shape=shape, parents=as_long([p if i else -1 for i, p in enumerate(parents)]), depths=as_long(depths),
                   ranks=as_long(ranks if ranks is not None else [0] * q), ancestors=anc.to(device),
                   attn_bias=bias.to(device), levels=levels)

    def head(self, m: int) -> TreeTensors:
        """The first ``m`` nodes, when they form a tree of their own (the verified part of a step)."""
        return TreeTensors(shape=self.shape, parents=self.parents[:m], depths=self.depths[:m],
                           ranks=self.ranks[:m], ancestors=self.ancestors[:m, :m],
                           attn_bias=self.attn_bias[:m, :m], levels=())

    def select(self, keep: torch.Tensor) -> "TreeTensors":
        """The nodes where ``keep [q]`` (bool, the root kept, closed under ancestors: a kept node's
        parent is kept) as a tree of their own, in the same order; ``kept [q']`` holds their indices
        in this tree (retrieval has already happened: no ``levels``)."""
        idx = keep.nonzero().squeeze(1)  # [q']
        renumber = torch.cumsum(keep.long(), 0) - 1  # [q]: old index -> new
        parents = self.parents[idx]  # [q']
        parents = torch.where(parents >= 0, renumber[parents.clamp(min=0)], -1)
        return TreeTensors(shape=None, parents=parents, depths=self.depths[idx],
                           ranks=self.ranks[idx], ancestors=self.ancestors[idx][:, idx],
                           attn_bias=self.attn_bias[idx][:, idx], levels=(), kept=idx)

    def children(self) -> list[list[int]]:
        """Each node's children, by index."""
        out: list[list[int]] = [[] for _ in range(self.parents.shape[0])]
        for i, p in enumerate(self.parents.tolist()):
            if p >= 0:
                out[p].append(i)
        return out

    def graft_chain(self, attach: int, length: int) -> "TreeTensors":
        """This tree plus a chain of ``length`` nodes under node ``attach`` (appended at the end).

        Used to merge a prompt-lookup continuation into the draft tree; ``levels`` keeps the
        static tree's slices (retrieval has already happened).
        """
        q, dev = self.parents.shape[0], self.parents.device
        idx = torch.arange(q, q + length, device=dev)
        parents = torch.cat([self.parents, torch.cat([torch.tensor([attach], device=dev), idx[:-1]])])
        depths = torch.cat([self.depths, self.depths[attach] + 1 + torch.arange(length, device=dev)])
        ranks = torch.cat([self.ranks, torch.zeros(length, dtype=torch.long, device=dev)])
        anc = torch.zeros(q + length, q + length, dtype=torch.bool, device=dev)
        anc[:q, :q] = self.ancestors
        anc[q:, :q] = self.ancestors[attach]
        anc[q:, q:] = torch.ones(length, length, dtype=torch.bool, device=dev).tril()
        bias = torch.zeros(anc.shape, dtype=self.attn_bias.dtype, device=dev)
        bias.masked_fill_(~anc, torch.finfo(bias.dtype).min)
        return TreeTensors(shape=self.shape, parents=parents, depths=depths, ranks=ranks, ancestors=anc,
                           attn_bias=bias, levels=self.levels)

    def attention_mask(self, past: int, window: int | None = None) -> torch.Tensor:
        """``[1, 1, q, past + q]``: every node sees the whole cache, itself and its ancestors; with a
        sliding ``window``, only the entries less than ``window`` positions before its own (the cache
        holds position ``i`` in slot ``i``; node ``j`` sits at ``past + depth[j]``)."""
        q = self.attn_bias.shape[0]
        mask = self.attn_bias.new_zeros(1, 1, q, past + q)
        mask[0, 0, :, past:] = self.attn_bias
        if window is not None:
            query_pos = self.depths + past  # [q]
            key_pos = torch.cat([torch.arange(past, device=query_pos.device), query_pos])  # [past + q]
            outside = query_pos[:, None] - key_pos[None, :] >= window  # [q, past + q]
            mask[0, 0].masked_fill_(outside, torch.finfo(mask.dtype).min)
        return mask

    def position_ids(self, past: int) -> torch.Tensor:
        """``[1, q]``: position = prefix length + depth."""
        return (self.depths + past)[None, :]


def generations(parents: list[int]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The nodes below a parent, grouped by how many parents stand above them: ``(nodes [g], their
    parents [g])`` long, for the first generation, then the second, ... (``parents [q]``: parents
    precede children; node 0 and any other node whose parent is -1 start a tree).  Filling a table
    generation by generation takes one tensor operation per depth instead of one per node."""
    level = [0] * len(parents)
    groups: dict[int, tuple[list[int], list[int]]] = {}
    for i, p in enumerate(parents):
        if i and p >= 0:
            level[i] = level[p] + 1
            below, above = groups.setdefault(level[i], ([], []))
            below.append(i)
            above.append(p)
    return [(torch.tensor(b), torch.tensor(a)) for _, (b, a) in sorted(groups.items())]


# ---- presets -----------------------------------------------------------------------------------
def list_presets() -> list[str]:
    return sorted(p.stem for p in PRESET_DIR.glob("*.json"))


def preset_data(name: str) -> dict:
    """What a preset file holds beside its nodes (``{}`` for none or a bare list): acceptance rates,
    the lookup prior and the ``"calibration"`` record written by ``python -m tr_core.bench.calibrate``."""
    path = PRESET_DIR / f"{name}.json"
    data = json.loads(path.read_text()) if path.is_file() else {}
    return data if isinstance(data, dict) else {}


def tree_prior(name: str) -> dict[tuple[int, ...], float] | None:
    """Per-node acceptance rates stored beside a preset (``"acceptance"``), if any."""
    data = preset_data(name)
    rates = data.get("acceptance")
    return {tuple(p): float(r) for p, r in zip(data["nodes"], rates)} if rates else None


def load_tree(spec: str | Path | list, k: int | None = None) -> TreeShape:
    """A tree from a preset name, a JSON file (``{"nodes": [...]}`` or a bare list), JSON text of the
    same (what a user types into the app) or a list of paths."""
    if isinstance(spec, (list, tuple)):
        return TreeShape.from_paths(spec, k=k)
    spec = str(spec).strip()
    if spec[:1] in "[{" and spec:
        try:
            data = json.loads(spec)
        except json.JSONDecodeError as err:
            raise TreeError(f"The tree is not valid JSON: {err}") from None
        return _tree_from_json(data, "custom", k)
    if spec.startswith("chain-"):
        try:
            n = int(spec.split("-", 1)[1])
        except ValueError:
            raise TreeError(f"Bad chain tree {spec!r}; use chain-N.") from None
        return TreeShape.from_paths([[0] * d for d in range(1, n + 1)], name=spec, k=k)
    if (PRESET_DIR / f"{spec}.json").is_file():
        return _preset(spec, k)
    if not Path(spec).is_file():
        raise TreeError(f"Unknown tree {spec!r}: use one of {list_presets()}, chain-N, or a JSON file.")
    return _tree_file(Path(spec), k)


@lru_cache(maxsize=64)
def _preset(name: str, k: int | None) -> TreeShape:
    """A shipped preset, read and checked once (a shape is immutable: every decoder may share it)."""
    return _tree_file(PRESET_DIR / f"{name}.json", k)


def _tree_file(path: Path, k: int | None) -> TreeShape:
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise TreeError(f"Cannot read tree file {str(path)!r}: {err}") from err
    return _tree_from_json(data, path.stem, k)


def _tree_from_json(data, default_name: str, k: int | None) -> TreeShape:
    """``{"name": ..., "nodes": [...]}`` or a bare list of rank paths."""
    if isinstance(data, dict):
        return TreeShape.from_paths(data.get("nodes"), name=data.get("name", default_name), k=k)
    return TreeShape.from_paths(data, name=default_name, k=k)
