"""Token Recycling exactly as the paper gives it (Luo et al., "Turning Trash into Treasure", ACL 2025).

``M`` (:class:`~tr_core.matrix.AdjacencyMatrix`, ``[|V|, k]``): ``M[t]`` holds the top-k tokens last
seen after token ``t``.  Each step, one forward:

  1. draft    - BFS from the last committed token over a static tree shape: node ``[a, b, c]`` is
                ``M[M[M[root][a]][b]][c]``, one gather of ``M``'s rows per depth
  2. forward  - the root and the tree in one forward with tree attention (position = prefix + depth)
  3. verify   - the longest path whose tokens are the model's own choices, plus the model's next token
  4. recycle  - ``M[token] = topk(logits)`` at *every* input, accepted or not; where a token occurs
                twice, the last write wins
  5. prune    - keep only the accepted path's KV entries

``M`` outlives the request: pass the same matrix to the next decoder (hot start).  The prompt's own
logits are recycled into ``M`` during the prefill, as every forward's are.  Our additions build on
this class in ``recycling.py``.
"""
from __future__ import annotations

import torch

from ..matrix import AdjacencyMatrix, RowsWritten
from ..models import LoadedModel
from ..sampling import SamplingConfig
from ..trace import RowUpdate, Step
from ..trees import TreeShape, load_tree
from .base import ForwardRequest, PhaseClock
from .tree_step import StepState, TreeDecoder

PAPER_TREE = "paper-80"  # the paper's static tree: 80 draft nodes


class PaperTokenRecycling(TreeDecoder):
    """The paper's method on a static ``tree`` (a shape, a preset name or rank paths)."""

    method = "tr"

    def __init__(self, lm: LoadedModel, tree: TreeShape | str | list = PAPER_TREE, k: int = 8,
                 matrix: AdjacencyMatrix | None = None, max_new_tokens: int = 128,
                 sampling: SamplingConfig | None = None, trace_rows: bool = True):
        """``matrix``: ``M``, shared between decoders and requests (the hot start; a new one if None);
        ``sampling``: lossless sampling instead of greedy decoding; ``trace_rows``: keep each step's
        rows before and after their write in its record (what the page draws)."""
        super().__init__(lm, max_new_tokens, sampling)
        self.matrix = matrix if matrix is not None else AdjacencyMatrix(lm.vocab_size, k, lm.device, lm.fingerprint)
        if self.matrix.fingerprint != lm.fingerprint or self.matrix.vocab_size != lm.vocab_size:
            raise ValueError("The matrix belongs to another vocabulary than the model.")
        self.trace_rows = trace_rows
        self.set_tree(tree)

    def set_tree(self, tree: TreeShape | str | list) -> None:
        """Use another static tree shape from the next step on."""
        shape = tree if isinstance(tree, TreeShape) else load_tree(tree, k=self.matrix.k)
        if shape.max_rank >= self.matrix.k:
            raise ValueError(f"Tree {shape.name!r} needs rank {shape.max_rank}, but k={self.matrix.k}.")
        self.tree = shape
        self.tree_t = shape.tensors(self.lm.device, self.lm.dtype)  # computed once per shape
        self.lookahead = shape.depth + 1

    # ---- the step ------------------------------------------------------------------------
    def draft(self, clock: PhaseClock) -> StepState:
        """1. ``tokens [q]``: the root, then ``M``'s BFS over the static shape.  A node drafted from
        a row never written is marked ``"empty"`` (its token is the row's zero, not a prediction)."""
        with clock.phase("retrieve"):
            tokens = self.matrix.retrieve_draft_tree(self.last, self.tree_t)  # [q]
            empty = self.matrix.empty_rows(tokens[self.tree_t.parents[1:]]).tolist()  # [q - 1]
        return StepState(tokens, self.tree_t, ["root"] + ["empty" if e else "matrix" for e in empty])

    # 2. forward: ``base.run_forward``, between ``prepare_step`` and ``finish_step``

    @torch.inference_mode()
    def finish_step(self, request: ForwardRequest, logits: torch.Tensor) -> Step:
        """3. verify, 4. recycle, 5. prune, given the forward's ``logits [q, vocab]``."""
        request.finish_begins()
        state = request.draft
        self.verify(state, logits, request)
        written = self.recycle(state, logits, request.clock)
        self.prune(state, request)
        return self.record(self.to_step(state, request, row_updates(written) if self.trace_rows else None))

    def recycle(self, state: StepState, logits: torch.Tensor, clock: PhaseClock) -> RowsWritten:
        """4. ``M[tokens[i]] = topk(logits[i])`` for every input ``i`` (``logits [q, vocab]``); the
        last occurrence of a token wins."""
        with clock.phase("update"):
            return self.matrix.recycle(state.tokens, logits, keep_old=self.trace_rows)

    # ---- the prompt ----------------------------------------------------------------------
    def prefill(self, prefix: torch.Tensor, chunk: int = 256) -> None:
        """Run the prompt ``prefix [L]`` (all but its last token) into the cache and recycle the
        prompt's logits into ``M``.

        The forward takes the last prompt token too, so ``M[last]`` holds the model's own top-k for
        the first new token: step 1's first drafts are exact.  That token's KV entry is then cropped,
        so the cache ends where every decoder's does and step 1 runs the last token as its root.  The
        output head runs ``chunk`` positions at a time (:meth:`seed`)."""
        prompt = torch.cat([prefix, torch.tensor([self.prompt[-1]], dtype=prefix.dtype, device=prefix.device)])
        hidden = self.forward_hidden(prompt[None])  # [L + 1, d]
        self.cache.crop(-1)  # the last prompt token is step 1's root
        positions, before = self.seed_positions(prompt)
        self.seed(prompt, positions, hidden[positions], before, chunk)

    def prefill_request(self) -> ForwardRequest:
        """The prefill as a forward request, as :meth:`prefill` runs it: the whole prompt, the last
        hidden states of the positions whose rows are recycled (``hidden_rows``: :meth:`finish_prefill`
        runs the output head there itself, so a forward that greedy's reading shares costs what
        greedy's own would), the logits of the last position alone (``rows``)."""
        prompt = torch.tensor(self.prompt, device=self.lm.device)
        positions, _ = self.seed_positions(prompt)
        return self.new_request(prompt[None], self.next_positions(prompt[None]),
                                rows=torch.tensor([len(self.prompt) - 1]), hidden_rows=positions.cpu())

    def finish_prefill(self, request: ForwardRequest, logits: torch.Tensor) -> None:
        """The last prompt token's KV entry cropped (step 1's root) and the prompt recycled into ``M``
        from the request's ``hidden [u, d]`` (at ``seed_positions``), as :meth:`prefill` does."""
        if request.hidden is None:
            raise RuntimeError("the prefill's forward did not hand over the prompt's hidden states (hidden_rows)")
        self.cache.crop(-1)
        prompt = torch.tensor(self.prompt, device=self.lm.device)
        positions, before = self.seed_positions(prompt)
        self.seed(prompt, positions, request.hidden, before)

    @torch.inference_mode()
    def seed(self, prompt: torch.Tensor, positions: torch.Tensor, hidden: torch.Tensor, before,
             chunk: int = 256) -> None:
        """``M`` seeded from the prompt: the output head over ``hidden [u, d]``, the last hidden states
        at ``positions [u]``, and top-k, ``chunk`` rows at a time (``logits [chunk, vocab]``, a bounded
        amount of memory)."""
        head = self.lm.model.get_output_embeddings()
        for s in range(0, positions.shape[0], chunk):
            self.matrix.seed_from_prompt(prompt[positions[s:s + chunk]], head(hidden[s:s + chunk]),
                                         None if before is None else before[s:s + chunk])

    def seed_positions(self, prompt: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The prompt positions whose logits are recycled, ``[u]``: where the last write wins, only
        each token's last occurrence can survive, so the head runs there alone (the same ``M`` for
        about half the work); and the token before each (None: rows by token alone)."""
        return last_occurrences(prompt).nonzero().squeeze(1), None


def last_occurrences(tokens: torch.Tensor) -> torch.Tensor:
    """``[L] bool``: True where ``tokens[i]`` does not occur again later in ``tokens [L]``."""
    n = tokens.shape[0]
    pos = torch.arange(n, device=tokens.device)
    latest = torch.full((int(tokens.max()) + 1,), -1, dtype=torch.long, device=tokens.device)
    latest.scatter_reduce_(0, tokens, pos, reduce="amax")
    return latest[tokens] == pos


def row_updates(rows: RowsWritten) -> list[RowUpdate]:
    """The rows one recycle wrote, as the step record keeps them."""
    return [RowUpdate(token=t, old=o, new=n)
            for t, o, n in zip(rows.tokens.tolist(), rows.old.tolist(), rows.new.tolist())]
