"""``python -m tr_core.bench.calibrate``: learn every number the decoders take from data, on prompts
the reported figures never use.

What it learns, all on the calibration split (Spec-Bench after the first 10 questions of each
category, ``--offset 10``; the bench reports the first 10, ``--split eval``):

* the acceptance rate of every node of the paper's tree (the planner's prior, stored in
  ``paper-80.json`` as ``"acceptance"``): Token Recycling with the full tree and a hot-started
  matrix, no prompt lookup; a node's rate is the fraction of steps in which it was accepted,
  smoothed by half a hit (never exactly 0);
* the ``tr-N`` presets: the N nodes with the highest rates, grown best-first (a parent before its
  children), so each is a sub-tree of the paper's;
* the retrieval prior (``"lookup_acceptance"`` in ``paper-80.json``): P(the i-th token of a
  continuation is accepted) by match length (``tr_core.lookup.MATCH_BUCKETS``) and by whether the previous lookup step's
  continuation was accepted at length (``hot``, the text is being copied: ``planner.is_hot``) or
  not (``cold``), from the retrieval (``lookup_longest``) replayed on the greedy outputs (lossless, so TR's outputs
  are greedy's).  ``--only lookup`` re-derives this one alone, from greedy decoding.

``--write DIR`` stores them in the preset folder ``DIR`` (the one this package ships and reads is
``tr_core/tree_presets``) with the command and split in each file's ``"calibration"`` entry; without
it the results are printed only.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..lookup import MATCH_BUCKETS, lookup_longest, match_bucket
from ..planner import is_hot
from ..trees import TreeShape, load_tree
from .data import EVAL_PER_CATEGORY, PROMPTS_HELP, SPLITS, is_spec_bench, load_prompts

PRESET_SIZES = (8, 10, 16, 20, 24, 40, 56)  # 56 + a 24-token lookup: the paper's budget of 80 draft nodes
LOOKUP_SPAN = 24  # continuation positions a lookup prior covers
UNIVERSE = "paper-80"
MIN_TRIALS = 20  # fewer observations than this at a lookup position: no prior there (the geometric one holds)
PSEUDO_TRIALS = 2.0  # how many trials the geometric prior counts as inside a calibrated lookup rate


def significant(x: float, digits: int = 4) -> float:
    """``x`` rounded to ``digits`` significant digits (a small rate stays small, never 0)."""
    return float(f"{x:.{digits}g}")


def smoothed(hits: float, trials: float, prior: float, pseudo: float) -> float:
    """``(hits + pseudo * prior) / (trials + pseudo)``: a rate that is never exactly 0 or 1 from a
    handful of observations (a hard 0 in a prior would mean "never try this again")."""
    return (hits + pseudo * prior) / (trials + pseudo)


def tree_acceptance(lm, prompts: list[list[int]], universe: TreeShape, max_new_tokens: int):
    """TR on ``universe`` over ``prompts`` (token ids), one hot-started matrix throughout.

    Returns (per-node acceptance rate ``[|universe|]``, steps counted, the outputs).  A rate is
    smoothed by half a hit over one step (Jeffreys), so a node never seen accepted keeps a small
    chance instead of a hard zero."""
    from ..decoders import TokenRecyclingDecoder
    from ..matrix import AdjacencyMatrix

    matrix = AdjacencyMatrix(lm.vocab_size, 8, lm.device, lm.fingerprint)
    hits, steps, outputs = [0] * universe.size, 0, []
    for ids in prompts:
        dec = TokenRecyclingDecoder(lm, tree=universe, matrix=matrix, lookup=0, max_new_tokens=max_new_tokens,
                                    trace_rows=False, drop_blank=False)  # every node drafted: the shape's indices
        outputs.append(dec.generate(ids))
        for step in dec.steps:
            steps += 1
            for node in step.accepted_path[1:]:
                hits[node - 1] += 1
    return [smoothed(h, steps, 0.5, 1.0) for h in hits], steps, outputs


def lookup_acceptance(prompts: list[list[int]], outputs: list[list[int]], span: int = LOOKUP_SPAN) -> dict:
    """Retrieval replayed on known outputs: at each step the continuation of the longest suffix
    match (``tr_core.lookup.lookup_longest``, up to ``span`` tokens) is matched against the output's next tokens, then the step
    commits the matched tokens and one more, as a verifying forward would.

    Returns ``{"1": {"cold": [rate by position], "hot": [...]}, "2": ..., ...}`` by match length
    (``MATCH_BUCKETS``).  A rate is
    None where fewer than ``MIN_TRIALS`` continuations reached that position (the planner then uses
    its geometric prior), else shrunk towards that geometric prior by ``PSEUDO_TRIALS``."""
    from ..planner import ChainStats

    import torch

    trials: dict = {}
    hits: dict = {}
    for prompt, out in zip(prompts, outputs):
        t, hot = 0, False
        while t < len(out):
            chain, match = lookup_longest(torch.tensor(prompt + out[:t]), span)
            n = match_bucket(match)
            chain = chain[:len(out) - t]
            run = next((i for i, (a, b) in enumerate(zip(chain, out[t:])) if a != b), len(chain))
            for i in range(len(chain)):
                key = (n, hot, i)
                trials[key] = trials.get(key, 0) + 1
                hits[key] = hits.get(key, 0) + (i < run)
            if chain:
                hot = is_hot(len(chain), run)
            t += run + 1
    geometric = lambda n, i: ChainStats.PRIOR_RATE[n] ** (i + 1)  # noqa: E731
    return {str(n): {state: [significant(smoothed(hits[n, h, i], trials[n, h, i], geometric(n, i), PSEUDO_TRIALS))
                             if trials.get((n, h, i), 0) >= MIN_TRIALS else None for i in range(span)]
                     for state, h in (("cold", False), ("hot", True))}
            for n in MATCH_BUCKETS}


def grow_preset(universe: TreeShape, rates: list[float], size: int) -> list[list[int]]:
    """The ``size`` nodes of ``universe`` with the highest rates whose parents are in: best-first."""
    rate = dict(zip(universe.paths, rates))
    chosen, frontier = [], [p for p in universe.paths if len(p) == 1]
    while frontier and len(chosen) < size:
        best = max(frontier, key=lambda p: (rate[p], -len(p)))
        frontier.remove(best)
        chosen.append(best)
        frontier += [p for p in universe.paths if len(p) == len(best) + 1 and p[:-1] == best]
    return [list(p) for p in sorted(chosen, key=lambda p: (len(p), p))]


def write_presets(universe_file: Path, rates: list[float], lookup: dict, provenance: dict, folder: Path) -> None:
    """Store the rates and lookup prior in the universe's file and (re)write the ``tr-N`` presets."""
    data = json.loads(universe_file.read_text())
    universe = load_tree(UNIVERSE)
    data["acceptance"] = [significant(r) for r in rates]
    data["acceptance_note"] = ("Fraction of steps in which each node was accepted, smoothed by half a hit (the "
                               "cost-aware planner's prior); learnt by the command in \"calibration\", never on "
                               "the reported prompts.")
    data["lookup_acceptance"] = lookup
    data["calibration"] = provenance
    data.pop("lookup_calibration", None)  # an earlier --only lookup run: this one supersedes it
    universe_file.write_text(json.dumps(data) + "\n")
    for size in PRESET_SIZES:
        preset = {"name": f"tr-{size}",
                  "description": (f"The {size} nodes of the paper's tree with the highest acceptance rate in "
                                  f"{UNIVERSE}.json, grown best-first so every node's parent is in; a sub-tree "
                                  "of the paper's tree."),
                  "nodes": grow_preset(universe, rates, size), "calibration": provenance}
        (folder / f"tr-{size}.json").write_text(json.dumps(preset) + "\n")


def greedy_outputs(lm, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
    """Plain greedy decoding of every prompt (what the lookup prior is replayed on)."""
    from ..decoders import GreedyDecoder

    return [GreedyDecoder(lm, max_new_tokens).generate(ids) for ids in prompts]


def write_lookup_prior(universe_file: Path, lookup: dict, provenance: dict) -> None:
    """Store the lookup prior alone, with its own provenance (``"lookup_calibration"``)."""
    data = json.loads(universe_file.read_text())
    data["lookup_acceptance"] = lookup
    data["lookup_calibration"] = provenance
    universe_file.write_text(json.dumps(data) + "\n")


def main(argv: list[str] | None = None) -> int:
    from ..models import ModelLoadError, load_model

    ap = argparse.ArgumentParser(prog="python -m tr_core.bench.calibrate", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", required=True, help=PROMPTS_HELP)
    ap.add_argument("--offset", type=int, default=SPLITS["calib"],
                    help="skip the first N of each category (default: the evaluation split's 10)")
    ap.add_argument("--limit", type=int, default=5, help="prompts per category")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--model", default=None)
    ap.add_argument("--write", default=None, metavar="DIR",
                    help="store the results in this preset folder (the package's own: tr_core/tree_presets)")
    ap.add_argument("--only", choices=("all", "lookup"), default="all",
                    help="lookup: re-derive only the prompt-lookup prior (from greedy decoding; quicker)")
    args = ap.parse_args(argv)
    if args.limit < 1 or args.max_new_tokens < 1 or args.offset < 0:
        ap.error("--limit and --max-new-tokens must be at least 1, --offset at least 0")
    if args.write and args.offset < EVAL_PER_CATEGORY and is_spec_bench(args.prompts):
        ap.error(f"--write learns only from the calibration split: use --offset {EVAL_PER_CATEGORY} or more "
                 f"(the first {EVAL_PER_CATEGORY} questions of each category are what the bench reports)")
    try:
        prompts = load_prompts(args.prompts, args.limit, offset=args.offset)
        if not prompts:
            raise ValueError(f"no prompts in {args.prompts} past offset {args.offset}")
        lm = load_model(args.model, "cpu", "float32")
    except (OSError, ValueError, ModelLoadError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    ids = [lm.encode_prompt(p.text) for p in prompts]
    command = "python -m tr_core.bench.calibrate " + " ".join(argv if argv is not None else sys.argv[1:])
    provenance = {"command": command.strip(), "prompts": Path(args.prompts).name, "offset": args.offset,
                  "limit": args.limit, "prompt_count": len(prompts), "max_new_tokens": args.max_new_tokens,
                  "model": lm.name, "dtype": "float32"}
    folder = Path(args.write) if args.write else None
    if args.only == "lookup":
        lookup = lookup_acceptance(ids, greedy_outputs(lm, ids, args.max_new_tokens))
        print(json.dumps({"provenance": provenance, "lookup_hot_3": lookup["3"]["hot"][:8],
                          "lookup_cold_3": lookup["3"]["cold"][:8]}))
        if args.write:
            write_lookup_prior(folder / f"{UNIVERSE}.json", lookup, provenance)
        return 0
    rates, steps, outputs = tree_acceptance(lm, ids, load_tree(UNIVERSE), args.max_new_tokens)
    lookup = lookup_acceptance(ids, outputs)
    provenance["steps"] = steps
    print(json.dumps({"provenance": provenance, "top_rates": sorted(rates, reverse=True)[:8],
                      "lookup_hot_3": lookup["3"]["hot"][:8], "lookup_cold_3": lookup["3"]["cold"][:8]}))
    if args.write:
        write_presets(folder / f"{UNIVERSE}.json", rates, lookup, provenance, folder)
    return 0


if __name__ == "__main__":
    sys.exit(main())
