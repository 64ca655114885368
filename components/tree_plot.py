"""The draft tree of one step as a plotly figure, laid out top-down by depth as a tidy tree."""
from __future__ import annotations

from tr_core.trace import Step

from .figures import Figure, figure, scatter
from .phase_strip import planned_nothing
from .tokens import visible
from .tree_labels import Frame, Mark, frame_for, place_labels

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


def panel_layout(title: str, legend: str, uirevision: str, height: int = TREE_HEIGHT) -> dict:
    """A tree panel's layout: no axes, the ``heading``; ``uirevision`` keeps zoom across steps."""
    return dict(uirevision=uirevision, height=height, plot_bgcolor="white", showlegend=False,
                margin=dict(l=6, r=6, t=top_margin(title, legend, 58), b=4), title=heading(title, legend),
                xaxis=dict(visible=False), yaxis=dict(visible=False))


def heading(title: str, legend: str) -> dict:
    """A title over legend lines, each short enough for a phone's width."""
    return dict(text=f"{title}<br><span style='font-size:11px;color:#555'>{legend}</span>", x=0.01, y=0.97,
                yanchor="top", font=dict(size=13))


def top_margin(title: str, legend: str, least: int) -> int:
    """The top margin that holds the ``heading`` (Plotly's lines: about 17 px), at least ``least``."""
    return max(least, 12 + 17 * (title.count("<br>") + legend.count("<br>") + 2))


def note(text: str, size: int) -> dict:
    """A line of words in the middle of an empty panel (a layout annotation)."""
    return dict(text=text, showarrow=False, font=dict(size=size))


def edge_trace(edges, color: str, width: float, dash: str | None = None) -> dict:
    """One line trace for many ``((x0, y0), (x1, y1))`` edges."""
    xs, ys = [], []
    for a, b in edges:
        xs += [a[0], b[0], None]
        ys += [a[1], b[1], None]
    line = dict(color=color, width=width, **({"dash": dash} if dash else {}))
    return scatter(x=xs, y=ys, mode="lines", hoverinfo="skip", line=line)


# legend lines of at most about 55 characters: they fit a phone's width (390 px)
ROOT_LEGEND = "<span style='color:#1f4e99'>●</span> root: last committed token, where this step starts"
LEGEND = (f"{ROOT_LEGEND}<br><span style='color:#2e9d4f'>●</span> accepted draft · <span style='color:#9aa1a9'>●"
          "</span> rejected · <span style='color:#e0a100'>★</span> the model's own token<br><span "
          "style='color:#8e44ad'>●</span> prompt lookup: copied from the text · click a node")
EMPTY_LEGEND = "<br>∅ hollow: the matrix had no candidates after its parent<br>(its row was still empty when this step drafted): a blank draft"
FRAME_LEGEND = {1: "Phase 1, retrieve: drafts from M's rows or pair rows<br>"
                   f"{ROOT_LEGEND}<br><span style='color:#6c8ebf'>●</span> a draft (verdict at phase 2) · "
                   "<span style='color:#8e44ad'>●</span> prompt lookup",
                2: "Phase 2, verify: one forward checks every node<br><span style='color:#2e9d4f'>●</span> the "
                   "model chose this token after its parent<br><span style='color:#d0455b'>✕</span> it chose "
                   "another · <span style='color:#c9ced4'>●</span> faded: below a ✕, no verdict",
                3: LEGEND, 4: LEGEND}
PTD_RETRIEVE = ("Phase 1, retrieve: candidates from PTD's tries<br>"
                f"{ROOT_LEGEND}<br><span style='color:#6c8ebf'>●</span> a draft (verdict at phase 2)")
DRAFT = "#6c8ebf"
EMPTY_COLOR = "#444"  # a draft from a row never written (∅: the paper's full shape keeps them)
CROWDED = 14  # rows with more nodes than this label only their accepted nodes (hover shows all)


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


def tree_legend(step: Step | None, frame: int) -> str:
    """The legend lines under the tree's title: the frame's, then the ∅ sign's where the tree has one."""
    legend = PTD_RETRIEVE if frame == 1 and step is not None and step.method == "ptd" else FRAME_LEGEND.get(frame, LEGEND)
    if step is None:
        return legend
    if "empty" in (step.tree.sources or []):
        return legend + EMPTY_LEGEND
    if planned_nothing(step):
        return legend + "<br>Nothing drafted: the planner judged no draft<br>worth its forward time (see 1. retrieve)"
    if not step.blank_under:
        return legend
    n = step.blank_drafts
    return legend + ("<br>∅: the matrix had no candidates after the token above<br>it (its row was still empty "
                     "when this step drafted;<br>this step's writes fill it), so nothing was drafted<br>"
                     f"below it ({n} place{'s' * (n != 1)} of the tree shape left out)")


def tree_figure(step: Step | None, token_text, title: str = "", frame: int = 0, picked: int | None = None):
    """``token_text(id) -> str``.  ``frame``: 0 the whole step, 1-4 Teach mode's retrieve, verify,
    accept, recycle.  ``picked``: a node to ring (clicked).  Each node carries its index as customdata."""
    layout = panel_layout(title or "Draft tree", tree_legend(step, frame), "tree")
    if step is None:
        return figure(layout=dict(layout, annotations=[note("Enter a prompt and press Step", 16)]))
    show_path = frame in (0, 3, 4)  # Teach mode's frames 1-2 tell nothing of the verdict, not even by a gap
    pos, star, spots = _positions(step, show_path and bool(step.committed))
    sources = step.tree.sources or ["root"] + ["matrix"] * step.tree.size
    kinds = _kinds(step, frame, sources)
    marks, order, prefer, must = _marks(step, token_text, pos, kinds, sources, star, spots)
    sides = place_labels(marks, order, framed(layout, marks), prefer, must)
    traces = (_edges(step, pos, show_path) + _blank_leaves(step, token_text, pos, spots)
              + _node_traces(step, token_text, marks, kinds, sources, picked, frame, sides))
    if show_path and star is not None:
        traces += _bonus_traces(step, token_text, pos[step.accepted_path[-1]], star, sides.get(len(pos)))
    if step.sampled and show_path and len(step.accepted_path) > 1:  # the draw at each level, on the path it chose
        traces.append(scatter(x=[pos[i][0] for i in step.accepted_path[1:]],
                              y=[pos[i][1] for i in step.accepted_path[1:]], mode="markers", hoverinfo="skip",
                              marker=dict(size=26, symbol="circle-open", color=COLORS["bonus"], line=dict(width=2))))
    return figure(data=traces, layout=layout)


def framed(layout: dict, marks: list[Mark]) -> Frame:
    """Set the axes' ranges in ``layout``: room around the nodes for their labels (``tree_labels.frame_for``),
    in the plot area's height (the figure's less its margins)."""
    box = frame_for(marks, layout["height"] - layout["margin"]["t"] - layout["margin"]["b"])
    layout["xaxis"] = dict(layout["xaxis"], range=[box.x0, box.x1])
    layout["yaxis"] = dict(layout["yaxis"], range=[box.y0, box.y1])
    return box


def _positions(step: Step, with_star: bool):
    """Node positions, the ★'s (``with_star``) and the ∅ leaves' (``{node: place}``): the ★ (the model's own
    token after the accepted path's end) and each ∅ leaf take a place of their own in the tidy layout, as a
    last child of their node, so that they lie over no node and no other label."""
    t = step.tree
    n = len(t.tokens)
    blanks = [i for i in step.blank_under if 0 <= i < n]
    extra = ([step.accepted_path[-1]] if with_star else []) + blanks
    pos = tree_layout(list(t.parents) + extra, list(t.depths) + [t.depths[p] + 1 for p in extra])
    star = pos[n] if with_star else None
    return {i: pos[i] for i in range(n)}, star, {i: pos[n + with_star + k] for k, i in enumerate(blanks)}


def _kinds(step: Step, frame: int, sources: list[str]) -> list[str]:
    t = step.tree
    matches = [i > 0 and t.parents[i] < len(step.model_choices) and step.model_choices[t.parents[i]] == tok
               for i, tok in enumerate(t.tokens)]
    kinds = [node_kind(i, set(step.accepted_path), frame, sources, matches) for i in range(len(t.tokens))]
    if frame == 2:  # under a ✕ the text differs from the model's: a verdict there cannot count
        for i in range(1, len(kinds)):
            if kinds[t.parents[i]] in ("miss", "moot"):
                kinds[i] = "moot"
    return kinds


def _style(kind: str, source: str) -> tuple[str, int, str]:
    """A node's colour, size and symbol."""
    color, size, symbol = KIND_STYLE[kind]
    if source == "empty" and kind != "accepted":  # hollow, dark and larger than a grey rejected draft
        return EMPTY_COLOR, 14, "circle-open"
    if source == "lookup" and kind in ("rejected", "draft"):
        return COLORS["lookup"], size, symbol
    return color, size, symbol


DIM = ("rejected", "miss", "draft", "moot")
IMPORTANT = ("root", "accepted")


def _marks(step: Step, token_text, pos, kinds, sources, star, spots):
    """Every node as a ``Mark`` (the ★'s, then the ∅ leaves', after the tree's), the order in which their labels
    are placed (root, accepted path and ★ first: labelled whatever comes; then the nodes over a ∅; then the
    rest row by row), the sides each tries (``_sides``) and how many must be labelled.  A row of more than
    ``CROWDED`` nodes labels only its root and accepted nodes (hover shows all)."""
    t = step.tree
    marks = []
    for i, tok in enumerate(t.tokens):
        text = "∅" if sources[i] == "empty" and kinds[i] != "accepted" else visible(token_text(tok), 10)
        marks.append(Mark(*pos[i], _style(kinds[i], sources[i])[1], text, 9 if kinds[i] in DIM else 11))
    if star is not None:
        marks.append(Mark(*star, 18, visible(token_text(step.model_choices[step.accepted_path[-1]]), 10), 11))
    marks += [Mark(*spots[i], 17) for i in spots]
    rows = [round(m.y) for m in marks]
    per_row = {r: rows.count(r) for r in set(rows)}
    first = [i for i in range(len(t.tokens)) if kinds[i] in IMPORTANT] + ([len(t.tokens)] if star else [])
    then = [i for i in spots if i not in first]  # the token above a ∅: the legend speaks of it
    placed = set(first + then)
    rest = sorted((i for i in range(len(t.tokens)) if i not in placed and per_row[rows[i]] <= CROWDED),
                  key=lambda i: (-marks[i].y, marks[i].x))
    parents = list(t.parents) + ([step.accepted_path[-1]] if star else []) + list(spots)
    return marks, first + then + rest, _sides(marks, parents, per_row, rows), len(first)


def _sides(marks: list[Mark], parents: list[int], per_row: dict, rows: list[int]) -> dict[int, tuple[str, ...]]:
    """The sides a label tries, in order: below a leaf; beside a node with children (their edges leave from
    below it; never below one with a child straight under it) or alone in its row (a chain's rows are close),
    first on the side away from the edge to its parent."""
    below = {p for i, p in enumerate(parents) if p >= 0 and marks[i].x == marks[p].x}
    has_children, prefer = set(parents), {}
    for i, m in enumerate(marks[:len(parents)]):
        if i in has_children or per_row[rows[i]] == 1:
            left = parents[i] >= 0 and marks[parents[i]].x > m.x  # the edge to its parent leaves up and right
            prefer[i] = ("middle left", "middle right") if left else ("middle right", "middle left")
            prefer[i] += () if i in below else ("bottom center",)
    return prefer


def _edges(step: Step, pos: dict, show_path: bool) -> list[dict]:
    """Grey edges, and the accepted path's in green once it is known."""
    parents, path = step.tree.parents, step.accepted_path
    shown = set(path) if show_path else set()
    grey = edge_trace([(pos[p], pos[i]) for i, p in enumerate(parents) if p >= 0 and i not in shown], "#dde1e6", 1)
    if not show_path:
        return [grey]
    return [grey, edge_trace([(pos[a], pos[b]) for a, b in zip(path, path[1:])], COLORS["accepted"], 4)]


def _blank_leaves(step: Step, token_text, pos: dict, spot: dict) -> list[dict]:
    """One hollow ∅ leaf, on a dotted edge, under each node whose children were left out (its row was still
    empty, ``Step.blank_under``): the places the tree shape had there, sent to no forward."""
    under = list(spot)
    if not under:
        return []
    return [edge_trace([(pos[i], spot[i]) for i in under], EMPTY_COLOR, 1, "dot"), scatter(
        name="left out", x=[spot[i][0] for i in under], y=[spot[i][1] for i in under], mode="markers+text",
        text=["∅"] * len(under), textposition="middle center", textfont=dict(size=10, color=EMPTY_COLOR),
        marker=dict(size=17, symbol="circle-open", color=EMPTY_COLOR, line=dict(width=1.5)), cliponaxis=False,
        hovertext=[f"<b>∅ left out</b> under {visible(token_text(step.tree.tokens[i]), 30)}<br>the matrix had no "
                   "candidates after this token yet (its row was still empty, never written, when this step drafted),<br>so nothing was "
                   "drafted below it: the tree's places there are left out of the forward pass"
                   for i in under], hoverinfo="text")]


def _node_traces(step: Step, token_text, marks: list[Mark], kinds, sources, picked, frame: int,
                 sides: dict) -> list[dict]:
    """The tree's nodes, dim ones first (drawn under the others); a label where ``sides`` places it; a ring
    round the ``picked`` one, drawn first so that the labels stay readable over it."""
    order = sorted(range(len(kinds)), key=lambda j: kinds[j] in ("accepted", "root", "match"))
    styles = [_style(kinds[j], sources[j]) for j in order]
    faded = [kinds[j] in ("rejected", "miss", "moot") for j in order]
    traces = [scatter(
        x=[marks[j].x for j in order], y=[marks[j].y for j in order], mode="markers+text", customdata=order,
        text=[marks[j].text if j in sides else "" for j in order],
        textposition=[sides.get(j, "bottom center") for j in order],
        textfont=dict(size=[marks[j].font for j in order], color=["#9aa1a9" if f else "#222" for f in faded]),
        marker=dict(size=[s[1] for s in styles], color=[s[0] for s in styles], symbol=[s[2] for s in styles],
                    line=dict(width=1.5, color=[s[0] for s in styles]), opacity=[0.6 if f else 1.0 for f in faded]),
        hovertext=[_hover(step, j, token_text, sources, frame) for j in order], hoverinfo="text")]
    if picked is not None and 0 <= picked < len(kinds):
        traces.insert(0, scatter(x=[marks[picked].x], y=[marks[picked].y], mode="markers", hoverinfo="skip",
                                 marker=dict(size=30, symbol="circle-open", color="#d0455b", line=dict(width=3))))
    return traces


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


def _bonus_traces(step: Step, token_text, end: tuple, star: tuple, side: str | None) -> list[dict]:
    """The ★ of the model's own token, on a dotted edge from the accepted path's end ``end``; its label at
    ``side`` (none when no side was clear)."""
    bonus = step.model_choices[step.accepted_path[-1]]
    return [edge_trace([(end, star)], COLORS["bonus"], 3, "dot"), scatter(
        name="model's own", x=[star[0]], y=[star[1]], mode="markers+text", cliponaxis=False,
        text=[visible(token_text(bonus), 10) if side else ""], textposition=side or "bottom center",
        textfont=dict(size=11, color="#6b4e00"), marker=dict(size=18, symbol="star", color=COLORS["bonus"]),
        hovertext=[f"<b>★ the model's own token</b> {visible(token_text(bonus), 30)} (id {bonus})<br>the model's own next "
                   f"token after the accepted path" + (" (sampled; no child matched it)" if step.sampled else "")],
        hoverinfo="text")]


DRAFT_LEGEND = ("<span style='color:#1f4e99'>●</span> root · <span style='color:#7f8c9a'>●</span> kept from earlier "
                "steps<br><span style='color:#2e9d4f'>●</span> attached this step (the model's argmax) · "
                "<span style='color:#d0455b'>✕</span> pruned")
FATE_COLORS = {"root": "#1f4e99", "kept": "#7f8c9a", "new": "#2e9d4f", "pruned": "#d0455b"}


def draft_figure(step: Step | None, token_text, title: str = "") -> Figure:
    """PTD's evolving draft tree after a step: kept nodes grey, new children green, pruned ones red."""
    layout = panel_layout(title or "PTD's draft tree", DRAFT_LEGEND, "draft")
    d = step.draft_tree if step is not None else None
    if d is None or len(d.tokens) < 2:
        return figure(layout=dict(layout, annotations=[note(
            "Choose the PTD method to see its evolving draft tree" if d is None else "The draft tree is empty", 14)]))
    pos = tree_layout(list(d.parents), list(d.depths))
    fates = list(d.sources)
    marks = [Mark(*pos[i], 20 if f == "root" else 13, visible(token_text(t), 10)) for i, (t, f) in
             enumerate(zip(d.tokens, fates))]
    order = sorted(range(len(marks)), key=lambda i: (-marks[i].y, marks[i].x))  # row by row
    sides = place_labels(marks, order, framed(layout, marks), {})
    words = {"root": "the step's root: first-level branches sit at its position",
             "kept": "kept from earlier steps", "new": "the model's argmax, attached this step",
             "pruned": "pruned this step (depth stepping or the root window)"}
    nodes = scatter(
        x=[pos[i][0] for i in range(len(d.tokens))], y=[pos[i][1] for i in range(len(d.tokens))],
        mode="markers+text", text=[m.text if i in sides else "" for i, m in enumerate(marks)], textfont=dict(size=11),
        textposition=[sides.get(i, "bottom center") for i in range(len(marks))],
        marker=dict(size=[20 if f == "root" else 13 for f in fates], color=[FATE_COLORS[f] for f in fates],
                    symbol=["x" if f == "pruned" else "circle" for f in fates], line=dict(width=1, color="white")),
        hovertext=[f"<b>{visible(token_text(t), 30)}</b> (id {t}), depth {dep}<br>{words[f]}"
                   for t, dep, f in zip(d.tokens, d.depths, fates)], hoverinfo="text")
    edges = edge_trace([(pos[p], pos[i]) for i, p in enumerate(d.parents) if p >= 0], "#dde1e6", 1)
    return figure(data=[edges, nodes], layout=layout)
