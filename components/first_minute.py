"""``python -m components.first_minute``: what a visitor's first Steps show, measured as the page runs them.

Each prompt gets a fresh tab (``components.session.Session``: its own copy of the shipped matrix,
or a cold start), then ``--steps`` Step presses with the page's default settings (TR, the auto
tree, prompt lookup on, the page's token count), and the figures the counters then show: MAT
(tokens per forward) and the speedup over greedy, both decoded side by side in this process.  A run
that ends before the last press is read where it ended.  The model is warmed first, as the app does
before its first visitor.

    python -m components.first_minute --categories mt_bench,summarization            # the evaluation split
    python -m components.first_minute --categories mt_bench --offset 20 --limit 60    # MT-bench past both splits

Prompts that a calibration command read (``tr_core.bench.calibrate``'s presets and
``tr_core.bench.warm``'s shipped matrix, as their files record) are left out and counted, so that
the figures are on prompts the project never saw.  Run it on a quiet machine: the auto tree's size
follows the forwards' measured times.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

TARGET_MAT, TARGET_SPEEDUP = 1.5, 1.0  # the bar: by step 5, MAT 1.5 and no slower than greedy
ROOT = Path(__file__).resolve().parents[1]
SPEC_BENCH = ROOT.parent / "shared" / "data" / "spec_bench" / "question.jsonl"  # this project's copy of Spec-Bench
EXAMPLES = ROOT / "assets" / "examples.json"  # the page's examples (the warm command leaves them out)


@dataclass
class FirstSteps:
    """One prompt's first Steps on a fresh tab, as its counters read them."""

    question_id: str
    category: str  # the file's own category (MT-bench's writing, stem, ...)
    steps: int  # presses that ran a step (fewer where the run ended)
    mat: float
    speedup: float

    @property
    def at_bar(self) -> bool:
        return self.mat >= TARGET_MAT and self.speedup >= TARGET_SPEEDUP


def first_steps(hub, text: str, steps: int, start: str, warm_file: str | None):
    """A fresh tab's first ``steps`` Step presses on ``text``, with the page's defaults: the tab
    (``Session``) and the counters' figures after its last step."""
    from tr_core.decoders.recycling import DEFAULT_LOOKUP, DEFAULT_TREE

    from .session import METHODS, PAGE_TOKENS, Session, Settings

    sess = Session.starting_from(warm_file=warm_file)
    settings = Settings.from_inputs(dict(model="embedded", tree=DEFAULT_TREE, k=8, max_new_tokens=PAGE_TOKENS,
                                         hot_start=True, lookup=DEFAULT_LOOKUP > 0, method=next(iter(METHODS)),
                                         start=start))
    for _ in range(steps):
        sess.step(hub, text, settings, 256)
        if sess.live.race.done:  # a further press would start the prompt again
            break
    return sess, sess.view().figures(len(sess.live.race.decoder.steps))


def own_categories(path: str) -> dict[str, str]:
    """Question id -> the file's own category (MT-bench's eight are grouped as ``mt_bench`` elsewhere)."""
    from tr_core.bench.data import load_prompts

    return {p.question_id: p.category for p in load_prompts(path, group=False)}


def calibration_reads(path: str) -> set[str]:
    """Question ids a calibration command read: the presets' (``tr_core.bench.calibrate``, its
    offset and limit as ``paper-80.json`` records them) and the shipped matrix's
    (``tr_core.bench.warm`` at its default limit, the page's examples skipped)."""
    from tr_core.bench import warm
    from tr_core.bench.data import SPLITS, load_prompts
    from tr_core.trees import PRESET_DIR

    made = json.loads((PRESET_DIR / "paper-80.json").read_text()).get("calibration", {})
    presets = load_prompts(path, made.get("limit", 10), offset=made.get("offset", SPLITS["calib"]))
    warmed = warm.warm_prompts(path, warm.build_parser().get_default("limit"), EXAMPLES)
    return {p.question_id for p in presets} | {p.question_id for p in warmed}


def summary(results: list[FirstSteps]) -> list[str]:
    """One line per category: how many prompts reach the bar, each condition alone, the median MAT."""
    by: dict[str, list[FirstSteps]] = defaultdict(list)
    for r in results:
        by[r.category].append(r)
    return [f"{cat:14} {sum(r.at_bar for r in rs):>2} of {len(rs):<2} at the bar "
            f"(MAT >= {TARGET_MAT} {sum(r.mat >= TARGET_MAT for r in rs)}, speedup >= {TARGET_SPEEDUP:.1f}x "
            f"{sum(r.speedup >= TARGET_SPEEDUP for r in rs)}); median MAT {statistics.median(r.mat for r in rs):.2f}"
            for cat, rs in by.items()]


def main(argv: list[str] | None = None) -> int:
    """Parse, pick the prompts (a message, not a traceback, where there are none), warm, measure."""
    from tr_core.bench.data import is_spec_bench, load_prompts
    from tr_core.devices import describe_machine
    from tr_core.models import ModelLoadError

    from .model_hub import ModelHub
    from .session import SHIPPED_MATRIX
    from .startup import warm_up

    ap = argparse.ArgumentParser(prog="python -m components.first_minute", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", default=str(SPEC_BENCH))
    ap.add_argument("--categories", default="",
                    help="comma-separated, grouped (mt_bench) or the file's own (writing, stem); default: all")
    ap.add_argument("--offset", type=int, default=0, help="questions skipped per category (0: the evaluation split)")
    ap.add_argument("--limit", type=int, default=10, help="questions per category")
    ap.add_argument("--steps", type=int, default=5, help="Step presses per prompt")
    ap.add_argument("--start", choices=["hot", "cold"], default="hot")
    args = ap.parse_args(argv)
    if args.limit < 1 or args.steps < 1 or args.offset < 0:
        ap.error("--limit and --steps must be at least 1, --offset at least 0")
    try:
        prompts = load_prompts(args.prompts, args.limit, offset=args.offset)
        own = own_categories(args.prompts)
        read = calibration_reads(args.prompts) if is_spec_bench(args.prompts) else set()
    except (OSError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    wanted = {c for c in args.categories.split(",") if c}
    prompts = [p for p in prompts if not wanted or wanted & {p.category, own.get(p.question_id)}]
    unseen = [p for p in prompts if p.question_id not in read]
    if not unseen:
        names = sorted({p.category for p in load_prompts(args.prompts)} | set(own.values()))
        print(f"error: no prompts the calibration never read in {args.prompts} for "
              f"{sorted(wanted) or 'any category'} (categories: {', '.join(names)})", file=sys.stderr)
        return 2
    hub = ModelHub()
    try:
        print(warm_up(hub, lambda *a, **k: None), flush=True)
    except (ModelLoadError, OSError) as err:
        print(f"error: the model did not load: {err}", file=sys.stderr)
        return 2
    left = f"; {len(prompts) - len(unseen)} left out, a calibration command read them" if len(unseen) < len(prompts) else ""
    print(f"{args.steps} Steps on a fresh page, {args.start} start, on {describe_machine(hub.get(None).device)}{left}")
    results = []
    for p in unseen:
        sess, f = first_steps(hub, p.text, args.steps, args.start, str(SHIPPED_MATRIX))
        r = FirstSteps(p.question_id, own.get(p.question_id, p.category), len(sess.live.race.decoder.steps),
                       f["tr"]["mat"], f["speedup"])
        results.append(r)
        print(f"q{r.question_id:>4} {r.category:14} steps {r.steps} MAT {r.mat:.2f} speedup {r.speedup:.2f}x "
              f"{'at the bar' if r.at_bar else '          '} | {p.text[:48]!r}", flush=True)
    print("\n".join(summary(results)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
