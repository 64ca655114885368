"""Runs kept and shared: the run file of the tab's run (download), a run file opened (upload), and the
example runs in ``assets/runs`` (by name only: a visitor never names a server path)."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

import gradio as gr

from tr_core.runs import MAX_BYTES, RunFileError, read_run, write_run

KEEP_CHARS = 2_000_000  # a run kept in the browser for a reload, at most (its storage holds a few MB)

from .run_view import RunView
from .session import MAX_PROMPT_CHARS, METHODS, SETTINGS_FIELDS, Session, UserError, settings_fields

EXAMPLE_DIR = Path(__file__).resolve().parents[1] / "assets" / "runs"


def example_runs() -> list[str]:
    return sorted(p.stem for p in EXAMPLE_DIR.glob("*.json"))


def example_label(name: str) -> str:
    """A run file's name in words: ``tr-paper-80-days-of-the-week`` -> ``TR, paper-80 tree: days of the week``."""
    method, _, rest = name.partition("-")
    if method == "tr":
        for tree in ("paper-80", "auto"):
            if rest.startswith(tree + "-"):
                return f"TR, {tree} tree: {rest[len(tree) + 1:].replace('-', ' ')}"
    return f"{method.upper()}: {rest.replace('-', ' ')}" if rest else name


def example_choices() -> list[tuple[str, str]]:
    """The Example runs box: (words, file name) for each example run."""
    return [(example_label(n), n) for n in example_runs()]


def run_file_for(sess: Session | None) -> str | None:
    """Write the tab's run (live or replayed) to its own temporary file; None when there is none."""
    view = sess.view() if sess is not None else None
    if view is None:
        return None
    folder = sess.run_folder or tempfile.mkdtemp(prefix="tr-run-")
    sess.run_folder = folder
    method = view.method
    path = Path(folder) / f"token-recycling-run-{method}-{len(view.steps)}-steps.json"
    for old in Path(folder).glob("*.json"):
        old.unlink(missing_ok=True)
    write_run(view.to_run(), path)
    return str(path)


def read_upload(path: str) -> bytes:
    """The bytes of a file Gradio received from the browser (its own temporary copy), size-checked first."""
    size = os.path.getsize(path)
    if size > MAX_BYTES:
        raise UserError(f"The file is {size / 1e6:.1f} MB; a run file is at most {MAX_BYTES // 2**20} MB.")
    with open(path, "rb") as f:
        return f.read(MAX_BYTES + 1)


def open_run_bytes(sess: Session, data: bytes, name: str) -> str:
    try:
        run = read_run(data)
    except RunFileError as err:
        raise UserError(f"{name}: {err}") from None
    sess.open_run(run)
    h = run.header
    prompt = " ".join(str(h.get("prompt", "")).split())
    shown = prompt if len(prompt) <= 90 else prompt[:89] + "…"
    sess.message = (f"Replay of {name}: “{shown}” ({h.get('model', '?')}, {h.get('dtype', '?')} on "
                    f"{h.get('device', '?')}, {len(run.steps)} steps), at step 1. Step, Play, Run to end and Phase ▶ walk "
                    "through its recorded steps (no model runs); “Run its prompt live” runs it with the model.")
    return sess.message


class RunFiles:
    """Save / open / example handlers, drawing through ``handlers.render``."""

    def __init__(self, handlers):
        self.handlers = handlers

    def prepare(self, sess: Session | None):
        """After a step: the run file for Save run, and the tab's prompt, settings and run kept in the
        browser for a reload (:meth:`restore`).  Skipped while Run to end or Play goes on (each
        step's file would only be written over): the last step of the run writes it."""
        busy = sess.flight if sess is not None else None
        if busy is not None and not busy.stop and sess.in_progress and (busy.running is not None or busy.playing):
            return gr.skip(), gr.skip()
        path = run_file_for(sess)
        return gr.DownloadButton(value=path, interactive=path is not None), kept_for_reload(sess, path)

    def restore(self, request: gr.Request, kept: dict | None, current: Session | None = None):
        """A page (re)load: the tab's prompt, settings and run as they were before a reload, when the
        browser kept them; else an empty page.  (session, *panels, prompt, *settings fields.)  A tab that
        has stepped already (``current``) is left as it is."""
        fields = [gr.skip()] * (1 + len(SETTINGS_FIELDS))
        if current is not None and current.view() is not None:
            return (*[gr.skip()] * len(self.handlers.render(current)[:-1]), *fields)
        if not (isinstance(kept, dict) and kept.get("prompt") is not None):  # nothing kept: the empty page,
            return (gr.skip(), *self.handlers.render(Session())[1:-1], *fields)  # the tab's first event makes its session
        sess = self.handlers.session(current, request)
        fields = [str(kept["prompt"])[:MAX_PROMPT_CHARS]] + settings_fields(kept.get("settings"))
        method = kept["settings"].get("method") if isinstance(kept.get("settings"), dict) else None
        if method in METHODS.values():  # the Method box gets it back: the empty panels describe it
            sess.cursor.method = method
        run, note = None, kept.get("note", "")
        if kept.get("run"):
            try:
                run = read_run(str(kept["run"]))
            except RunFileError:
                note = "the run kept in this browser could not be read"
        if run is not None:
            sess.live.kept, sess.cursor.shown = RunView.of_run(run, bool(kept.get("timed_here", True))), None
            sess.live.kept.replayed = False
            note = (f"the run of {len(run.steps)} steps is shown as it was; Step starts the prompt again "
                    "from step 1 (a reload does not keep the model's state)")
        gr.Info(f"Restored from this browser's last visit to the page: the prompt and settings; {note}.", duration=10)
        return (*self.handlers.render(sess)[:-1], *fields)

    def upload(self, request: gr.Request, file, sess: Session | None):
        sess = self.handlers.session(sess, request)
        path = file if isinstance(file, str) else getattr(file, "name", None)
        try:
            if not path:
                raise UserError("No file arrived.")
            message = open_run_bytes(sess, read_upload(path), Path(path).name)
        except UserError as err:
            return self.handlers.failed(sess, err)
        return self.handlers.render(sess, message)

    def example(self, request: gr.Request, name: str, sess: Session | None):
        sess = self.handlers.session(sess, request)
        if not name:
            return self.handlers.render(sess)
        try:
            if name not in example_runs():
                raise UserError(f"There is no example run {name[:40]!r}.")
            message = open_run_bytes(sess, (EXAMPLE_DIR / f"{name}.json").read_bytes(), name)
        except UserError as err:
            return self.handlers.failed(sess, err)
        return self.handlers.render(sess, message)


def kept_for_reload(sess: Session | None, path: str | None) -> dict | None:
    """What the browser keeps of the tab (``gr.BrowserState``): the prompt and settings of its run, and
    the run file's text when it fits the browser's storage."""
    view = sess.view() if sess is not None else None
    if view is None:
        return None
    if sess.live.started_with is not None:
        prompt, values = sess.live.started_with[0], settings_values(sess.live.started_with[1])
    else:  # a replay, or a run kept after its model went: its own prompt and settings
        prompt, values = str(view.header.get("prompt", "")), dict(view.header.get("settings") or {})
    kept = {"prompt": prompt, "settings": values, "run": None, "note": "", "timed_here": view.timed_here}
    if path is not None:
        text = Path(path).read_text()
        if len(text) <= KEEP_CHARS:
            kept["run"] = text
        else:
            kept["note"] = f"the run was too long ({len(text) / 1e6:.1f} MB) to keep in the browser"
    return kept


def settings_values(s) -> dict:
    """A run's settings as the page's fields show them (``SETTINGS_FIELDS``' names)."""
    from dataclasses import asdict
    return {k: v for k, v in asdict(s).items() if k in SETTINGS_FIELDS}
