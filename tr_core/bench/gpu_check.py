"""The GPU check: what this project needs to know of a GPU, in one command, within 8 minutes.

    python -m tr_core.bench.gpu_prepare OUT --prompts .../spec_bench/question.jsonl   # here (CPU)
    python -m tr_core.bench.gpu_check --model OUT --out gpu_check.json              # there (GPU)

It needs PyTorch (CUDA) and transformers only: no network, no model hub, no Gradio.  ``--model``
is a folder made by ``gpu_prepare`` (its parts are joined and checked, its ``gguf`` wheel put on
``sys.path`` where ``gguf`` is missing), a ``.gguf`` file, any local model folder, or ``embedded``;
``--no-weights`` (or no model at all) runs only the parts that need none.  It writes one JSON file
(after every part, so a part that fails leaves the others) and prints one table:

* ``environment``: GPU, driver, CUDA, torch, transformers, where ``gguf`` came from;
* ``no_weights``: every decoder (greedy, TR auto, TR paper-80, PTD, PLD) against
  ``generate(do_sample=False)`` in float32 on tiny random models of the eight families and on a
  random model of the embedded model's shape;
* ``exactness``: the same on the model (six short built-in prompts), in float32 and bfloat16, each
  divergence classified by its logit margin against the rounding bound **measured here**
  (``rounding``; ``tr_core.precision``);
* ``timed``: the bench harness (``tr_core.bench.harness``) on Spec-Bench prompts, methods interleaved,
  with the A/A row: tokens per second, MAT, speedup over greedy;
* ``costs``: a random-weight model of Llama-3-8B's shapes (grouped-query) in bfloat16: a forward of
  q = 1 ... 128 query tokens over 256 and 2,048 cached tokens, with the tree mask and without, and
  each way of running grouped-query attention under a mask; the tree the planner picks; the
  **projected** speedup from it and from the model's measured acceptance (projections, not timings);
* ``dtype_rule``: the dtype the rule of ``tr_core.devices`` picks for that model here, and why;
* ``batching``: a packed forward's cost over its total tokens for 1, 8 and 32 tabs' trees, and a
  class of 30's steps per second projected from them.

``--device cpu --shapes small`` runs all of it on any machine in about a minute (the suite does);
``--skip PART,...`` leaves parts out.
The app's own check (three Steps through ``gradio_client``) needs Gradio and lives with the app:
``python -m components.app_check`` runs this check with it.
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from dataclasses import dataclass
from pathlib import Path

PROMPTS = ["Explain in two sentences why the sky is blue.",
           "Write a Python function that returns the n-th Fibonacci number.",
           "Translate into French: The weather is nice today and we are going to the park.",
           "Summarise: The meeting moved to Tuesday because the room was booked on Monday.",
           "List three colours of the rainbow.",
           "Rewrite more politely: Send me the report now."]
METHODS = ("greedy", "tr (auto)", "tr:paper-80", "ptd", "pld")
TIMED_METHODS = "tr,tr:paper-80,ptd,pld"
SHAPES = ("7b", "small")
LENGTHS = {"7b": (1, 2, 4, 8, 16, 24, 32, 48, 64, 81, 96, 128), "small": (1, 2, 4, 8, 16, 32, 81, 128)}
CACHES = {"7b": (256, 2048), "small": (16, 64)}
BATCHES = (1, 8, 32)
BATCH_TREE = 16  # query tokens of each tree in the batching part
PARTS = ("no_weights", "exactness", "timed", "costs", "dtype_rule", "batching")


# ---- where things are ----------------------------------------------------------------------------
def resolve_model(spec: str | None) -> tuple[str | None, dict]:
    """(the path ``load_model`` takes, what was done to get it) for ``--model``: a prepared folder
    (parts joined, wheels on ``sys.path``), a ``manifest.json`` folder, a file or folder as it is."""
    from .gpu_pieces import MANIFEST, MODEL_DIR, PROMPTS as PROMPT_FILE, WHEEL_DIR, reassemble, use_wheels

    info: dict = {"spec": spec}
    if spec in (None, "", "none"):
        return None, info
    p = Path(spec).expanduser()
    if p.is_dir() and (p / MODEL_DIR / MANIFEST).is_file():
        info["wheels"] = use_wheels(p / WHEEL_DIR)
        if (p / PROMPT_FILE).is_file():
            info["prompts"] = str(p / PROMPT_FILE)
        p = p / MODEL_DIR
    if p.is_dir() and (p / MANIFEST).is_file():
        try:
            path = reassemble(p)
        except OSError:  # a read-only copy: joined in the temporary folder
            import tempfile

            path = reassemble(p, Path(tempfile.gettempdir()) / "tr_gpu_check")
        info["joined"] = str(path)
        return str(path), info
    return spec, info


def gguf_status() -> str:
    import importlib.util

    try:
        spec = importlib.util.find_spec("gguf")
    except (ImportError, ValueError):
        spec = None
    if spec is None:
        return "missing"
    origin = str(spec.origin or "")
    return f"from {origin.split('.whl')[0]}.whl" if ".whl" in origin else "installed"


def environment(dev) -> dict:
    import subprocess

    import torch
    import transformers

    from ..devices import describe_machine

    env = {"device": str(dev), "machine": describe_machine(dev), "python": platform.python_version(),
           "torch": torch.__version__, "transformers": transformers.__version__, "cuda": torch.version.cuda,
           "gguf": gguf_status(), "driver": None}
    if dev.type == "cuda":
        env["capability"] = ".".join(map(str, torch.cuda.get_device_capability(dev)))
        env["memory_gib"] = round(torch.cuda.get_device_properties(dev).total_memory / 2**30, 1)
        try:
            env["driver"] = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                           capture_output=True, text=True, timeout=20).stdout.split("\n")[0].strip()
        except (OSError, subprocess.SubprocessError):
            env["driver"] = "unknown (no nvidia-smi)"
    return env


# ---- exact or explained ---------------------------------------------------------------------------
def method_makers(lm, n: int) -> dict:
    from ..decoders import GreedyDecoder, ProgressiveTreeDecoder, PromptLookupDecoder, TokenRecyclingDecoder

    return {"greedy": lambda: GreedyDecoder(lm, n),
            "tr (auto)": lambda: TokenRecyclingDecoder(lm, tree="auto", max_new_tokens=n, trace_rows=False),
            "tr:paper-80": lambda: TokenRecyclingDecoder.paper(lm, "paper-80", max_new_tokens=n, trace_rows=False),
            "ptd": lambda: ProgressiveTreeDecoder(lm, n),
            "pld": lambda: PromptLookupDecoder(lm, n)}


def flat_curve(steep: bool = False):
    """A cost curve on which every query size costs the same: the planners then draft their biggest
    trees, so every tree path runs (what the exactness parts need; the costs part measures).
    ``steep``: each extra query token costs a tenth of a forward (a CPU's small trees, quick to run)."""
    from ..cost import CostCurve

    return CostCurve([1, 128], [1.0, 13.7 if steep else 1.0])


def check_exactness(lm, prompt_ids: list[list[int]], tokens: int, measure: bool = True) -> dict:
    """Every method against ``generate(do_sample=False)`` on each prompt: identical, near-ties, bugs,
    MAT; each divergence classified against the rounding bound measured on the first prompt.  On a
    CPU, a model with no cost curve yet gets a steep one (:func:`flat_curve`): measuring one there
    takes minutes and changes no output."""
    if lm.cost_curve is None and lm.device.type == "cpu":
        lm.cost_curve = flat_curve(steep=True)
    from ..precision import BUG, NEAR_TIE, ROUNDING_ULPS, explain_divergence, measure_rounding, measured_bound_ulps
    from .peers import HFGenerate

    references = [HFGenerate(lm, tokens).generate(ids) for ids in prompt_ids]
    rounding = measure_rounding(lm, prompt_ids[0], references[0]) if measure else {"max_margin_ulps": 0.0}
    bound = measured_bound_ulps(rounding["max_margin_ulps"])
    rows: dict[str, dict] = {}
    for ids, reference in zip(prompt_ids, references):
        for name, make in method_makers(lm, tokens).items():
            dec = make()
            out = dec.generate(ids)
            r = rows.setdefault(name, {"prompts": 0, "identical": 0, "near_ties": 0, "bugs": 0, "tokens": 0,
                                       "forwards": 0, "divergences": []})
            r["prompts"] += 1
            r["tokens"] += len(out)
            r["forwards"] += len(dec.steps)
            if out == reference:
                r["identical"] += 1
                continue
            div = explain_divergence(lm, ids, reference, out, bound_ulps=bound)
            if div is None:  # the reference stopped first: nothing to explain before it
                r["divergences"].append({"cause": "reference stopped first"})
                continue
            r["divergences"].append(div.to_json())
            r["near_ties"] += div.cause == NEAR_TIE
            r["bugs"] += div.cause == BUG
    for r in rows.values():
        r["mat"] = round(r["tokens"] / max(r["forwards"], 1), 3)
    rounding.update(bound_ulps=bound, constant_ulps=ROUNDING_ULPS, dtype=str(lm.dtype).replace("torch.", ""))
    return {"rounding": rounding, "methods": rows}


def random_prompts(vocab: int, count: int, length: int = 24, seed: int = 0) -> list[list[int]]:
    """Prompts of random ids (above the special ids), each with a repeated stretch to retrieve."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(count):
        ids = torch.randint(3, vocab, (length,), generator=gen).tolist()
        out.append(ids + ids[: length // 3])
    return out


def check_no_weights(dev, tokens: int, prompts: int, families=None, layers: int | None = None) -> dict:
    """The decoders on random models of real shapes in float32 (module doc); ``families``: which of
    the eight (default: all); ``layers``: the embedded shape's model with this many layers only
    (widths, heads and vocabulary kept; a CPU's quick run)."""
    import torch

    from ..devices import exact_float32
    from .random_models import family_configs, random_lm, smollm2_config

    exact_float32(dev)
    out = {}
    big = smollm2_config()
    if layers:
        big.num_hidden_layers = layers
    models = {**{k: v for k, v in family_configs().items() if families is None or k in families},
              "smollm2-135m shape" + (f" ({layers} layers)" if layers else ""): big}
    for name, config in models.items():
        t0 = time.perf_counter()
        lm = random_lm(config, dev, torch.float32, name=f"random {name}")
        lm.cost_curve = flat_curve()  # the biggest trees: every path of the tree step runs
        result = check_exactness(lm, random_prompts(config.vocab_size, prompts), tokens)
        result["seconds"] = round(time.perf_counter() - t0, 1)
        out[name] = result
        del lm
    return out


def in_dtype(lm, name: str):
    """A copy of ``lm`` in dtype ``name`` (one load for every dtype: a ``.gguf`` file is dequantised to
    float32 and cast, as ``load_model`` does); None where ``lm`` is not float32."""
    import copy
    import dataclasses

    import torch

    if lm.dtype != torch.float32:
        return None
    dtype = getattr(torch, name)
    model = copy.deepcopy(lm.model).to(dtype)
    return dataclasses.replace(lm, model=model, dtype=dtype, cost_curve=None, _token_text={},
                               dtype_reason=f"{name}: asked for")


def load_prompt_texts(path: str | None, limit: int, count: int) -> list:
    """Spec-Bench prompts (``limit`` a category) from ``path``, else the built-in ones."""
    from .data import BenchPrompt, load_prompts

    if path and Path(path).is_file():
        return load_prompts(path, limit)
    return [BenchPrompt(str(i), "builtin", t, (t,)) for i, t in enumerate(PROMPTS[:count])]


def check_timed(lm, prompts: list, tokens: int, methods: str = TIMED_METHODS) -> dict:
    """The bench harness: ``methods`` with greedy, its A/A twin and ``hf-greedy``, interleaved."""
    from .harness import parse_methods, run_benchmark
    from .report import summarize

    specs = parse_methods(methods, lm)
    runs = run_benchmark(lm, prompts, specs, tokens, warmup=1, progress=False)
    s = summarize(runs)
    keep = ("prompts", "new_tokens", "tok_per_s", "mat", "speedup", "speedup_ci", "identical", "mean_forward_tokens")
    return {"dtype": str(lm.dtype).replace("torch.", ""), "prompts": len(prompts), "max_new_tokens": tokens,
            "baseline": s["baseline"], "aa": s["aa"], "warnings": s["warnings"],
            "methods": {n: {k: m.get(k) for k in keep} for n, m in s["methods"].items()},
            "mismatches": {n: m["mismatches"] for n, m in s["methods"].items() if m.get("mismatches")}}


# ---- what a 7B model's forwards cost --------------------------------------------------------------
def big_config(shapes: str):
    from .random_models import llama3_8b_config, small_gqa_config

    return llama3_8b_config() if shapes == "7b" else small_gqa_config()


def bare(model, name: str):
    """A ``LoadedModel`` around a random model whose ids alone matter (no tokenizer)."""
    from ..layout import AttentionLayout
    from ..models import LoadedModel, cache_argument

    p = next(model.parameters())
    return LoadedModel(model=model, tokenizer=None, name=name, device=p.device, dtype=p.dtype,
                       vocab_size=model.config.vocab_size, fingerprint="random", eos_token_ids=(),
                       max_context=model.config.max_position_embeddings, layout=AttentionLayout.from_config(model.config),
                       cache_arg=cache_argument(model))


def check_costs(big, shapes: str, repeats: int, measured_mat: dict) -> dict:
    """Forward seconds by query tokens and cache length, masked and not; the ways of grouped-query
    attention under a mask; the planner's tree and the projections (module doc)."""
    from .. import attention
    from ..cost import CostCurve, time_forwards
    from ..planner import TreePlanner

    lengths, caches = LENGTHS[shapes], CACHES[shapes]
    dev_type = big.device.type
    seconds = {str(c): {"masked": time_forwards(big, lengths, c, repeats),
                        "no_mask": time_forwards(big, lengths, c, repeats, mask=False)} for c in caches}
    ways = {}
    native = attention.MASKED_GQA.get(dev_type, "repeat_kv")
    for way in dict.fromkeys((native, "fold", "enable_gqa", "repeat_kv")):
        saved = attention.MASKED_GQA.get(dev_type)
        attention.MASKED_GQA[dev_type] = way
        try:
            ways[way] = time_forwards(big, lengths, caches[-1], repeats)
        finally:
            attention.MASKED_GQA[dev_type] = saved
    near, far = seconds[str(caches[0])], seconds[str(caches[-1])]
    curve = CostCurve.from_two_caches(lengths, near["masked"], caches[0], dict(zip(lengths, far["masked"])), caches[-1])
    curve.plain_ratio = near["no_mask"][0] / near["masked"][0]
    big.cost_curve = curve
    planner = TreePlanner(big)
    size = planner.tree.size
    ratio = curve(1 + size) / curve.greedy()
    out = {"model": big.name, "dtype": str(big.dtype).replace("torch.", ""), "lengths": list(lengths),
           "seconds_by_cache": seconds, "masked_gqa_at_longest_cache": ways, "masked_gqa_way": native,
           "plain_ratio": round(curve.plain_ratio, 4), "per_query_token_per_cached_token": curve.per_cache,
           "per_cached_token_any_size": curve.per_cache_fixed,
           "planner": {"tree_nodes": size, "tree": planner.tree.name, "paths": [list(p) for p in planner.tree.paths],
                       "expected_tokens": round(planner.expected, 3), "cost_ratio": round(ratio, 3)},
           "projection": {"note": "PROJECTED, not timed: expected tokens per step over the step's cost ratio "
                                  "to greedy's mask-free 1-token forward, on this 7B-shaped curve",
                          "planner_prior": round(planner.expected / ratio, 3)}}
    r81 = curve(81) / curve.greedy()
    out["projection"]["paper80_cost_ratio"] = round(r81, 3)
    for name, mat in measured_mat.items():  # the model's measured acceptance on this curve
        if name == "tr:paper-80":
            out["projection"]["paper80_measured_mat"] = round(mat["mat"] / r81, 3)
        elif mat.get("mean_forward_tokens"):
            q = max(1, round(mat["mean_forward_tokens"]))
            out["projection"][f"{name}_measured_mat"] = round(mat["mat"] / (curve(q) / curve.greedy()), 3)
    return out


def check_dtype_rule(dev, config) -> dict:
    from ..devices import fast_bf16, free_memory, layer_shapes, pick_dtype
    from ..models import parameter_count

    params = parameter_count(config)  # on the meta device: the rule sees the card before the model is on it
    rule = pick_dtype("auto", dev, params, layer_shapes(config))
    free = free_memory(dev)
    return {"parameters": params, "dtype": str(rule.dtype).replace("torch.", ""), "reason": rule.reason,
            "ratio32": None if rule.ratio32 is None else round(rule.ratio32, 3), "fast_bf16": fast_bf16(dev),
            "free_gib": None if not free else round(free / 2**30, 1)}


def check_batching(big, repeats: int, cache: int) -> dict:
    """Seconds of one packed forward (:func:`tr_core.batching.run_forwards`) of ``b`` tabs' chain trees
    of ``BATCH_TREE`` tokens, each over its own cache of ``cache`` tokens, for b in ``BATCHES``; per
    token; and, as a projection from these, a class of ``CLASS`` tabs' steps per second."""
    import torch

    from ..batching import run_forwards
    from ..decoders.base import ForwardRequest, PhaseClock
    from ..devices import release_device_memory, synchronize
    from ..trees import TreeTensors

    out = {}
    dev = big.device
    gen = torch.Generator().manual_seed(1)
    q = BATCH_TREE
    tree = TreeTensors.from_parents(list(range(-1, q - 1)), list(range(q)), dev, big.dtype)
    for b in BATCHES:
        try:
            requests = []
            for _ in range(b):
                ids = torch.randint(100, big.vocab_size, (1, cache + q), generator=gen).to(dev)
                own = big.new_cache()
                with torch.inference_mode():
                    big.model(input_ids=ids[:, :cache], use_cache=True, logits_to_keep=1, **{big.cache_arg: own})
                requests.append(ForwardRequest(ids[:, cache:], tree.position_ids(cache), big.tree_masks(tree, cache),
                                               own, cache, PhaseClock(dev)))
            times = []
            for r in range(repeats + 1):
                synchronize(dev)
                t0 = time.perf_counter()
                run_forwards(big, requests)
                synchronize(dev)
                if r:
                    times.append(time.perf_counter() - t0)
                for request in requests:
                    request.cache.crop(-q)
            s = sorted(times)[len(times) // 2]
            out[str(b)] = {"total_tokens": b * q, "seconds": s, "per_token": s / (b * q)}
            del requests
        except torch.OutOfMemoryError:
            release_device_memory(dev)
            out[str(b)] = {"skipped": "out of memory"}
            break
    return {"cache": cache, "tree_tokens": q, "by_batch": out, "class": class_projection(out)}


CLASS = 30  # the class the projection is for


def class_projection(by_batch: dict) -> dict | None:
    """Steps per second of ``CLASS`` tabs stepping together: every tab's tree in one forward, its cost
    interpolated (linearly in total tokens) from the measured batches; against the tabs' trees run one
    forward each.  A projection from measured forwards, not a measured class."""
    points = sorted((v["total_tokens"], v["seconds"]) for v in by_batch.values() if "seconds" in v)
    if len(points) < 2:
        return None
    (x0, y0), (x1, y1) = points[-2], points[-1]
    q = points[0][0]
    tokens = CLASS * q
    together = y1 + (y1 - y0) * (tokens - x1) / (x1 - x0) if tokens > x1 else y1
    alone = points[0][1]
    return {"tabs": CLASS, "projection": True, "steps_per_s_batched": CLASS / together,
            "steps_per_s_one_at_a_time": 1 / alone, "gain": alone * CLASS / together}


# ---- the command ----------------------------------------------------------------------------------
@dataclass
class CheckOptions:
    """What the command asks for: its flags, by the same names (``json_path`` is ``--out``)."""
    model: str | None = None
    device: str | None = None
    shapes: str = "7b"
    prompts: int = 6
    tokens: int = 64
    dtypes: tuple[str, ...] = ("float32", "bfloat16")
    repeats: int = 3
    json_path: str | None = None
    no_weights: bool = False
    prompts_file: str | None = None
    limit: int = 1
    timed_tokens: int = 96
    timed_dtype: str = "float32"
    timed_prompts: int | None = None
    random_prompts: int = 2
    random_tokens: int = 32
    families: tuple[str, ...] | None = None
    batching: bool = True
    skip: tuple[str, ...] = ()
    argv: list[str] | None = None


class Report:
    """The check's JSON: one section per part, written to ``path`` after every part, so a part that
    fails, or a check cut short, leaves the parts before it."""

    def __init__(self, dev, model_info: dict, path: str | None, provenance: dict, started: float,
                 skip: tuple[str, ...] = ()):
        """``started``: the check's start (``time.perf_counter()``), from which ``seconds`` counts;
        ``skip``: the parts not to run."""
        self.dev, self.path, self.started, self.skip = dev, path, started, skip
        self.data: dict = {"environment": environment(dev), "model": model_info, "no_weights": {}, "exactness": {},
                           "timed": {}, "costs": {}, "dtype_rule": {}, "batching": {}, "parts": {},
                           "provenance": provenance}

    def save(self) -> None:
        self.data["seconds"] = round(time.perf_counter() - self.started, 1)
        if self.path:
            Path(self.path).write_text(json.dumps(self.data, indent=2, default=str))

    def run(self, name: str, part) -> None:
        """Section ``name`` = ``part()``, or ``{"skipped": ...}`` where ``skip`` names it, or the error
        it raised (out of memory said as such); timed, the device's memory given back, saved."""
        import torch

        from ..devices import release_device_memory

        if name in self.skip:
            self.data[name] = {"skipped": "--skip"}
            return
        t0 = time.perf_counter()
        try:
            self.data[name] = part()
        except torch.OutOfMemoryError as err:
            self.data[name] = {"error": f"out of memory: {str(err).splitlines()[0]}"}
        except Exception as err:  # noqa: BLE001 - one part failing leaves the others
            self.data[name] = {"error": f"{type(err).__name__}: {err}"}
        if isinstance(self.data[name], dict):
            self.data[name].setdefault("seconds", round(time.perf_counter() - t0, 1))
        release_device_memory(self.dev)
        self.save()


def run_check(opts: CheckOptions, parts: dict | None = None) -> dict:
    """Every part of the module doc but those named in ``opts.skip``, as one JSON-able dict;
    ``parts``: more ``{name: fn(lm, text) -> dict}`` run on the model at the end (the app's check)."""
    from ..devices import pick_device
    from .report import provenance

    started = time.perf_counter()
    path, info = resolve_model(None if opts.no_weights else opts.model)
    dev = pick_device(opts.device)
    report = Report(dev, info, opts.json_path, provenance("python -m tr_core.bench.gpu_check", opts.argv), started,
                    opts.skip)
    report.run("no_weights", lambda: check_no_weights(dev, opts.random_tokens, opts.random_prompts, opts.families,
                                                      None if opts.shapes == "7b" else 2))
    if path is None:
        for name in ("exactness", "timed"):
            report.data[name] = {"skipped": "--no-weights" if opts.no_weights else "no --model given"}
        measured = {}
    else:
        measured = model_parts(report, opts, path, parts or {})
    random_model_parts(report, opts, measured)
    report.save()
    return report.data


def model_parts(report: Report, opts: CheckOptions, path: str, parts: dict) -> dict:
    """The parts on the model at ``path``: exactness in every dtype, timed in ``opts.timed_dtype``, then
    ``parts``; gives the acceptance measured, by method (for the costs part's projections)."""
    from ..models import load_model

    texts = load_prompt_texts(opts.prompts_file or report.data["model"].get("prompts"), opts.limit, opts.prompts)
    kept = {}  # the timed dtype's model, loaded once for exactness, timed and the extra parts

    def model_in(dtype: str):
        return kept.get(dtype) or load_model(path, str(report.dev), dtype, prepack=False)

    def exactness() -> dict:
        out, first = {}, None
        for name in opts.dtypes:
            lm = (first and in_dtype(first, name)) or model_in(name)  # one read of the file for every dtype
            first = first or lm
            report.data["model"]["name"] = lm.name
            out[name] = check_exactness(lm, [lm.encode_prompt(t) for t in PROMPTS[:opts.prompts]], opts.tokens)
            if name == opts.timed_dtype:
                kept[name] = lm
            report.save()
        return out

    report.run("exactness", exactness)
    report.run("timed", lambda: check_timed(model_in(opts.timed_dtype),
                                            texts[:opts.timed_prompts] if opts.timed_prompts else texts,
                                            opts.timed_tokens))
    for name, fn in parts.items():
        report.data["parts"][name] = fn(model_in(opts.timed_dtype), texts[0].text)
        report.save()
    timed = report.data["timed"]
    measured = timed.get("methods", {}) if isinstance(timed, dict) else {}
    if "tr:paper-80" not in measured:
        measured = report.data["exactness"].get(opts.timed_dtype, {}).get("methods", {})
    return measured


def random_model_parts(report: Report, opts: CheckOptions, measured: dict) -> None:
    """The parts on a random model of a 7B's shapes (``opts.shapes``): the dtype rule, the forwards'
    costs with the projections from ``measured``, and the batching part on the costs part's model."""
    import torch

    from .random_models import random_model

    config, made = big_config(opts.shapes), {}
    report.run("dtype_rule", lambda: check_dtype_rule(report.dev, config))

    def costs() -> dict:
        made["big"] = bare(random_model(config, report.dev, torch.bfloat16, sharpen=1.0),
                           "random Llama-3-8B shapes" if opts.shapes == "7b" else "random small GQA Llama")
        return check_costs(made["big"], opts.shapes, opts.repeats,
                           {k: v for k, v in measured.items() if k in ("tr:paper-80", "tr", "tr (auto)")})

    report.run("costs", costs)
    if opts.batching and "big" in made:
        report.run("batching", lambda: check_batching(made["big"], opts.repeats, CACHES[opts.shapes][0]))
    elif opts.batching:
        report.data["batching"] = {"skipped": "--skip" if "batching" in opts.skip
                                   else "it runs on the costs part's model, which failed or was skipped"}


def verdict(report: dict) -> tuple[bool, str]:
    """(passed, words): no bug anywhere, every float32 output identical or a measured near-tie, no
    part failed; the words name the parts left out."""
    bugs = near = 0
    for group in [report.get("exactness", {}), *([report.get("no_weights", {})])]:
        for block in group.values():
            for m in (block.get("methods", {}) if isinstance(block, dict) else {}).values():
                bugs += m["bugs"]
                near += m["near_ties"]
    errors = [k for k, v in report.items() if isinstance(v, dict) and "error" in v]
    skipped = [k for k in PARTS if isinstance(report.get(k), dict) and "skipped" in report[k]]
    ok = not bugs and not errors
    return ok, f"{'OK' if ok else 'FAILED'}: bugs {bugs}; near-ties (explained) {near}; parts failed: " \
               f"{', '.join(errors) or 'none'}; parts not run: {', '.join(skipped) or 'none'}"


def format_report(r: dict) -> str:
    """The printed table: the environment, then each part's lines."""
    e = r["environment"]
    lines = [f"GPU check on {e['device']} ({e['machine']}), driver {e.get('driver')}, CUDA {e.get('cuda')}, "
             f"torch {e['torch']}, transformers {e['transformers']}, gguf {e['gguf']}; {r.get('seconds')} s", ""]
    lines += decoder_lines("no weights: every decoder vs generate(do_sample=False), float32, random models",
                           r.get("no_weights", {}))
    lines += decoder_lines(f"exactness on {r['model'].get('name', r['model'].get('spec'))}", r.get("exactness", {}))
    lines += timed_lines(r.get("timed", {})) + [""] + cost_lines(r.get("costs", {}))
    d = r.get("dtype_rule", {})
    lines.append(f"dtype rule for {d['parameters'] / 1e9:.2f}B parameters: {d['reason']}" if "reason" in d
                 else f"dtype rule: {d}")
    lines += batching_lines(r.get("batching", {}))
    lines += [f"{name}: {v}" for name, v in r.get("parts", {}).items()]
    return "\n".join(lines)


def decoder_lines(title: str, section: dict) -> list[str]:
    """A table of every decoder's exactness, one block per model (or dtype) of ``section``."""
    lines = [title, f"  {'model':<31}{'dtype':<10}{'method':<13}{'identical':>10}{'near-ties':>10}{'bugs':>6}"
                    f"{'MAT':>7}{'bound ulps (measured)':>24}"]
    ran = "error" not in section and "skipped" not in section
    for model, block in [(k, v) for k, v in section.items() if k != "seconds"] if ran else [("-", section)]:
        if not isinstance(block, dict) or "methods" not in block:
            lines.append(f"  {model:<31}{block}")
            continue
        rd = block["rounding"]
        for name, m in block["methods"].items():
            lines.append(f"  {model:<31}{rd['dtype']:<10}{name:<13}{m['identical']:>5}/{m['prompts']:<4}"
                         f"{m['near_ties']:>10}{m['bugs']:>6}{m['mat']:>7.2f}"
                         f"{rd['bound_ulps']:>10.1f} ({rd['max_margin_ulps']:.1f})")
    return lines + [""]


def timed_lines(t: dict) -> list[str]:
    """The timed part: each method's tokens per second, MAT, speedup and share identical to greedy."""
    if "methods" not in t:
        return [f"timed: {t}"]
    lines = [f"timed ({t['dtype']}, {t['prompts']} prompts x {t['max_new_tokens']} tokens, interleaved; "
             f"baseline {t['baseline']}; A/A {t['aa'] and t['aa']['ratio']})",
             f"  {'method':<14}{'tok/s':>9}{'MAT':>7}{'speedup':>9}{'identical':>11}"]
    for n, m in t["methods"].items():
        lines.append(f"  {n:<14}{m['tok_per_s']:>9.1f}{(m['mat'] or 0):>7.2f}{m['speedup']:>8.2f}x"
                     f"{'' if m['identical'] is None else format(m['identical'], '.0%'):>11}")
    return lines + [f"  warning: {w}" for w in t.get("warnings", [])]


def cost_lines(c: dict) -> list[str]:
    """The costs part: forward milliseconds by query tokens, the masked GQA ways, the planner's tree and
    the projections."""
    if "seconds_by_cache" not in c:
        return [f"costs: {c}"]
    lines = [f"forward ms, {c['model']} ({c['dtype']}); q = query tokens"]
    for cache, s in c["seconds_by_cache"].items():
        for kind in ("masked", "no_mask"):
            cells = " ".join(f"{q}:{x * 1e3:.1f}" for q, x in zip(c["lengths"], s[kind]))
            lines.append(f"  cache {cache:>5} {kind:<8} {cells}")
    for way, s in c["masked_gqa_at_longest_cache"].items():
        cells = " ".join(f"{q}:{x * 1e3:.1f}" for q, x in zip(c["lengths"], s))
        lines.append(f"  masked GQA '{way}'{' (used)' if way == c['masked_gqa_way'] else ''}: {cells}")
    p, pr = c["planner"], c["projection"]
    extra = ", ".join(f"{k} {v:.2f}x" for k, v in pr.items() if k.endswith("measured_mat"))
    return lines + [f"  planner picks {p['tree_nodes']} nodes (expects {p['expected_tokens']:.2f} tokens a step, "
                    f"cost {p['cost_ratio']:.2f}x greedy's forward)",
                    f"  PROJECTED speedup (not timed): {pr['planner_prior']:.2f}x from the planner's prior"
                    f"{'; ' + extra if extra else ''}"]


def batching_lines(b: dict) -> list[str]:
    """The batching part: a packed forward's time by batch, and the class projected from them."""
    if not b:
        return []
    if "by_batch" not in b:
        return [f"batching: {b}"]
    cells = "  ".join(f"b={k}: {v['seconds'] * 1e3:.1f} ms ({v['per_token'] * 1e6:.0f} us/token)"
                      if "seconds" in v else f"b={k}: {v}" for k, v in b["by_batch"].items())
    lines = [f"batching ({b['tree_tokens']}-token trees over {b['cache']} cached each): {cells}"]
    c = b.get("class")
    if c:
        lines.append(f"a class of {c['tabs']} (projection from these forwards): {c['steps_per_s_batched']:.1f} "
                     f"steps/s with every tab's tree in one forward, {c['steps_per_s_one_at_a_time']:.1f} one "
                     f"at a time ({c['gain']:.1f}x)")
    return lines


def main(argv: list[str] | None = None, parts=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tr_core.bench.gpu_check", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="a gpu_prepare folder, a .gguf file, a model folder, or 'embedded'")
    ap.add_argument("--no-weights", action="store_true", help="only the parts that need no model file")
    ap.add_argument("--device", default=None, help="cuda (default where there is one), cuda:N or cpu")
    ap.add_argument("--shapes", choices=SHAPES, default="7b", help="the random cost model's shapes")
    ap.add_argument("--prompts", type=int, default=6, help="prompts of the exactness part")
    ap.add_argument("--tokens", type=int, default=64, help="new tokens of the exactness part")
    ap.add_argument("--prompts-file", default=None, help="Spec-Bench prompts (default: the prepared folder's)")
    ap.add_argument("--limit", type=int, default=1, help="timed prompts per category")
    ap.add_argument("--timed-tokens", type=int, default=96)
    ap.add_argument("--timed-dtype", default="float32")
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--random-prompts", type=int, default=2)
    ap.add_argument("--random-tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--no-batching", action="store_true")
    ap.add_argument("--families", default=None, help="comma-separated families of the no-weights part (default: all)")
    ap.add_argument("--timed-prompts", type=int, default=None, help="at most this many timed prompts")
    ap.add_argument("--skip", default="", help=f"comma-separated parts not to run, of: {', '.join(PARTS)}")
    ap.add_argument("--out", "--json", dest="out", default="gpu_check.json")
    args = ap.parse_args(argv)
    skip = tuple(p for p in args.skip.split(",") if p)
    if set(skip) - set(PARTS):
        ap.error(f"--skip takes parts of: {', '.join(PARTS)}")
    from ..devices import DeviceError
    from .gpu_pieces import PiecesError

    try:
        report = run_check(CheckOptions(
            model=args.model, device=args.device, shapes=args.shapes, prompts=args.prompts, tokens=args.tokens,
            dtypes=tuple(d for d in args.dtypes.split(",") if d), repeats=args.repeats, json_path=args.out,
            no_weights=args.no_weights, prompts_file=args.prompts_file, limit=args.limit,
            timed_tokens=args.timed_tokens, timed_dtype=args.timed_dtype, timed_prompts=args.timed_prompts,
            random_prompts=args.random_prompts, random_tokens=args.random_tokens,
            families=tuple(args.families.split(",")) if args.families else None, batching=not args.no_batching,
            skip=skip, argv=argv), parts)
    except (PiecesError, DeviceError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(format_report(report))
    if report["environment"]["gguf"] == "missing" and str(report["model"].get("joined", args.model or "")).endswith(".gguf"):
        print("\nnote: gguf is missing here, and a .gguf model needs it: copy the prepared folder's wheels/ "
              "(python -m tr_core.bench.gpu_prepare) or pass a model folder")
    ok, words = verdict(report)
    print(f"\n{words}; json: {args.out}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
