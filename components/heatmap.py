"""The matrix rows one step wrote, as a plotly heatmap: one row per token, k candidate columns."""
from __future__ import annotations

from tr_core.trace import RowUpdate, Step

from .figures import Figure, figure, heatmap
from .tokens import visible
from .tree_plot import HEIGHT, heading, note, top_margin

MAX_ROWS = 20
ROW_PX = 26  # the tallest a row is drawn
CELL_CHARS = 6  # a cell's token, shortened to fit a phone's 8 columns (its hover has it whole)
# 0 = same token at the same rank, 1 = moved from another rank, 2 = new to the row, 3 = empty (never written)
SCALE = [[0.0, "#eef1f4"], [0.24, "#eef1f4"], [0.25, "#ffe08a"], [0.49, "#ffe08a"], [0.5, "#f08a4b"],
         [0.74, "#f08a4b"], [0.75, "#ffffff"], [1.0, "#ffffff"]]
ROWS = "each row: “a token” #its id (its vocabulary number)<br>and its k likeliest next tokens<br>"  # a phone's lines
PATH = "▶ the accepted path, from the root: the last<br>committed token, where this step starts<br>"
ROOT = "▶ the tree's root: the last committed token, where<br>this step starts (the path is known at phase 3)<br>"
SIGNS = "∅ never written: no candidates · ␣ space · ↵ new line<br>‹_› a token of underscores only"
COLOURS = ("<span style='color:#999'>■</span> unchanged <span style='color:#e0b000'>■</span> moved rank "
           "<span style='color:#f08a4b'>■</span> new")


def legend(frame: int) -> str:
    """The lines under the matrix's title: what a row and ▶ are, before or after the writes, the signs."""
    marks = ROOT if frame in (1, 2) else PATH  # before the verdict ▶ marks the root's row alone
    if frame in (1, 2, 3):
        return f"{ROWS}{marks}<b>before</b> this step's writes: what the drafts read<br>{SIGNS}"
    return f"{ROWS}{marks}<b>after</b> the writes: {COLOURS}<br>{SIGNS}"


NO_MATRIX = {"greedy": "Greedy decoding keeps no matrix",
             "ptd": "PTD keeps no matrix: its drafts are n-grams<br>from its tries (see the phase strip)"}
EMPTY_START = "Each step writes the rows of every token<br>it ran through the model (the recycling)."


def heatmap_figure(step: Step | None, token_text, frame: int = 0, picked: list[int] | None = None,
                   method: str = "tr") -> Figure:
    """``frame`` 1-3 (Teach mode before recycling) shows the rows before the writes; ``picked``: row
    tokens to outline (the row a clicked node was drafted from and the row it wrote); ``method``: the
    method named before any step."""
    before = frame in (1, 2, 3)
    if step is None or not step.rows_written:
        method = step.method if step is not None else method
        if method != "tr":  # no TR words under another method
            title, key = "No matrix for this method", "The matrix M is Token Recycling's: shown when TR runs"
            words = NO_MATRIX.get(method, "No rows written yet")
        else:
            title, key = "The matrix M: each token's k candidates", legend(frame)
            words = "No rows written yet" if step else "No rows yet: press Step.<br>" + EMPTY_START
        return figure(layout=dict(matrix_layout(title, key), xaxis=dict(visible=False), yaxis=dict(visible=False),
                                  annotations=[note(words, 13)]))
    guessing = frame in (1, 2)  # Teach mode before the verdict: nothing may tell which path is accepted
    rows = _ordered_rows(step, picked or [], by_path=not guessing)
    shown = rows[:MAX_ROWS]
    path_tokens = {step.tree.tokens[0]} if guessing else {step.tree.tokens[i] for i in step.accepted_path}
    z, text, hover, ylabels = [], [], [], []
    for r in shown:
        zr, tr_, hr = _row_cells(r, token_text, before)
        z.append(zr)
        text.append(tr_)
        hover.append(hr)
        ylabels.append(f"{'▶ ' if r.token in path_tokens else ''}“{visible(token_text(r.token), 12)}” #{r.token}")
    k = len(shown[0].new)
    cells = heatmap(z=z, x=[f"#{j}" for j in range(k)], y=list(range(len(shown))), text=text,
                    texttemplate="%{text}", textfont=dict(size=10), hovertext=hover, hoverinfo="text",
                    zmin=0, zmax=3, colorscale=SCALE, showscale=False, xgap=1, ygap=1)
    outlines = [dict(type="rect", x0=-0.5, x1=k - 0.5, y0=n - 0.5, y1=n + 0.5, line=dict(color="#d0455b", width=3))
                for n, r in enumerate(shown) if r.token in (picked or [])]
    more = f" (+{len(rows) - len(shown)} more)" if len(rows) > len(shown) else ""
    blank = sum(1 for r in step.rows_written if not any(r.old))
    empties = f" · {blank} {'was' if blank == 1 else 'were'} empty" if blank else ""
    # Teach mode before recycling (frames 1-3): the rows as the drafts read them, nothing of the writes to come
    title = (f"The matrix M: the {len(rows)} row{'s' * (len(rows) != 1)} of this step's tree{more}" if before else
             f"The matrix M: {len(rows)} row{'s' * (len(rows) != 1)} written{more or ' this step'}{empties}")
    layout = matrix_layout(title, legend(frame))
    layout.update(xaxis=dict(side="top"), **({"shapes": outlines} if outlines else {}),
                  yaxis=dict(tickmode="array", tickvals=list(range(len(shown))), ticktext=ylabels,
                             range=[rows_tall(layout, len(shown)) - 0.5, -0.5], tickfont=dict(size=10)))
    return figure(data=[cells], layout=layout)


def matrix_layout(title: str, key: str) -> dict:
    """The matrix panel's layout: its ``heading`` over the legend ``key``, room above for the ranks."""
    return dict(margin=dict(l=6, r=6, t=top_margin(title, key, 102), b=4), height=HEIGHT, plot_bgcolor="white",
                title=heading(title, key))


def rows_tall(layout: dict, rows: int) -> float:
    """How many rows the y axis spans: ``rows``, or more when fewer would draw a row taller than ``ROW_PX``
    (a step with one row or a few draws them at a row's height, from the top)."""
    return max(rows, (layout["height"] - layout["margin"]["t"] - layout["margin"]["b"]) / ROW_PX)


def _ordered_rows(step: Step, picked: list[int], by_path: bool = True) -> list[RowUpdate]:
    """Picked rows first, then the accepted path's rows in path order (``by_path``; else the root's
    alone, as before the verdict), then the rest in tree order."""
    path = [step.tree.tokens[i] for i in (step.accepted_path if by_path else [0])]
    tokens = step.tree.tokens
    def key(r: RowUpdate):
        return (r.token not in picked, r.token not in path, path.index(r.token) if r.token in path else 0,
                tokens.index(r.token) if r.token in tokens else len(tokens))  # the rest: where the tree has them
    return sorted(step.rows_written, key=key)


def _row_cells(r: RowUpdate, token_text, before: bool):
    empty_before = not any(r.old)
    zr, tr_, hr = [], [], []
    for j, (o, n) in enumerate(zip(r.old, r.new)):
        old_text = "∅" if empty_before else visible(token_text(o), CELL_CHARS)
        if before:
            zr.append(3 if empty_before else 0)
            tr_.append(old_text)
        else:
            zr.append(2 if empty_before else (0 if o == n else (1 if n in r.old else 2)))
            tr_.append(visible(token_text(n), CELL_CHARS))
        was = "∅ (never written)" if empty_before else f"{visible(token_text(o), 20)} ({o})"
        head = f"row {visible(token_text(r.token), 20)} (id {r.token}), rank {j}<br>"
        # before the writes (Teach mode's frames 1-3) the hover tells what the cell holds, not what it will
        hr.append(head + (was if before else f"{was} → {visible(token_text(n), 20)} ({n})"))
    return zr, tr_, hr
