"""The one step interface every decoder shares.

``start(prompt_ids)`` runs the prefill, then each ``step()`` runs exactly one verification forward
and returns a ``Step``; ``done`` says when EOS or the token budget is reached.  Invariant between
steps: the KV cache holds every committed token except the last one, which roots the next step.

A step is two halves around its forward, so that a caller may run the forwards of several
decoders together::

    request = dec.prepare_step()                 # draft: what the forward takes (ForwardRequest)
    logits = run_forward(dec.lm, request)        # the forward alone: plain tensors in, logits out
    step = dec.finish_step(request, logits)      # verify, learn from the logits, prune, record

``step()`` is exactly these three calls.
"""
from __future__ import annotations

import threading
import time
from abc import ABC, abstractmethod
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from ..devices import synchronize
from ..models import LoadedModel
from ..sampling import Sampler, SamplingConfig
from ..trace import Step


class DecodeError(ValueError):
    """Input a decoder cannot run on (empty prompt, prompt too long, bad budget)."""


class PhaseClock:
    """Seconds per named phase.  On a CUDA device each phase is bracketed by CUDA events on the
    model's own device (no synchronisation added by the clock itself); ``seconds`` waits once for the
    last event and reads them all.  On CPU, plain wall-clock time."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.device = device
        self._spans: list[tuple[str, object, object]] = []  # (phase, start, end): events or times
        self._added: dict[str, float] = {}  # seconds measured elsewhere (a batched forward's queue)
        self._seconds: dict[str, float] | None = None

    def add(self, name: str, seconds: float) -> None:
        """Seconds of phase ``name`` measured by someone else (on the host)."""
        self._added[name] = self._added.get(name, 0.0) + seconds
        self._seconds = None

    def _mark(self):
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record(torch.cuda.current_stream(self.device))
            return event
        return time.perf_counter()

    @contextmanager
    def phase(self, name: str):
        start = self._mark()
        yield
        self._spans.append((name, start, self._mark()))
        self._seconds = None

    @property
    def seconds(self) -> dict[str, float]:
        if self._seconds is None:
            if self.cuda and self._spans:
                self._spans[-1][2].synchronize()
            self._seconds = dict(self._added)
            for name, a, b in self._spans:
                took = a.elapsed_time(b) / 1000.0 if self.cuda else b - a
                self._seconds[name] = self._seconds.get(name, 0.0) + took
        return self._seconds


@dataclass
class ForwardRequest:
    """What one step's forward takes, as plain tensors, and what its second half needs back.

    ``input_ids [1, q]`` and ``position_ids [1, q]`` are the step's inputs, ``attention_mask`` the
    tree mask ``[1, 1, q, past + q]`` (or one per layer type; None: causal), ``cache`` the KV cache
    holding ``past`` entries that the forward appends to.  ``draft`` is the decoder's own record of
    what it drafted, ``clock`` times its phases.  ``batch``, ``batch_tokens``: the requests and query
    tokens of the forward that ran it, where it was shared with other requests (tr_core.batching).
    ``rows``: the positions whose logits the step needs (a prefill's few), the output head run there
    alone; None: every position.  ``hidden_rows``:
    positions whose last hidden states (after the final norm) the step takes instead, in ``hidden``
    ``[h, d]`` after the forward: its decoder runs the output head there itself, off the forward's clock.
    ``prepared``: the seconds its decoder spent making it (drafting, masks); ``finishing``
    (``time.perf_counter()``) when its decoder began the step's second half."""

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    attention_mask: Any
    cache: Any
    past: int
    clock: PhaseClock
    draft: Any = None
    batch: int = 1  # requests in the forward that ran it (tr_core.batching), and their query tokens
    batch_tokens: int = 0
    rows: torch.Tensor | None = None  # [r] CPU long: the positions whose logits are wanted (None: all)
    hidden_rows: torch.Tensor | None = None  # [h] CPU long: the positions whose last hidden states are wanted
    hidden: torch.Tensor | None = None  # [h, d]: those hidden states, once the forward ran
    prepared: float = 0.0
    finishing: float | None = None

    def finish_begins(self) -> None:
        """The step's second half begins: ``finishing`` is now, once the forward's results are ready
        (the device synchronised: a forward still running on a GPU is not the decoder's host work)."""
        synchronize(self.input_ids.device)
        self.finishing = time.perf_counter()

    def own_host_seconds(self) -> float:
        """The decoder's own work on this step outside its forward, so far: making the request and
        finishing the step (since :meth:`finish_begins`).  Not the time it waited while other requests
        of a shared forward were made or finished (a class's tabs, ``tr_core.batching``): a planner
        that counted that as its own host work would see a forward's tokens as cheap, and grow its
        tree with the class."""
        if self.finishing is None:
            raise RuntimeError("own_host_seconds() before the step's second half began (finish_begins)")
        return self.prepared + time.perf_counter() - self.finishing


@torch.inference_mode()
def model_forward(lm: LoadedModel, input_ids: torch.Tensor, position_ids: torch.Tensor, attention_mask,
                  cache, logits_to_keep: int | torch.Tensor = 0, **attention_kwargs) -> torch.Tensor:
    """One forward of ``lm`` over ``input_ids [1, q]`` at ``position_ids [1, q]``, appending to
    ``cache``; returns ``logits [q', vocab]`` (``logits_to_keep``: the last n positions, 0 = all, or
    a 1-D tensor of positions; ``attention_kwargs`` reach the attention function, e.g. a packed
    forward's ``segments``)."""
    out = lm.model(input_ids=input_ids, position_ids=position_ids, attention_mask=attention_mask,
                   use_cache=True, logits_to_keep=logits_to_keep, **attention_kwargs, **{lm.cache_arg: cache})
    return out.logits[0]


@contextmanager
def last_hidden_states(lm: LoadedModel, wanted: bool = True):
    """Where ``wanted``: the decoder body's last hidden states ``[1, Q, d]`` (after the final norm) of the
    forward this thread runs inside, in the list yielded, for requests that take some of them
    (``hidden_rows``)."""
    found: list[torch.Tensor] = []
    thread = threading.get_ident()

    def keep(module, args, out):
        if threading.get_ident() == thread:  # not another thread's forward of the same model
            found.append(out.last_hidden_state)

    hook = lm.model.get_decoder().register_forward_hook(keep) if wanted else None
    try:
        yield found
    finally:
        if hook is not None:
            hook.remove()
    if wanted and len(found) != 1:
        raise RuntimeError(f"the forward gave {len(found)} sets of hidden states, not one: the model's decoder "
                           "body (get_decoder()) did not run once")


def take_hidden(request: ForwardRequest, found: list[torch.Tensor], start: int = 0) -> None:
    """``request.hidden [h, d]``, where it asks for some: its ``hidden_rows`` of the forward's last hidden
    states (``found``, of :func:`last_hidden_states`), its queries starting at ``start`` in that forward."""
    if request.hidden_rows is not None:
        request.hidden = found[0][0, request.hidden_rows.to(found[0].device) + start]


def run_forward(lm: LoadedModel, request: ForwardRequest) -> torch.Tensor:
    """The forward phase of a step: ``logits [q, vocab]`` for ``request``'s inputs (and its
    ``hidden``, where it asks for some), timed on its clock as ``"forward"`` (the planners read that
    time; a caller running several requests' forwards at once times the phase on each request's clock)."""
    keep = request.rows.to(request.input_ids.device) if request.rows is not None else 0
    with request.clock.phase("forward"), last_hidden_states(lm, request.hidden_rows is not None) as found:
        logits = model_forward(lm, request.input_ids, request.position_ids, request.attention_mask,
                               request.cache, keep)
    take_hidden(request, found)
    return logits


class Decoder(ABC):
    """Base class: prompt checks, prefill, the forward call, committing tokens, stopping."""

    method: ClassVar[str] = "?"
    lookahead: int = 0  # positions a step may reach past the committed tokens

    def __init__(self, lm: LoadedModel, max_new_tokens: int = 128, sampling: SamplingConfig | None = None):
        """``sampling``: None = greedy decoding; else temperature/top-p/top-k sampling, seeded anew
        by every ``start`` (the same seed and settings give the same output)."""
        self.lm = lm
        self.max_new_tokens = max_new_tokens
        self.sampling = sampling
        self.sampler: Sampler | None = None
        self.prompt: list[int] = []
        self.output: list[int] = []
        self.steps: list[Step] = []
        self.cache = None
        self.last: torch.Tensor | None = None
        self._done = True

    # ---- the interface ------------------------------------------------------------------
    def start(self, prompt_ids) -> None:
        """Validate the prompt, reset per-request state and prefill all prompt tokens but the last."""
        if self.prepare_start(prompt_ids):
            self.prefill(torch.tensor(self.prompt[:-1], device=self.lm.device))

    def prepare_start(self, prompt_ids) -> bool:
        """:meth:`start` without its forward: the prompt checked, per-request state reset, the KV cache
        empty; whether the prompt still needs its prefill (more than one token): :meth:`prefill`, or
        :meth:`prefill_request` and :meth:`finish_prefill` where the forward is shared."""
        ids = [int(t) for t in (prompt_ids.tolist() if torch.is_tensor(prompt_ids) else prompt_ids)]
        if not ids:
            raise DecodeError("The prompt is empty.")
        if not 1 <= self.max_new_tokens:
            raise DecodeError(f"max_new_tokens must be at least 1 (got {self.max_new_tokens}).")
        need = len(ids) + self.max_new_tokens + self.lookahead
        if need > self.lm.max_context:
            raise DecodeError(
                f"The prompt has {len(ids)} tokens; with {self.max_new_tokens} new tokens it does not fit "
                f"the model's context of {self.lm.max_context} tokens.")
        self.prompt, self.output, self.steps = ids, [], []
        self.sampler = Sampler(self.sampling, self.lm.device) if self.sampling is not None else None
        self.cache = self.lm.new_cache()
        self._done = False
        self.last = torch.tensor(ids[-1], device=self.lm.device)
        return len(ids) > 1

    def prefill_request(self) -> ForwardRequest:
        """The prefill as a forward request, as :meth:`prefill` runs it: the whole prompt, causal, the
        logits of the last position alone (``rows``); :meth:`finish_prefill` crops the last entry."""
        ids = torch.tensor(self.prompt, device=self.lm.device)[None]  # [1, L + 1]
        return self.new_request(ids, self.next_positions(ids), rows=torch.tensor([ids.shape[1] - 1]))

    def finish_prefill(self, request: ForwardRequest, logits: torch.Tensor) -> None:
        """After the prefill's forward (``request`` of :meth:`prefill_request`, its ``logits [rows,
        vocab]``): the last prompt token's entry cropped (the next step's root)."""
        self.cache.crop(-1)

    @torch.inference_mode()
    def step(self) -> Step:
        """Exactly one verification forward; returns its trace record (:meth:`prepare_step`, the
        forward, :meth:`finish_step`: a caller sharing forwards between decoders runs the three itself)."""
        request = self.prepare_step()
        return self.finish_step(request, run_forward(self.lm, request))  # logits [q, vocab]

    @abstractmethod
    def prepare_step(self) -> ForwardRequest:
        """The step's first half: draft, and the forward's inputs (nothing is run on the model)."""

    @abstractmethod
    def finish_step(self, request: ForwardRequest, logits: torch.Tensor) -> Step:
        """The step's second half, given the forward's ``logits [q, vocab]``: verify, commit, record."""

    def new_request(self, input_ids: torch.Tensor, position_ids: torch.Tensor, attention_mask=None,
                    clock: PhaseClock | None = None, draft=None, started: float | None = None,
                    rows: torch.Tensor | None = None, hidden_rows: torch.Tensor | None = None) -> ForwardRequest:
        """A request over this decoder's cache for ``input_ids [1, q]`` at ``position_ids [1, q]``;
        ``started`` (``time.perf_counter()``): when the decoder began making it (its ``prepared`` time)."""
        prepared = 0.0 if started is None else time.perf_counter() - started
        return ForwardRequest(input_ids, position_ids, attention_mask, self.cache, self.cache_length,
                              clock or PhaseClock(self.lm.device), draft, rows=rows,
                              hidden_rows=hidden_rows, prepared=prepared)

    @property
    def done(self) -> bool:
        return self._done

    def generate(self, prompt_ids) -> list[int]:
        """Decode to EOS or the budget; returns the new token ids."""
        self.start(prompt_ids)
        while not self.done:
            self.step()
        return self.output

    def release_cache(self) -> None:
        """Drop the KV cache (its memory goes back); :meth:`restore_cache` rebuilds it when needed."""
        self.cache = None

    def restore_cache(self) -> None:
        """Rebuild a released cache from the prompt and the committed tokens (all but the last, which
        roots the next step), in one prefill forward.  Nothing to do where the cache is there or the
        decoder is done."""
        if self.cache is not None or self._done or not self.prompt:
            return
        self.cache = self.lm.new_cache()
        ids = self.prompt + self.output
        if len(ids) > 1:
            Decoder.prefill(self, torch.tensor(ids[:-1], device=self.lm.device))

    # ---- shared mechanics ---------------------------------------------------------------
    @property
    def cache_length(self) -> int:
        return self.cache.get_seq_length() if self.cache is not None else 0

    def context_ids(self) -> torch.Tensor:
        """``[L]`` CPU long: the prompt and everything committed so far (what prompt lookup searches)."""
        return torch.tensor(self.prompt + self.output)

    def prefill(self, prefix: torch.Tensor) -> None:
        """Run ``prefix [L]`` into the cache as ``generate`` reads a prompt: in one forward with the token
        after it (``last``, the next step's root), whose entry is then cropped.  So a decoder's cache
        holds the entries of one reading of the whole text, the same for every decoder (a race reads a
        prompt once for both sides: ``tr_core.race.read_once``); subclasses may use the logits."""
        whole = torch.cat([prefix, self.last.reshape(1).to(device=prefix.device, dtype=prefix.dtype)])
        self.forward(whole[None], logits_to_keep=1)
        self.cache.crop(-1)

    def next_positions(self, input_ids: torch.Tensor) -> torch.Tensor:
        """``[1, q]``: the positions right after the cache, for ``input_ids [1, q]`` in a row."""
        past = self.cache_length
        return torch.arange(past, past + input_ids.shape[1], device=input_ids.device)[None]

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None,
                logits_to_keep: int | torch.Tensor = 0) -> torch.Tensor:
        """One forward over ``input_ids [1, q]`` appending to the cache; returns ``logits [q', vocab]``
        (``logits_to_keep``: the last n positions, 0 = all, or a 1-D tensor of positions)."""
        if position_ids is None:
            position_ids = self.next_positions(input_ids)
        return model_forward(self.lm, input_ids, position_ids, attention_mask, self.cache, logits_to_keep)

    @torch.inference_mode()
    def forward_hidden(self, input_ids: torch.Tensor) -> torch.Tensor:
        """``forward`` without the output head: the last hidden states ``[q, d]`` (after the final
        norm) of ``input_ids [1, q]``, appended to the cache at the next positions."""
        body = self.lm.model.get_decoder()
        out = body(input_ids=input_ids, position_ids=self.next_positions(input_ids), use_cache=True,
                   **{self.lm.cache_arg: self.cache})
        return out.last_hidden_state[0]

    def commit(self, tokens: list[int]) -> list[int]:
        """Append tokens to the output, cut at the first EOS or at the budget; set ``done``."""
        kept = []
        for t in tokens:
            if len(self.output) >= self.max_new_tokens:
                break
            kept.append(t)
            self.output.append(t)
            if t in self.lm.eos_token_ids:
                self._done = True
                break
        if len(self.output) >= self.max_new_tokens:
            self._done = True
        return kept

    def record(self, step: Step) -> Step:
        step.done = self._done
        self.steps.append(step)
        return step

    def _check_running(self) -> None:
        if self._done:
            raise DecodeError("This decoder is done: call start() with a new prompt.")
