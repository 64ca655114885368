"""Side-by-side counters (HTML) and two small charts: accepted length per step, speedup over steps."""
from __future__ import annotations

import html

from .figures import Figure, bar, figure, scatter


# Beside the figure, on the first screen, in one line: the ★ is counted.
MAT_SAYS = "(mean accepted tokens, ★ included; greedy: {greedy:.2f})"
MAT_WORDS = ("MAT (mean accepted tokens) is the method's own figure: tokens committed per forward pass, "
             "the accepted drafts and the model's own token (★) together; greedy's is 1. "
             "The speedup is what the machine that ran it makes of it: MAT ÷ how much longer a step of the "
             "method takes than a greedy step there (its forward carries the whole draft tree).")


def cost_words(fig: dict, cpu: bool, recorded_on: str | None = None) -> str:
    """The speedup taken apart: MAT ÷ a step's cost in greedy steps, measured on this machine or on
    ``recorded_on`` (a replay's, in words); before any draft is accepted, what a figure above 1× then
    is; on a CPU, what the same MAT would give where extra tokens are nearly free (a projection)."""
    tr, g = fig["tr"], fig["greedy"]
    if not (tr["forwards"] and g["forwards"] and tr.get("seconds") and g.get("seconds")):
        return ""
    cost = (tr["seconds"] / tr["forwards"]) / (g["seconds"] / g["forwards"])
    words = (f"{fig['speedup']:.2f}× = MAT {tr['mat']:.2f} ÷ {cost:.2f}: on {recorded_on or 'this machine'} a "
             f"step of the method took {cost:.2f}× as long as a greedy step, on average over the run so far, the "
             "reading of the prompt included.")
    if tr["tokens"] <= tr["forwards"] and fig["speedup"] > 1:
        words += (" No draft has been accepted yet, so the method has done at least a greedy step's work for "
                  "every token: a figure above 1× here is how step times vary from one step to the next, not a "
                  "gain.")
    if cpu:
        words += (f" Where extra draft tokens cost almost nothing (a GPU), the same MAT would give close to "
                  f"{tr['mat']:.1f}× (a projection, not a measurement).")
    return words


def alongside_words(fig: dict, recorded_on: str | None = None) -> str:
    """Where the tab's forwards ran together with other tabs' steps (a class on one server): what the
    speedup then means.  "" for a tab that had the model to itself."""
    tr, g = fig["tr"], fig["greedy"]
    if not (tr.get("alongside") or g.get("alongside")):
        return ""
    server, there = ("this server", "here") if recorded_on is None else ("the server that recorded it", "there")
    return (f"A class on {server}: {tr['alongside']} of the method's {tr['forwards']} forward passes and "
            f"{g['alongside']} of the baseline's {g['forwards']} ran together with other tabs' steps. Each is "
            f"charged that whole forward, what this tab waited for, so the speedup {there} is a busy server's, "
            "not this tab's alone.")


def counters_html(fig: dict | None, method_label: str = "Token Recycling", sampled: bool = False,
                  extra: str = "", start: str = "", pending: str = "", cpu: bool = True, step_line: str = "",
                  recorded_on: str | None = None) -> str:
    """``extra``: one more sentence under the verdict (e.g. why two precisions part); ``start``: where
    the matrix of the run came from (hot or cold start), in words; ``pending``: a step shown but not
    counted yet (Teach mode before its verdict); ``recorded_on``: the machine the run's times are from,
    in words, where it is not this one (a replay)."""
    later = f"<div class='not-counted'>Not counted yet: {html.escape(pending)}.</div>" if pending else ""
    if not fig:
        return (f'<div class="counters-empty">{"Counters appear after the first step." if not pending else ""}'
                f'</div>{later}')
    tr, g = fig["tr"], fig["greedy"]
    if sampled and fig.get("identical"):
        same = (f"<span class='ok'>sampling: the two texts are the same so far ({fig['compared']} tokens compared): "
                "both draw from the same distribution at every token, and here their draws agreed</span>")
    elif sampled:
        same = ("<span class='ok'>sampling: both draw from the same distribution at every token; the texts "
                f"differ (after {fig['compared']} tokens compared) because the random draws do</span>")
    else:
        same = ("<span class='ok'>✔ identical to greedy so far</span>" if fig["identical"]
                else "<span class='bad'>✘ differs from greedy</span>")
        same += f" ({fig['compared']} token{'s' * (fig['compared'] != 1)} compared)"
    baseline = "Plain sampling" if sampled else "Greedy"
    cost, alongside = cost_words(fig, cpu, recorded_on), alongside_words(fig, recorded_on)

    def row(label, a, b):
        return f"<tr><th>{label}</th><td>{a}</td><td>{b}</td></tr>"
    return (
        f"<div class='mat-lead'>MAT <b>{tr['mat']:.2f}</b> tokens per forward pass</div>"
        f"<div class='mat-says'>{MAT_SAYS.format(greedy=g['mat'])}</div>"
        f'<table class="counters"><tr><th></th><th>{method_label}</th><th>{baseline}</th></tr>'
        + row("tokens", tr["tokens"], g["tokens"])
        + row("forward passes", tr["forwards"], g["forwards"])
        + row("tokens / s", f"{tr['tok_per_s']:.1f}", f"{g['tok_per_s']:.1f}")
        + f"<tr class='speedup'><th>speedup {'here' if recorded_on is None else 'recorded'}</th>"
        + f"<td colspan=2><b>{fig['speedup']:.2f}×</b></td></tr></table>"
        + f"<div class='same'>{same}</div>" + later
        + (f"<div class='cost'>{html.escape(cost)}</div>" if cost else "")
        + (f"<div class='alongside'>{html.escape(alongside)}</div>" if alongside else "")
        + (f"<div class='step-cost'>{html.escape(step_line)}</div>" if step_line else "")
        + f"<div class='mat-words'>{MAT_WORDS}</div>"
        + (f"<div class='start'>Matrix: {html.escape(start)}.</div>" if start else "")
        + (f"<div class='extra'>{extra}</div>" if extra else ""))


def charts_figure(accepted_lengths: list[int], speedups: list[float], max_len: int = 7) -> Figure:
    """How many steps committed 1, 2, ... tokens, and the speedup after each step, side by side.  The bars
    run to one past the longest step seen (at least 7), never past ``max_len``, the most one step can commit."""
    max_len = min(max_len, max(7, max(accepted_lengths, default=0) + 1))  # up to the longest seen, not all possible
    counts = [accepted_lengths.count(i) for i in range(1, max_len + 1)]
    bars = bar(x=list(range(1, max_len + 1)), y=counts, marker=dict(color="#2e9d4f"), xaxis="x", yaxis="y",
               hovertemplate="%{y} steps committed %{x} tokens<extra></extra>")
    line = scatter(x=list(range(1, len(speedups) + 1)), y=speedups, xaxis="x2", yaxis="y2",
                   mode="lines+markers" if len(speedups) < 3 else "lines", line=dict(color="#1f4e99"),
                   hovertemplate="step %{x}: %{y:.2f}×<extra></extra>")
    whole = lambda top: dict(tick0=0, dtick=max(1, -(-top // 6)), tickformat="d")  # noqa: E731  (counts: no 0.5 ticks)
    axis_title = lambda text: dict(text=text, font=dict(size=11))  # noqa: E731
    left, right = [0.0, 0.43], [0.57, 1.0]  # two plots, 0.14 of the width apart
    return figure(data=[bars, line], layout=dict(
        height=250, margin=dict(l=10, r=10, t=42, b=10), showlegend=False, plot_bgcolor="white", uirevision="charts",
        xaxis=dict(anchor="y", domain=left, title=axis_title("tokens committed in one step"),  # ticks one can tell apart
                   dtick=1 if max_len <= 12 else (2 if max_len <= 24 else 5)),
        yaxis=dict(anchor="x", domain=[0.0, 1.0], title=axis_title("steps"), rangemode="tozero",
                   **whole(max(counts, default=1))),
        xaxis2=dict(anchor="y2", domain=right, title=axis_title("step"), range=[0.5, max(len(speedups), 1) + 0.5],
                    **dict(whole(max(len(speedups), 1)), tick0=1)),  # steps from 1: no 0 or −1 before the first
        yaxis2=dict(anchor="x2", domain=[0.0, 1.0], title=axis_title("speedup (×)"),  # short: a phone's gap
                    range=speedup_range(speedups)),
        annotations=[dict(text=text, x=sum(span) / 2, y=1.0, xref="paper", yref="paper", xanchor="center",
                          yanchor="bottom", showarrow=False, font=dict(size=12), yshift=10)  # clear of the plot's top
                     for text, span in (("tokens committed per step", left), ("speedup over steps", right))],
        shapes=[dict(type="line", xref="x2 domain", x0=0, x1=1, yref="y2", y0=1.0, y1=1.0,
                     line=dict(color="#999", dash="dot", width=1))]))


def speedup_range(speedups: list[float]) -> list[float]:
    """The speedup axis: every point and the 1× line inside it, with room above and below (a line
    drawn without markers would otherwise touch the plot's edge at its highest and lowest points)."""
    lo, hi = min([*speedups, 1.0]), max([*speedups, 1.0])
    pad = max((hi - lo) * 0.08, 0.05)
    return [max(lo - pad, 0.0), hi + pad]
