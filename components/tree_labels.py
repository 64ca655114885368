"""Where the draft tree's labels go: beside their nodes, where (at any width the page gives the plot) a label
overlaps no other label or node and stays inside the frame; a label with no such place is left out (its
node's hover still names it).  Also the frame itself: room around the nodes for their labels.

The plot's height is fixed, its width follows the page: a box is measured in pixels, its horizontal place
as a linear function of the width's scale (pixels per x unit), checked over the scales from the narrowest
plot (a phone's column) to the widest."""
from __future__ import annotations

from dataclasses import dataclass

WIDTHS = (280, 1100)  # the plot's width in px: a narrow column ... a wide screen (less 12 px of margins)
ROOM_X, ROOM_TOP, ROOM_BOTTOM = 44, 16, 26  # px kept free around the nodes for their labels
SIDES = {"bottom center": (-0.5, 1), "middle right": (0, 0), "middle left": (-1, 0)}  # above: the edges arrive
NARROW, WIDE = set("fijlrtI.,:;'|!()[]{}/\\` -·‹›"), set("mwMW@%…→")


def text_width(text: str, font: float) -> float:
    """A generous estimate of a label's width in px (Arial-like metrics, a wider fallback font allowed)."""
    def em(c: str) -> float:
        if c in NARROW:
            return 0.36
        if c in WIDE or not c.isascii():
            return 1.0
        return 0.78 if c.isupper() else 0.6
    return 1.1 * font * sum(em(c) for c in text) + 2


@dataclass
class Mark:
    """A node as drawn: data position, marker diameter (px), its label and the label's font size."""
    x: float
    y: float
    size: float
    text: str = ""
    font: float = 11


@dataclass
class Frame:
    """The axes' ranges and the plot area's height in px."""
    x0: float
    x1: float
    y0: float
    y1: float
    height: float

    def scales(self) -> tuple[float, float]:
        return tuple((w - 12) / (self.x1 - self.x0) for w in WIDTHS)

    def top(self, y: float) -> float:
        return (self.y1 - y) * self.height / (self.y1 - self.y0)


@dataclass
class Box:
    """A rectangle: left edge at ``x * scale + dx`` px, ``w`` wide; top ``top`` px, ``h`` tall."""
    x: float
    dx: float
    w: float
    top: float
    h: float


def frame_for(marks: list[Mark], height: float, min_rows: float = 3.0) -> Frame:
    """Ranges that keep ROOM_* px free around the outermost nodes at the narrowest width; at least
    ``min_rows`` rows tall (a tiny tree stays compact, at the top)."""
    xs, ys = [m.x for m in marks], [m.y for m in marks]
    span = max(xs) - min(xs)
    area = WIDTHS[0] - 12
    pad = ROOM_X * span / (area - 2 * ROOM_X) if span else 0.6
    rows = max(ys) - min(ys)
    total = max(rows * height / (height - ROOM_TOP - ROOM_BOTTOM), min_rows)
    top = max(ys) + ROOM_TOP * total / height
    return Frame(min(xs) - pad, max(xs) + pad, top - total, top, height)


def marker_box(m: Mark, frame: Frame) -> Box:
    return Box(m.x, -m.size / 2, m.size, frame.top(m.y) - m.size / 2, m.size)


def label_box(m: Mark, side: str, frame: Frame) -> Box:
    """The box Plotly gives ``m``'s label at ``side`` (measured in Chromium: a gap of about 0.7 of the marker
    beside it, half the marker and a pixel below it)."""
    w, h = text_width(m.text, m.font), 1.1 * m.font + 1
    across, down = SIDES[side]
    gap = 0.7 * m.size + 1
    dx = across * w + (gap if across == 0 else -gap if across == -1 else 0)
    centre = frame.top(m.y)
    return Box(m.x, dx, w, centre + m.size / 2 + 0.5 if down else centre - h / 2, h)


def _where_below(k: float, c: float, lo: float, hi: float) -> tuple[float, float]:
    """The scales s in (lo, hi) with k * s < c, as an interval (empty when lo >= hi)."""
    if k > 0:
        return lo, min(hi, c / k)
    if k < 0:
        return max(lo, c / k), hi
    return (lo, hi) if c > 0 else (1.0, 0.0)


def overlap(a: Box, b: Box, scales: tuple[float, float]) -> bool:
    """Whether ``a`` and ``b`` overlap at some scale between the narrowest and the widest plot."""
    if a.top >= b.top + b.h or b.top >= a.top + a.h:
        return False
    lo, hi = _where_below(a.x - b.x, b.dx + b.w - a.dx, *scales)  # a's left edge left of b's right edge
    lo, hi = _where_below(b.x - a.x, a.dx + a.w - b.dx, lo, hi)  # and b's left edge left of a's right edge
    return lo < hi


def inside(box: Box, frame: Frame) -> bool:
    """Whether ``box`` stays inside the plot area at every width (linear in the scale: its ends suffice)."""
    if box.top < 0 or box.top + box.h > frame.height:
        return False
    return all((box.x - frame.x0) * s + box.dx >= 0 and (box.x - frame.x1) * s + box.dx + box.w <= 0
               for s in frame.scales())


def place_labels(marks: list[Mark], order: list[int], frame: Frame, prefer: dict[int, tuple[str, ...]],
                 must: int = 0) -> dict[int, str]:
    """Each labelled mark of ``order`` (most important first) -> the first of its ``prefer`` sides (default:
    below, right, left) where its label stays inside the frame and clear of every marker but its own
    and of the labels placed before it; marks with no such side are left out, except the first ``must`` of
    ``order``: those try every side, then take one clear of the labels alone (over a node's marker), or else
    their first."""
    scales = frame.scales()
    markers = [(i, marker_box(m, frame)) for i, m in enumerate(marks)]
    labels: list[Box] = []
    placed: dict[int, str] = {}
    for k, i in enumerate(order):
        sides = prefer.get(i, tuple(SIDES)) + (tuple(SIDES) if k < must else ())  # any side, last, for a must
        boxes = {side: label_box(marks[i], side, frame) for side in dict.fromkeys(sides)}
        fits = [side for side, box in boxes.items() if inside(box, frame) and
                not any(overlap(box, b, scales) for b in labels)]
        clear = [side for side in fits if not any(j != i and overlap(boxes[side], b, scales) for j, b in markers)]
        side = (clear or (fits if k < must else []) or ([next(iter(boxes))] if k < must else [None]))[0]
        if side is not None and marks[i].text:
            placed[i] = side
            labels.append(boxes[side])
    return placed
