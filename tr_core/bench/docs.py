"""``python -m tr_core.bench.docs RESULTS_DIR OUT.md``: a Markdown page of every result file in a folder.

Each ``*.json`` written by ``python -m tr_core.bench``, ``tr_core.bench.ablate``,
``tr_core.bench.kernels`` or ``tr_core.bench.gpu_check`` becomes a section: where it came from (its ``provenance``: commit, CPU,
date, command) and its table, printed as the command prints it.  The page is made from the files
alone, so it cannot disagree with them; ``--check`` says whether ``OUT.md`` is what the files give now.

    python -m tr_core.bench.docs assets/bench docs/benchmark.md
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .report import format_table

HEADER = """# Benchmark results

Generated from the result files in `{folder}` by `python -m tr_core.bench.docs {folder} {out}`;
do not edit by hand. Every speedup is over the fastest plain greedy decoder of its run (or plain
sampling, when sampling), with a 95% bootstrap interval over prompts; the A/A line compares that
baseline with its own second copy. MAT (tokens committed per forward) does not depend on the hardware;
the speedups do.
"""


def _provenance(result: dict) -> list[str]:
    p = result.get("provenance") or {}
    lines = [f"- command: `{p.get('command', 'not recorded')}`",
             f"- commit: {p.get('commit', 'not recorded')}; date: {p.get('date', 'not recorded')}",
             f"- CPU: {p.get('cpu', 'not recorded')}; torch {p.get('torch', '?')}, "
             f"transformers {p.get('transformers', '?')}"]
    if p.get("note"):
        lines.append(f"- note: {p['note']}")
    return lines


def _ablation(result: dict) -> str:
    lines = ["| variant | MAT | forward tokens | MAT / forward token | identical to greedy |", "|---|---|---|---|---|"]
    for r in result["rows"]:
        lines.append(f"| {r['name']} | {r['mat']:.2f} | {r['mean_forward_tokens']:.1f} | {r['per_forward_token']:.3f} "
                     f"| {r['identical']}/{r['prompts']} |")
    head = (f"{result['model']}; tree {result['tree']} plus {result['lookup']} retrieved tokens; {result['split']} split, "
            f"{result['limit']} prompts a category x {result['max_new_tokens']} tokens.")
    return head + "\n\n" + "\n".join(lines)


def _kernels(result: dict) -> str:
    sizes = result["sizes"]
    lines = ["| kernels | " + " | ".join(f"q={q}" for q in sizes) + " |", "|---" * (len(sizes) + 1) + "|"]
    for name, secs in result["seconds"].items():
        lines.append(f"| {name}, ms | " + " | ".join(f"{s * 1e3:.1f}" for s in secs) + " |")
        lines.append(f"| {name}, ratio to 1 | " + " | ".join(f"{s / secs[0]:.2f}" for s in secs) + " |")
    return (f"{result['model']}: a forward of q tokens over a 128-token cache with a tree mask, by kernel.\n\n"
            + "\n".join(lines))


def render_result(result: dict) -> str:
    """The body of one result file's section."""
    if "rows" in result:
        return _ablation(result)
    if "sizes" in result:
        return _kernels(result)
    if "environment" in result:
        from .gpu_check import format_report, verdict

        return "```text\n" + format_report(result).rstrip() + "\n\n" + verdict(result)[1] + "\n```"
    return "```text\n" + format_table(result).rstrip() + "\n```"


def render(folder: str | Path, out: str | Path) -> str:
    """The page for every ``*.json`` in ``folder`` (in name order); ``out`` is named in its header."""
    folder = Path(folder)
    parts = [HEADER.format(folder=folder.as_posix(), out=Path(out).as_posix())]
    for path in sorted(folder.glob("*.json")):
        result = json.loads(path.read_text())
        parts.append(f"## `{path.name}`\n\n" + "\n".join(_provenance(result)) + "\n\n" + render_result(result) + "\n")
    return "\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tr_core.bench.docs", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results", help="a folder of result files (*.json)")
    ap.add_argument("out", help="the Markdown page to write")
    ap.add_argument("--check", action="store_true", help="write nothing; exit 1 when OUT differs from the files")
    args = ap.parse_args(argv)
    try:
        page = render(args.results, args.out)
    except (OSError, ValueError, KeyError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if args.check:
        current = Path(args.out).read_text(encoding="utf-8") if Path(args.out).exists() else None
        if current != page:
            print(f"{args.out} is not what {args.results} gives: run python -m tr_core.bench.docs "
                  f"{args.results} {args.out}", file=sys.stderr)
            return 1
        return 0
    Path(args.out).write_text(page, encoding="utf-8")
    print(f"{args.out}: {page.count(chr(10) + '## ')} result files")
    return 0


if __name__ == "__main__":
    sys.exit(main())
