"""Aggregate runs into the paper's figures: tok/s, MAT, speedup over the fastest plain greedy with a 95%
bootstrap interval over prompts, identical fraction, and the A/A check of the timing."""
from __future__ import annotations

import json
import shlex
import subprocess
import sys
from collections import Counter, defaultdict
from datetime import datetime, timezone
from pathlib import Path


AA_BAND = 0.03  # the A/A row must read 1.00x within this, or the machine was busy during the run
BOOTSTRAP = 2000  # resamples of the prompts for a speedup's 95% interval
GREEDY_PEERS = ("greedy", "hf-greedy")  # the plain greedy decoders: the fastest is the baseline


def _tps(runs) -> float | None:
    secs = sum(r.seconds for r in runs)
    return sum(r.new_tokens for r in runs) / secs if secs else None


def _figures(runs, base_tps: float | None) -> dict:
    tokens = sum(r.new_tokens for r in runs)
    secs = sum(r.seconds for r in runs)
    steps = sum(r.steps for r in runs)
    tps = tokens / secs if secs else 0.0
    phases: dict[str, float] = defaultdict(float)
    for r in runs:
        for k, v in r.phases.items():
            phases[k] += v
    return {
        "prompts": len(runs), "new_tokens": tokens, "seconds": round(secs, 4), "steps": steps,
        "tok_per_s": round(tps, 3), "mat": round(tokens / steps, 4) if steps else None,
        "speedup": round(tps / base_tps, 4) if base_tps else 1.0,
        "identical": _identical(runs),
        "mean_forward_tokens": round(sum(r.forward_tokens for r in runs) / steps, 2) if steps else 0.0,
        "phase_share": {k: round(v / sum(phases.values()), 4) for k, v in phases.items()} if phases else {},
        "mismatches": [mismatch_record(r) for r in runs if r.identical is False],
    }


def mismatch_record(run) -> dict:
    """One output that differs from the baseline's (a dict, so that more facts can join it)."""
    return {"question_id": run.question_id, "turn": run.turn, "position": run.first_mismatch,
            **(run.divergence or {})}


def _identical(runs) -> float | None:
    """Fraction of runs equal to the baseline's output; None when sampling (outputs differ by design)."""
    checked = [r.identical for r in runs if r.identical is not None]
    return round(sum(checked) / len(checked), 4) if checked else None


def speedup_interval(runs, base_runs, resamples: int = BOOTSTRAP, seed: int = 0) -> list[float] | None:
    """95% bootstrap interval of ``tok/s(runs) / tok/s(base_runs)`` over prompts: the questions both
    ran are resampled with replacement (a question's turns together: they are not independent), each
    resample's speedup a ratio of sums (as the point estimate)."""
    import numpy as np

    base = {(r.question_id, r.turn): r for r in base_runs}
    by_question: dict[str, np.ndarray] = defaultdict(lambda: np.zeros(4))  # the turns of a question together
    for a in runs:
        b = base.get((a.question_id, a.turn))
        if b is not None:
            by_question[a.question_id] += (a.new_tokens, a.seconds, b.new_tokens, b.seconds)
    if len(by_question) < 2:
        return None
    arr = np.array(list(by_question.values()))  # [questions, 4]
    idx = np.random.default_rng(seed).integers(0, len(arr), (resamples, len(arr)))
    s = arr[idx].sum(axis=1)  # [resamples, 4]
    ratio = (s[:, 0] / s[:, 1]) / (s[:, 2] / s[:, 3])
    lo, hi = np.percentile(ratio, [2.5, 97.5])
    return [round(float(lo), 4), round(float(hi), 4)]


def fastest_baseline(by_method: dict) -> str | None:
    """The plain greedy decoder with the highest overall tok/s (``sample`` when sampling)."""
    peers = [n for n in GREEDY_PEERS if by_method.get(n)] or [n for n in ("sample",) if by_method.get(n)]
    return max(peers, key=lambda n: _tps(by_method[n]) or 0.0) if peers else None


def aa_check(by_method: dict, band: float = AA_BAND) -> dict | None:
    """The baseline against its second copy: ratio, 95% interval and whether it is within ``band``."""
    from .harness import AA_SUFFIX

    base = next((n for n in ("greedy", "sample") if by_method.get(n) and by_method.get(n + AA_SUFFIX)), None)
    if base is None:
        return None
    twin = by_method[base + AA_SUFFIX]
    ratio = (_tps(twin) or 0.0) / (_tps(by_method[base]) or 1.0)
    return {"pair": [base + AA_SUFFIX, base], "ratio": round(ratio, 4),
            "ci": speedup_interval(twin, by_method[base]), "band": band, "ok": abs(ratio - 1.0) <= band}


HEAD_TO_HEAD = (("tr", ("hf-pld", "hf-pld:same", "pld")),)  # (method, the rivals it is read against)


def head_to_head(by_method: dict, cats: list[str]) -> dict:
    """``{"tr / hf-pld": {"ratio", "ci", "per_category": {cat: ratio}, "worst": [cat, ratio]}, ...}``:
    a method's tok/s over a rival's, run on the same prompts (the interval bootstrapped as a speedup's)."""
    out = {}
    for name, rivals in HEAD_TO_HEAD:
        for rival in rivals:
            ours, theirs = by_method.get(name), by_method.get(rival)
            if not ours or not theirs or not _tps(ours) or not _tps(theirs):
                continue
            per = {}
            for c in cats:
                a, b = _tps([r for r in ours if r.category == c]), _tps([r for r in theirs if r.category == c])
                if a and b:
                    per[c] = round(a / b, 4)
            worst = min(per.items(), key=lambda kv: kv[1]) if per else None
            out[f"{name} / {rival}"] = {"ratio": round(_tps(ours) / _tps(theirs), 4),
                                        "ci": speedup_interval(ours, theirs), "per_category": per,
                                        "worst": list(worst) if worst else None}
    return out


def summarize(runs, meta: dict | None = None) -> dict:
    """``{"meta", "baseline", "aa", "warnings", "methods": {name: {tok_per_s, mat, speedup, speedup_ci,
    identical, per_category: {...}}}}``; every speedup is over ``baseline``, the fastest plain greedy."""
    by_method: dict[str, list] = defaultdict(list)
    for r in runs:
        by_method[r.method].append(r)
    base_name = fastest_baseline(by_method)
    base = by_method.get(base_name, [])
    cats = sorted({r.category for r in runs})

    def in_cat(rs, c):
        return [r for r in rs if r.category == c]

    methods = {}
    for name, rs in by_method.items():
        fig = _figures(rs, _tps(base))
        fig["speedup_ci"] = speedup_interval(rs, base)
        fig["per_category"] = {}
        for c in cats:
            if in_cat(rs, c):
                pc = {k: v for k, v in _figures(in_cat(rs, c), _tps(in_cat(base, c))).items()
                      if k not in ("mismatches", "phase_share")}
                pc["speedup_ci"] = speedup_interval(in_cat(rs, c), in_cat(base, c))
                fig["per_category"][c] = pc
        methods[name] = fig
    aa = aa_check(by_method)
    warnings = [] if aa is None or aa["ok"] else [
        f"A/A reads {aa['ratio']:.2f}x, outside 1.00x +/- {aa['band']:.0%}: the machine was busy during the "
        "run; its timings are not reliable"]
    return {"meta": meta or {}, "baseline": base_name, "aa": aa, "warnings": warnings, "methods": methods,
            "versus": head_to_head(by_method, cats)}


def ordered_categories(summary: dict) -> list[str]:
    from .data import PAPER_ORDER

    cats = {c for m in summary["methods"].values() for c in m["per_category"]}
    return [c for c in PAPER_ORDER if c in cats] + sorted(cats - set(PAPER_ORDER))


def _percent(x: float | None) -> str:
    return "n/a" if x is None else f"{x * 100:.0f}%"


def write_csv(summary: dict, path) -> None:
    """One row per method and category (``overall`` included)."""
    import csv

    keys = ["prompts", "new_tokens", "seconds", "steps", "tok_per_s", "mat", "speedup", "identical"]

    def row(fig):
        ci = fig.get("speedup_ci") or [None, None]
        return [fig[k] for k in keys] + ci

    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["method", "category", *keys, "speedup_ci_low", "speedup_ci_high"])
        for name, m in summary["methods"].items():
            w.writerow([name, "overall", *row(m)])
            for c in ordered_categories(summary):
                if c in m["per_category"]:
                    w.writerow([name, c, *row(m["per_category"][c])])


def write_chart(summary: dict, path) -> list[str]:
    """Speedup per category per method as a plotly bar chart: HTML, and PNG where kaleido works."""
    from pathlib import Path

    import plotly.graph_objects as go

    cats = ordered_categories(summary) + ["overall"]
    fig = go.Figure()
    for name, m in summary["methods"].items():
        ys = [m["per_category"].get(c, {}).get("speedup") if c != "overall" else m["speedup"] for c in cats]
        fig.add_trace(go.Bar(name=name, x=cats, y=ys, text=[f"{y:.2f}" if y else "" for y in ys]))
    meta = summary.get("meta", {})
    fig.add_hline(y=1.0, line=dict(dash="dot", color="#888"))
    fig.update_layout(barmode="group", yaxis_title="speedup over greedy",
                      title=f"{meta.get('model', '')} · {meta.get('device', '')} · {meta.get('dtype', '')}")
    path = Path(path)
    written = [str(path.with_suffix(".html"))]
    fig.write_html(written[0], include_plotlyjs="cdn")
    try:
        fig.write_image(str(path.with_suffix(".png")))
        written.append(str(path.with_suffix(".png")))
    except Exception:  # kaleido (and a browser for it) is optional
        pass
    return written


def _interval(ci) -> str:
    return f"[{ci[0]:.2f}, {ci[1]:.2f}]" if ci else "-"


def format_table(summary: dict) -> str:
    """A plain-text table: one row per method (speedup over the fastest plain greedy, with its 95%
    interval over prompts), the A/A check, then speedup per category."""
    methods = summary["methods"]
    meta, cpu = summary.get("meta", {}), summary.get("meta", {}).get("cpu") or {}
    where = meta.get("gpu") or (f"{cpu.get('model', '?')} ({cpu.get('torch_isa', '?')}, {cpu.get('threads', '?')} "
                                f"threads; oneDNN packed: {', '.join(cpu.get('onednn_packed', [])) or 'none'})")
    head = (f"{'method':<22}{'tokens':>8}{'seconds':>10}{'tok/s':>9}{'MAT':>7}{'speedup':>9}{'95% CI':>15}"
            f"{'identical':>11}")
    lines = [f"{meta.get('model', '?')}, {meta.get('dtype', '?')} on {meta.get('device', '?')}: {where}" if meta else "",
             head, "-" * len(head)]
    lines = [x for x in lines if x]
    for name, m in methods.items():
        mat = f"{m['mat']:>7.2f}" if m["mat"] is not None else f"{'-':>7}"
        lines.append(f"{name:<22}{m['new_tokens']:>8}{m['seconds']:>10.2f}{m['tok_per_s']:>9.2f}"
                     f"{mat}{m['speedup']:>8.2f}x{_interval(m.get('speedup_ci')):>15}{_percent(m['identical']):>11}")
    if summary.get("baseline"):
        lines.append(f"speedups over {summary['baseline']}, the fastest plain decoder of this run")
    aa = summary.get("aa")
    if aa:
        verdict = "ok" if aa["ok"] else f"OUTSIDE +/- {aa['band']:.0%}: machine busy, timings unreliable"
        lines.append(f"A/A ({aa['pair'][0]} / {aa['pair'][1]}): {aa['ratio']:.3f}x {_interval(aa['ci'])} {verdict}")
    for pair, v in summary.get("versus", {}).items():
        worst = f", lowest category {v['worst'][0]} {v['worst'][1]:.2f}x" if v["worst"] else ""
        lines.append(f"{pair}: {v['ratio']:.2f}x {_interval(v['ci'])}{worst}")
    cats = ordered_categories(summary)
    if cats:
        lines += ["", "speedup (MAT) per category", f"{'category':<18}" + "".join(f"{n:>22}" for n in methods)]
        for c in cats:
            cells = []
            for m in methods.values():
                pc = m["per_category"].get(c)
                mat = f" ({pc['mat']:.2f})" if pc and pc["mat"] is not None else ""
                cells.append(f"{pc['speedup']:.2f}x{mat}" if pc else "-")
            lines.append(f"{c:<18}" + "".join(f"{x:>22}" for x in cells))
    causes = [(name, Counter(x.get("cause", "?") for x in m["mismatches"])) for name, m in methods.items()]
    if any(c for _, c in causes):
        lines += ["", "outputs that differ from greedy, by cause (near-tie: the reference's margin is within what "
                  "the dtype's rounding explains; bug: it is not)"]
        lines += [f"  {name:<20} " + ", ".join(f"{k} {v}" for k, v in sorted(c.items())) for name, c in causes if c]
    meta = summary.get("meta", {})
    if "matrix_bytes" in meta:
        vocab, k = meta["matrix_shape"]
        mib = meta["matrix_bytes"] / 2**20
        lines += ["", f"matrix M: {vocab} x {k} int32 = {mib:.2f} MiB ({mib * 32000 / vocab:.2f} MiB for a 32k vocabulary)"]
        if "pair_rows_bytes" in meta:
            lines += [f"pair rows beside it: {meta['pair_rows_bytes'] / 2**20:.2f} MiB (the same for any vocabulary "
                      "of a few hundred tokens or more)"]
    return "\n".join(lines)


def source_commit() -> str:
    """The git commit of the checkout ``tr_core`` runs from, ``+dirty`` with uncommitted changes;
    ``"unknown"`` for an installed copy (no git checkout around it) or without git."""
    here = Path(__file__).resolve().parent

    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(here), *args], capture_output=True, text=True, check=True,
                              timeout=10).stdout.strip()

    try:
        commit = git("rev-parse", "HEAD")
        dirty = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return commit + ("+dirty" if dirty else "")


def cpu_words(cpu: dict | None) -> str:
    """A CPU in a few words, from :func:`tr_core.devices.cpu_info`: "AMD EPYC (AVX2, 2 cores)"."""
    if not cpu:
        return "not recorded"
    isa = {"AVX512": "AVX-512"}.get(cpu.get("torch_isa"), cpu.get("torch_isa") or "ISA unknown")
    return f"{cpu.get('model') or 'unknown CPU'} ({isa}, {cpu.get('cores', '?')} cores)"


def provenance(prog: str, argv: list[str] | None = None) -> dict:
    """What a result file records of how it was made: the commit, the CPU, the date (UTC), the command
    (``prog`` and its arguments: ``argv``, else this process's), and the torch and transformers versions."""
    import torch
    import transformers

    from ..devices import cpu_info

    args = sys.argv[1:] if argv is None else argv
    return {"commit": source_commit(), "cpu": cpu_words(cpu_info()),
            "date": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%MZ"),
            "command": " ".join([prog, *map(shlex.quote, args)]),
            "torch": torch.__version__, "transformers": transformers.__version__}


def write_json(result: dict, path, prog: str, argv: list[str] | None = None) -> None:
    """Write a result file with its ``provenance`` (:func:`provenance`)."""
    Path(path).write_text(json.dumps({**result, "provenance": provenance(prog, argv)}, indent=2) + "\n")
