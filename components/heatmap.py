"""The matrix rows one step wrote, as a plotly heatmap: one row per token, k candidate columns."""
from __future__ import annotations

import plotly.graph_objects as go

from tr_core.trace import Step

from .tokens import visible

MAX_ROWS = 24
# 0 = same token at the same rank, 1 = moved from another rank, 2 = new to the row
SCALE = [[0.0, "#eef1f4"], [0.33, "#eef1f4"], [0.34, "#ffe08a"], [0.66, "#ffe08a"], [0.67, "#f08a4b"],
         [1.0, "#f08a4b"]]


def heatmap_figure(step: Step | None, token_text) -> go.Figure:
    fig = go.Figure()
    fig.update_layout(margin=dict(l=10, r=10, t=40, b=10), height=430, plot_bgcolor="white",
                      title=dict(text="Matrix rows recycled this step", x=0.01, font_size=14))
    if step is None or not step.rows_written:
        words = {"greedy": "Greedy decoding keeps no matrix",
                 "ptd": "PTD keeps no matrix: its drafts come from the draft-tree tab's tries"}
        fig.add_annotation(text=words.get(step.method, "No rows written yet") if step else "No rows written yet",
                           showarrow=False, font_size=14)
        fig.update_layout(xaxis=dict(visible=False), yaxis=dict(visible=False))
        return fig
    path_tokens = [step.tree.tokens[i] for i in step.accepted_path]
    rows = sorted(step.rows_written, key=lambda r: (r.token not in path_tokens,
                                                    path_tokens.index(r.token) if r.token in path_tokens else 0))
    shown = rows[:MAX_ROWS]
    z, text, hover, ylabels = [], [], [], []
    for r in shown:
        zr, tr_, hr = [], [], []
        for j, (o, n) in enumerate(zip(r.old, r.new)):
            zr.append(0 if o == n else (1 if n in r.old else 2))
            tr_.append(visible(token_text(n), 8))
            hr.append(f"row {visible(token_text(r.token), 20)} (id {r.token}), rank {j}<br>"
                      f"{visible(token_text(o), 20)} ({o}) → {visible(token_text(n), 20)} ({n})")
        z.append(zr)
        text.append(tr_)
        hover.append(hr)
        mark = "▶ " if r.token in path_tokens else ""
        ylabels.append(f"{mark}{visible(token_text(r.token), 12)} ·{r.token}")
    k = len(shown[0].new)
    fig.add_trace(go.Heatmap(z=z, x=[f"#{j}" for j in range(k)], y=list(range(len(shown))), text=text,
                             texttemplate="%{text}", textfont=dict(size=10), hovertext=hover,
                             hoverinfo="text", zmin=0, zmax=2, colorscale=SCALE, showscale=False,
                             xgap=1, ygap=1))
    more = f" (+{len(rows) - len(shown)} more rows)" if len(rows) > len(shown) else ""
    fig.update_layout(
        title=dict(text=f"Matrix rows recycled this step: {len(rows)}{more}"),
        yaxis=dict(tickmode="array", tickvals=list(range(len(shown))), ticktext=ylabels, autorange="reversed",
                   tickfont=dict(size=10)),
        xaxis=dict(side="top", title=None), height=max(260, 60 + 17 * len(shown)))
    return fig
