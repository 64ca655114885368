"""Aggregate runs into the paper's figures: tok/s, MAT, speedup vs greedy, identical fraction."""
from __future__ import annotations

from collections import Counter, defaultdict


def _figures(runs, greedy_tps: float | None) -> dict:
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
        "speedup": round(tps / greedy_tps, 4) if greedy_tps else 1.0,
        "identical": _identical(runs),
        "mean_forward_tokens": round(sum(r.forward_tokens for r in runs) / steps, 2) if steps else 0.0,
        "phase_share": {k: round(v / sum(phases.values()), 4) for k, v in phases.items()} if phases else {},
        "mismatches": [{"question_id": r.question_id, "turn": r.turn, **(r.divergence or {"position": r.first_mismatch})}
                       for r in runs if r.identical is False],
    }


def _identical(runs) -> float | None:
    """Fraction of runs equal to the baseline's output; None when sampling (outputs differ by design)."""
    checked = [r.identical for r in runs if r.identical is not None]
    return round(sum(checked) / len(checked), 4) if checked else None


def summarize(runs, meta: dict | None = None) -> dict:
    """``{"meta": ..., "methods": {name: {tok_per_s, mat, speedup, identical, per_category: {...}}}}``."""
    by_method: dict[str, list] = defaultdict(list)
    for r in runs:
        by_method[r.method].append(r)
    # The baseline: plain greedy decoding, or plain sampling ("sample") when sampling.
    greedy = by_method.get("greedy") or by_method.get("sample") or []
    cats = sorted({r.category for r in runs})

    def greedy_tps(cat=None):
        sel = [r for r in greedy if cat is None or r.category == cat]
        secs = sum(r.seconds for r in sel)
        return sum(r.new_tokens for r in sel) / secs if secs else None

    methods = {}
    for name, rs in by_method.items():
        fig = _figures(rs, greedy_tps())
        fig["per_category"] = {c: {k: v for k, v in _figures([r for r in rs if r.category == c],
                                                            greedy_tps(c)).items()
                                   if k not in ("mismatches", "phase_share")}
                               for c in cats if any(r.category == c for r in rs)}
        methods[name] = fig
    return {"meta": meta or {}, "methods": methods}


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
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["method", "category", *keys])
        for name, m in summary["methods"].items():
            w.writerow([name, "overall", *[m[k] for k in keys]])
            for c in ordered_categories(summary):
                if c in m["per_category"]:
                    w.writerow([name, c, *[m["per_category"][c][k] for k in keys]])


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


def format_table(summary: dict) -> str:
    """A plain-text table: one row per method, then speedup per category."""
    methods = summary["methods"]
    head = f"{'method':<22}{'tokens':>8}{'seconds':>10}{'tok/s':>9}{'MAT':>7}{'speedup':>9}{'identical':>11}"
    lines = [head, "-" * len(head)]
    for name, m in methods.items():
        mat = f"{m['mat']:>7.2f}" if m["mat"] is not None else f"{'-':>7}"
        lines.append(f"{name:<22}{m['new_tokens']:>8}{m['seconds']:>10.2f}{m['tok_per_s']:>9.2f}"
                     f"{mat}{m['speedup']:>8.2f}x{_percent(m['identical']):>11}")
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
    return "\n".join(lines)
