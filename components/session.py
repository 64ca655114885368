"""Per-browser-session state and the handlers' logic, free of layout (app.py wires it to Gradio)."""
from __future__ import annotations

import re
import tempfile
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from tr_core import AdjacencyMatrix, GreedyDecoder, MatrixFileError, TokenRecyclingDecoder
from tr_core.decoders import DecodeError, ProgressiveTreeDecoder
from tr_core.models import LoadedModel, ModelLoadError
from tr_core.planner import TreePlanner
from tr_core.progressive import PTDConfig
from tr_core.sampling import SamplingConfig
from tr_core.runs import Run, run_header
from tr_core.trees import TreeError, list_presets, load_tree

from .model_hub import ModelHub
from tr_core.race import Race
from .run_view import RunView

MAX_PROMPT_CHARS = 20_000
# The embedded model's hot-start matrix, warmed on the calibration split (``python -m tr_core.bench.warm``):
# every new tab starts from its own copy.  Read only: "Save matrix" never writes it.
SHIPPED_MATRIX = Path(__file__).resolve().parent.parent / "assets" / "matrix" / "embedded.safetensors"
COLD = "cold"  # Settings.start: an empty matrix at the first step (the contrast to the hot start)
DONE = "Done: end of text or token budget reached."
METHODS = {"Token Recycling (TR)": "tr", "Progressive Tree Drafting (PTD)": "ptd"}
# Where the planner finds PTD's draft nodes do not pay (a CPU), the page still carries this many, so
# that its draft tree can be watched growing; the benchmark's ``ptd`` lets the planner drop them.
PAGE_MIN_DRAFT = 8


class UserError(Exception):
    """A problem to show the user in words."""


class Superseded(Exception):
    """The tab was reset while this step was being set up: nothing is shown for it."""


PAGE_TOKENS = 96  # Max new tokens as a new page shows it (app.build_app's default)


@dataclass(frozen=True)
class Settings:
    model: str
    tree: str
    k: int
    max_new_tokens: int
    hot_start: bool
    lookup: int = 0  # context-retrieval tokens merged into the tree (0 = none)
    method: str = "tr"  # "tr" or "ptd" (tree, k, hot start and lookup are TR's settings)
    temperature: float = 0.0  # 0 = greedy; above 0 = lossless sampling (both sides of the race)
    top_p: float = 1.0
    seed: int = 0
    start: str = "hot"  # TR's matrix at a new tab's first step: "hot" (warmed, or the server's file) or COLD

    def sampling(self) -> SamplingConfig | None:
        if not self.temperature:
            return None
        try:
            return SamplingConfig(float(self.temperature), float(self.top_p), 0, int(self.seed))
        except ValueError as err:
            raise UserError(str(err)) from None

    def validate(self, cap: int) -> None:
        check_tree_spec(self.tree)
        self.sampling()
        if self.method not in METHODS.values():
            raise UserError(f"Unknown method {self.method!r}; use one of {sorted(METHODS.values())}.")
        if not isinstance(self.max_new_tokens, (int, float)) or not 1 <= self.max_new_tokens <= cap:
            raise UserError(f"Max new tokens must be between 1 and {cap} (got {self.max_new_tokens}).")
        if not 1 <= int(self.k) <= 8:
            raise UserError(f"k must be between 1 and 8 (got {self.k}).")


# The settings fields of the page, in the order of app.wire's inputs (a reload restores them by name)
SETTINGS_FIELDS = ("model", "tree", "k", "max_new_tokens", "hot_start", "lookup", "method", "temperature", "top_p",
                   "seed", "start")


def settings_fields(values: dict | None) -> list:
    """The page's settings fields (``SETTINGS_FIELDS`` order) from a run's settings by name; a field
    not given, or of the wrong type, keeps what the page shows."""
    import gradio as gr

    values = values if isinstance(values, dict) else {}
    label = {v: k for k, v in METHODS.items()}
    out = []
    for name in SETTINGS_FIELDS:
        v = values.get(name)
        if name == "method":
            v = label.get(v)
        elif name == "lookup" and isinstance(v, (int, float)):
            v = bool(v)
        elif name == "start":
            v = v if v in ("hot", COLD) else None
        ok = v is not None and not isinstance(v, (dict, list)) and (not isinstance(v, str) or len(v) <= 4000)
        out.append(v if ok else gr.skip())
    return out


PAGE_MAX_NODES = 128  # a visitor's tree: larger ones make forwards of seconds on a CPU and an unreadable plot


def check_tree_spec(spec: str) -> None:
    """A visitor's tree is a preset name, chain-N or JSON text of at most ``PAGE_MAX_NODES`` nodes;
    anything else, a server path above all, gets a refusal without the file system being looked at."""
    spec = str(spec).strip()
    if spec[:1] in ("[", "{") or re.fullmatch(r"chain-\d{1,4}", spec):
        try:
            size = load_tree(spec).size
        except TreeError as err:
            raise UserError(str(err)) from None
        if size > PAGE_MAX_NODES:
            raise UserError(f"This tree has {size} draft nodes; the page runs trees of at most {PAGE_MAX_NODES} "
                            "(the paper's has 80).")
        return
    if spec in ("auto", "default"):
        return
    if spec in list_presets():
        return
    raise UserError(f"Unknown tree {spec[:60]!r}: use one of {['auto', *list_presets()]}, chain-N, "
                    "or JSON text of rank paths such as [[0], [1], [0, 0]].")


@dataclass
class Session:
    """What one browser tab owns: its race, its matrix (hot start) and what it was started with."""

    race: Race | None = None
    matrix: AdjacencyMatrix | None = None
    planner: TreePlanner | None = None  # the auto tree's statistics, kept like the matrix
    planner_model: LoadedModel | None = field(default=None, repr=False)  # the model the planner learnt on
    started_with: tuple | None = None
    prompt: str = ""
    message: str = ""
    start_file: str | None = None  # a saved matrix every new matrix of this session starts from (TR_MATRIX)
    warm_file: str | None = None  # else this one, where it fits the model (SHIPPED_MATRIX: read only)
    cold: bool = False  # the matrix was started empty on purpose (Settings.start == COLD)
    notice: str = ""  # said once with the next status message
    closed: bool = False  # freed when its tab closed or its state expired
    replay: RunView | None = None  # a run opened from a file (no model needed)
    header: dict | None = None  # the live race's run header (model, dtype, device, settings, prompt)
    shown: int | None = None  # the step the panels show (None: the latest)
    frame: int = 0  # Teach mode's phase frame (0: the whole step)
    picked: int | None = None  # a tree node clicked
    stop: bool = False  # Stop or Reset pressed while a run holds the session
    run_folder: str | None = None  # where its run file is written for download
    recorded: Run | None = None  # ZeroGPU: the whole run, decoded in one GPU call (components.recorded)
    revealed: int = 0  # how many of its steps the page has stepped through
    last_active: float = field(default_factory=time.monotonic)  # for freeing an idle tab's KV caches
    busy: int = 0  # steps of this tab in flight (Reset waits for them)
    epoch: int = 0  # counts resets: a run set up across one is dropped
    borrowed_prompt: str | None = None  # a replay's prompt, stepped live while the prompt box is empty
    running: object = None  # the run Run to end steps (its ticks never start another)
    loaded: bool = False  # the matrix came from "Load matrix": the next race drafts from it, whatever the start
    playing: bool = False  # Play's timer is on
    kept: RunView | None = None  # the run shown, detached from its model: it stays while a new one cannot start
    held: bool = False  # a step that was running when Stop or Pause came is not shown yet: the next Step shows it

    # ---- lifecycle -------------------------------------------------------------------------
    def matrix_for(self, lm: LoadedModel, k: int, hot_start: bool, cold: bool = False) -> AdjacencyMatrix:
        """The matrix the next race drafts from: this tab's own, carried over from its earlier prompts
        (``hot_start``), else a fresh one (:meth:`fresh_matrix`); ``cold``: empty, on purpose."""
        m = self.matrix
        fits = m is not None and m.fingerprint == lm.fingerprint and m.k == k
        if self.loaded and fits:
            self.matrix, self.cold, self.loaded = m.to(lm.device), False, False
            return self.matrix
        carry = fits and hot_start and self.cold == cold  # this tab's own, from a run of the same start
        if cold:
            if not carry:
                m = AdjacencyMatrix(lm.vocab_size, k, lm.device, lm.fingerprint)
                m.note = "cold start: an empty matrix (the prompt's own rows are written as it is read)"
            else:
                m = m.to(lm.device)
                m.note = "cold start, then this tab's earlier prompts"
        elif not carry:
            m = self.fresh_matrix(lm, k)
        else:
            m = m.to(lm.device)  # itself on the model's device; else its copy there (e.g. into a ZeroGPU call)
            if "earlier prompts" not in m.note:
                m.note = (m.note or "hot start") + ", then this tab's earlier prompts"
        self.matrix, self.cold = m, cold
        return m

    def fresh_matrix(self, lm: LoadedModel, k: int) -> AdjacencyMatrix:
        """Zeros, or this session's own copy of the server's hot-start file when there is a good one,
        else of the warmed matrix shipped for the model (``warm_file``) where it fits."""
        if self.warm_file and not self.start_file and Path(self.warm_file).is_file():
            try:
                m = AdjacencyMatrix.load(self.warm_file, lm.fingerprint, lm.vocab_size, lm.device)
                if m.k >= k:  # rows are sorted by rank: fewer candidates are their first k
                    m = m.narrowed(k)
                    m.note = f"hot start: a matrix {m.note or 'warmed on calibration prompts'}"
                    return m
            except MatrixFileError:
                pass  # made for another model: this one starts empty
        if self.start_file and Path(self.start_file).is_file():
            try:
                m = AdjacencyMatrix.load(self.start_file, lm.fingerprint, lm.vocab_size, lm.device)
                if m.k == k:
                    self.notice = f"Matrix: hot start from the server's file ({Path(self.start_file).name}). "
                    m.note = "hot start: the server's matrix file"
                    return m
                self.notice = f"Matrix file has k={m.k}, not {k}: starting from zeros. "
            except MatrixFileError as err:
                self.notice = f"⚠️ The server's matrix file was not used ({err}); starting from zeros. "
        m = AdjacencyMatrix(lm.vocab_size, k, lm.device, lm.fingerprint)
        m.note = "an empty matrix (none is shipped for this model)"
        return m

    def planner_for(self, lm: LoadedModel, k: int, hot_start: bool) -> TreePlanner:
        if self.planner is None or self.planner_model is not lm or self.planner.k != k:
            self.planner, self.planner_model = TreePlanner(lm, k=k), lm
        elif not hot_start:
            self.planner.reset()
        return self.planner

    def begin(self, hub: ModelHub, prompt: str, s: Settings, cap: int) -> Race:
        """A new race on ``prompt`` (returned); the matrix carries over when hot start is on."""
        check_prompt(prompt)
        s.validate(cap)
        epoch = self.epoch
        if self.started_with is not None and self.started_with[1].model != s.model:
            self.keep_shown()  # the run stays on screen, whether or not the new model loads
            self.race = self.planner = self.planner_model = self.running = None  # let the old model go
        try:
            lm = hub.get(s.model)
        except ModelLoadError as err:
            raise UserError(f"{err} The run shown stays.") from None
        try:
            sampling = s.sampling()
            if s.method == "ptd":
                config = replace(PTDConfig.default(), min_draft=PAGE_MIN_DRAFT)
                decoder = ProgressiveTreeDecoder(lm, int(s.max_new_tokens), config, sampling=sampling)
            else:
                matrix = self.matrix_for(lm, int(s.k), s.hot_start, cold=s.start == COLD)
                planner = self.planner_for(lm, int(s.k), s.hot_start) if s.tree == "auto" else None
                decoder = TokenRecyclingDecoder(lm, tree=s.tree, k=int(s.k), matrix=matrix, planner=planner,
                                                max_new_tokens=int(s.max_new_tokens), lookup=int(s.lookup),
                                                sampling=sampling)
            race = Race(decoder, GreedyDecoder(lm, int(s.max_new_tokens), sampling=sampling))
            race.start(lm.encode_prompt(prompt))
        except (DecodeError, TreeError, ValueError, OSError) as err:
            raise UserError(str(err)) from None
        if self.epoch != epoch:
            raise Superseded()  # Reset while this race was being set up: Reset's page stands
        self.race, self.prompt, self.started_with, self.kept = race, prompt, (prompt, s), None
        self.header = run_header(lm, s.method, asdict(s), prompt, race.decoder.prompt)
        if s.method == "tr":
            self.header["matrix_start"] = matrix.note
        self.replay, self.recorded = None, None
        return race

    def needs_new_race(self, prompt: str, s: Settings) -> bool:
        return self.race is None or self.race.done or self.started_with != (prompt, s)

    def step(self, hub: ModelHub, prompt: str, s: Settings, cap: int) -> Race:
        """One step of the race on ``prompt`` (a new race when the prompt or settings changed); the race."""
        if not self.needs_new_race(prompt, s):
            return self.advance(self.race)
        again = self.race is not None and self.race.done and self.started_with == (prompt, s)
        race = self.begin(hub, prompt, s, cap)
        if again:  # said, never silent: the finished run is replaced
            self.notice += "The last run had ended: this Step started it again from step 1. "
        return self.advance(race)

    def advance(self, race: Race | None = None) -> Race:
        """One step of ``race`` (default: the current one); the panels follow it to the latest step.
        Reset may drop the race while it steps (it does not wait for the model): the step then
        belongs to a race nobody shows, and the session is left as Reset made it."""
        race = race or self.race
        if race is None:
            raise UserError("Nothing to step: the session was reset. Press Step to start again.")
        race.step()
        if race.done:
            race.release_caches()  # a finished race never steps again: its KV caches go at once
        if race is self.race:
            self.shown, self.picked = None, None
            self.message = self.notice + (DONE if race.done else "")
            self.notice = ""
        return race

    # ---- ZeroGPU: a run recorded in one GPU call, stepped through here ------------------------
    def reveal(self, record, prompt: str, s: Settings, cap: int) -> Run:
        """The next step of the recorded run; the whole run is first decoded in one GPU call,
        ``record(prompt, settings, cap, matrix, start_file) -> Recording``, when there is none yet,
        the prompt or settings changed, or the last one was shown to its end."""
        if self.recorded is None or self.started_with != (prompt, s) or not self.in_progress:
            check_prompt(prompt)
            s.validate(cap)
            epoch = self.epoch
            same_start = self.cold == (s.start == COLD)  # else the next run starts from its own kind of matrix
            rec = record(prompt, s, cap, self.matrix if same_start else None, self.start_file)
            if self.epoch != epoch:
                raise Superseded()  # Reset while the GPU call ran: its recording is dropped
            if rec.error:
                raise UserError(rec.error)
            self.race, self.replay, self.recorded, self.revealed = None, None, rec.run, 0
            self.prompt, self.started_with, self.header = prompt, (prompt, s), rec.run.header
            self.matrix, self.notice = rec.matrix if rec.matrix is not None else self.matrix, rec.notice
            self.cold = s.start == COLD
        self.show_next()
        return self.recorded

    def show_next(self) -> None:
        self.revealed = min(self.revealed + 1, len(self.recorded.steps))
        self.shown, self.picked = None, None
        self.message = self.notice + ("" if self.in_progress else DONE)
        self.notice = ""

    # ---- either kind of run ---------------------------------------------------------------
    def current(self):
        """The run being stepped: the recording (ZeroGPU) or the live race; None."""
        return self.recorded if self.recorded is not None else self.race

    def stepping(self):
        """What Step, Play and Run to end walk: an opened run file's recorded steps, else ``current()``."""
        return self.replay if self.replay is not None else self.current()

    def replay_next(self, teach: bool = False) -> None:
        """The opened run's next recorded step (no model runs); in Teach mode from its first frame."""
        replay = self.replay
        shown = replay.clamp(self.shown)
        if shown < len(replay.steps):
            self.shown, self.frame, self.picked = shown + 1, 1 if teach else 0, None
            self.message = (f"Replay: step {shown + 1} of {len(replay.steps)} of the opened run, as recorded "
                            "(no model runs). “Run its prompt live” runs it with the model; Reset closes the replay.")
        else:
            self.message = (f"The end of the replay ({len(replay.steps)} steps). “Run its prompt live” runs it "
                            "with the model; Reset closes the replay.")

    @property
    def in_progress(self) -> bool:
        """Whether the run being stepped (a replay included) has steps to come."""
        if self.replay is not None:
            return self.replay.clamp(self.shown) < len(self.replay.steps)
        if self.recorded is not None:
            return self.revealed < len(self.recorded.steps)
        return self.race is not None and not self.race.done

    def next_step(self, run) -> None:
        """One more step of ``run`` (what ``current()`` was when the run began)."""
        if run is self.replay and run is not None:
            self.replay_next()
        elif run is self.recorded and run is not None:
            self.show_next()
        else:
            self.advance(run)

    @contextmanager
    def working(self):
        """Marks a step in flight (Reset waits for it: :meth:`wait_idle`)."""
        self.busy += 1
        try:
            yield
        finally:
            self.busy -= 1

    def wait_idle(self, timeout: float) -> bool:
        """Wait until no step of this tab is in flight (at most ``timeout`` seconds); True if none is."""
        end = time.monotonic() + timeout
        while self.busy > 0 and time.monotonic() < end:
            time.sleep(0.02)
        return self.busy <= 0

    def release_caches(self) -> bool:
        """Free the live race's KV caches (an idle tab); its next step rebuilds them."""
        return self.race is not None and self.race.release_caches()

    def forget(self, lm) -> None:
        """Drop every reference to model ``lm`` (the hub evicted it): its race and planner go."""
        if self.race is not None and self.race.decoder.lm is lm:
            self.race, self.started_with = None, None
        if getattr(getattr(self.running, "decoder", None), "lm", None) is lm:
            self.running = None
        if self.planner_model is lm:
            self.planner = self.planner_model = None

    def reset(self, keep_run: bool = False) -> None:
        """Start over (Reset); ``keep_run``: the run shown stays on screen, detached (after an error)."""
        self.epoch += 1  # a step or recording begun before this is dropped when it ends (Superseded)
        if keep_run:
            self.keep_shown()
        else:
            self.kept = None
        self.race, self.started_with, self.message = None, None, "Reset."  # until the next step says more
        self.replay, self.header, self.shown, self.frame, self.picked = None, None, None, 0, None
        self.recorded, self.revealed, self.borrowed_prompt, self.running = None, 0, None, None

    def close(self) -> bool:
        """Free what the session holds (decoders, KV caches, matrix, planner); True when it was open
        or held something, False for a session already closed and empty (nothing to report)."""
        held = self.current() is not None or self.matrix is not None or self.planner is not None
        self.reset()
        self.matrix = self.planner = self.planner_model = None
        was_open, self.closed = not self.closed, True
        return was_open or held

    # ---- matrix file --------------------------------------------------------------------
    def save_matrix(self, folder: str | None = None) -> str:
        """Write the matrix for download (and to the server's hot-start file, when there is one);
        written to a temporary file and renamed, so a crash never leaves half a file."""
        if self.matrix is None or self.current() is None:
            raise UserError("There is no matrix yet: decode something first.")
        name = self.race.decoder.lm.name if self.race is not None else (self.header or {}).get("model", "")
        path = Path(tempfile.mkdtemp(dir=folder)) / "token_recycling_matrix.safetensors"
        self.matrix.save(path, model_name=name)
        if self.start_file and Path(self.start_file).resolve() != SHIPPED_MATRIX.resolve():  # never the shipped one
            self.matrix.save(self.start_file, model_name=name)
        return str(path)

    def load_matrix(self, hub: ModelHub, path: str, s: Settings) -> None:
        try:
            lm = hub.get(s.model)
            # on the host: the next race takes it to the model's device (on ZeroGPU, inside its GPU call)
            self.matrix = AdjacencyMatrix.load(path, lm.fingerprint, lm.vocab_size, "cpu")
        except (MatrixFileError, ModelLoadError) as err:
            raise UserError(str(err)) from None
        self.matrix.note, self.loaded = "loaded from a matrix file", True
        self.race, self.recorded, self.started_with = None, None, None

    # ---- views and run files ----------------------------------------------------------------
    def view(self) -> RunView | None:
        if self.replay is not None:
            return self.replay
        if self.recorded is not None:
            return replace(RunView.of_run(self.recorded), replayed=False).first(self.revealed)
        if self.race is None or not self.race.decoder.steps:
            return self.kept
        return RunView.of_race(self.race, self.header or {})

    def keep_shown(self) -> None:
        """Detach the run shown from its model (its token texts copied): it stays on screen after the
        race is dropped, while a new run cannot start (a model that fails to load, an error)."""
        view = self.view()
        if view is not None:
            self.kept = view if view.replayed else replace(RunView.of_run(view.to_run()), replayed=False)

    def views(self) -> tuple:
        """Every panel at the step shown (``panels.PANELS`` order)."""
        from .panels import draw_panels

        view = self.view()
        return draw_panels(view, view.clamp(self.shown) if view else None, self.frame, self.picked)

    def open_run(self, run: Run) -> None:
        """Replay a run file: the race stops, the panels show the file's steps from the first."""
        self.reset()
        self.replay = RunView.of_run(run)
        self.shown = 1


def check_prompt(prompt) -> None:
    """Refuse an empty or over-long prompt with words a visitor can act on."""
    if not prompt or not str(prompt).strip():
        raise UserError("The prompt is empty: type something or pick an example.")
    if len(prompt) > MAX_PROMPT_CHARS:
        raise UserError(f"The prompt is {len(prompt):,} characters; the limit is {MAX_PROMPT_CHARS:,}.")
