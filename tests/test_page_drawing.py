"""The page's drawing without a model or a browser: blank-like tokens shown with signs wherever tokens are
drawn, the ∅ and ▶ signs explained in words a student reads once, MAT's meaning beside its figure, the tree's
labels placed clear of one another at every width, a lone matrix row at a row's height."""
from __future__ import annotations

import re

from components.counters import charts_figure, counters_html
from components.heatmap import ROW_PX, heatmap_figure, legend
from components.phase_strip import phase_html
from components.text_view import output_html
from components.tokens import blank_like, token_html, visible
from components.tree_labels import WIDTHS, Box, Frame, Mark, label_box, overlap, place_labels
from components.tree_plot import LEGEND, tree_figure, tree_legend
from tr_core.trace import DraftTree, RowUpdate, Step

TEXTS = {1: "_", 2: " ", 3: "\n", 4: "  ", 5: "cat", 6: " dog", 7: "\t", 8: "__", 9: "\xa0"}


def text_of(token_id: int) -> str:
    return TEXTS.get(token_id, f"w{token_id}")


def a_step(blank_under=(), rows=None) -> Step:
    tree = DraftTree([5, 1, 2, 3, 4], [-1, 0, 0, 1, 1], [0, 1, 1, 2, 2], [0, 0, 1, 0, 1], ["root"] + ["matrix"] * 4)
    rows = rows if rows is not None else [RowUpdate(t, [0] * 8, [1, 2, 3, 4, 7, 8, 9, 6]) for t in (5, 1)]
    return Step(1, "tr", tree, [0, 1], [1, 8], [1, 8, 3, 9, 9], rows, 5, 10, {}, blank_under=list(blank_under),
                blank_drafts=3 * len(blank_under))


def test_blank_like_tokens_are_shown_with_signs_wherever_tokens_are_drawn():
    assert [visible(t) for t in ("_", " ", "\n", "  ", "\t", "__", "\xa0", "\n  ")] == \
        ["‹_›", "␣", "↵", "␣␣", "→", "‹__›", "⍽", "↵␣␣"]
    assert visible(" dog") == "␣dog" and visible("a_b") == "a_b" and not blank_like(" dog") and blank_like("\r\n")
    assert token_html(" dog") == " dog"  # a word reads as it is
    assert token_html("_") == '<span class="signs">_</span>' and token_html("\n") == '<span class="signs">↵<br></span>'
    text = output_html([a_step()], text_of)
    assert '<span class="signs">_</span>' in text and '<span class="signs">‹' not in text
    tree = tree_figure(a_step(), text_of)
    labels = {x for t in tree.data for x in (t.text or []) if x}
    assert {"‹_›", "␣", "‹__›"} <= labels, labels  # the root's first row: "_", " ", and the ★ "__"
    cells = {c for row in heatmap_figure(a_step(), text_of).data[0].text for c in row}
    assert {"‹_›", "␣", "↵", "␣␣", "→", "‹__›"} <= cells, cells


def test_the_empty_sign_and_the_root_marker_are_explained_in_plain_words():
    words = re.sub("<[^>]+>", " ", tree_figure(a_step(blank_under=[2]), text_of).layout.title.text)
    assert "∅: the matrix had no candidates after the token above" in words
    assert "row was still empty" in words and "nothing was drafted" in words and "node's row" not in words
    assert "root: last committed token, where this step starts" in re.sub("<[^>]+>", "", LEGEND)
    for frame in range(5):
        said = re.sub("<[^>]+>", "", legend(frame).replace("<br>", " "))
        assert re.search("▶ the .*root.* the last committed token, where this step starts", said), said


def test_mat_is_explained_beside_its_figure():
    fig = {"tr": {"tokens": 30, "forwards": 12, "mat": 2.5, "tok_per_s": 15.0, "seconds": 2.0},
           "greedy": {"tokens": 30, "forwards": 30, "mat": 1.0, "tok_per_s": 12.0, "seconds": 2.5},
           "speedup": 1.25, "identical": True, "compared": 30}
    html = counters_html(fig)
    lead = html[html.index("mat-lead"):html.index("<table")]  # before the table: on the first screen
    assert "MAT <b>2.50</b> tokens per forward pass" in lead
    assert "mean accepted tokens" in lead and "★ included; greedy: 1.00" in lead


def test_a_lone_matrix_row_is_drawn_at_a_row_height():
    fig = heatmap_figure(a_step(rows=[RowUpdate(5, [0] * 8, list(range(10, 18)))]), text_of)
    top, bottom = sorted(fig.layout.yaxis.range)
    area = fig.layout.height - fig.layout.margin.t - fig.layout.margin.b
    assert area / (bottom - top) <= ROW_PX  # one row: a row's height, the rest of the panel left blank


def test_labels_placed_are_clear_of_one_another_and_of_the_nodes_at_every_width():
    """Crowded nodes (a row of ten, close together): every label placed keeps clear of every other and of
    every other node at the narrowest and the widest plot; the first ``must`` are all labelled."""
    marks = [Mark(0, 0, 22, "root")] + [Mark(-1 + k * 0.2, -1, 9, f"token{k}", 9) for k in range(11)]
    marks += [Mark(-1 + k * 0.5, -2, 16, "supercalifragilistic"[: 3 + 2 * k]) for k in range(5)]
    frame = Frame(-1.3, 1.3, -2.8, 0.3, 200)
    sides = place_labels(marks, list(range(len(marks))), frame, {}, must=2)
    assert {0, 1} <= set(sides) and len(sides) < len(marks)  # the crowded row loses some labels
    boxes = [label_box(marks[i], side, frame) for i, side in sides.items()]
    dots = [Box(m.x, -m.size / 2, m.size, frame.top(m.y) - m.size / 2, m.size) for m in marks]
    scales = frame.scales()
    assert scales[0] == (WIDTHS[0] - 12) / 2.6
    assert not any(overlap(a, b, scales) for k, a in enumerate(boxes) for b in boxes[k + 1:])
    for (i, _), box in zip(sides.items(), boxes):
        assert not any(overlap(box, dot, scales) for j, dot in enumerate(dots) if j != i), i


def test_before_the_verdict_the_tree_is_laid_out_alike_whichever_path_is_accepted():
    """Teach mode's frames 1-2: the ★'s place (a child of the path's end once shown) leaves no gap that tells
    where the accepted path ends."""
    def nodes(step, frame):
        fig = tree_figure(step, text_of, frame=frame)
        trace = next(t for t in fig.data if t.customdata is not None)
        return sorted(zip(trace.customdata, trace.x, trace.y)), fig.layout.xaxis.range, fig.layout.yaxis.range

    one, other = a_step(), a_step()
    other.accepted_path = [0, 2]
    for frame in (1, 2):
        assert nodes(one, frame) == nodes(other, frame)
    assert nodes(one, 3) != nodes(other, 3)  # once shown, the ★ hangs under the path's end


def test_every_figure_drawn_is_what_plotly_validation_makes_of_it():
    """The panels' figures skip plotly's validation (``components.figures``): each figure of the three
    example runs, at every third step and the last (Teach mode's frames at the first three), and of the
    empty state, is the same figure once validated, so no property is misnamed, misplaced or left for
    plotly to expand (``font_size`` for ``font.size``), and what ``gr.Plot`` sends of it is plotly's JSON
    with the template ``go.Figure`` would give it."""
    import json
    from pathlib import Path

    import gradio as gr
    import plotly.graph_objects as go

    from components.figures import Figure
    from components.panels import draw_panels
    from components.run_view import RunView
    from tr_core.runs import read_run

    checked = 0
    views = [None] + [RunView.of_run(read_run(p.read_text())) for p in sorted(Path("assets/runs").glob("*.json"))]
    for view in views:
        last = len(view.steps) if view else 0
        for n in ([None] if view is None else [n for n in range(1, last + 1) if n <= 3 or n % 3 == 0 or n == last]):
            for frame in ((0,) if view is None or n > 3 else (0, 1, 2, 3, 4)):  # Teach frames: steps 1-3
                for fig in draw_panels(view, n, frame, picked=0 if frame == 0 else None):
                    if isinstance(fig, Figure):
                        sent = gr.Plot().postprocess(fig)  # what the page gets
                        assert sent.type == "plotly"
                        drawn = json.loads(sent.plot)
                        # built and validated by plotly, with its default template
                        validated = json.loads(go.Figure(data=fig.traces, layout=fig.layout_dict).to_json())
                        assert validated == drawn, (n, frame, drawn["layout"].get("title"))
                        checked += 1
    assert checked > 150


def test_a_step_the_planner_drafted_nothing_for_says_why():
    """No draft and no place left out: the auto tree's planner chose none, and the retrieve phase and the
    tree's legend say so; a tree with drafts, or with places left out, says what it did instead."""
    bare = Step(4, "tr", DraftTree([5], [-1], [0], [0], ["root"]), [0], [6], [6], [], 1, 30, {})
    assert "judged no draft worth it" in phase_html(bare, text_of) and "Nothing drafted" in tree_legend(bare, 0)
    assert "0 draft tokens were read" not in phase_html(bare, text_of)
    for other in (a_step(), a_step(blank_under=[0])):
        assert "judged no draft" not in phase_html(other, text_of)
        assert "Nothing drafted" not in tree_legend(other, 0)
    left_out = Step(4, "tr", DraftTree([5], [-1], [0], [0], ["root"]), [0], [6], [6], [], 1, 30, {}, blank_drafts=3)
    assert "left out" in phase_html(left_out, text_of) and "judged no draft" not in phase_html(left_out, text_of)


def test_the_speedup_chart_holds_every_point_and_the_one_times_line_clear_of_its_edges():
    for speedups in ([0.81, 0.92, 0.84, 0.87, 1.05], [1.4, 1.6, 2.2], [0.5], []):
        low, high = charts_figure([1, 2], speedups).layout.yaxis2.range
        assert low < min([*speedups, 1.0]) and high > max([*speedups, 1.0]) and low >= 0


def test_the_accept_phase_says_what_was_committed_where_the_text_ended_within_the_drafts():
    """One accepted draft and the model's own token: both committed; the text ending at that draft (end of
    text): the draft alone, none of the model's own, and no "drafts hit" line for a single token; the
    budget cutting two accepted drafts after the first: that one."""
    whole = phase_html(a_step(), text_of)
    assert "committed <b>2</b> (1 from the draft + 1 of its own)" in whole and "drafts hit" in whole
    ended = a_step()
    ended.committed = [1]
    said = phase_html(ended, text_of)
    assert "the text ended with it" in said and "committed <b>1</b>, all from the draft" in said
    assert "of its own" not in said and "itself" not in said and "drafts hit" not in said and "1 tokens" not in said
    cut = a_step()
    cut.accepted_path, cut.committed = [0, 1, 3], [1]
    said = phase_html(cut, text_of)
    assert "had <b>2</b> tokens" in said and "committed its first <b>1</b>" in said and "itself" not in said
