"""Every panel of one step of a run, drawn from its Step records (live or replayed, any step, any frame)."""
from __future__ import annotations

import html
from typing import Any, NamedTuple

from tr_core.precision import Divergence, describe

from .acceptance_map import acceptance_figure, acceptance_words
from .counters import charts_figure, counters_html
from .heatmap import heatmap_figure
from .phase_strip import phase_html
from .run_view import METHOD_LABELS, RunView
from .text_view import output_html
from .tokens import visible
from .tree_plot import draft_figure, tree_figure


class Panels(NamedTuple):
    """Every panel of a step, by name (a tuple in this order: the page's outputs, ``handlers.DRAWN``)."""

    tree: Any  # the draft tree (a plotly figure as JSON)
    draft: Any  # PTD's next draft tree (empty for the other methods)
    heatmap: Any  # the matrix rows read and written
    text: str  # the output so far (HTML)
    counters: str  # tokens, forwards, MAT, speed (HTML)
    charts: Any  # tokens per step and the speedup so far
    phases: str  # the phase strip (HTML)
    acceptance: Any  # which tree places were accepted, over the run
    alt: str  # the step in words, for a screen reader (HTML)


PANELS = Panels._fields
FRAMES = ("whole step", "retrieve", "verify", "accept", "recycle")


def draw_panels(view: RunView | None, n: int | None = None, frame: int = 0, picked: int | None = None,
                method: str = "tr") -> Panels:
    """Every panel of step ``n`` (None: the latest) at Teach mode's ``frame``; ``picked``: a clicked node;
    ``method``: the method the Method box names, which the panels describe before any step."""
    if view is None:
        return empty_panels(method)
    n = view.clamp(n)
    step, text_of = view.step(n), view.token_text
    rows = picked_rows(step, picked)
    label = METHOD_LABELS.get(view.method, view.method)
    # Teach mode's retrieve and verify frames come before the verdict: text, counters and charts stay as
    # they were before this step (what was accepted, and the new tokens, appear at frame 3, accept)
    done = n - 1 if frame in (1, 2) else n
    div = view.divergence(done) if done else None
    figures = view.figures(done) if done else None
    return Panels(
        tree=tree_figure(step, text_of, tree_title(view, n), frame, picked),
        draft=draft_figure(step, text_of, f"PTD's draft tree after step {n}<br>(it rides along in the next forward)"
                           if view.method == "ptd" else ""),
        heatmap=heatmap_figure(step, text_of, frame, rows),
        text=output_html(view.steps[:done] if frame else view.steps, text_of, view.special, current=n,
                         mark=div and div["position"], prompt_ids=view.header.get("prompt_ids")),  # later steps dimmed
        counters=counters_html(figures, label, sampled=view.sampled,
                               extra=html.escape(describe(Divergence(**div), lambda t: visible(text_of(t), 20)))
                               if div else "",
                               start=view.header.get("matrix_start", ""),
                               pending=f"step {n} is counted at phase 3, accept" if done < n else "",
                               cpu=str(view.header.get("device", "cpu")).startswith("cpu"),
                               step_line=step_cost_line(view, done), recorded_on=recorded_on(view)),
        charts=charts_figure([len(s.committed) for s in view.steps[:done]], view.speedups(done),
                             max_len=view.lookahead),
        phases=phase_html(step, text_of, frame),
        acceptance=acceptance_figure(view.steps, done),
        alt=text_alternative(view, n, frame))


def empty_panels(method: str) -> Panels:
    """The panels before any step, describing ``method`` ("tr" or "ptd")."""
    return Panels(tree=tree_figure(None, str), draft=draft_figure(None, str, ""),
                  heatmap=heatmap_figure(None, str, method=method), text=output_html([], str),
                  counters=counters_html(None), charts=charts_figure([], []), phases=phase_html(None, str, method=method),
                  acceptance=acceptance_figure([], 0, method=method),
                  alt="<div class='sr-only'>Nothing decoded yet.</div>")


def recorded_on(view: RunView) -> str | None:
    """None where the run's times are this server's; else the machine that recorded it, in words (a
    run file's, replayed or kept by the browser)."""
    if view.timed_here:
        return None
    machine = str(view.header.get("machine") or "")[:100]
    return f"the machine that recorded this run, {machine}," if machine else "the machine that recorded this run"


def step_cost_line(view: RunView, n: int) -> str:
    """Step ``n``'s forward size and what it cost where it ran, in greedy steps (their mean so far)."""
    step, b = view.step(n), view.baseline[n - 1] if 0 < n <= len(view.baseline) else None
    if step is None or b is None or not b["forwards"] or not b["seconds"] or step.method == "greedy":
        return ""
    read, greedy_read = step.timings.get("reading", 0.0), b.get("reading", 0.0)
    ratio = (step.seconds - read) / ((b["seconds"] - greedy_read) / b["forwards"])
    words = (f"This step: one forward of {step.forward_tokens} token{'s' * (step.forward_tokens != 1)} took "
             f"{ratio:.2f}× a greedy step's time {'here' if recorded_on(view) is None else 'there'}, and committed "
             f"{len(step.committed)}.")
    if read:  # the first step: the prompt read before it, and the counters count it, as the benchmark does
        words += (f" Before it, the prompt was read for both sides in one forward (charged {read:.2f} s; greedy "
                  f"{greedy_read:.2f} s); the counters include that.")
    return words


def tree_title(view: RunView, n: int) -> str:
    step = view.step(n)
    if step is None:
        return "Draft tree"
    src = step.tree.sources
    if step.method == "ptd":
        return f"Step {n}: the candidates verified ({step.tree.size} nodes)<br>from the trie of the last token"
    looked = sum(1 for s in src if s == "lookup")
    tree = str(view.header.get("settings", {}).get("tree", ""))
    if tree[:1] in ("[", "{") or len(tree) > 24:
        tree = "your tree"  # JSON text: the nodes are in the plot
    parts = f"{step.tree.size - looked} from the matrix" + (f" + {looked} from prompt lookup" if looked else "")
    return f"Step {n}: the draft tree{f' ({tree})' if tree else ''},<br>{parts}"  # two lines: a phone's width


def picked_rows(step, picked: int | None) -> list[int]:
    """The ``M`` row a clicked node was drafted from (its parent's token; none where a pair row or
    the context drafted it) and the row it wrote (its own)."""
    if step is None or picked is None or not 0 <= picked < len(step.tree.tokens):
        return []
    t = step.tree
    own = t.tokens[picked]
    source = t.sources[picked] if t.sources and picked < len(t.sources) else "matrix"
    return [t.tokens[t.parents[picked]], own] if picked and source in ("matrix", "empty") else [own]


def text_alternative(view: RunView, n: int, frame: int = 0) -> str:
    """The plots in words, for screen readers (Teach mode's frames 1-2: the drafts, no verdict yet)."""
    step = view.step(n)
    if step is None:
        return "Nothing decoded yet."
    if frame in (1, 2):
        words = f"Step {n} of {len(view.steps)}, phase {frame}: {step.tree.size} draft nodes; the verdict comes at phase 3."
        return "<div class='sr-only' role='note'>" + html.escape(words) + "</div>"
    t, say = step.tree, view.token_text
    path = " ".join(visible(say(t.tokens[i]), 20) for i in step.accepted_path[1:]) or "none"
    k = len(step.committed)
    own = (f"the model's own token: {visible(say(step.model_choices[step.accepted_path[-1]]), 20)}"
           if k > step.accepted_drafts else "the text ended within the drafts")
    fig = view.figures(n) or {"speedup": 0.0}
    words = [f"Step {n} of {len(view.steps)}. Draft tree: {t.size} draft nodes; accepted drafts: {path}; "
             f"{own}; committed {k} token{'s' * (k != 1)}.",
             "" if frame == 3 else  # the writes are phase 4's
             f"Matrix: {len(step.rows_written)} row{'s' * (len(step.rows_written) != 1)} written.",
             f"Speedup after step {n}: {fig['speedup']:.2f}x.", acceptance_words(view.steps, n)]
    return "<div class='sr-only' role='note'>" + " ".join(html.escape(w) for w in words if w) + "</div>"
