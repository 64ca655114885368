"""The GPU check: what this project needs to know of a GPU, in one command, in a few minutes.

    python -m tr_core.bench.gpu_check --json gpu_check.json             # the embedded model (needs gguf)
    python -m tr_core.bench.gpu_check --model FOLDER --json out.json    # e.g. an unpacked GPU bundle

It needs a CUDA build of torch and transformers only: no network, no ``gguf`` for a safetensors
folder, no Gradio (the app part is skipped without it).  It writes a JSON file and prints a table:

1. **Exact or explained**, on the embedded model (or ``--model``): every method (TR auto, TR
   paper-80, PTD, PLD) against ``model.generate(do_sample=False)`` on a few prompts.  In float32
   each must be identical; in bfloat16 every divergence is classified by its logit margin
   (``tr_core.precision``) and none may be a bug.
2. **What a 7B model's forwards cost**, on a random-weight model with Llama-2-7B's shapes, in
   bfloat16 and float32 (TF32 off): seconds of a q-token forward for q = 1...96 over 256 and 2,048
   cached tokens; the exact-mode rule's verdict (``tr_core.devices``); the tree the cost-aware
   planner picks in each dtype; and two **projections** of the speedup (not measurements): the
   planner's expected tokens per step over its tree's cost ratio, and paper-80's MAT measured in
   part 1 over the 81-token cost ratio.
3. **The app on this device**: started, three Steps through ``gradio_client`` (where Gradio is).

``--device cpu --shapes small`` runs the same on any machine in seconds (the test suite does).
"""
from __future__ import annotations

import argparse
import json
import socket
import sys
import time
from pathlib import Path

import torch

from ..cost import COST_LENGTHS, CostCurve, time_forwards
from ..devices import describe_machine, exact_float32, layer_shapes, pick_device, pick_dtype
from ..models import LoadedModel, load_model
from ..precision import BUG, explain_divergence
from .peers import HFGenerate

ROOT = Path(__file__).resolve().parents[2]
PROMPTS = ["Explain in two sentences why the sky is blue.",
           "Write a Python function that returns the n-th Fibonacci number.",
           "Translate into French: The weather is nice today and we are going to the park.",
           "Summarise: The meeting moved to Tuesday because the room was booked on Monday.",
           "List three colours of the rainbow.",
           "Rewrite more politely: Send me the report now."]
SHAPES = {  # Llama-2-7B's config, and a tiny one of the same kind for any machine
    "7b": dict(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32,
               num_key_value_heads=32, vocab_size=32000, max_position_embeddings=4096),
    "small": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=256, max_position_embeddings=4096),
}


# ---- 1. exact or explained ----------------------------------------------------------------------
def method_makers(lm, n: int) -> dict:
    from ..decoders import ProgressiveTreeDecoder, PromptLookupDecoder, TokenRecyclingDecoder

    return {"tr (auto)": lambda: TokenRecyclingDecoder(lm, tree="auto", max_new_tokens=n, trace_rows=False),
            "tr:paper-80": lambda: TokenRecyclingDecoder.paper(lm, "paper-80", max_new_tokens=n, trace_rows=False),
            "ptd": lambda: ProgressiveTreeDecoder(lm, n),
            "pld": lambda: PromptLookupDecoder(lm, n)}


def check_exactness(lm: LoadedModel, prompts: list[str], tokens: int) -> dict:
    """Every method against ``generate(do_sample=False)``: identical share, MAT, divergences by cause."""
    rows: dict[str, dict] = {}
    for text in prompts:
        ids = lm.encode_prompt(text)
        reference = HFGenerate(lm, tokens).generate(ids)
        for name, make in method_makers(lm, tokens).items():
            dec = make()
            out = dec.generate(ids)
            r = rows.setdefault(name, {"prompts": 0, "identical": 0, "tokens": 0, "forwards": 0, "divergences": []})
            r["prompts"] += 1
            r["tokens"] += len(out)
            r["forwards"] += len(dec.steps)
            if out == reference:
                r["identical"] += 1
                continue
            div = explain_divergence(lm, ids, reference, out)
            r["divergences"].append(div.to_json() if div is not None else {"cause": "reference stopped first"})
    for r in rows.values():
        r["mat"] = r["tokens"] / max(r["forwards"], 1)
        r["bugs"] = sum(d.get("cause") == BUG for d in r["divergences"])
    return rows


# ---- 2. what a big model's forwards cost ----------------------------------------------------------
def random_model(shapes: str, device: torch.device, dtype: torch.dtype) -> LoadedModel:
    """A random-weight Llama of ``SHAPES[shapes]`` built on ``device`` (no weights read)."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    from ..attention import register
    from ..layout import AttentionLayout

    config = LlamaConfig(**SHAPES[shapes])
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, attn_implementation=register(), dtype=dtype).eval()
    return bare(model, f"random Llama ({shapes} shapes)", AttentionLayout.from_config(config))


def bare(model, name: str, layout) -> LoadedModel:
    p = next(model.parameters())
    return LoadedModel(model=model, tokenizer=None, name=name, device=p.device, dtype=p.dtype,
                       vocab_size=model.config.vocab_size, fingerprint="random", eos_token_ids=(),
                       max_context=model.config.max_position_embeddings, layout=layout)


def check_costs(lm: LoadedModel, lengths, caches, repeats: int, paper_mat: float | None) -> dict:
    """The forward-cost curve over each cache length, the planner's tree and the projections."""
    from ..planner import TreePlanner

    if lm.dtype == torch.float32:
        exact_float32(lm.device)
    curves = {str(c): time_forwards(lm, list(lengths), c, repeats) for c in caches}
    far = dict(zip(lengths, curves[str(caches[-1])]))
    lm.cost_curve = CostCurve.from_two_caches(lengths, curves[str(caches[0])], caches[0], far, caches[-1])
    planner = TreePlanner(lm)
    size = planner.tree.size
    ratio = lm.cost_curve(1 + size) / lm.cost_curve(1)
    out = {"dtype": str(lm.dtype).replace("torch.", ""), "lengths": list(lengths), "seconds_by_cache": curves,
           "per_query_token_per_cached_token": lm.cost_curve.per_cache,
           "per_cached_token_any_size": lm.cost_curve.per_cache_fixed,
           "planner_tree_nodes": size, "planner_expected_tokens": round(planner.expected, 3),
           "planner_cost_ratio": round(ratio, 3),
           "projected_speedup_planner": round(planner.expected / ratio, 3)}
    if paper_mat is not None and 81 <= max(lengths):
        r81 = lm.cost_curve(81) / lm.cost_curve(1)
        out.update(paper80_cost_ratio=round(r81, 3), projected_speedup_paper80=round(paper_mat / r81, 3))
    return out


# ---- 3. the app ---------------------------------------------------------------------------------
def check_app(lm: LoadedModel, prompt: str) -> dict:
    """The app on ``lm``'s device: launched, three Steps through gradio_client (skipped without Gradio)."""
    try:
        import gradio  # noqa: F401
        from gradio_client import Client
    except ImportError:
        return {"skipped": "gradio is not installed"}
    sys.path.insert(0, str(ROOT))
    from app import build_app, serve
    from components.model_hub import ModelHub

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    demo = build_app(ModelHub(loaded={"embedded": lm}), cap=64)
    serve(demo, "127.0.0.1", port, prevent_thread_lock=True, quiet=True)
    try:
        client = Client(f"http://127.0.0.1:{port}/", verbose=False)
        args = (prompt, "embedded", "auto", 8, 24, True, True, "Token Recycling (TR)")
        counters = [client.predict(*args, api_name="/do_step")[4] for _ in range(3)]
        return {"steps": 3, "identical": all("identical to greedy" in c for c in counters),
                "distinct_steps": len(set(counters))}
    finally:
        demo.close()


# ---- the command ----------------------------------------------------------------------------------
def run_check(model: str | None, device: str | None, shapes: str, prompts: int, tokens: int,
              dtypes: list[str], app: bool = True, repeats: int = 3, loaded: dict | None = None,
              json_path: str | None = None) -> dict:
    """The three parts (module doc); ``loaded``: models already in memory by dtype name (tests);
    ``json_path``: written after each part, so that a part that fails leaves the others."""
    from transformers import LlamaConfig

    from ..devices import free_memory
    from ..models import parameter_count

    def save():
        if json_path:
            Path(json_path).write_text(json.dumps(report, indent=2))
    dev = pick_device(device)
    started = time.perf_counter()
    report: dict = {"device": str(dev), "machine": describe_machine(dev), "torch": torch.__version__,
                    "exactness": {}, "costs": {}, "app": None}
    texts = PROMPTS[:prompts]
    paper_mat, fp32_lm = None, None
    for name in dtypes:
        lm = (loaded or {}).get(name) or load_model(model, str(dev), name)
        report["exactness"][name] = check_exactness(lm, texts, tokens)
        if name == "float32":
            paper_mat, fp32_lm = report["exactness"][name]["tr:paper-80"]["mat"], lm
        save()
    caches = (256, 2048) if shapes == "7b" else (16, 64)
    lengths = COST_LENGTHS if shapes == "7b" else (1, 2, 4, 8, 16, 32, 81, 96)
    config = LlamaConfig(**SHAPES[shapes])
    params = parameter_count(config)  # on the meta device: the rule sees the card before the model is on it
    rule = pick_dtype("auto", dev, params, layer_shapes(config))
    report["exact_mode_rule"] = {"parameters": params, "dtype": str(rule.dtype).replace("torch.", ""),
                                 "reason": rule.reason}
    big = random_model(shapes, dev, torch.bfloat16)
    report["costs"]["bfloat16"] = check_costs(big, lengths, caches, repeats, paper_mat)
    save()
    free = free_memory(dev)
    if dev.type == "cuda" and (free is None or 4 * params > 0.9 * (free + 2 * params)):
        report["costs"]["float32"] = {"skipped": f"float32 weights ({4 * params / 2**30:.1f} GiB) do not fit"}
    else:
        try:
            big.model.to(torch.float32)
            report["costs"]["float32"] = check_costs(bare(big.model, big.name, big.layout), lengths, caches,
                                                     repeats, paper_mat)
        except torch.OutOfMemoryError:
            report["costs"]["float32"] = {"skipped": "out of memory in float32"}
    del big
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    save()
    if app:
        report["app"] = check_app(fp32_lm or load_model(model, str(dev)), texts[0])
    report["seconds"] = round(time.perf_counter() - started, 1)
    save()
    return report


def format_report(r: dict) -> str:
    lines = [f"GPU check on {r['device']} ({r['machine']}), torch {r['torch']}, {r['seconds']} s", "",
             f"{'dtype':<10}{'method':<14}{'identical':>10}{'MAT':>7}{'near-ties':>11}{'bugs':>6}"]
    for dtype, rows in r["exactness"].items():
        for name, m in rows.items():
            ties = sum(d.get("cause") == "near-tie" for d in m["divergences"])
            lines.append(f"{dtype:<10}{name:<14}{m['identical']:>5}/{m['prompts']:<4}{m['mat']:>7.2f}{ties:>11}"
                         f"{m['bugs']:>6}")
    rule = r.get("exact_mode_rule", {})
    lines += ["", f"exact-mode rule for {rule.get('parameters', 0) / 1e9:.2f}B parameters: {rule.get('reason')}", "",
              "forward cost (ms) over the first cache length; q = query tokens"]
    for dtype, c in r["costs"].items():
        if "skipped" in c:
            lines.append(f"{dtype:<10}skipped: {c['skipped']}")
            continue
        first = next(iter(c["seconds_by_cache"].values()))
        cells = "  ".join(f"{q}:{s * 1e3:.1f}" for q, s in zip(c["lengths"], first) if q in (1, 8, 16, 32, 81, 96))
        proj = f"; PROJECTED speedup {c['projected_speedup_planner']:.2f}x (planner)"
        if "projected_speedup_paper80" in c:
            proj += f", {c['projected_speedup_paper80']:.2f}x (paper-80: MAT / {c['paper80_cost_ratio']:.2f})"
        lines.append(f"{dtype:<10}{cells}")
        lines.append(f"{'':<10}planner picks {c['planner_tree_nodes']} nodes (cost ratio {c['planner_cost_ratio']:.2f})"
                     f"{proj}")
    lines += ["", f"app: {r['app']}"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tr_core.bench.gpu_check", description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="'embedded' (default; needs gguf) or a local model folder")
    ap.add_argument("--device", default=None, help="cuda (default where there is one), cuda:N or cpu")
    ap.add_argument("--shapes", choices=sorted(SHAPES), default="7b", help="the random model's shapes")
    ap.add_argument("--prompts", type=int, default=6)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--no-app", action="store_true")
    ap.add_argument("--json", default="gpu_check.json")
    args = ap.parse_args(argv)
    try:
        report = run_check(args.model, args.device, args.shapes, args.prompts, args.tokens,
                           [d for d in args.dtypes.split(",") if d], not args.no_app, args.repeats,
                           json_path=args.json)
    except torch.OutOfMemoryError as err:
        print(f"error: out of memory ({err})", file=sys.stderr)
        return 3
    except Exception as err:  # a model that cannot load, no such device: in words
        print(f"error: {type(err).__name__}: {err}", file=sys.stderr)
        return 2
    print(format_report(report))
    bugs = sum(m["bugs"] for rows in report["exactness"].values() for m in rows.values())
    fp32 = report["exactness"].get("float32", {})
    exact = all(m["identical"] == m["prompts"] for m in fp32.values())
    print(f"\n{'OK' if exact and not bugs else 'FAILED'}: float32 identical: {exact}; bugs: {bugs}; json: {args.json}")
    return 0 if exact and not bugs else 1


if __name__ == "__main__":
    sys.exit(main())
