"""``python -m tr_core.bench.kernels``: what a q-token forward costs next to a 1-token one, per kernel.

The ratio cost(q) / cost(1) is the denominator of every speedup a tree can give.  This times the
whole model (``tr_core.cost.time_forwards``: a chain of q tokens over a 128-token cache, with an
explicit mask, as tree steps run it; the median of ``--repeats`` after a warm-up round) with:

* ``plain``: PyTorch's default CPU linear kernels (MKL);
* ``packed``: every linear layer's weight reordered once for oneDNN (``tr_core.prepack``);
* ``by size``: the per-size choice between those two that ``load_model`` makes at load (what the
  decoders and the greedy baseline use);
* ``compiled`` (``--compile``): ``torch.compile`` with Inductor's CPU freezing, dynamic shapes; only
  kept in the table where its greedy tokens equal the plain model's (numerics left alone).

It prints milliseconds and the ratio to 1 token per size, with the CPU, and ``--json`` writes them.
"""
from __future__ import annotations

import argparse
import sys
import time

import torch

from ..cost import time_forwards

SIZES = (1, 2, 4, 6, 8, 12, 16, 24, 32, 48, 81)


def curve(lm, sizes, repeats: int) -> list[float]:
    return time_forwards(lm, sizes, 128, repeats)


def with_choice(lm, packed: bool | None):
    """Set every packed layer to always packed (True), always plain (False), or back to the load-time
    choice (None: returns nothing to restore)."""
    from ..prepack import kernel_choice

    choice = kernel_choice(lm.model)
    if choice is None:
        return None
    saved = (list(choice.rows), list(choice.packed))
    if packed is not None:
        choice.rows, choice.packed = [1], [packed]
    return choice, saved


def restore(state) -> None:
    if state is not None:
        choice, (rows, packed) = state
        choice.rows, choice.packed = rows, packed


def compiled_curve(lm, sizes, repeats: int, reference: list[int]):
    """The same timings with ``torch.compile`` (freezing, dynamic shapes), or the reason it is not kept."""
    import dataclasses

    from ..decoders import GreedyDecoder

    import torch._inductor.config as inductor

    frozen = inductor.freezing
    try:
        inductor.freezing = True
        model = torch.compile(lm.model, dynamic=True)
        clm = dataclasses.replace(lm, model=model)
        t0 = time.perf_counter()
        out = GreedyDecoder(clm, len(reference)).generate(lm.encode_prompt("The capital of France is"))
        warm = time.perf_counter() - t0
        if out != reference:
            return None, "its greedy tokens differ from the plain model's (numerics changed)"
        return curve(clm, sizes, repeats), f"compiled in {warm:.0f} s"
    except Exception as err:  # Inductor needs a C++ compiler and can fail in many ways
        return None, f"torch.compile failed here ({type(err).__name__}: {str(err).splitlines()[0][:120]})"
    finally:
        inductor.freezing = frozen


def main(argv: list[str] | None = None) -> int:
    from ..decoders import GreedyDecoder
    from ..devices import cpu_info
    from ..models import ModelLoadError, load_model

    ap = argparse.ArgumentParser(prog="python -m tr_core.bench.kernels", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--compile", action="store_true", help="also time torch.compile with CPU freezing (slow to build)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    try:
        lm = load_model(args.model, "cpu", "float32")
    except (OSError, ValueError, ModelLoadError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    sizes = list(SIZES)
    rows: dict[str, list[float]] = {}
    notes: dict[str, str] = {}
    for name, packed in (("plain", False), ("packed", True), ("by size", None)):
        state = with_choice(lm, packed)
        if state is None and name != "plain":
            notes[name] = "no packed layers on this CPU"
            continue
        try:
            rows[name] = curve(lm, sizes, args.repeats)
        finally:
            restore(state)
    if args.compile:
        state = with_choice(lm, False)  # Inductor takes plain weights; it packs them itself
        try:
            reference = GreedyDecoder(lm, 12).generate(lm.encode_prompt("The capital of France is"))
            timed, notes["compiled"] = compiled_curve(lm, sizes, args.repeats, reference)
        finally:
            restore(state)
        if timed is not None:
            rows["compiled"] = timed
    info = cpu_info()
    print(f"{lm.name}, float32, forward of q tokens over a 128-token cache, median of {args.repeats}; "
          f"CPU {info.get('model')} ({info.get('torch_isa')}, {info.get('threads')} threads)")
    print("ms (ratio to 1 token)")
    print(f"{'q':>4} " + " ".join(f"{n:>16}" for n in rows))
    for i, q in enumerate(sizes):
        print(f"{q:>4} " + " ".join(f"{s[i] * 1e3:8.1f} ({s[i] / s[0]:4.2f})" for s in rows.values()))
    fastest = {q: min(rows, key=lambda n: rows[n][i]) for i, q in enumerate(sizes)}
    print("fastest by size:", ", ".join(f"{q}: {n}" for q, n in fastest.items()))
    for name, note in notes.items():
        print(f"note: {name}: {note}")
    if args.json:
        from .report import write_json

        write_json({"model": lm.name, "cpu": info, "sizes": sizes, "seconds": rows, "notes": notes,
                    "fastest": fastest, "kernels_by_rows": _choice_dict(lm)}, args.json, "python -m tr_core.bench.kernels", argv)
    return 0


def _choice_dict(lm):
    from ..prepack import kernel_choice

    choice = kernel_choice(lm.model)
    return choice.as_dict() if choice is not None else None


if __name__ == "__main__":
    sys.exit(main())
