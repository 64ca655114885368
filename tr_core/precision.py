"""Exact, or explained: why a speculative decoder's output can differ from greedy decoding's in
reduced precision, and how to tell rounding from a bug.

Speculative decoding is lossless in exact arithmetic.  In bfloat16 or float16, a one-token forward
(greedy) and a q-token tree forward run different kernels with different accumulation orders, so the
same position's logits differ by a few units of the dtype's rounding, and where the model's top two
candidates are that close, the argmax can flip.  From there on the two outputs are different
continuations, each greedy up to rounding.

At the first position where a method's output differs from the reference's, we recompute the
reference's logits exactly as it computed them (the same one-token forwards, replayed) and take the
**margin**: the reference's logit of its own token minus its logit of the method's token.  The
**bound** of what rounding explains is ``ROUNDING_ULPS`` units in the last place (ulp) of the larger
of the two logits in the model's dtype: a dtype with ``p`` significant bits stores a value ``x`` to
within half of ``ulp(x) = 2^(floor(log2 |x|) - p + 1)`` (bfloat16: p = 8, so ulp(20) = 0.125; float16:
p = 11; float32: p = 24, ulp(20) = 1.9e-6).  On the embedded model in bfloat16 the margin between the top
candidates at one position moved by up to 3 ulps between a 1-token and a 40-token forward;
``ROUNDING_ULPS`` = 8 leaves room for deeper models.  A margin within the bound is a **near-tie**; a
larger one cannot come from rounding and is a **bug**.  In float32 the bound is a few millionths of
a logit, so any real divergence there reads as a bug, as it should.

The constant was calibrated on a CPU.  A GPU's kernels (and, in float32, the different kernels of
1-token and multi-token forwards) round differently, so the GPU check measures the bound on the
device itself (:func:`measure_rounding`): the same tokens are run through greedy's one-token forwards
and through chunks of ``q`` tokens under the tree mask, and the largest change of the margin between
the top two candidates, in ulps, is what rounding does there.  :func:`explain_divergence` then takes
``bound_ulps`` (:func:`measured_bound_ulps`: that, with room, and never below ``ROUNDING_ULPS``).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch

from .models import LoadedModel

ROUNDING_ULPS = 8
SIGNIFICANT_BITS = {torch.float32: 24, torch.bfloat16: 8, torch.float16: 11}
NEAR_TIE, BUG = "near-tie", "bug"


def ulp(x: float, dtype: torch.dtype) -> float:
    """The spacing of ``dtype``'s numbers around ``x`` (for |x| >= 1; 1's spacing below that)."""
    exponent = math.floor(math.log2(abs(x))) if abs(x) >= 1 else 0
    return 2.0 ** (exponent - SIGNIFICANT_BITS.get(dtype, 24) + 1)


def rounding_bound(top_logit: float, dtype: torch.dtype, ulps: float = ROUNDING_ULPS) -> float:
    """The largest logit margin that rounding in ``dtype`` explains (module doc)."""
    return ulps * ulp(top_logit, dtype)


@dataclass
class Divergence:
    """The first position where a method's output left the reference's, and why."""

    position: int  # index into the new tokens
    greedy_token: int
    method_token: int | None  # None: the method stopped early (no token there)
    margin: float  # reference's logit(greedy_token) - logit(method_token), as the reference computed it
    bound: float  # what rounding in ``dtype`` explains at this logit size
    cause: str  # NEAR_TIE or BUG
    dtype: str
    forward_tokens: int | None = None  # the method's forward size at that position, when known

    def to_json(self) -> dict:
        return asdict(self)


def first_difference(a: list[int], b: list[int]) -> int | None:
    """The first index where ``a`` and ``b`` differ (one ending early counts); None if equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


@torch.inference_mode()
def reference_logits(lm: LoadedModel, prompt_ids: list[int], reference: list[int], position: int) -> torch.Tensor:
    """``[vocab]`` float32: greedy decoding's logits for new token ``position``, recomputed by
    replaying its one-token forwards over ``reference[:position]`` (bit for bit what it computed)."""
    return replay_logits(lm, prompt_ids, reference[:position], position + 1)[-1]


@torch.inference_mode()
def replay_logits(lm: LoadedModel, prompt_ids: list[int], reference: list[int], count: int,
                  chunk: int = 1) -> torch.Tensor:
    """``[count, vocab]`` float32: the logits of new tokens ``0..count-1`` with ``reference`` fed back,
    computed as greedy decoding does (``chunk`` 1: one-token forwards, no mask) or in forwards of
    ``chunk`` tokens under the tree mask (a chain), as a tree step computes them."""
    from .decoders.greedy import GreedyDecoder
    from .trees import TreeTensors

    dec = GreedyDecoder(lm, max_new_tokens=count)
    dec.start(prompt_ids)
    fed = [int(dec.last)] + list(reference[:count - 1])
    out = []
    for i in range(0, count, chunk):
        ids = torch.tensor(fed[i:i + chunk], device=lm.device)[None]
        if chunk == 1:
            out.append(dec.forward(ids).float())
            continue
        q = ids.shape[1]
        past = dec.cache_length
        tree = TreeTensors.from_parents(list(range(-1, q - 1)), list(range(q)), lm.device, lm.dtype)
        out.append(dec.forward(ids, tree.position_ids(past), lm.tree_masks(tree, past)).float())
    return torch.cat(out)[:count]


def measure_rounding(lm: LoadedModel, prompt_ids: list[int], reference: list[int],
                     chunks=(4, 16, 64)) -> dict:
    """How far a tree forward's logits move from greedy's on this device and dtype (module doc):
    for every position of ``reference`` and every chunk size, the change of the margin between greedy's
    top two candidates, in ulps of the larger logit; the largest and the 99th percentile, and the
    largest change of any logit (also in ulps)."""
    n = len(reference)
    if n < 2:
        return {"positions": 0, "max_margin_ulps": 0.0, "p99_margin_ulps": 0.0, "max_logit_ulps": 0.0}
    one = replay_logits(lm, prompt_ids, reference, n)
    top2 = one.topk(2, dim=-1).indices  # [n, 2]
    shifts, logit_shift = [], 0.0
    for q in sorted({min(q, n) for q in chunks}):  # a chunk longer than the output is the output
        many = replay_logits(lm, prompt_ids, reference, n, chunk=q)
        a, b = top2[:, 0:1], top2[:, 1:2]
        m1 = (one.gather(1, a) - one.gather(1, b)).squeeze(1)
        mq = (many.gather(1, a) - many.gather(1, b)).squeeze(1)
        units = torch.tensor([ulp(float(x), lm.dtype) for x in one.gather(1, a).squeeze(1).tolist()])
        shifts += ((m1 - mq).abs().cpu() / units).tolist()
        logit_shift = max(logit_shift, float(((one - many).abs().amax(dim=-1).cpu() / units).max()))
    shifts.sort()
    return {"positions": n, "chunks": list(chunks), "max_margin_ulps": round(shifts[-1], 3),
            "p99_margin_ulps": round(shifts[int(0.99 * (len(shifts) - 1))], 3),
            "max_logit_ulps": round(logit_shift, 3)}


def measured_bound_ulps(measured: float, room: float = 2.0) -> float:
    """The bound to classify with, from the largest margin change measured (:func:`measure_rounding`):
    ``room`` times it (positions not measured may move more), never below ``ROUNDING_ULPS``."""
    return max(float(ROUNDING_ULPS), room * float(measured))


def explain_divergence(lm: LoadedModel, prompt_ids: list[int], reference: list[int], output: list[int],
                       forward_tokens: int | None = None, bound_ulps: float = ROUNDING_ULPS) -> Divergence | None:
    """Why ``output`` first differs from greedy decoding's ``reference`` (None where it does not);
    ``forward_tokens``: the method's forward size at that position, for the explanation;
    ``bound_ulps``: what rounding explains, in ulps (a device's measured bound: :func:`measured_bound_ulps`)."""
    pos = first_difference(reference, output)
    if pos is None or pos >= len(reference):
        return None  # identical, or the reference stopped first (it cannot then be wrong before)
    dtype = str(lm.dtype).replace("torch.", "")
    if pos >= len(output):  # the method stopped where greedy went on: no rounding explains that
        return Divergence(pos, reference[pos], None, math.inf, 0.0, BUG, dtype, forward_tokens)
    logits = reference_logits(lm, prompt_ids, reference, pos)
    top, mine = float(logits[reference[pos]]), float(logits[output[pos]])
    margin, bound = top - mine, rounding_bound(max(top, mine, key=abs), lm.dtype, bound_ulps)
    return Divergence(pos, reference[pos], output[pos], round(margin, 6), bound,
                      NEAR_TIE if margin <= bound else BUG, dtype, forward_tokens)


def describe(div: Divergence, token_text=lambda t: str(t)) -> str:
    """One or two sentences for a reader: where the outputs part and why."""
    where = f"token {div.position + 1}"
    if div.cause == BUG:
        return (f"{where}: the method chose {token_text(div.method_token)!r} where greedy chose "
                f"{token_text(div.greedy_token)!r}, {div.margin:.3g} logits behind; {div.dtype} rounding explains "
                f"at most {div.bound:.3g}, so this is a bug, not rounding.")
    size = f"a {div.forward_tokens}-token forward" if div.forward_tokens else "a multi-token forward"
    exact = "float32 mode avoids it" if div.dtype != "float32" else "it is within float32 rounding"
    return (f"{where}: the model's two candidates {token_text(div.greedy_token)!r} and "
            f"{token_text(div.method_token)!r} were {div.margin:.3g} logits apart (rounding explains up to "
            f"{div.bound:.3g}); {div.dtype} rounding in {size} picked the other one. Both continuations are "
            f"greedy up to rounding; {exact}.")
