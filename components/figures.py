"""Plotly figures from plain dicts: traces and layouts under plotly's JSON names, not validated
property by property on the way.

The page redraws five figures at every step of every tab.  Validating each property (what
``go.Scatter(...)`` and ``go.Figure(...)`` do) costs most of a step's drawing time (about 15 of 19 ms
on a 2-core Xeon), host work a server pays once per tab per step, beside the forwards it shares.
Built from dicts, the same figures cost a fifth of that.  The names are plotly's JSON names: nested
dicts, none of plotly's ``font_size`` shortcuts for ``font.size``.  ``tests/test_page_drawing.py``
checks that every figure the panels draw is what plotly's validation makes of it."""
from __future__ import annotations

import plotly.graph_objects as go


def figure(data: list[dict] | tuple = (), layout: dict | None = None) -> go.Figure:
    """A figure of ``data`` (trace dicts, e.g. :func:`scatter`'s) and ``layout``, unvalidated."""
    return go.Figure(data=list(data), layout=layout or {}, _validate=False)


def scatter(**props) -> dict:
    return dict(type="scatter", **props)


def bar(**props) -> dict:
    return dict(type="bar", **props)


def heatmap(**props) -> dict:
    return dict(type="heatmap", **props)
