"""The draft tree of one step as a plotly figure, laid out top-down by depth with networkx."""
from __future__ import annotations

import networkx as nx
import plotly.graph_objects as go

from tr_core.trace import Step

from .tokens import visible

COLORS = {"root": "#1f4e99", "accepted": "#2e9d4f", "rejected": "#b8bec6", "bonus": "#e0a100",
          "lookup": "#8e44ad"}


def tree_layout(parents: list[int], depths: list[int]) -> dict[int, tuple[float, float]]:
    """Positions: one row per depth (root on top, y = -depth), nodes in BFS order across each row."""
    if len(depths) == 1:
        return {0: (0.0, 0.0)}
    g = nx.DiGraph()
    for i, d in enumerate(depths):
        g.add_node(i, depth=d)
    g.add_edges_from((p, i) for i, p in enumerate(parents) if p >= 0)
    pos = nx.multipartite_layout(g, subset_key="depth", align="horizontal", scale=1.0)
    return {i: (float(x), -float(depths[i])) for i, (x, _) in pos.items()}


def blank_figure(title: str, uirevision: str) -> go.Figure:
    """An empty tree panel: no axes, the title top left; ``uirevision`` keeps zoom across steps."""
    fig = go.Figure()
    fig.update_layout(uirevision=uirevision, margin=dict(l=10, r=10, t=40, b=10), height=430,
                      plot_bgcolor="white", showlegend=False, title=dict(text=title, x=0.01, font_size=14),
                      xaxis=dict(visible=False), yaxis=dict(visible=False))
    return fig


def edge_trace(edges, color: str, width: float, dash: str | None = None) -> go.Scatter:
    """One line trace for many ``((x0, y0), (x1, y1))`` edges."""
    xs, ys = [], []
    for a, b in edges:
        xs += [a[0], b[0], None]
        ys += [a[1], b[1], None]
    return go.Scatter(x=xs, y=ys, mode="lines", hoverinfo="skip", line=dict(color=color, width=width, dash=dash))


def tree_figure(step: Step | None, token_text, title: str = "") -> go.Figure:
    """``token_text(id) -> str``.  Accepted path green, rejected dimmed, root blue, bonus token gold."""
    fig = blank_figure(title, "tree")
    if step is None:
        fig.add_annotation(text="Enter a prompt and press Step", showarrow=False, font_size=16)
        return fig
    t = step.tree
    depths = list(t.depths)
    parents = list(t.parents)
    pos = tree_layout(parents, depths)
    ys = sorted({y for _, y in pos.values()})
    gap = (ys[-1] - ys[-2]) if len(ys) > 1 else 1.0
    accepted = set(step.accepted_path)
    last = step.accepted_path[-1]
    bonus_pos = (pos[last][0] + 0.1, pos[last][1] - gap * 0.45)  # between rows, clear of its parent's label
    xs_all = [x for x, _ in pos.values()] + [bonus_pos[0]]
    if max(xs_all) - min(xs_all) < 1.0:  # a chain or a tiny tree: keep the star close, not at the far edge
        mid = (max(xs_all) + min(xs_all)) / 2
        fig.update_xaxes(range=[mid - 0.6, mid + 0.6])

    rejected_edges = [(pos[p], pos[i]) for i, p in enumerate(parents) if p >= 0 and i not in accepted]
    accepted_edges = [(pos[a], pos[b]) for a, b in zip(step.accepted_path, step.accepted_path[1:])]
    fig.add_trace(edge_trace(rejected_edges, "#dde1e6", 1))
    fig.add_trace(edge_trace(accepted_edges, COLORS["accepted"], 4))
    if step.committed:
        fig.add_trace(edge_trace([(pos[last], bonus_pos)], COLORS["bonus"], 3, "dot"))

    kinds, hovers, labels, xs, ys_ = [], [], [], [], []
    sources = t.sources or ["root"] + ["matrix"] * t.size
    for i, tok in enumerate(t.tokens):
        kind = "root" if i == 0 else ("accepted" if i in accepted else "rejected")
        kinds.append(kind)
        text = token_text(tok)
        labels.append(visible(text, 10))
        xs.append(pos[i][0])
        ys_.append(pos[i][1])
        if i == 0:
            hover = f"<b>root</b> {visible(text, 30)!s} (id {tok})<br>the last committed token"
        else:
            p = parents[i]
            choice = step.model_choices[p] if p < len(step.model_choices) else None
            verdict = "accepted" if i in accepted else "rejected"
            what = "token sampled" if step.sampled else "model's choice"
            hover = (f"<b>{visible(text, 30)}</b> (id {tok}) — {verdict}<br>depth {depths[i]}, rank {t.ranks[i]} "
                     f"under its parent, from {sources[i]}<br>{what} after the parent: "
                     f"{visible(token_text(choice), 30) if choice is not None else '?'}")
        hovers.append(hover)
    order = sorted(range(len(kinds)), key=lambda j: kinds[j] != "rejected")  # rejected drawn first
    fig.add_trace(go.Scatter(
        x=[xs[j] for j in order], y=[ys_[j] for j in order], mode="markers+text",
        text=[labels[j] for j in order], textposition="bottom center",
        textfont=dict(size=[11 if kinds[j] != "rejected" else 9 for j in order],
                      color=["#222" if kinds[j] != "rejected" else "#9aa1a9" for j in order]),
        marker=dict(size=[22 if kinds[j] == "root" else 16 if kinds[j] == "accepted" else 9 for j in order],
                    color=[COLORS["lookup"] if sources[j] == "lookup" and kinds[j] == "rejected" else COLORS[kinds[j]]
                           for j in order],
                    opacity=[1.0 if kinds[j] != "rejected" else 0.55 for j in order],
                    line=dict(width=1, color="white")),
        hovertext=[hovers[j] for j in order], hoverinfo="text"))
    if step.committed:
        bonus = step.model_choices[last]
        fig.add_trace(go.Scatter(
            x=[bonus_pos[0]], y=[bonus_pos[1]], mode="markers+text", text=[visible(token_text(bonus), 10)],
            textposition="bottom center", marker=dict(size=18, symbol="star", color=COLORS["bonus"]),
            hovertext=[f"<b>bonus</b> {visible(token_text(bonus), 30)} (id {bonus})<br>the model's own next "
                       f"token after the accepted path" + (" (sampled; no child matched it)" if step.sampled else "")],
            hoverinfo="text"))
    if step.sampled and len(step.accepted_path) > 1:  # the draw at each level, on the path it chose
        xs_ = [pos[i][0] for i in step.accepted_path[1:]]
        ys2 = [pos[i][1] for i in step.accepted_path[1:]]
        fig.add_trace(go.Scatter(x=xs_, y=ys2, mode="markers", hoverinfo="skip",
                                 marker=dict(size=26, symbol="circle-open", color=COLORS["bonus"], line_width=2)))
    return fig


FATE_COLORS = {"root": "#1f4e99", "kept": "#7f8c9a", "new": "#2e9d4f", "pruned": "#d0455b"}


def draft_figure(step: Step | None, token_text, title: str = "") -> go.Figure:
    """PTD's evolving draft tree after a step: kept nodes grey, new children green, pruned ones red."""
    fig = blank_figure(title, "draft")
    d = step.draft_tree if step is not None else None
    if d is None or len(d.tokens) < 2:
        fig.add_annotation(text="Choose the PTD method to see its evolving draft tree" if d is None
                           else "The draft tree is empty", showarrow=False, font_size=14)
        return fig
    pos = tree_layout(list(d.parents), list(d.depths))
    fig.add_trace(edge_trace([(pos[p], pos[i]) for i, p in enumerate(d.parents) if p >= 0], "#dde1e6", 1))
    fates = list(d.sources)
    words = {"root": "the step's root: first-level branches sit at its position",
             "kept": "kept from earlier steps", "new": "the model's argmax, attached this step",
             "pruned": "pruned this step (depth stepping or the root window)"}
    fig.add_trace(go.Scatter(
        x=[pos[i][0] for i in range(len(d.tokens))], y=[pos[i][1] for i in range(len(d.tokens))],
        mode="markers+text", text=[visible(token_text(t), 10) for t in d.tokens], textposition="bottom center",
        marker=dict(size=[20 if f == "root" else 13 for f in fates], color=[FATE_COLORS[f] for f in fates],
                    symbol=["x" if f == "pruned" else "circle" for f in fates], line=dict(width=1, color="white")),
        hovertext=[f"<b>{visible(token_text(t), 30)}</b> (id {t}), depth {dep}<br>{words[f]}"
                   for t, dep, f in zip(d.tokens, d.depths, fates)], hoverinfo="text"))
    return fig
