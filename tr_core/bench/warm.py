"""``python -m tr_core.bench.warm``: write the hot-start matrix an app ships for a model, warmed on the
calibration split.

The paper's hot start keeps ``M`` from one request to the next, so a server that has answered
earlier requests drafts from rows already written.  This command plays those earlier requests: it
decodes prompts of the calibration split (never the evaluation split, nor the prompts of the
``--examples`` file, which are left out wherever they occur) with Token Recycling's default
settings, one matrix throughout, and saves that matrix to ``--out``.  This repository's app starts
every new tab from its own copy of the file it ships, made by

    python -m tr_core.bench.warm --prompts ../shared/data/spec_bench/question.jsonl \
        --examples assets/examples.json --limit 10 --max-new-tokens 128 --out assets/matrix/embedded.safetensors

The file records the command, the split and the prompt count (its ``note``).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from .data import PROMPTS_HELP, SPLITS, load_prompts

def page_examples(path) -> set[str]:
    """The prompts of an examples file (a JSON list of ``{"prompt": ...}``; none where ``path`` is None
    or the file is missing): never warmed on, so that a page's examples start from unseen rows."""
    if path is None:
        return set()
    try:
        return {str(e["prompt"]).strip() for e in json.loads(Path(path).read_text())}
    except (OSError, ValueError, KeyError, TypeError):
        return set()


def first_per_category(prompts: list, limit: int) -> list:
    """The first ``limit`` prompts of each category, in order."""
    seen: dict[str, int] = {}
    kept = []
    for p in prompts:
        seen[p.category] = seen.get(p.category, 0) + 1
        if seen[p.category] <= limit:
            kept.append(p)
    return kept


def warm_prompts(path, limit: int, examples_file=None) -> list:
    """The prompts the warm run decodes: the first ``limit`` of each category of the calibration split,
    the prompts of ``examples_file`` (:func:`page_examples`) left out."""
    examples = page_examples(examples_file)
    calib = [p for p in load_prompts(path, None, offset=SPLITS["calib"]) if p.text.strip() not in examples]
    return first_per_category(calib, limit)


def warm_matrix(lm, prompts: list[list[int]], max_new_tokens: int, k: int = 8, report=None):
    """Token Recycling (default settings: the auto tree, retrieval) over ``prompts`` (token ids), one
    hot-started matrix throughout; returns the matrix.  ``report(i, n)`` after each prompt."""
    from ..decoders import TokenRecyclingDecoder
    from ..matrix import AdjacencyMatrix
    from ..planner import TreePlanner

    matrix = AdjacencyMatrix(lm.vocab_size, k, lm.device, lm.fingerprint)
    planner = TreePlanner(lm, k=k)
    for i, ids in enumerate(prompts, 1):
        TokenRecyclingDecoder(lm, matrix=matrix, planner=planner, k=k, max_new_tokens=max_new_tokens,
                              trace_rows=False).generate(ids)
        if report is not None:
            report(i, len(prompts))
    return matrix


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m tr_core.bench.warm", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", required=True, help=PROMPTS_HELP)
    ap.add_argument("--examples", default=None, help="a page's examples (JSON list of {\"prompt\": ...}), left out")
    ap.add_argument("--limit", type=int, default=10, help="calibration prompts per category")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--model", default=None, help="default: the embedded model")
    ap.add_argument("--out", required=True, help="the matrix file to write (.safetensors)")
    return ap


def main(argv: list[str] | None = None) -> int:
    from ..models import ModelLoadError, load_model

    ap = build_parser()
    args = ap.parse_args(argv)
    if args.limit < 1 or args.max_new_tokens < 1:
        ap.error("--limit and --max-new-tokens must be at least 1")
    try:
        prompts = warm_prompts(args.prompts, args.limit, args.examples)
        if not prompts:
            raise ValueError(f"no calibration prompts in {args.prompts}")
        lm = load_model(args.model, "cpu", "float32")
        t0 = time.monotonic()
        matrix = warm_matrix(lm, [lm.encode_prompt(p.text) for p in prompts], args.max_new_tokens,
                                    report=lambda i, n: print(f"\r{i}/{n} prompts", end="", file=sys.stderr,
                                                              flush=True))
        skipped = ", none of the page's examples" if args.examples else ""
        matrix.note = (f"warmed on {len(prompts)} calibration prompts (up to {args.limit} a category of Spec-Bench, "
                       f"after the {SPLITS['calib']} of the evaluation split{skipped}; {args.max_new_tokens} tokens each)")
        matrix.save(args.out, model_name=lm.name)
    except (OSError, ValueError, ModelLoadError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    rows = int((matrix.table != 0).any(1).sum())
    print(f"\n{args.out}: {rows} rows written of {matrix.vocab_size}, {matrix.note}; "
          f"{time.monotonic() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
