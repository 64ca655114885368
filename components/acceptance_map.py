"""How often each node of the tree shape was accepted over the run, drawn on the shape itself.

A node is a rank path from the root ((0,) = the top candidate of the root's row, (0, 1) = the second
candidate of that one's row, ...).  The auto tree keeps the nodes whose rate pays for their forward cost.
"""
from __future__ import annotations

from tr_core.trace import Step

from .figures import Figure, figure, scatter
from .tree_plot import edge_trace, note, panel_layout, tree_layout

LEGEND = ("colour = accepted ÷ drafted (white 0% → green 100%)<br>size = how often drafted · hover: the rank path<br>"
          "the auto tree keeps the nodes that pay for their cost")
PTD_LEGEND = ("colour = accepted ÷ drafted (white 0% → green 100%)<br>size = how often drafted · hover: the path<br>"
              "a node: a place in PTD's tries (rank among siblings)")


def acceptance_counts(steps: list[Step]) -> dict[tuple[int, ...], list[int]]:
    """Rank path -> [drafted, accepted] over the matrix nodes of ``steps`` (lookup branches left out)."""
    counts: dict[tuple[int, ...], list[int]] = {}
    for s in steps:
        t = s.tree
        if not t.ranks:
            continue
        paths: list[tuple[int, ...]] = [()]
        accepted = set(s.accepted_path)
        for i in range(1, len(t.tokens)):
            paths.append(paths[t.parents[i]] + (t.ranks[i],))
            if t.sources and t.sources[i] == "lookup":
                continue
            c = counts.setdefault(paths[i], [0, 0])
            c[0] += 1
            c[1] += i in accepted
    return counts


def acceptance_figure(steps: list[Step], upto: int, method: str = "tr") -> Figure:
    """How often each node was accepted over steps 1 to ``upto``; ``method``: the method named before any
    step."""
    counts = acceptance_counts(steps[:upto])
    ptd = (steps[0].method if steps else method) == "ptd"
    span = f", steps 1–{upto}" if upto > 1 else ", step 1" if upto == 1 else ""
    layout = panel_layout(f"Acceptance map{span}:<br>how often each node was accepted",
                          PTD_LEGEND if ptd else LEGEND, "acceptance")
    if not counts:
        return figure(layout=dict(layout, annotations=[note(
            "No steps yet: press Step." if not steps else
            "Step 1 is counted at phase 3, accept." if not upto else
            "No node drafted yet: the steps so far drafted<br>nothing from the tree shape", 13)]))
    paths = [()] + sorted(counts, key=lambda p: (len(p), p))
    index = {p: i for i, p in enumerate(paths)}
    parents = [-1] + [index.get(p[:-1], 0) for p in paths[1:]]
    depths = [len(p) for p in paths]
    pos = tree_layout(parents, depths)
    most = max(c[0] for c in counts.values())
    rates = [1.0] + [counts[p][1] / counts[p][0] for p in paths[1:]]
    nodes = scatter(
        x=[pos[i][0] for i in range(len(paths))], y=[pos[i][1] for i in range(len(paths))], mode="markers+text",
        text=["root"] + [f"{r:.0%}" if r >= 0.2 else "" for r in rates[1:]], textposition="bottom center",
        textfont=dict(size=9),
        marker=dict(size=[18] + [8 + 12 * counts[p][0] / most for p in paths[1:]], color=rates,
                    colorscale=[[0, "#ffffff"], [1, "#2e9d4f"]], cmin=0, cmax=1, line=dict(width=1, color="#7f8c9a")),
        hovertext=["root"] + [f"rank path {list(p)}: accepted {counts[p][1]} of {counts[p][0]} times ({rates[i + 1]:.0%})"
                              for i, p in enumerate(paths[1:])], hoverinfo="text")
    layout["yaxis"] = dict(layout["yaxis"], range=[-max(depths) - 0.8, 0.45])
    edges = edge_trace([(pos[parents[i]], pos[i]) for i in range(1, len(paths))], "#dde1e6", 1)
    return figure(data=[edges, nodes], layout=layout)


def acceptance_words(steps: list[Step], upto: int) -> str:
    """The map in one sentence (its text alternative)."""
    counts = acceptance_counts(steps[:upto])
    if not counts:
        return "Acceptance map: no tree steps yet."
    best = sorted(counts.items(), key=lambda kv: -kv[1][1] / kv[1][0])[:3]
    said = ", ".join(f"{list(p)} {c[1]}/{c[0]}" for p, c in best)
    return f"Acceptance map over {upto} steps, {len(counts)} tree nodes; most accepted (rank path, accepted/drafted): {said}."
