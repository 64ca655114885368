"""The GPU run bundle: everything a benchmark needs on a GPU host that has PyTorch and transformers
but no network, in 58 MiB (61 MB).

The embedded model is 98 MB as GGUF (4-bit layers, 8-bit embedding), too big to travel with the
script, so the bundle carries a lossy copy: every row of every matrix is rounded to a uniform grid
of step ``0.45 x`` the row's standard deviation (``0.35 x`` for the embedding, which is also the
output head), the integers compressed with LZMA (entropy 3.27 bits a weight; 3.6 with LZMA's
overhead and the rows' float16 offsets and scales); the norms stay float16.  The copy is not the
embedded model (it agrees with its top-1 choice on about half of teacher-forced positions and
writes plainer English), but every method of a run decodes the same copy, so greedy decoding and
the speculative decoders are still compared token for token.

    python -m tr_core.bench.bundle make gpu_bundle          # here: write the bundle folder
    bash gpu_bundle/run.sh                                  # there: unpack, then benchmark

``make`` also writes ``run.sh`` (unpack to a standard Hugging Face folder, then ``python -m
tr_core.bench`` on CUDA) and the Spec-Bench prompts, since ``../shared`` does not travel.
"""
from __future__ import annotations

import argparse
import gzip
import json
import lzma
import shutil
import sys
from pathlib import Path

import torch

from .data import PROMPTS_HELP

STEP = 0.45  # grid step of a matrix row, in units of the row's standard deviation
EMBED_STEP = 0.35
WEIGHTS = "weights.safetensors.xz"
RUN_SH = """#!/usr/bin/env bash
# GPU benchmark from a bundle made by `python -m tr_core.bench.bundle make` (no network needed).
# Run from the repository root: bash {bundle}/run.sh   (results go to $OUT, else {bundle}/out)
# Settings by environment: DEVICE (cuda), DTYPE (float32: exact, so "identical" is token for token), LIMIT per
# category (5), TOKENS (128), METHODS.  The GPU check (tr_core.bench.gpu_check) runs first, on the same copy.
set -euo pipefail
B={bundle}
R=${{OUT:-$B/out}}; mkdir -p "$R"
M=${{TMPDIR:-/tmp}}/tr_bundle_model
python3 -m tr_core.bench.bundle unpack "$B" "$M" --dtype ${{DTYPE:-float32}}
python3 -m tr_core.bench.gpu_check --model "$M" --device ${{DEVICE:-cuda}} --json "$R/gpu_check.json" \\
  | tee "$R/gpu_check.txt" || true
python3 -m tr_core.bench --model "$M" --device ${{DEVICE:-cuda}} --dtype ${{DTYPE:-float32}} \\
  --prompts "$B/question.jsonl" --limit ${{LIMIT:-5}} --max-new-tokens ${{TOKENS:-128}} \\
  --methods ${{METHODS:-greedy,tr,tr:auto,tr:auto+pld10,tr:tr-20,pld,hf-pld,ptd}} --quiet \\
  --json "$R/gpu_bench.json" --csv "$R/gpu_bench.csv" | tee "$R/gpu_bench.txt"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv >> "$R/gpu_bench.txt" 2>/dev/null || true
"""



# ---- uniform rows ---------------------------------------------------------------------------------
def quantize_rows(w: torch.Tensor, step: float) -> dict[str, torch.Tensor]:
    """``w [rows, cols]`` -> ``q [rows, cols] int8`` on a grid of ``step`` row standard deviations
    around each row's mean, with the row's ``offset [rows, 1]`` and ``scale [rows, 1]`` (float16)."""
    w = w.float()
    offset = w.mean(dim=1, keepdim=True).half()
    scale = (step * w.std(dim=1, keepdim=True)).clamp(min=1e-4).half()
    q = torch.round((w - offset.float()) / scale.float()).clamp(-127, 127).to(torch.int8)
    return {"q": q, "offset": offset, "scale": scale}


def dequantize_rows(q: torch.Tensor, offset: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``[rows, cols]`` float32 from :func:`quantize_rows`' three tensors."""
    return q.float() * scale.float() + offset.float()


def pack_state(state: dict[str, torch.Tensor]) -> bytes:
    """Matrices as ``NAME.q/.offset/.scale`` (the embedding on a finer grid), the rest float16;
    the whole as LZMA-compressed safetensors bytes."""
    from safetensors.torch import save

    out = {}
    for name, w in state.items():
        if w.dim() == 2:
            parts = quantize_rows(w, EMBED_STEP if "embed" in name else STEP)
            out.update({f"{name}.{k}": v.contiguous() for k, v in parts.items()})
        else:
            out[name] = w.half().contiguous()
    return lzma.compress(save(out), preset=6)


def unpack_state(blob: bytes, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Inverse of :func:`pack_state` (up to the rounding): a state dict in ``dtype``."""
    from safetensors.torch import load

    packed = load(lzma.decompress(blob))
    state = {}
    for name, t in packed.items():
        if name.endswith(".q"):
            base = name[:-2]
            state[base] = dequantize_rows(t, packed[base + ".offset"], packed[base + ".scale"]).to(dtype)
        elif not name.endswith((".offset", ".scale")):
            state[name] = t.to(dtype)
    return state


# ---- bundle ---------------------------------------------------------------------------------------
def make_bundle(out: Path, prompts: Path, spec: str | None = None, per_category: int = 10) -> int:
    """Write the bundle for model ``spec`` (default: the embedded one) to ``out``, with the first
    ``per_category`` prompts of each category; returns its size in bytes."""
    from ..models import load_model
    from .data import paper_category

    lm = load_model(spec, "cpu", "float32", prepack=False)
    out.mkdir(parents=True, exist_ok=True)
    lm.model.config.save_pretrained(out)
    plain_config(out / "config.json")
    lm.tokenizer.save_pretrained(out)
    tok = out / "tokenizer.json"
    if tok.exists():  # 3.5 MB of JSON, 0.6 MB gzipped
        with open(tok, "rb") as src, gzip.open(str(tok) + ".gz", "wb") as dst:
            shutil.copyfileobj(src, dst)
        tok.unlink()
    tied = lm.model.config.tie_word_embeddings
    state = {k: v for k, v in lm.model.state_dict().items() if not (tied and k == "lm_head.weight")}
    (out / WEIGHTS).write_bytes(pack_state(state))
    kept, seen = [], {}
    for line in prompts.read_text(encoding="utf-8").splitlines():
        if line.strip():
            cat = paper_category(str(json.loads(line).get("category", "default")))
            seen[cat] = seen.get(cat, 0) + 1
            if seen[cat] <= per_category:
                kept.append(line)
    (out / "question.jsonl").write_text("\n".join(kept) + "\n", encoding="utf-8")
    (out / "run.sh").write_text(RUN_SH.format(bundle=out.as_posix()))
    return sum(f.stat().st_size for f in out.rglob("*") if f.is_file())


def unpack_bundle(bundle: Path, out: Path, dtype: str = "float32") -> None:
    """Rebuild a standard Hugging Face model folder from a bundle (weights in ``dtype``)."""
    from safetensors.torch import save_file

    if not (bundle / WEIGHTS).is_file():
        raise ValueError(f"{bundle} is not a bundle (no {WEIGHTS}); make one with: python -m tr_core.bench.bundle make DIR")
    out.mkdir(parents=True, exist_ok=True)
    for f in bundle.iterdir():
        if f.suffix in (".json", ".jinja") and f.name != "question.jsonl":
            shutil.copyfile(f, out / f.name)
    with gzip.open(bundle / "tokenizer.json.gz", "rb") as src, open(out / "tokenizer.json", "wb") as dst:
        shutil.copyfileobj(src, dst)
    state = unpack_state((bundle / WEIGHTS).read_bytes(), getattr(torch, dtype))
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    plain_config(out / "config.json", dtype)


def plain_config(path: Path, dtype: str | None = None) -> None:
    """Drop what ties a config to where its model came from (a GGUF file's ``quantization_config``
    would send transformers to the ``gguf`` package, absent on the GPU host); set ``dtype``."""
    config = json.loads(path.read_text())
    config.pop("quantization_config", None)
    config.pop("_model_name_or_path", None)
    if dtype:
        config["dtype"] = dtype
    path.write_text(json.dumps(config, indent=2))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tr_core.bench.bundle", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    mk = sub.add_parser("make", help="write a bundle folder (here, with the embedded model)")
    mk.add_argument("out")
    mk.add_argument("--model", default=None, help="default: the embedded model")
    mk.add_argument("--prompts", required=True, help=PROMPTS_HELP)
    mk.add_argument("--per-category", type=int, default=10, help="prompts kept per category")
    un = sub.add_parser("unpack", help="rebuild a Hugging Face model folder from a bundle")
    un.add_argument("bundle")
    un.add_argument("out")
    un.add_argument("--dtype", default="float32", choices=("bfloat16", "float16", "float32"))
    args = ap.parse_args(argv)
    from ..models import ModelLoadError

    try:
        if args.cmd == "make":
            size = make_bundle(Path(args.out), Path(args.prompts), args.model, args.per_category)
            print(f"bundle {args.out}: {size / 2**20:.1f} MiB; run there: bash {Path(args.out).as_posix()}/run.sh")
        else:
            unpack_bundle(Path(args.bundle), Path(args.out), args.dtype)
            print(f"model folder {args.out} ({args.dtype})")
    except (OSError, ValueError, ModelLoadError, lzma.LZMAError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
