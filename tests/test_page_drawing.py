"""The page's drawing without a model or a browser: blank-like tokens shown with signs wherever tokens are
drawn."""
from __future__ import annotations

from components.heatmap import heatmap_figure
from components.text_view import output_html
from components.tokens import blank_like, token_html, visible
from components.tree_plot import tree_figure
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
    assert {"‹_›", "␣"} <= labels, labels  # the root's first row: "_" and " "
    cells = {c for row in heatmap_figure(a_step(), text_of).data[0].text for c in row}
    assert {"‹_›", "␣", "↵", "␣␣", "→", "‹__›"} <= cells, cells
