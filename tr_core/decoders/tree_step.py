"""What every tree-drafting decoder shares: the step's state, and the phases around its forward.

A tree decoder's step is a pipeline of named phases over one :class:`StepState`::

    prepare_step():  draft (the decoder's own)  ->  prepare (positions, tree mask)  ->  ForwardRequest
    forward:         plain tensors in, logits out (``base.run_forward``)
    finish_step():   verify  ->  [the decoder's own: recycle, expand]  ->  prune  ->  record  ->  [plan]

Each decoder writes ``draft`` and, where it learns from the logits, its own ``finish_step`` from
these phase functions; the forward never sees a decoder, so several decoders' forwards can run
together between their halves.
"""
from __future__ import annotations

import time
from abc import abstractmethod
from dataclasses import dataclass

import torch

from ..cache import keep_accepted_kv
from ..trace import DraftTree, RowUpdate, Step
from ..trees import TreeTensors
from ..verify import Verdict, verify_greedy, verify_sampled
from .base import Decoder, ForwardRequest, PhaseClock


@dataclass
class StepState:
    """One step of a tree decoder, as its phases fill it in.

    Drafting sets ``tokens [q]`` (long, root first), ``tree`` (their ``TreeTensors``: parents, depths,
    attention bias) and ``sources`` (``q`` words, ``"root"`` first: where each node came from).  The
    first ``verified`` nodes form the tree that is verified (None: all ``q``; PTD's draft nodes ride
    along behind them).  Verifying sets ``verdict`` and ``path`` (the accepted nodes, root first)."""

    tokens: torch.Tensor
    tree: TreeTensors
    sources: list[str]
    verified: int | None = None
    verdict: Verdict | None = None
    path: list[int] | None = None

    @property
    def size(self) -> int:
        """``q``: the forward's query tokens."""
        return self.tokens.shape[0]

    @property
    def head(self) -> int:
        """The verified nodes' count (the root included)."""
        return self.size if self.verified is None else self.verified


class TreeDecoder(Decoder):
    """Subclasses write :meth:`draft`; the other phases are shared."""

    @abstractmethod
    def draft(self, clock: PhaseClock) -> StepState:
        """Phase 1: this step's tree under the root ``self.last``, timed on ``clock``."""

    # ---- the two halves ----------------------------------------------------------------
    @torch.inference_mode()
    def prepare_step(self) -> ForwardRequest:
        """Draft, then the forward's inputs: ``input_ids [1, q]``, ``position_ids [1, q]``
        (prefix length + depth) and the tree mask ``[1, 1, q, past + q]`` (or one per layer type)."""
        self._check_running()
        started, clock = time.perf_counter(), PhaseClock(self.lm.device)
        state = self.draft(clock)
        past = self.cache_length
        with clock.phase("prepare"):
            positions = state.tree.position_ids(past)  # [1, q]
            mask = self.lm.tree_masks(state.tree, past)
        return self.new_request(state.tokens[None], positions, mask, clock, state, started)

    @torch.inference_mode()
    def finish_step(self, request: ForwardRequest, logits: torch.Tensor) -> Step:
        """Verify, prune, record (decoders that learn from ``logits [q, vocab]`` add their phases)."""
        request.finish_begins()
        state = request.draft
        self.verify(state, logits, request)
        self.prune(state, request)
        return self.record(self.to_step(state, request))

    # ---- the shared phases -------------------------------------------------------------
    def verify(self, state: StepState, logits: torch.Tensor, request: ForwardRequest) -> None:
        """Phase 3: the longest path whose tokens the model chose, plus the model's own next token.

        ``logits [q, vocab]``; only the first ``state.head`` inputs are verified.  With sampling on,
        the verdict follows the draws (``verify_sampled``), else the argmax (``verify_greedy``)."""
        with request.clock.phase("verify"):
            m, tree = state.head, state.tree
            head = tree if m == state.size else tree.head(m)
            tokens, logits = state.tokens[:m], logits[:m]
            if self.sampler is not None:
                state.verdict = verify_sampled(tokens, logits, head, self.sampler, request.position_ids[0, :m])
            else:
                state.verdict = verify_greedy(tokens, logits, head)
            state.path = state.verdict.path.tolist()

    def prune(self, state: StepState, request: ForwardRequest) -> None:
        """Phase 5: keep only the accepted path's KV entries (the rest of this step's ``q`` go)."""
        with request.clock.phase("prune"):
            keep_accepted_kv(self.cache, request.past, state.path)

    def to_step(self, state: StepState, request: ForwardRequest, rows: list[RowUpdate] | None = None) -> Step:
        """Commit the accepted path's tokens + the model's own, and the step's record (its tree: the
        verified nodes; ``parents[0] = -1``)."""
        m = state.head
        token_list = state.tokens[:m].tolist()
        self.last = state.verdict.bonus
        committed = self.commit([token_list[i] for i in state.path[1:]] + [int(state.verdict.bonus)])
        parents = state.tree.parents[:m].tolist()
        parents[0] = -1
        tree = state.tree
        return Step(
            index=len(self.steps) + 1, method=self.method,
            tree=DraftTree(tokens=token_list, parents=parents, depths=tree.depths[:m].tolist(),
                           ranks=tree.ranks[:m].tolist(), sources=state.sources),
            accepted_path=state.path, committed=committed, model_choices=state.verdict.choices.tolist(),
            sampled=self.sampler is not None, rows_written=rows or [], forward_tokens=state.size,
            cache_length=request.past, timings=request.clock.seconds)
