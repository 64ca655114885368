"""The draft tree of one step as a plotly figure, laid out top-down by depth as a tidy tree."""
from __future__ import annotations

import plotly.graph_objects as go

from tr_core.trace import Step

from .tokens import visible

HEIGHT = 370
TREE_HEIGHT = HEIGHT - 34  # the tree's tabs take the rest: tree and matrix end level
COLORS = {"root": "#1f4e99", "accepted": "#2e9d4f", "rejected": "#b8bec6", "bonus": "#e0a100",
          "lookup": "#8e44ad"}


def tree_layout(parents: list[int], depths: list[int]) -> dict[int, tuple[float, float]]:
    """Positions: one row per depth (root on top, y = -depth); across, a tidy tree: leaves side by side
    in the order of their parents, each parent centred over its children, so every subtree sits under
    its own parent and no two edges cross.  x spans [-1, 1]."""
    n = len(depths)
    if n == 1:
        return {0: (0.0, 0.0)}
    children: list[list[int]] = [[] for _ in range(n)]
    for i in range(1, n):
        children[max(parents[i], 0)].append(i)  # a forest's other tops (parent -1) hang beside the root's
    x = [0.0] * n
    walk = _preorder(children)
    slot = {i: k for k, i in enumerate(i for i in walk if not children[i])}  # leaves left to right
    for i in reversed(walk):  # children before their parents
        x[i] = float(slot[i]) if not children[i] else sum(x[c] for c in children[i]) / len(children[i])
    lo, hi = min(x), max(x)
    span = (hi - lo) or 1.0
    return {i: (2.0 * (x[i] - lo) / span - 1.0 if hi > lo else 0.0, -float(depths[i])) for i in range(n)}


def _preorder(children: list[list[int]]) -> list[int]:
    """Node indices root first, each subtree whole before the next (depth first, children in order)."""
    out, stack = [], [0]
    while stack:
        i = stack.pop()
        out.append(i)
        stack.extend(reversed(children[i]))
    return out


def blank_figure(title: str, uirevision: str) -> go.Figure:
    """An empty tree panel: no axes, the title top left; ``uirevision`` keeps zoom across steps."""
    fig = go.Figure()
    fig.update_layout(uirevision=uirevision, margin=dict(l=6, r=6, t=58, b=4), height=TREE_HEIGHT,
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


# legend lines of at most about 55 characters: they fit a phone's width (390 px)
LEGEND = ("<span style='color:#1f4e99'>●</span> root = last token · <span style='color:#2e9d4f'>●</span> accepted "
          "draft · <span style='color:#9aa1a9'>●</span> rejected<br><span style='color:#8e44ad'>●</span> prompt "
          "lookup: copied from earlier in the text<br><span style='color:#e0a100'>★</span> the token the model "
          "added itself · click a node")
EMPTY_LEGEND = "<br>∅ hollow: drafted from a row never written:<br>it predicts nothing"
FRAME_LEGEND = {1: "Phase 1, retrieve: the drafts, read row by row from M<br>"
                   "<span style='color:#6c8ebf'>●</span> a draft (verdict at phase 2)",
                2: "Phase 2, verify: one forward checks every node<br><span style='color:#2e9d4f'>●</span> the "
                   "model chose this token after its parent<br><span style='color:#d0455b'>✕</span> it chose "
                   "another · <span style='color:#c9ced4'>●</span> faded: below a ✕, no verdict",
                3: LEGEND, 4: LEGEND}
DRAFT = "#6c8ebf"
EMPTY_COLOR = "#444"  # a draft from a row never written (∅: the paper's full shape keeps them)
CROWDED = 14  # rows with more nodes than this label only their accepted nodes (hover shows all)


def titled(fig: go.Figure, title: str, legend: str) -> None:
    """A title over legend lines (each short enough for a phone's width); the top margin grows to hold them."""
    fig.update_layout(title=dict(text=f"{title}<br><span style='font-size:11px;color:#555'>{legend}</span>",
                                 x=0.01, y=0.97, yanchor="top", font_size=13))
    lines = title.count("<br>") + legend.count("<br>") + 2
    fig.update_layout(margin=dict(t=max(fig.layout.margin.t or 0, 12 + 17 * lines)))  # Plotly's lines: ~17 px


def node_kind(i: int, accepted: set[int], frame: int, sources: list[str], matches: list[bool]) -> str:
    if i == 0:
        return "root"
    if frame == 1:
        return "draft"
    if frame == 2:
        return "match" if matches[i] else "miss"
    return "accepted" if i in accepted else "rejected"


KIND_STYLE = {  # colour, size, symbol
    "root": (COLORS["root"], 22, "circle"), "accepted": (COLORS["accepted"], 16, "circle"),
    "rejected": (COLORS["rejected"], 9, "circle"), "draft": (DRAFT, 11, "circle"),
    "match": (COLORS["accepted"], 12, "circle"), "miss": ("#d0455b", 9, "x"), "moot": ("#c9ced4", 8, "circle")}


def tree_figure(step: Step | None, token_text, title: str = "", frame: int = 0, picked: int | None = None):
    """``token_text(id) -> str``.  ``frame``: 0 the whole step, 1-4 Teach mode's retrieve, verify,
    accept, recycle.  ``picked``: a node to ring (clicked).  Each node carries its index as customdata."""
    fig = blank_figure("", "tree")
    empty = step is not None and "empty" in (step.tree.sources or [])
    n = step.blank_drafts if step is not None else 0
    left_out = (f"<br>∅ hollow leaf: its node's row was never written, so<br>the {n} place{'s' * (n != 1)} below "
                f"would predict nothing: {'they are' if n != 1 else 'it is'}<br>left out of the forward pass, and "
                "nothing hangs there") \
        if step is not None and step.blank_under and not empty else ""
    titled(fig, title or "Draft tree", FRAME_LEGEND.get(frame, LEGEND) + (EMPTY_LEGEND if empty else "") + left_out)
    if step is None:
        fig.add_annotation(text="Enter a prompt and press Step", showarrow=False, font_size=16)
        return fig
    t = step.tree
    depths, parents = list(t.depths), list(t.parents)
    pos = tree_layout(parents, depths)
    accepted = set(step.accepted_path)
    sources = t.sources or ["root"] + ["matrix"] * t.size
    matches = [i > 0 and parents[i] < len(step.model_choices) and step.model_choices[parents[i]] == tok
               for i, tok in enumerate(t.tokens)]
    kinds = [node_kind(i, accepted, frame, sources, matches) for i in range(len(t.tokens))]
    if frame == 2:  # under a ✕ the text differs from the model's: a verdict there cannot count
        for i in range(1, len(kinds)):
            if kinds[parents[i]] in ("miss", "moot"):
                kinds[i] = "moot"
    spots = _blank_spots(step, pos)
    star = [_star_spot(step, pos)] if frame in (0, 3, 4) and step.committed else []
    if star and step.accepted_path[-1]:  # the path's end is labelled left of it (clear of the ★): room there
        x, y = pos[step.accepted_path[-1]]
        star.append((x - 0.42, y))
    _frame_axes(fig, [*pos.values(), *spots.values(), *star], depths)  # the ∅ leaves and the ★ inside too
    show_path = frame in (0, 3, 4)
    rejected_edges = [(pos[p], pos[i]) for i, p in enumerate(parents) if p >= 0 and (i not in accepted or not show_path)]
    fig.add_trace(edge_trace(rejected_edges, "#dde1e6", 1))
    if show_path:
        fig.add_trace(edge_trace([(pos[a], pos[b]) for a, b in zip(step.accepted_path, step.accepted_path[1:])],
                                 COLORS["accepted"], 4))
    _blank_leaves(fig, step, token_text, pos, spots)
    _node_trace(fig, step, token_text, pos, kinds, sources, picked, frame)
    if show_path and step.committed:
        _bonus_trace(fig, step, token_text, pos, depths)
    if step.sampled and show_path and len(step.accepted_path) > 1:  # the draw at each level, on the path it chose
        fig.add_trace(go.Scatter(x=[pos[i][0] for i in step.accepted_path[1:]],
                                 y=[pos[i][1] for i in step.accepted_path[1:]], mode="markers", hoverinfo="skip",
                                 marker=dict(size=26, symbol="circle-open", color=COLORS["bonus"], line_width=2)))
    return fig


def _blank_spots(step: Step, pos: dict) -> dict[int, tuple[float, float]]:
    """Where the ∅ leaf under each node of ``Step.blank_under`` sits: below and left of it; its sign is inside
    its hollow circle, so no label of its own lies over another's."""
    return {i: (pos[i][0] - 0.1, pos[i][1] - 0.72) for i in step.blank_under if i in pos}


def _blank_leaves(fig: go.Figure, step: Step, token_text, pos: dict, spot: dict) -> None:
    """One hollow ∅ leaf, on a dotted edge, under each node whose children were left out (its row was never
    written, ``Step.blank_under``): the places the tree shape had there, sent to no forward."""
    under = list(spot)
    if not under:
        return
    fig.add_trace(edge_trace([(pos[i], spot[i]) for i in under], EMPTY_COLOR, 1, "dot"))
    fig.add_trace(go.Scatter(
        name="left out", x=[spot[i][0] for i in under], y=[spot[i][1] for i in under], mode="markers+text",
        text=["∅"] * len(under), textposition="middle center", textfont=dict(size=10, color=EMPTY_COLOR),
        marker=dict(size=17, symbol="circle-open", color=EMPTY_COLOR, line_width=1.5), cliponaxis=False,
        hovertext=[f"<b>∅ left out</b> under {visible(token_text(step.tree.tokens[i]), 30)}<br>its matrix row was "
                   "never written, so the tree's places below it would be blank drafts (the row's zeros, not "
                   "predictions):<br>they are left out: no forward tokens, and nothing drafted under them"
                   for i in under], hoverinfo="text"))


def _frame_axes(fig: go.Figure, points: list[tuple[float, float]], depths: list[int]) -> None:
    """Room for every point and its label (the bonus star and the ∅ leaves among them): the lowest point
    sits at least 0.4 rows above the frame's bottom, whatever the depth of the accepted path's end; at least
    three rows tall, so a tiny tree stays compact."""
    xs = [x for x, _ in points]
    mid, half = (max(xs) + min(xs)) / 2, max((max(xs) - min(xs)) / 2 + 0.12, 0.6)
    deepest = max(depths) if depths else 0
    lowest = min(y for _, y in points)
    fig.update_xaxes(range=[mid - half, mid + half + 0.2])  # + the bonus star and its label, right of a node
    fig.update_yaxes(range=[min(-max(deepest + 1.0, 2.5), lowest - 0.4), 0.45])


def _node_trace(fig, step: Step, token_text, pos, kinds, sources, picked, frame: int = 0) -> None:
    t, depths = step.tree, step.tree.depths
    per_depth = {d: depths.count(d) for d in set(depths)}
    order = sorted(range(len(kinds)), key=lambda j: kinds[j] in ("accepted", "root", "match"))  # dim ones first
    labels, hovers, colors, sizes, symbols = [], [], [], [], []
    for j in order:
        color, size, symbol = KIND_STYLE[kinds[j]]
        empty = sources[j] == "empty"
        if sources[j] == "lookup" and kinds[j] in ("rejected", "draft"):
            color = COLORS["lookup"]
        text = "∅" if empty and kinds[j] != "accepted" else visible(token_text(t.tokens[j]), 10)  # every frame
        crowded = per_depth[depths[j]] > CROWDED and kinds[j] not in ("root", "accepted")
        labels.append("" if crowded else text)
        if empty and kinds[j] != "accepted":  # hollow, dark and larger than a grey rejected draft
            color, size, symbol = EMPTY_COLOR, 14, "circle-open"
        colors.append(color)
        sizes.append(size)
        symbols.append(symbol)
        hovers.append(_hover(step, j, token_text, sources, frame))
    end = step.accepted_path[-1] if frame in (0, 3, 4) and step.committed and step.accepted_path else None
    fig.add_trace(go.Scatter(
        x=[pos[j][0] for j in order], y=[pos[j][1] for j in order], mode="markers+text", text=labels,
        textposition=["middle left" if j == end and j else  # the ★ below right of it: its label beside it
                      "middle right" if per_depth[depths[j]] == 1 else "bottom center" for j in order],  # chains
        customdata=order,
        textfont=dict(size=[9 if kinds[j] in ("rejected", "miss", "draft", "moot") else 11 for j in order],
                      color=["#9aa1a9" if kinds[j] in ("rejected", "miss", "moot") else "#222" for j in order]),
        marker=dict(size=sizes, color=colors, symbol=symbols, line=dict(width=1.5, color=colors),
                    opacity=[0.6 if kinds[j] in ("rejected", "miss", "moot") else 1.0 for j in order]),
        hovertext=hovers, hoverinfo="text"))
    if picked is not None and 0 <= picked < len(t.tokens):
        fig.add_trace(go.Scatter(x=[pos[picked][0]], y=[pos[picked][1]], mode="markers", hoverinfo="skip",
                                 marker=dict(size=30, symbol="circle-open", color="#d0455b", line_width=3)))


WHERE = {"empty": "an empty matrix row (never written: a blank draft)",
         "matrix": "its parent's matrix row",
         "pair": "its parent's pair row: what followed the parent after the same token before it",
         "lookup": "the context: the continuation of its longest match in the prompt and text so far"}


def _hover(step: Step, i: int, token_text, sources, frame: int = 0) -> str:
    """A node's hover text; Teach mode's frame 1 (retrieve) tells no verdict nor the model's choice,
    frame 2 (verify) the choice but not yet which path was accepted."""
    t = step.tree
    tok = t.tokens[i]
    text = visible(token_text(tok), 30)
    if i == 0:
        return f"<b>root</b> {text} (id {tok})<br>the last committed token"
    p = t.parents[i]
    choice = step.model_choices[p] if p < len(step.model_choices) else None
    verdict = "accepted" if i in step.accepted_path else "rejected"
    where = WHERE.get(sources[i], sources[i])
    what = "token sampled" if step.sampled else "model's choice"
    head = f"<b>{text}</b> (id {tok})" + (f" — {verdict}" if frame not in (1, 2) else "")
    said = "" if frame == 1 else (f"<br>{what} after the parent: "
                                  f"{visible(token_text(choice), 30) if choice is not None else '?'}")
    return (f"{head}<br>depth {t.depths[i]}, rank {t.ranks[i]} under its parent, from {where}{said}"
            "<br>click: show its matrix rows")


def _star_spot(step: Step, pos: dict) -> tuple[float, float]:
    """Where the ★ of the model's own token sits: below and right of the accepted path's end, clear of
    that node's own label (under it) and of its children's row."""
    x, y = pos[step.accepted_path[-1]]
    return x + 0.09, y - 0.62


def _bonus_trace(fig, step: Step, token_text, pos, depths) -> None:
    """The ★ of the model's own token, on a dotted edge from the accepted path's end; its label is a
    boxed note on the side with fewer nodes near it, drawn over whatever grey label lies beneath."""
    last = step.accepted_path[-1]
    star = _star_spot(step, pos)
    fig.add_trace(edge_trace([(pos[last], star)], COLORS["bonus"], 3, "dot"))
    bonus = step.model_choices[last]
    fig.add_trace(go.Scatter(
        name="model's own", x=[star[0]], y=[star[1]], mode="markers", cliponaxis=False,
        marker=dict(size=18, symbol="star", color=COLORS["bonus"]),
        hovertext=[f"<b>bonus</b> {visible(token_text(bonus), 30)} (id {bonus})<br>the model's own next "
                   f"token after the accepted path" + (" (sampled; no child matched it)" if step.sampled else "")],
        hoverinfo="text"))
    near = [x for x, y in pos.values() if star[1] - 0.7 < y < star[1] + 0.7]  # the rows above and below
    right = sum(1 for x in near if star[0] < x < star[0] + 0.45)
    left = sum(1 for x in near if star[0] - 0.45 < x < star[0])
    side = "left" if left < right or star[0] > 0.75 else "right"  # the right edge has no room for a label
    fig.add_annotation(x=star[0], y=star[1], text=f"★ {html_label(visible(token_text(bonus), 10))}",
                       showarrow=False, xanchor="right" if side == "left" else "left",
                       xshift=-11 if side == "left" else 11, font=dict(size=11, color="#6b4e00"),
                       bgcolor="rgba(255,255,255,0.92)", bordercolor=COLORS["bonus"], borderwidth=1, borderpad=1)


def html_label(text: str) -> str:
    """A token's text for an annotation (Plotly reads annotation text as HTML)."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


DRAFT_LEGEND = ("<span style='color:#1f4e99'>●</span> root · <span style='color:#7f8c9a'>●</span> kept from earlier "
                "steps<br><span style='color:#2e9d4f'>●</span> attached this step (the model's argmax) · "
                "<span style='color:#d0455b'>✕</span> pruned")
FATE_COLORS = {"root": "#1f4e99", "kept": "#7f8c9a", "new": "#2e9d4f", "pruned": "#d0455b"}


def draft_figure(step: Step | None, token_text, title: str = "") -> go.Figure:
    """PTD's evolving draft tree after a step: kept nodes grey, new children green, pruned ones red."""
    fig = blank_figure("", "draft")
    titled(fig, title or "PTD's draft tree", DRAFT_LEGEND)
    d = step.draft_tree if step is not None else None
    if d is None or len(d.tokens) < 2:
        fig.add_annotation(text="Choose the PTD method to see its evolving draft tree" if d is None
                           else "The draft tree is empty", showarrow=False, font_size=14)
        return fig
    pos = tree_layout(list(d.parents), list(d.depths))
    _frame_axes(fig, list(pos.values()), list(d.depths))
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
