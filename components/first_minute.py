"""``python -m components.first_minute``: what a visitor's first Steps show, measured as the page runs them.

Each prompt gets a fresh tab (``components.session.Session``: its own copy of the shipped matrix,
or a cold start), then ``--steps`` Step presses with the page's default settings (TR, the auto
tree, prompt lookup on), and the figures the counters then show: MAT (tokens per forward) and the
speedup over greedy, both decoded side by side in this process.  A run that ends before the last
press is read where it ended.  The model is warmed first, as the app does before its first visitor.

    python -m components.first_minute --categories mt_bench,summarization            # the evaluation split
    python -m components.first_minute --categories mt_bench --offset 20 --limit 60    # MT-bench no calibration used

The calibration commands (``tr_core.bench.calibrate``, ``tr_core.bench.warm``) read the 10 questions
of each category after the evaluation split's first 10: with ``--offset 20`` a category's prompts
were never seen by any of them.  Run it on a quiet machine: the auto tree's size follows the
forwards' measured times.
"""
from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from dataclasses import dataclass

TARGET_MAT, TARGET_SPEEDUP = 1.5, 1.0  # issue 23's bar: ahead of greedy by step 5


@dataclass
class FirstSteps:
    question_id: str
    category: str  # the subcategory where the file has one (MT-bench's writing, stem, ...)
    steps: int
    mat: float
    speedup: float

    @property
    def ahead(self) -> bool:
        return self.mat >= TARGET_MAT and self.speedup >= TARGET_SPEEDUP


def first_steps(hub, text: str, steps: int, start: str, warm_file: str | None):
    """A fresh tab's first ``steps`` Step presses on ``text``: the tab (``Session``) and the counters'
    figures after its last step."""
    from .handlers import make_settings
    from .session import Session

    sess = Session(warm_file=warm_file)
    settings = make_settings("embedded", "auto", 8, 96, True, True, "Token Recycling (TR)", start=start)
    for _ in range(steps):
        sess.step(hub, text, settings, 256)
        if sess.race.done:  # a further press would start the prompt again
            break
    return sess, sess.view().figures(len(sess.race.decoder.steps))


def subcategories(path: str) -> dict[str, str]:
    """Question id -> the file's own category (MT-bench's eight are grouped as ``mt_bench`` elsewhere)."""
    with open(path, encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return {str(r.get("question_id")): str(r.get("category", "default")) for r in rows}


def summary(results: list[FirstSteps]) -> list[str]:
    by: dict[str, list[FirstSteps]] = defaultdict(list)
    for r in results:
        by[r.category].append(r)
    lines = []
    for cat, rs in by.items():
        mats = sorted(r.mat for r in rs)
        lines.append(f"{cat:14} {sum(r.ahead for r in rs):>2} of {len(rs):<2} ahead "
                     f"(MAT >= {TARGET_MAT} {sum(r.mat >= TARGET_MAT for r in rs)}, speedup >= {TARGET_SPEEDUP:.1f}x "
                     f"{sum(r.speedup >= TARGET_SPEEDUP for r in rs)}); median MAT {mats[len(mats) // 2]:.2f}")
    return lines


def main(argv: list[str] | None = None) -> int:
    from tr_core.bench import __main__ as bench_cli
    from tr_core.bench.data import load_prompts
    from tr_core.devices import describe_machine

    from .model_hub import ModelHub
    from .session import SHIPPED_MATRIX
    from .startup import warm_up

    ap = argparse.ArgumentParser(prog="python -m components.first_minute", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", default=str(bench_cli.DEFAULT_PROMPTS))
    ap.add_argument("--categories", default="", help="comma-separated (grouped: mt_bench); default: all")
    ap.add_argument("--offset", type=int, default=0, help="questions skipped per category (0: the evaluation split)")
    ap.add_argument("--limit", type=int, default=10, help="questions per category")
    ap.add_argument("--steps", type=int, default=5, help="Step presses per prompt")
    ap.add_argument("--start", choices=["hot", "cold"], default="hot")
    args = ap.parse_args(argv)
    if args.limit < 1 or args.steps < 1 or args.offset < 0:
        ap.error("--limit and --steps must be at least 1, --offset at least 0")
    try:
        prompts = load_prompts(args.prompts, args.limit, offset=args.offset)
        subcat = subcategories(args.prompts)
    except (OSError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    wanted = {c for c in args.categories.split(",") if c}
    prompts = [p for p in prompts if not wanted or p.category in wanted]
    if not prompts:
        print(f"error: no prompts in {args.prompts} for {sorted(wanted) or 'any category'}", file=sys.stderr)
        return 2
    hub = ModelHub()
    print(warm_up(hub, lambda *a, **k: None), flush=True)
    print(f"{args.steps} Steps on a fresh page, {args.start} start, on {describe_machine(hub.get(None).device)}")
    results = []
    for p in prompts:
        sess, f = first_steps(hub, p.text, args.steps, args.start, str(SHIPPED_MATRIX))
        n = len(sess.race.decoder.steps)
        r = FirstSteps(p.question_id, subcat.get(p.question_id, p.category), n, f["tr"]["mat"], f["speedup"])
        results.append(r)
        print(f"q{r.question_id:>4} {r.category:14} steps {n} MAT {r.mat:.2f} speedup {r.speedup:.2f}x "
              f"{'ahead' if r.ahead else '     '} | {p.text[:48]!r}", flush=True)
    print("\n".join(summary(results)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
