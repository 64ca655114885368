"""The tree's and the matrix's drawing in a real browser (Debian's chromium via Playwright), without a model:
the figures of the example runs and of made-up steps (a chain, a path ending on an empty row, blank-like
tokens) are drawn by plotly.js at a phone's and a wide screen's plot width, and their boxes measured: no
label over another, the ★ and the accepted path's end inside the tree's frame, a lone matrix row at a row's
height."""
from __future__ import annotations

from pathlib import Path

import pytest

from components.heatmap import heatmap_figure
from components.tokens import visible
from components.tree_plot import TREE_HEIGHT, tree_figure
from tr_core.runs import read_run
from tr_core.trace import DraftTree, RowUpdate, Step

RUNS = Path(__file__).resolve().parents[1] / "assets" / "runs"
WIDTHS = (300, 370, 500)  # a narrow column, a phone (390 px), the first screen at 1280x800

# the labels, the ∅ leaves (their sign is a label) and the frame of the plot drawn in ``div``, as boxes
BOXES = """(div) => {
  const box = (e) => { const r = e.getBoundingClientRect(); return {x: r.x, y: r.y, w: r.width, h: r.height}; };
  const labels = [...div.querySelectorAll('.textpoint text, .annotation-text')].filter(e => e.textContent.trim())
      .map(e => ({...box(e), t: e.textContent}));
  const points = {};  // by the trace's index in the figure (a trace with no points draws no group)
  div.querySelectorAll('.scatterlayer .trace').forEach(t => {
    points[t.__data__[0].trace.index] = [...t.querySelectorAll('.point')].map(box); });
  return {labels, points, frame: box(div.querySelector('.nsewdrag'))};
}"""


def words(token_id: int) -> str:
    special = {1: "_", 2: " ", 3: "\n", 4: "__", 5: "  ", 6: "\t", 7: "supercalifragilistic", 8: "MMMMMMMM"}
    return special.get(token_id, f"w{token_id}" if token_id % 3 else f"token{token_id}")


def made_up_steps() -> list[Step]:
    """A chain whose path ends half way; a path that ends on a node with an empty row (its ∅ and the ★ under it);
    a wide first row of blank-like and long tokens; a tree of one node."""
    chain = DraftTree(list(range(10, 27)), [-1] + list(range(16)), list(range(17)), [0] * 17,
                      ["root"] + ["matrix"] * 16)
    wide = DraftTree([9, 1, 2, 3, 4, 5, 6, 7, 8, 11, 12], [-1, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1], [0] + [1] * 8 + [2, 2],
                     [0, 0, 1, 2, 3, 4, 5, 6, 7, 0, 1], ["root"] + ["matrix"] * 10)
    lone = DraftTree([3], [-1], [0], [0], ["root"])

    def step(tree, path, blank_under=()):
        choices = [1] * len(tree.tokens)
        for a, b in zip(path, path[1:]):
            choices[a] = tree.tokens[b]
        committed = [tree.tokens[i] for i in path[1:]] + [1]
        return Step(1, "tr", tree, path, committed, choices, [], len(tree.tokens), 10, {},
                    blank_under=list(blank_under), blank_drafts=3 * len(blank_under))
    return [step(chain, list(range(9))), step(chain, list(range(17))), step(wide, [0, 1, 9], [9, 3, 4]),
            step(wide, [0, 2], [2, 5, 6, 7, 8]), step(lone, [0], [0])]


def example_steps():
    for name in sorted(RUNS.glob("tr-*.json")):
        run = read_run(name.read_bytes())
        yield from ((step, run.token_text) for step in run.steps)


@pytest.fixture(scope="module")
def plot_page(browser):
    """A page with plotly.js and one div per width, each ``TREE_HEIGHT`` tall."""
    from plotly.offline import get_plotlyjs

    page = browser.new_page(viewport={"width": 1400, "height": 900})
    divs = "".join(f"<div id='w{w}' style='width:{w}px;height:{TREE_HEIGHT}px'></div>" for w in WIDTHS)
    page.set_content(f"<html><head><meta charset='utf-8'><script>{get_plotlyjs()}</script></head>"
                     f"<body style='margin:0'>{divs}</body></html>")
    yield page
    page.close()


def draw(page, fig, width: int) -> dict:
    page.evaluate("([id, fig]) => Plotly.react(id, fig.data, fig.layout)", [f"w{width}", fig.to_plotly_json()])
    return page.locator(f"#w{width}").evaluate(BOXES)


def overlapping(boxes: list[dict]) -> list[tuple[str, str]]:
    return [(a["t"], b["t"]) for k, a in enumerate(boxes) for b in boxes[k + 1:]
            if a["x"] < b["x"] + b["w"] - 0.5 and b["x"] < a["x"] + a["w"] - 0.5
            and a["y"] < b["y"] + b["h"] - 0.5 and b["y"] < a["y"] + a["h"] - 0.5]


def held(box: dict, frame: dict) -> bool:
    return (box["x"] >= frame["x"] - 0.5 and box["y"] >= frame["y"] - 0.5 and box["x"] + box["w"] <= frame["x"] +
            frame["w"] + 0.5 and box["y"] + box["h"] <= frame["y"] + frame["h"] + 0.5)


def test_tree_labels_never_overlap_and_the_frame_holds_the_star_and_the_path_end(plot_page):
    steps = [(s, words) for s in made_up_steps()] + list(example_steps())
    bad = []
    for k, (step, text) in enumerate(steps):
        for frame in (0, 1, 2) if k % 4 == 0 else (0,):
            fig = tree_figure(step, text, f"Step {k}", frame)
            star = next((t for t in fig.data if t.name == "model's own"), None)
            for width in WIDTHS:
                got = draw(plot_page, fig, width)
                if overlapping(got["labels"]):
                    bad.append((k, frame, width, overlapping(got["labels"])))
                if star is not None:  # the ★ and its label, the path's end (the trace of the tree's nodes)
                    star_box = got["points"][str(list(fig.data).index(star))][0]
                    said = visible(text(step.model_choices[step.accepted_path[-1]]), 10)
                    labels = [b for b in got["labels"] if said in b["t"]]
                    if not held(star_box, got["frame"]) or not all(held(b, got["frame"]) for b in labels):
                        bad.append((k, frame, width, "★ outside the frame"))
                nodes = [t.customdata is not None for t in fig.data].index(True)  # scatterlayer: a group per trace
                end = list(fig.data[nodes].customdata).index(step.accepted_path[-1])
                if not held(got["points"][str(nodes)][end], got["frame"]):
                    bad.append((k, frame, width, "the path's end outside the frame"))
    assert not bad, bad[:10]


def test_a_lone_matrix_row_is_drawn_at_a_row_height(plot_page):
    """One row written (or a few) draws at a row's height from the top, not stretched over the panel."""
    row = 30  # px: a row of the matrix as drawn for a step of about ten rows
    tree = DraftTree([5, 6], [-1, 0], [0, 1], [0, 0], ["root", "matrix"])
    rows = [RowUpdate(5, [0] * 8, list(range(10, 18))), RowUpdate(6, list(range(20, 28)), list(range(21, 29)))]
    for n in (1, 2):
        step = Step(1, "tr", tree, [0, 1], [6, 1], [6, 1], rows[:n], 2, 10, {})
        fig = heatmap_figure(step, words)
        plot_page.evaluate("([id, fig]) => { document.getElementById(id).style.height = fig.layout.height + 'px';"
                           " Plotly.react(id, fig.data, fig.layout); }", ["w500", fig.to_plotly_json()])
        drawn = plot_page.locator("#w500 .hm image").bounding_box()
        assert drawn["height"] <= n * row, (n, drawn)
        plot_page.locator("#w500").evaluate(f"d => d.style.height = '{TREE_HEIGHT}px'")
