"""Plotly figures from plain dicts: traces and layouts under plotly's JSON names, neither validated
nor copied on the way to the page.

The page redraws five figures at every step of every tab, and a class's server draws them for every
tab beside the forwards it shares.  ``go.Figure`` validates each property (``go.Scatter(...)``), and
even unvalidated it copies plotly's default template into every figure and its layout twice more on
the way to JSON: about 2.5 ms a figure on a 2-core AMD EPYC, where the JSON of the same dicts takes
0.1 ms.  In a server, that host work holds the interpreter lock that the forwards of every tab need
between their operations.  So a panel is a :class:`Figure`: the dicts themselves, turned into JSON
(with the default template, as plotly writes it) only when ``gr.Plot`` sends it.  The names are
plotly's JSON names: nested dicts, none of plotly's ``font_size`` shortcuts for ``font.size``.
``tests/test_page_drawing.py`` checks that every figure the panels draw is what plotly's validation
makes of it."""
from __future__ import annotations

from functools import cached_property, lru_cache

import plotly.graph_objects as go
import plotly.io as pio
from plotly.io.json import to_json_plotly


class Figure:
    """A plotly figure as plain data.  ``gr.Plot`` sends it as :meth:`to_json`; a reader that wants
    plotly's objects (``fig.data[0].text``, ``fig.layout.title.text``) gets them from :attr:`data`
    and :attr:`layout`, built from the dicts on first use: views to read, not to change."""

    def __init__(self, data: list[dict], layout: dict):
        self.traces, self.layout_dict = data, layout

    def to_dict(self) -> dict:
        """The figure as plotly writes it: ``{"data": [...], "layout": {..., "template": ...}}`` (plotly's
        default template, unless the layout names its own)."""
        return {"data": self.traces, "layout": {"template": default_template(), **self.layout_dict}}

    to_plotly_json = to_dict

    def to_json(self) -> str:
        return to_json_plotly(self.to_dict())

    @cached_property
    def plotly(self) -> go.Figure:
        return go.Figure(data=self.traces, layout=self.layout_dict, _validate=False)

    @property
    def data(self):
        return self.plotly.data

    @property
    def layout(self):
        return self.plotly.layout


@lru_cache(maxsize=4)
def _template(name: str) -> dict:
    return pio.templates[name].to_plotly_json()


def default_template() -> dict:
    """Plotly's default template as JSON data (what ``go.Figure`` puts in every figure's layout)."""
    return _template(pio.templates.default)


def figure(data: list[dict] | tuple = (), layout: dict | None = None) -> Figure:
    """A figure of ``data`` (trace dicts, e.g. :func:`scatter`'s) and ``layout``, unvalidated."""
    return Figure(list(data), layout or {})


def scatter(**props) -> dict:
    return dict(type="scatter", **props)


def bar(**props) -> dict:
    return dict(type="bar", **props)


def heatmap(**props) -> dict:
    return dict(type="heatmap", **props)
