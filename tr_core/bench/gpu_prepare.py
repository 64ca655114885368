"""Prepare what a bare GPU host needs for the GPU check, here, on a machine with the project installed.

    python -m tr_core.bench.gpu_prepare OUT --prompts PATH/TO/spec_bench/question.jsonl

writes ``OUT/`` (every file under 64 MiB; about 95 MiB in all):

* ``model/``: the embedded model's ``.gguf`` (or ``--model FILE``) in parts, with their checksums;
* ``wheels/``: ``gguf`` and ``yaml`` as pure-Python wheels (``--wheel FILE`` adds a wheel of your
  own, e.g. one from ``pip download --no-deps gguf``);
* ``question.jsonl``: the first ``--per-category`` Spec-Bench prompts of each category.

Copy ``OUT`` and the repository to the GPU host; there, from the repository root:

    python -m tr_core.bench.gpu_check --model OUT --out gpu_check.json
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

from .gpu_pieces import MODEL_DIR, PART_BYTES, PROMPTS, WHEEL_DIR, WHEEL_PACKAGES, PiecesError, split_file, wheel_from_installed

LIMIT_BYTES = 64 * 2**20


def pick_prompts(src: Path, per_category: int) -> list[str]:
    """The first ``per_category`` lines of each category of a Spec-Bench file (categories as the
    paper groups them), in file order."""
    from .data import paper_category

    kept, seen = [], {}
    for line in src.read_text(encoding="utf-8").splitlines():
        if line.strip():
            cat = paper_category(str(json.loads(line).get("category", "default")))
            seen[cat] = seen.get(cat, 0) + 1
            if seen[cat] <= per_category:
                kept.append(line)
    return kept


def prepare(out: Path, prompts: Path | None, model: str | None = None, per_category: int = 2,
            wheels: list[str] = (), part_bytes: int = PART_BYTES) -> dict:
    """Write the folder (module doc); returns what it holds: ``{"files": {path: bytes}, ...}``."""
    from ..models import embedded_gguf_path

    gguf = Path(model) if model else embedded_gguf_path()
    if not gguf.is_file():
        raise PiecesError(f"no model file at {gguf}")
    out.mkdir(parents=True, exist_ok=True)
    manifest = split_file(gguf, out / MODEL_DIR, part_bytes)
    made = []
    for dist, package in WHEEL_PACKAGES.items():
        made.append(wheel_from_installed(dist, package, out / WHEEL_DIR).name)
    for w in wheels:
        shutil.copy(w, out / WHEEL_DIR / Path(w).name)
        made.append(Path(w).name)
    if prompts is not None:
        (out / PROMPTS).write_text("\n".join(pick_prompts(Path(prompts), per_category)) + "\n", encoding="utf-8")
    files = {f.relative_to(out).as_posix(): f.stat().st_size for f in sorted(out.rglob("*")) if f.is_file()}
    big = [f for f, n in files.items() if n > LIMIT_BYTES]
    if big:
        raise PiecesError(f"{', '.join(big)} exceed 64 MiB; use a smaller --part-mib")
    return {"model": manifest["file"], "parts": len(manifest["parts"]), "wheels": made, "files": files}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tr_core.bench.gpu_prepare", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--prompts", default=None, help="a Spec-Bench question.jsonl (the shared data's)")
    ap.add_argument("--per-category", type=int, default=2)
    ap.add_argument("--model", default=None, help="a .gguf file (default: the embedded model's)")
    ap.add_argument("--wheel", action="append", default=[], help="a wheel to carry as well")
    ap.add_argument("--part-mib", type=int, default=PART_BYTES // 2**20)
    args = ap.parse_args(argv)
    try:
        done = prepare(Path(args.out), Path(args.prompts) if args.prompts else None, args.model,
                       args.per_category, args.wheel, args.part_mib * 2**20)
    except (OSError, ValueError, PiecesError, RuntimeError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    total = sum(done["files"].values())
    print(f"{args.out}: {len(done['files'])} files, {total / 2**20:.1f} MiB, none over 64 MiB "
          f"({done['model']} in {done['parts']} parts; wheels: {', '.join(done['wheels'])})")
    if not args.prompts:
        print("no --prompts: the check will use its built-in prompts")
    print(f"there, from the repository root: python -m tr_core.bench.gpu_check --model {args.out} --out gpu_check.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
