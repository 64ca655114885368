"""``python -m tr_core.bench`` (``tr-bench``): greedy vs Token Recycling on Spec-Bench-format prompts."""
from __future__ import annotations

import argparse
import platform
import sys
from typing import NamedTuple

import torch

from ..decoders.recycling import DEFAULT_TREE
from ..devices import cpu_info, free_memory, oom_message, release_device_memory
from ..models import ModelLoadError, load_model
from ..pairs import default_slots
from ..sampling import SamplingConfig
from ..trees import TreeError
from ..prepack import kernel_choice
from .data import PROMPTS_HELP, SPLITS, calibration_overlap, load_prompts
from .harness import parse_methods, run_benchmark
from .peers import load_untouched, model_bytes, second_copy_fits
from .report import format_table, summarize, write_chart, write_csv, write_json


def run_meta(args, lm, specs, sampling, offset: int) -> dict:
    """What a report needs to be read and repeated: model, machine, versions, settings, kernels, trees."""
    import transformers

    return {"model": lm.name, "device": str(lm.device), "dtype": str(lm.dtype).replace("torch.", ""),
            "prepacked_linears": lm.prepacked,
            "kernels_by_rows": (kernel_choice(lm.model).as_dict() if lm.prepacked else None),
            "torch": torch.__version__, "transformers": transformers.__version__,
            "machine": f"{platform.machine()} {platform.processor() or ''} threads={torch.get_num_threads()}".strip(),
            "cpu": cpu_info(), "dtype_reason": lm.dtype_reason,
            "gpu": torch.cuda.get_device_name(lm.device) if lm.device.type == "cuda" else None,
            "peers": args.peers, "prompts_file": str(args.prompts), "offset": offset, "limit": args.limit, "max_new_tokens": args.max_new_tokens,
            "turns": args.turns, "template": lm.template, "attention": lm.layout.describe(), "sampling": None if sampling is None else vars(sampling), "matrix_shape": [lm.vocab_size, args.k],
            "matrix_bytes": lm.vocab_size * args.k * 4, "pair_rows_bytes": default_slots(lm.vocab_size) * (args.k * 4 + 8),
            "trees": {s.name: s.tree for s in specs if s.tree}, "default_tree": DEFAULT_TREE,
            "cost_curve": cost_curve_meta(lm)}


def cost_curve_meta(lm) -> dict | None:
    """This machine's measured forward cost by query length (what the planners start from), with the
    ratio to one token, the denominator of every speedup; None where no planner measured it."""
    c = lm.cost_curve
    if c is None:
        return None
    return {"prefix": c.prefix, "lengths": list(c.lengths), "ms": [round(x * 1e3, 2) for x in c.seconds],
            "ratio_to_1": [round(x / c.seconds[0], 3) for x in c.seconds],
            "per_cache_ms": c.per_cache * 1e3, "per_cache_fixed_ms": c.per_cache_fixed * 1e3}


# The command's options, in the order ``--help`` lists them: (flags, argparse keywords).
OPTIONS = [
    (("--prompts",), dict(required=True, help=PROMPTS_HELP)),
    (("--limit",), dict(type=int, default=2, help="at most N prompts per category")),
    (("--offset",), dict(type=int, default=None,
                         help="skip the first N prompts of each category (default 0: the evaluation split)")),
    (("--split",), dict(choices=sorted(SPLITS), default="eval",
                        help="eval: the first 10 per category (what the README reports); calib: the rest "
                             "(what python -m tr_core.bench.calibrate learns from); --offset overrides")),
    (("--max-new-tokens",), dict(type=int, default=64)),
    (("--methods",), dict(default="greedy,tr",
                          help="comma list (greedy, its A/A copy and hf-greedy always run): tr (device default), tr:uniform "
                               "(no learnt priors), tr:TREE (the paper's method exactly on TREE), tr:TREE+pldN (TREE, our drafting, N tokens retrieved from the context), tr:bestN (the best N draft nodes a step, tree and retrieval together: a GPU's budget), pld, hf-pld, "
                               "hf-pld:same, ptd (cost-aware on CPU), ptd:paper, ptd:TxD")),
    (("--tree",), dict(default=None, help="tree for plain 'tr' (preset, chain-N or JSON file)")),
    (("--lookup",), dict(type=int, default=None,
                         help="prompt-lookup tokens merged into plain 'tr' trees (0 = off; default 24, cut by the planner to what pays)")),
    (("--k",), dict(type=int, default=8, help="candidates per matrix row")),
    (("--matrix",), dict(default=None,
                         help="a matrix file every prompt's 'tr' starts from, as the app's hot start does (default: "
                              "from empty, carried over from prompt to prompt)")),
    (("--model",), dict(default=None, help="'embedded' (default), a HF id, a folder or a .gguf file")),
    (("--device",), dict(default=None)),
    (("--dtype",), dict(default=None)),
    (("--warmup",), dict(type=int, default=1)),
    (("--json",), dict(default=None, help="write the summary here")),
    (("--csv",), dict(default=None, help="write one row per method and category here")),
    (("--chart",), dict(default=None, help="write a speedup chart here (.html, and .png with kaleido)")),
    (("--no-group",), dict(action="store_true", help="keep MT-bench's eight subcategories apart")),
    (("--temperature",), dict(type=float, default=0.0,
                              help="0 = greedy (default); above 0: lossless sampling for every method, baseline plain sampling")),
    (("--top-p",), dict(type=float, default=1.0)),
    (("--top-k",), dict(type=int, default=0)),
    (("--seed",), dict(type=int, default=0)),
    (("--turns",), dict(type=int, choices=(1, 2), default=1,
                        help="2: also run second turns (MT-bench), after greedy's first answer")),
    (("--no-prepack",), dict(action="store_true",
                             help="keep PyTorch's default CPU linear kernels (see tr_core.prepack)")),
    (("--peers",), dict(choices=("untouched", "same"), default="untouched",
                        help="which model the hf-greedy and hf-pld peers run on: untouched (default): a second copy "
                             "loaded as transformers loads it, nothing of ours applied (twice the memory); same: the "
                             "model our decoders run on (our kernels; one copy)")),
    (("--quiet",), dict(action="store_true", help="no progress bar")),
    (("--save-runs",), dict(default=None, metavar="DIR",
                            help="also write one run file per prompt and method (the app opens and replays them)")),
    (("--concurrency",), dict(default=None, metavar="N,N,...",
                              help="a class: at each N, N prompts decoded together, one forward a round, TR against "
                                   "greedy (e.g. 1,4,8,16; tr_core.bench.classroom)")),
    (("--repeats",), dict(type=int, default=2, help="with --concurrency: runs of each method at each N")),
]


class Setup(NamedTuple):
    """What a benchmark runs: the prompts, the sampling (None: greedy), the model and the methods."""

    prompts: list
    sampling: SamplingConfig | None
    lm: object
    specs: list


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m tr_core.bench", description=__doc__)
    for flags, kw in OPTIONS:
        ap.add_argument(*flags, **kw)
    return ap


def check_args(ap: argparse.ArgumentParser, args) -> None:
    """Refuse values no run can use (``ap.error`` exits with the usage line)."""
    if args.max_new_tokens < 1 or args.limit < 1 or args.k < 1:
        ap.error("--max-new-tokens, --limit and --k must be at least 1")
    if args.warmup < 0 or (args.offset is not None and args.offset < 0) or (args.lookup is not None and args.lookup < 0):
        ap.error("--warmup, --offset and --lookup cannot be negative")
    if args.temperature < 0:
        ap.error("--temperature cannot be negative (0 is greedy decoding)")


def peers_fit(args, lm) -> None:
    """``--peers untouched`` where a second copy of the model fits; else the peers run on the same model, said."""
    if args.peers == "untouched" and not second_copy_fits(lm):
        print(f"note: a second copy of {lm.name} ({model_bytes(lm) / 2**30:.1f} GiB) does not fit in the "
              f"{(free_memory(lm.device) or 0) / 2**30:.1f} GiB free on {lm.device}: the peers run on the same "
              "model (--peers same)", file=sys.stderr)
        args.peers = "same"


def set_up(ap: argparse.ArgumentParser, args, offset: int) -> Setup | int:
    """The prompts, sampling, model and methods; else the exit code, the error said on stderr."""
    lm = None
    try:
        prompts = load_prompts(args.prompts, args.limit, group=not args.no_group, offset=offset)
        if not prompts:
            ap.error(f"no prompts in {args.prompts}")
        sampling = (SamplingConfig(args.temperature, args.top_p, args.top_k, args.seed)
                    if args.temperature > 0 else None)
        lm = load_model(args.model, args.device, args.dtype, prepack=not args.no_prepack)
        if args.concurrency:  # a class: its own decoders (tr_core.bench.classroom), no peers
            return Setup(prompts, sampling, lm, [])
        peers_fit(args, lm)
        plain = load_untouched(args.model, lm.device, lm.dtype) if args.peers == "untouched" else None
        specs = parse_methods(args.methods, lm, args.tree, args.k, args.lookup, sampling, plain, args.matrix)
    except (OSError, ValueError, ModelLoadError, TreeError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except torch.OutOfMemoryError:
        device = lm.device if lm is not None else (args.device or "cuda")
        print(f"error: {oom_message(args.model or 'the embedded model', args.dtype or 'auto', device)}", file=sys.stderr)
        return 3
    return Setup(prompts, sampling, lm, specs)


def say_summary(summary: dict) -> None:
    """The table on stdout; warnings, and any method's difference from greedy, on stderr."""
    print(format_table(summary))
    for warning in summary["warnings"]:
        print(f"WARNING: {warning}", file=sys.stderr)
    for name, m in summary["methods"].items():
        if m["mismatches"]:
            bugs = [x for x in m["mismatches"] if x.get("cause") != "near-tie"]
            print(f"{'WARNING' if bugs else 'note'}: {name} differs from greedy on {len(m['mismatches'])} prompt(s), "
                  f"{len(bugs)} not explained by rounding: {bugs or m['mismatches']}", file=sys.stderr)


def write_outputs(args, argv: list[str] | None, summary: dict, setup: Setup) -> None:
    """The files asked for: summary JSON, CSV, chart, run files."""
    if args.json:
        write_json(summary, args.json, "python -m tr_core.bench", argv)
    if args.csv:
        write_csv(summary, args.csv)
    if args.chart:
        print("chart:", ", ".join(write_chart(summary, args.chart)))
    if args.save_runs:
        from ..runs import save_runs

        print("run files:", len(save_runs(args.save_runs, setup.lm, setup.prompts, setup.specs, args.max_new_tokens)))


def main(argv: list[str] | None = None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    check_args(ap, args)
    offset = SPLITS[args.split] if args.offset is None else args.offset
    overlap = calibration_overlap(args.prompts, offset, args.limit, args.no_group)
    if overlap:
        print(f"WARNING: {overlap}", file=sys.stderr)
    setup = set_up(ap, args, offset)
    if isinstance(setup, int):
        return setup
    lm = setup.lm
    if args.concurrency:
        from .classroom import run_class

        return run_class(args, lm, setup.prompts, argv)
    try:
        runs = run_benchmark(lm, setup.prompts, setup.specs, args.max_new_tokens, args.warmup,
                             progress=not args.quiet, turns=args.turns, compare=setup.sampling is None)
    except torch.OutOfMemoryError:
        release_device_memory(lm.device)
        print(f"error: {oom_message(lm.name, lm.dtype, lm.device)}", file=sys.stderr)
        return 3
    summary = summarize(runs, run_meta(args, lm, setup.specs, setup.sampling, offset))
    say_summary(summary)
    write_outputs(args, argv, summary, setup)
    return 0
