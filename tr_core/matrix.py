"""The adjacency matrix ``M``: ``M[t]`` = the top-k next tokens last seen after token ``t``.

Three operations, named after the paper's phases: ``retrieve_draft_tree`` (BFS over a static
shape, one batched gather per depth; ``blank_drafts`` marks what came from rows never written),
``recycle`` (overwrite rows from the logits of every input; last write wins, or by priority) and
persistence (``save``/``load``/``reset``) for hot start.

Beside ``M`` it keeps pair rows (``tr_core.pairs``): the top-k after a token *and the one before
it*.  Where a caller names the token before the root (``before``), retrieval drafts from a node's
pair row when that pair was seen, and recycling writes pair rows with ``M``'s; without ``before``
both are exactly the paper's.
"""
from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from .pairs import PairRows
from .trees import TreeTensors

FORMAT = "token-recycling-matrix/1"


class MatrixFileError(ValueError):
    """A matrix file that cannot be used (corrupt, truncated, or for another vocabulary)."""


@dataclass
class RowsWritten:
    """The rows one recycle wrote: ``tokens [r]``, ``old [r, k]``, ``new [r, k]`` (on the device)."""

    tokens: torch.Tensor
    old: torch.Tensor
    new: torch.Tensor


class AdjacencyMatrix:
    """``table: [vocab, k]`` int32 token ids, zeros at start (a row never written drafts token 0:
    ``blank_drafts`` finds those nodes); ``pairs``: the pair rows (``tr_core.pairs.PairRows``)."""

    def __init__(self, vocab_size: int, k: int = 8, device: torch.device | str = "cpu",
                 fingerprint: str = ""):
        if k < 1:
            raise ValueError("k must be at least 1")
        self.table = torch.zeros(vocab_size, k, dtype=torch.int32, device=device)
        self.pairs = PairRows(vocab_size, k, device)
        self.fingerprint = fingerprint
        self.writes = 0  # rows written since the last reset (a hot-start indicator)
        self.note = ""  # where its rows came from, in words (kept in its file: e.g. how it was warmed)

    @property
    def k(self) -> int:
        return self.table.shape[1]

    @property
    def vocab_size(self) -> int:
        return self.table.shape[0]

    @property
    def nbytes(self) -> int:
        return self.table.numel() * self.table.element_size() + self.pairs.nbytes

    def reset(self) -> None:
        self.table.zero_()
        self.pairs.reset()
        self.writes, self.note = 0, ""

    def to(self, device) -> "AdjacencyMatrix":
        """A copy on ``device`` (itself where it is there already): how a hot-start matrix crosses
        between the host and a GPU, e.g. in and out of a ZeroGPU call."""
        from .devices import same_device

        if same_device(self.table.device, device):
            return self
        m = AdjacencyMatrix.__new__(AdjacencyMatrix)
        m.table, m.fingerprint, m.writes, m.note = self.table.to(device), self.fingerprint, self.writes, self.note
        m.pairs = self.pairs.to(device)
        return m

    def narrowed(self, k: int) -> "AdjacencyMatrix":
        """Its first ``k`` candidates a row (rows are sorted by rank, as ``topk`` writes them): itself
        where it holds ``k`` already."""
        if k == self.k:
            return self
        if not 1 <= k < self.k:
            raise ValueError(f"k must be between 1 and {self.k} (got {k})")
        m = AdjacencyMatrix(self.vocab_size, k, self.table.device, self.fingerprint)
        m.table.copy_(self.table[:, :k])
        m.pairs = self.pairs.narrowed(k)
        m.writes, m.note = self.writes, self.note
        return m

    # ---- phase 1: retrieve -------------------------------------------------------------
    def retrieve_draft_tree(self, root: torch.Tensor, tree: TreeTensors, before: int | None = None) -> torch.Tensor:
        """BFS from ``root`` (a 0-d long tensor) over ``tree``: returns ``tokens [q]``, root first.

        Node ``[a, b, c]`` = ``M[M[M[root][a]][b]][c]``: each depth is one gather of the
        parents' rows at the nodes' ranks.  With ``before`` (the token committed before the root),
        a node's row is its pair row ``P[(grandparent, parent)]`` where that pair was seen.
        """
        tokens = torch.empty(tree.parents.shape[0], dtype=torch.long, device=self.table.device)
        tokens[0] = root
        for start, end in tree.levels:
            parents = tree.parents[start:end]
            rows, _ = self.rows_of(tokens, tree, parents, before)
            tokens[start:end] = rows.gather(1, tree.ranks[start:end, None]).squeeze(1)
        return tokens

    def rows_of(self, tokens: torch.Tensor, tree: TreeTensors, nodes: torch.Tensor, before: int | None):
        """The rows drafting the children of ``nodes [n]`` (indices into ``tokens [q]``, the tree's
        tokens so far): ``(rows [n, k] long, from_pair [n] bool)``."""
        rows = self.table[tokens[nodes]].long()
        if before is None:
            return rows, torch.zeros(nodes.shape, dtype=torch.bool, device=rows.device)
        prior = torch.where(nodes == 0, torch.full_like(nodes, int(before)), tokens[tree.parents[nodes]])
        pair, seen = self.pairs.lookup(prior, tokens[nodes])
        return torch.where(seen[:, None], pair.long(), rows), seen

    def from_pairs(self, tokens: torch.Tensor, tree: TreeTensors, before: int | None) -> torch.Tensor:
        """``[q] bool``: the nodes of a retrieved tree (``tokens [q]``) drafted from a pair row."""
        out = torch.zeros(tokens.shape, dtype=torch.bool, device=tokens.device)
        out[1:] = self.rows_of(tokens, tree, tree.parents[1:], before)[1]
        return out

    def empty_rows(self, tokens: torch.Tensor) -> torch.Tensor:
        """``[n] bool``: the rows of ``tokens [n]`` never written (all zeros: a written row holds k
        distinct tokens), whose drafts are token 0 by default rather than a prediction."""
        if self.k < 2:
            return torch.zeros(tokens.shape, dtype=torch.bool, device=tokens.device)
        return (self.table[tokens] == 0).all(-1)

    def blank_drafts(self, tokens: torch.Tensor, tree: TreeTensors, from_pair: torch.Tensor | None = None) -> torch.Tensor:
        """``[q] bool``: the nodes of a retrieved tree (``tokens [q]``; ``from_pair [q]``: the nodes a
        pair row drafted, :meth:`from_pairs`) drafted from a row never written, or below one.  Their
        tokens are the row's zeros, not predictions, so they get no forward tokens (the caller drops
        them with ``TreeTensors.select``)."""
        blank = torch.zeros(tokens.shape, dtype=torch.bool, device=tokens.device)
        blank[1:] = self.empty_rows(tokens[tree.parents[1:]])
        if from_pair is not None:
            blank &= ~from_pair
        return (tree.ancestors & blank[None, :]).any(1)

    # ---- phase 4: recycle --------------------------------------------------------------
    def recycle(self, tokens: torch.Tensor, logits: torch.Tensor, keep_old: bool = True,
                priority: torch.Tensor | None = None, before: torch.Tensor | None = None) -> RowsWritten:
        """``M[tokens[i]] = topk(logits[i], k)`` for every input ``i``; ``tokens [m]``, ``logits [m, vocab]``.

        When a token occurs several times, its last occurrence wins (the paper's rule); with
        ``priority [m]`` (long), the occurrence of highest priority wins, and the last among equals:
        e.g. the accepted path's nodes, whose logits saw the text as it really is, over the rejected
        branches'.  With ``before [m]`` (the token before each input: its parent in the tree), the
        pair rows ``P[(before[i], tokens[i])]`` are written too, in the same order.
        """
        top = logits.topk(self.k, dim=-1).indices.to(torch.int32)  # [m, k]
        order = None
        if priority is not None:
            order = torch.sort(priority, stable=True).indices  # [m]: lowest priority first, so written first
            tokens = tokens[order]
        if before is not None:
            self.pairs.write(before if order is None else before[order], tokens, top if order is None else top[order])
        later_twin = (tokens[:, None] == tokens[None, :]).triu(1).any(1)  # [m]
        keep = (~later_twin).nonzero().squeeze(1)
        rows = tokens[keep]
        source = keep if order is None else order[keep]
        new = top[source]
        old = self.table[rows].clone() if keep_old else new[:0]
        self.table[rows] = new
        self.writes += int(rows.shape[0])
        return RowsWritten(tokens=rows, old=old, new=new)

    def seed_from_prompt(self, tokens: torch.Tensor, logits: torch.Tensor, before: torch.Tensor | None = None) -> None:
        """Recycle a prompt's logits (``tokens [n]``, ``logits [n, vocab]``; ``before [n]``: the token
        before each, for pair rows); the caller bounds ``n`` (the prefill hands them over a chunk of
        positions at a time)."""
        self.recycle(tokens, logits, keep_old=False, before=before)

    # ---- hot start: persistence --------------------------------------------------------
    def save(self, path: str | Path, model_name: str = "") -> None:
        """Write to a safetensors file atomically (temporary file, then rename)."""
        from safetensors.torch import save_file

        path = Path(path)
        meta = {"format": FORMAT, "fingerprint": self.fingerprint, "vocab_size": str(self.vocab_size),
                "k": str(self.k), "model": model_name, "note": self.note}
        fd, tmp = tempfile.mkstemp(dir=path.parent if str(path.parent) else ".", suffix=".tmp")
        os.close(fd)
        try:
            save_file({"matrix": self.table.detach().cpu().contiguous(), **self.pairs.written_tensors()},
                      tmp, metadata=meta)
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)

    @classmethod
    def load(cls, path: str | Path, fingerprint: str, vocab_size: int,
             device: torch.device | str = "cpu") -> "AdjacencyMatrix":
        """Read a file written by ``save``; refuse one made for another vocabulary or damaged.  A file
        from before pair rows existed loads with none."""
        from safetensors import safe_open

        try:
            with safe_open(str(path), framework="pt") as f:
                meta = f.metadata() or {}
                table = f.get_tensor("matrix")
                pairs = {name: f.get_tensor(name) for name in f.keys() if name.startswith("pair_")}
        except FileNotFoundError:
            raise MatrixFileError(f"No matrix file at {str(path)!r}.") from None
        except Exception as err:  # safetensors raises several types for damaged files
            raise MatrixFileError(f"The matrix file is corrupt or truncated ({type(err).__name__}).") from err
        if meta.get("format") != FORMAT:
            raise MatrixFileError("This file is not a Token Recycling matrix (unknown format).")
        if meta.get("fingerprint") != fingerprint or table.shape[0] != vocab_size:
            raise MatrixFileError(
                f"This matrix belongs to another vocabulary (model {meta.get('model') or 'unknown'!r}, "
                f"{table.shape[0]} tokens); the loaded model has {vocab_size} tokens.")
        if table.dim() != 2 or table.dtype != torch.int32 or not 0 <= int(table.min()) <= int(table.max()) < vocab_size:
            raise MatrixFileError("The matrix file holds invalid token ids.")
        out = cls(vocab_size, table.shape[1], device, fingerprint)
        out.table.copy_(table)
        if pairs:
            try:
                out.pairs.load_written(pairs)
            except ValueError as err:
                raise MatrixFileError(f"The matrix file's pair rows are damaged: {err}") from None
        out.writes, out.note = int((table != 0).any(1).sum()), str(meta.get("note", ""))
        return out
