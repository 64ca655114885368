"""All methods on one prompt, each run to the end: tokens over wall time and over forward passes, and a
table of MAT, tok/s, speedup over greedy and whether each output is greedy's, token for token."""
from __future__ import annotations

import html
import time
from dataclasses import dataclass, field
from typing import Callable

import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots

from tr_core import GreedyDecoder, PromptLookupDecoder, TokenRecyclingDecoder
from tr_core.decoders import Decoder, ProgressiveTreeDecoder
from tr_core.race import step_once

COLORS = {"greedy": "#7f8c9a", "TR (auto)": "#2e9d4f", "TR (paper-80)": "#1f4e99", "PTD": "#d0455b",
          "PLD": "#8e44ad"}


def method_makers(lm, max_new_tokens: int) -> list[tuple[str, Callable[[], Decoder]]]:
    """The five methods Compare runs, each on a fresh matrix: (name, a fresh decoder)."""
    return [("greedy", lambda: GreedyDecoder(lm, max_new_tokens)),
            ("TR (auto)", lambda: TokenRecyclingDecoder(lm, tree="auto", max_new_tokens=max_new_tokens)),
            ("TR (paper-80)", lambda: TokenRecyclingDecoder.paper(lm, "paper-80", max_new_tokens=max_new_tokens)),
            ("PTD", lambda: ProgressiveTreeDecoder(lm, max_new_tokens)),
            ("PLD", lambda: PromptLookupDecoder(lm, max_new_tokens))]


@dataclass
class CompareRun:
    """Every method run to the end on one prompt, a few steps at a time (:meth:`advance`), so that the
    page can show progress per step, cancel, and let other tabs' steps run in between."""

    makers: list[tuple[str, Callable[[], Decoder]]]
    ids: list[int]
    max_new_tokens: int
    rows: list[dict] = field(default_factory=list)  # the methods finished so far
    decoder: Decoder | None = None  # the method running now (``makers[len(rows)]``)
    tokens: list[int] = field(default_factory=lambda: [0])
    seconds: list[float] = field(default_factory=lambda: [0.0])
    cancelled: bool = False  # Cancel pressed: the next tick stops, whatever one in flight asks for

    @classmethod
    def start(cls, lm, prompt: str, max_new_tokens: int) -> "CompareRun":
        return cls(method_makers(lm, max_new_tokens), lm.encode_prompt(prompt), max_new_tokens)

    @property
    def done(self) -> bool:
        return len(self.rows) == len(self.makers)

    def advance(self, budget: float = float("inf")) -> None:
        """Steps of the method running now (its decoder made and its prompt read first), each timed
        alone, until it ends or ``budget`` seconds have passed."""
        t0 = time.perf_counter()
        while not self.done and time.perf_counter() - t0 < budget:
            if self.decoder is None:
                self.decoder = self.makers[len(self.rows)][1]()
                self.decoder.start(self.ids)
            step = step_once(self.decoder)
            self.tokens.append(self.tokens[-1] + len(step.committed))
            self.seconds.append(self.seconds[-1] + step.seconds)
            if self.decoder.done:
                self.rows.append({"name": self.makers[len(self.rows)][0], "tokens": self.tokens,
                                  "seconds": self.seconds, "output": list(self.decoder.output)})
                self.decoder, self.tokens, self.seconds = None, [0], [0.0]

    def progress_text(self) -> str:
        """Where the run is, per step: the method running, its tokens so far, the methods done."""
        if self.done:
            return ""
        name = self.makers[len(self.rows)][0]
        return (f"Method {len(self.rows) + 1} of {len(self.makers)}: {name}, {self.tokens[-1]} of at most "
                f"{self.max_new_tokens} tokens ({len(self.tokens) - 1} forward passes so far).")


def compare_methods(lm, prompt: str, max_new_tokens: int, progress=None) -> list[dict]:
    """One row per method: name, cumulative tokens and seconds after each step, output (in one call)."""
    run = CompareRun.start(lm, prompt, max_new_tokens)
    while not run.done:
        if progress is not None:
            progress((len(run.rows), len(run.makers)), desc=f"Running {run.makers[len(run.rows)][0]} to the end")
        run.advance(budget=0.5)
    return run.rows


DASHES = ("solid", "dash", "dot", "dashdot", "longdash")


def compare_figure(rows: list[dict]) -> go.Figure:
    fig = make_subplots(rows=1, cols=2, subplot_titles=("tokens over wall time", "tokens over forward passes"),
                        horizontal_spacing=0.1)
    for i, r in enumerate(rows):
        # a dash of its own: methods with the same MAT draw the same line over forward passes, and the one
        # drawn last would hide the others
        line = dict(color=COLORS.get(r["name"], "#333"), width=2, dash=DASHES[i % len(DASHES)])
        fig.add_trace(go.Scatter(x=r["seconds"], y=r["tokens"], name=r["name"], mode="lines", line=line),
                      row=1, col=1)
        fig.add_trace(go.Scatter(x=list(range(len(r["tokens"]))), y=r["tokens"], name=r["name"], mode="lines",
                                 line=line, showlegend=False), row=1, col=2)
    fig.update_xaxes(title_text="seconds", row=1, col=1)
    fig.update_xaxes(title_text="forward passes", row=1, col=2)
    fig.update_yaxes(title_text="tokens", row=1, col=1)
    fig.update_layout(height=360, margin=dict(l=10, r=10, t=40, b=10), plot_bgcolor="white",
                      legend=dict(orientation="h", y=-0.25))
    return fig


def compare_table(rows: list[dict]) -> str:
    greedy = next(r for r in rows if r["name"] == "greedy")
    g_rate = greedy["tokens"][-1] / greedy["seconds"][-1] if greedy["seconds"][-1] else 0.0
    head = ("<table class='counters compare'><tr><th>method</th><th>tokens</th><th>forwards</th>"
            "<th>MAT</th><th>tok/s</th><th>speedup</th><th>output</th></tr>")
    body, varied = [], False
    for r in rows:
        n, f, s = r["tokens"][-1], len(r["tokens"]) - 1, r["seconds"][-1]
        rate = n / s if s else 0.0
        speedup = rate / g_rate if g_rate else 0.0
        same = r["output"] == greedy["output"]
        verdict = "<span class='ok'>✔ identical to greedy</span>" if same else "<span class='bad'>✘ differs</span>"
        mark = "*" if r is not greedy and n <= f and speedup > 1 else ""  # MAT 1.00: greedy's work for every token
        varied = varied or bool(mark)
        body.append(f"<tr><th>{html.escape(r['name'])}</th><td>{n}</td><td>{f}</td><td>{n / max(f, 1):.2f}</td>"
                    f"<td>{rate:.1f}</td><td>{speedup:.2f}×{mark}</td><td>{verdict}</td></tr>")
    note = ("<div class='legend'>MAT = tokens per forward pass. Speedup = tok/s over greedy's, measured here "
            "one method after the other on the device this app runs on.")
    if varied:
        note += (" * No draft was accepted (MAT 1.00): the method did greedy's work for every token, so a figure "
                 "above 1× is how step times vary from one run to the next, not a gain.")
    return head + "".join(body) + "</table>" + note + "</div>"


def compare_rows(hub, prompt: str, model: str, max_new: int, progress=None) -> list[dict] | str:
    """:func:`compare_methods` on the hub's model, or the refusal in words (plain data either way, so
    that it can cross a ZeroGPU call)."""
    from tr_core.decoders import DecodeError
    from tr_core.devices import oom_message

    try:
        lm = hub.get(model)
    except Exception as err:  # a model that cannot load, in words
        return str(err)
    try:
        return compare_methods(lm, str(prompt), int(max_new), progress)
    except DecodeError as err:  # e.g. a prompt too long for the model's context
        return str(err)
    except torch.OutOfMemoryError:
        return oom_message(lm.name, lm.dtype, lm.device)


def compare_handler(hub, cap: int, rows_on_gpu=None):
    """The Compare tab's button: the prompt and settings in, the chart and table out (words on a refusal).
    ``rows_on_gpu(prompt, model, max_new)``: where the methods run (ZeroGPU: one GPU call, no progress)."""
    import gradio as gr

    from .session import UserError

    def compare(prompt, model, max_new, progress=gr.Progress()):
        try:
            if rows_on_gpu is not None:
                checked_model(hub, prompt, model, max_new, cap)  # refused here, before the GPU call
                progress(0.1, desc="Running every method to the end on the GPU")
                rows = rows_on_gpu(str(prompt), model, int(max_new))
            else:
                check_input(prompt, max_new, cap)
                rows = compare_rows(hub, str(prompt), model, int(max_new), progress)
            if isinstance(rows, str):
                raise UserError(rows)
        except UserError as err:
            gr.Warning(str(err))
            return gr.skip(), warning_html(str(err))
        return compare_figure(rows), compare_table(rows)
    return compare


def check_input(prompt, max_new, cap: int) -> None:
    """Compare's prompt and token count, refused in words (``UserError``)."""
    from .session import UserError, check_prompt

    check_prompt(prompt)
    if not 1 <= int(max_new or 0) <= cap:
        raise UserError(f"Max new tokens must be between 1 and {cap}.")


def checked_model(hub, prompt, model, max_new, cap: int):
    """The model Compare runs on, after its input is checked; one that cannot load, in words."""
    from .session import UserError

    check_input(prompt, max_new, cap)
    try:
        return hub.get(model)
    except Exception as err:  # noqa: BLE001 - a model that cannot load, in words
        raise UserError(str(err)) from None


def warning_html(text: str) -> str:
    return f"<div class='status warn'>⚠️ {html.escape(text)}</div>"


COMPARE_SLICE = 0.3  # seconds of Compare's work per queued event: other tabs' steps run in between


class CompareSteps:
    """The Compare tab's Run and Cancel, a queued event per slice of work (like Run to end's steps):
    :meth:`begin` checks the prompt and starts, each tick of the tab's timer runs ``COMPARE_SLICE``
    seconds of steps and redraws the progress, Cancel stops at the next tick.  The run lives in the
    tab's own ``gr.State``."""

    def __init__(self, hub, cap: int):
        self.hub, self.cap = hub, cap

    def begin(self, prompt, model, max_new):
        import gradio as gr

        from tr_core.decoders import DecodeError

        from .session import UserError
        try:
            lm = checked_model(self.hub, prompt, model, max_new, self.cap)
            run = CompareRun.start(lm, str(prompt), int(max_new))
        except (UserError, DecodeError) as err:
            gr.Warning(str(err))
            return (None, gr.skip(), warning_html(str(err)), *self.controls(False))
        return (run, gr.skip(), self.progress_html(run), *self.controls(True))

    def tick(self, run: CompareRun | None):
        import gradio as gr

        from tr_core.devices import oom_message
        if run is not None and run.cancelled:
            return (None, gr.skip(), self.cancelled_html(run), *self.controls(False))
        if run is None or run.done:
            return (None, gr.skip(), gr.skip(), *self.controls(False))
        try:
            run.advance(COMPARE_SLICE)
        except torch.OutOfMemoryError:
            lm = self.hub.get(None)
            return (None, gr.skip(), warning_html(oom_message(lm.name, lm.dtype, lm.device)), *self.controls(False))
        if run.done:
            return (None, compare_figure(run.rows), compare_table(run.rows), *self.controls(False))
        return (run, compare_figure(run.rows) if run.rows and run.decoder is None else gr.skip(),
                self.progress_html(run), *self.controls(True))

    def cancel(self, run: CompareRun | None):
        if run is not None:
            run.cancelled = True  # a tick in flight still ends; the next one stops
        return (None, self.cancelled_html(run), *self.controls(False))

    @staticmethod
    def cancelled_html(run: CompareRun | None) -> str:
        """The methods finished before Cancel, in the table (with greedy's, their speedups), and a line."""
        if run is None:
            return "<div class='status'>Nothing to cancel.</div>"
        body = compare_table(run.rows) if any(r["name"] == "greedy" for r in run.rows) else ""
        return body + f"<div class='status'>Cancelled after {len(run.rows)} of {len(run.makers)} methods.</div>"

    @staticmethod
    def progress_html(run: CompareRun) -> str:
        done = f" Done: {', '.join(r['name'] for r in run.rows)}." if run.rows else ""
        return f"<div class='status' role='status'>{html.escape(run.progress_text())}{html.escape(done)}</div>"

    @staticmethod
    def controls(running: bool) -> tuple:
        """The tab's timer, Run button and Cancel button while a run goes on (True) or not."""
        import gradio as gr
        return gr.Timer(active=running), gr.Button(interactive=not running), gr.Button(visible=running)
