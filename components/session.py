"""Per-browser-session state and the handlers' logic, free of layout (app.py wires it to Gradio)."""
from __future__ import annotations

import re
import tempfile
import threading
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Mapping

from tr_core import AdjacencyMatrix, GreedyDecoder, MatrixFileError, TokenRecyclingDecoder
from tr_core.decoders import DecodeError, ProgressiveTreeDecoder
from tr_core.decoders.recycling import DEFAULT_LOOKUP
from tr_core.models import LoadedModel, ModelLoadError
from tr_core.planner import TreePlanner
from tr_core.progressive import PTDConfig
from tr_core.race import Race
from tr_core.rounds import Batcher
from tr_core.runs import Run, run_header
from tr_core.sampling import SamplingConfig
from tr_core.trees import TreeError, list_presets, load_tree

from .model_hub import ModelHub
from .run_view import RunView

if TYPE_CHECKING:
    from .panels import Panels

MAX_PROMPT_CHARS = 20_000
# The embedded model's hot-start matrix, warmed on the calibration split (``python -m tr_core.bench.warm``):
# every new tab starts from its own copy.  Read only: "Save matrix" never writes it.
SHIPPED_MATRIX = Path(__file__).resolve().parent.parent / "assets" / "matrix" / "embedded.safetensors"
COLD = "cold"  # Settings.start: an empty matrix at the first step (the contrast to the hot start)
DONE = "Done: end of text or token budget reached."
TEACH_BEFORE_VERDICT = "Step {n} has run: what it accepts shows at phase 3, accept."
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

    @classmethod
    def from_inputs(cls, values: Mapping[str, object]) -> Settings:
        """The settings from the page's fields by name (``SETTINGS_FIELDS``), as the page shows them: the
        Method box's label, the lookup checkbox; a field not given reads as empty, an unknown name is refused."""
        unknown = set(values) - set(SETTINGS_FIELDS)
        if unknown:
            raise TypeError(f"Not a settings field: {sorted(unknown)}")
        v = values.get
        max_new, top_p, method = v("max_new_tokens"), v("top_p"), v("method")
        return cls(model=str(v("model") or ""), tree=str(v("tree") or "default"), k=int(v("k") or 8),
                   max_new_tokens=int(max_new) if max_new is not None else 0, hot_start=bool(v("hot_start")),
                   lookup=DEFAULT_LOOKUP if v("lookup") else 0, method=METHODS.get(method, str(method)),
                   temperature=float(v("temperature") or 0.0), top_p=float(top_p if top_p is not None else 1.0),
                   seed=int(v("seed") or 0), start=COLD if v("start") == COLD else "hot")

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


# The settings fields of the page by name: the handlers' keyword inputs (app.wire), the fields a reload restores
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


# ---- a tab's state, by concern -------------------------------------------------------------------
class Origin(Enum):
    """Where a tab's matrix came from (``MatrixOrigin.kind``)."""

    SHIPPED = "shipped"  # this tab's copy of the matrix warmed for the model (``SHIPPED_MATRIX``)
    SERVER_FILE = "server_file"  # the server's hot-start file (``TR_MATRIX``)
    EMPTY = "empty"  # zeros: no file fits the model
    COLD = "cold"  # empty on purpose (``Settings.start == COLD``)
    LOADED = "loaded"  # "Load matrix"
    EMPTIED = "emptied"  # "Reset matrix"


ORIGIN_NOTES = {
    Origin.SERVER_FILE: "hot start: the server's matrix file",
    Origin.EMPTY: "an empty matrix (none is shipped for this model)",
    Origin.COLD: "cold start: an empty matrix (the prompt's own rows are written as it is read)",
    Origin.LOADED: "loaded from a matrix file",
    Origin.EMPTIED: "emptied by Reset matrix",
}


@dataclass(frozen=True)
class MatrixOrigin:
    """Where the matrix came from, and whether it has since carried over from this tab's earlier prompts;
    :meth:`note` says it in words (the run header's ``matrix_start``, a saved file's note)."""

    kind: Origin
    carried: bool = False  # carried over from this tab's earlier prompts
    detail: str = ""  # the shipped file's own words on how it was warmed

    def note(self) -> str:
        if self.kind is Origin.COLD and self.carried:
            return "cold start, then this tab's earlier prompts"
        if self.kind is Origin.SHIPPED:
            base = f"hot start: a matrix {self.detail or 'warmed on calibration prompts'}"
        else:
            base = ORIGIN_NOTES[self.kind]
        return base + (", then this tab's earlier prompts" if self.carried else "")


@dataclass
class MatrixState:
    """TR's matrix M of this tab and where it came from, and the auto tree's planner, kept like it
    between prompts; ``start_file`` and ``warm_file`` are where a fresh matrix comes from."""

    matrix: AdjacencyMatrix | None = None
    origin: MatrixOrigin | None = None  # set with the matrix
    cold: bool = False  # the matrix was started empty on purpose: it carries over into cold starts only
    loaded: bool = False  # from "Load matrix": the next race drafts from it, whatever the start
    start_file: str | None = None  # a saved matrix every new matrix of this tab starts from (TR_MATRIX)
    warm_file: str | None = None  # else this one, where it fits the model (SHIPPED_MATRIX: read only)
    notice: str = ""  # words on the server's file, for the tab's next status message
    planner: TreePlanner | None = None  # the auto tree's statistics
    planner_model: LoadedModel | None = field(default=None, repr=False)  # the model the planner learnt on

    def for_race(self, lm: LoadedModel, k: int, hot_start: bool, cold: bool = False) -> AdjacencyMatrix:
        """The matrix the next race drafts from: a loaded one, else this tab's own, carried over from its
        earlier prompts (``hot_start``, a run of the same start), else a fresh one (:meth:`fresh`);
        ``cold``: empty, on purpose.  On the model's device (a copy there, e.g. into a ZeroGPU call)."""
        m = self.matrix
        fits = m is not None and m.fingerprint == lm.fingerprint and m.k == k
        if self.loaded and fits:
            self.matrix, self.cold, self.loaded = m.to(lm.device), False, False
            return self.matrix
        if fits and hot_start and self.cold == cold:
            origin = MatrixOrigin(Origin.COLD) if cold else self.origin
            self.matrix, self.origin = m.to(lm.device), replace(origin, carried=True)
        elif cold:
            self.matrix = AdjacencyMatrix(lm.vocab_size, k, lm.device, lm.fingerprint)
            self.origin = MatrixOrigin(Origin.COLD)
        else:
            self.matrix, self.origin = self.fresh(lm, k)
        self.cold = cold
        return self.matrix

    def fresh(self, lm: LoadedModel, k: int) -> tuple[AdjacencyMatrix, MatrixOrigin]:
        """This tab's own copy of the warmed matrix shipped for the model (``warm_file``) where it fits and
        no server file is set, else of the server's file when it is a good one, else zeros."""
        if self.warm_file and not self.start_file and Path(self.warm_file).is_file():
            try:
                m = AdjacencyMatrix.load(self.warm_file, lm.fingerprint, lm.vocab_size, lm.device)
                if m.k >= k:  # rows are sorted by rank: fewer candidates are their first k
                    return m.narrowed(k), MatrixOrigin(Origin.SHIPPED, detail=m.note)
            except MatrixFileError:
                pass  # made for another model: this one starts empty
        m = self.server_file(lm, k)
        if m is not None:
            return m, MatrixOrigin(Origin.SERVER_FILE)
        return AdjacencyMatrix(lm.vocab_size, k, lm.device, lm.fingerprint), MatrixOrigin(Origin.EMPTY)

    def server_file(self, lm: LoadedModel, k: int) -> AdjacencyMatrix | None:
        """A copy of the server's hot-start file where there is one that fits; ``notice`` says what was done."""
        if not (self.start_file and Path(self.start_file).is_file()):
            return None
        try:
            m = AdjacencyMatrix.load(self.start_file, lm.fingerprint, lm.vocab_size, lm.device)
        except MatrixFileError as err:
            self.notice = f"⚠️ The server's matrix file was not used ({err}); starting from zeros. "
            return None
        if m.k != k:
            self.notice = f"Matrix file has k={m.k}, not {k}: starting from zeros. "
            return None
        self.notice = f"Matrix: hot start from the server's file ({Path(self.start_file).name}). "
        return m

    def planner_for(self, lm: LoadedModel, k: int, hot_start: bool) -> TreePlanner:
        if self.planner is None or self.planner_model is not lm or self.planner.k != k:
            self.planner, self.planner_model = TreePlanner(lm, k=k), lm
        elif not hot_start:
            self.planner.reset()
        return self.planner

    def take_notice(self) -> str:
        notice, self.notice = self.notice, ""
        return notice

    def forget_planner(self, lm=None) -> None:
        """Let the planner go (on model ``lm`` only, when given): its model's memory goes with it."""
        if lm is None or self.planner_model is lm:
            self.planner = self.planner_model = None

    def drop(self) -> None:
        """Free the matrix and the planner (the tab closed)."""
        self.matrix, self.origin = None, None
        self.forget_planner()

    def empty(self) -> None:
        """"Reset matrix": every row empty again."""
        if self.matrix is not None:
            self.matrix.reset()
            self.origin = MatrixOrigin(Origin.EMPTIED)

    def load(self, path: str, lm: LoadedModel) -> None:
        """"Load matrix": kept on the host (the next race takes it to the model's device; on ZeroGPU,
        inside its GPU call); the next race drafts from it whatever the start."""
        self.matrix = AdjacencyMatrix.load(path, lm.fingerprint, lm.vocab_size, "cpu")
        self.origin, self.loaded = MatrixOrigin(Origin.LOADED), True

    def save(self, model_name: str, folder: str | None = None) -> str:
        """Write the matrix for download (and to the server's hot-start file, when there is one), its
        origin in words as its note; written to a temporary file and renamed, so a crash never leaves half a file."""
        path = Path(tempfile.mkdtemp(dir=folder)) / "token_recycling_matrix.safetensors"
        if self.origin is not None:
            self.matrix.note = self.origin.note()
        self.matrix.save(path, model_name=model_name)
        if self.start_file and Path(self.start_file).resolve() != SHIPPED_MATRIX.resolve():  # never the shipped one
            self.matrix.save(self.start_file, model_name=model_name)
        return str(path)

    def handed(self, cold: bool) -> MatrixState:
        """What a ZeroGPU call takes along (small and picklable: no planner): the matrix and its origin where
        it was started as the run asks (hot or cold), else none (the call makes a fresh one)."""
        same = self.cold == cold
        return MatrixState(self.matrix if same else None, self.origin if same else None, cold=cold,
                           start_file=self.start_file)

    def took_back(self, matrix: AdjacencyMatrix | None, origin: MatrixOrigin | None, cold: bool) -> None:
        """The matrix a ZeroGPU call returned (on the host), where it returned one."""
        if matrix is not None:
            self.matrix, self.origin = matrix, origin
        self.cold = cold


@dataclass
class LiveRun:
    """The run stepped with the model: its race (None on ZeroGPU, where :class:`RecordedRun` holds the run),
    the prompt and settings it began with, its run header; and the run kept on screen without a model."""

    race: Race | None = None
    started_with: tuple[str, Settings] | None = None  # (prompt, settings)
    header: dict | None = None  # the run header (model, dtype, device, settings, prompt, matrix_start)
    kept: RunView | None = None  # the run shown, detached from its model: it stays while a new one cannot start
    borrowed_prompt: str | None = None  # a replay's prompt, stepped live while the prompt box is empty

    def same_run(self, prompt: str, s: Settings) -> bool:
        return self.started_with == (prompt, s)


@dataclass
class RecordedRun:
    """ZeroGPU: the whole run, decoded in one GPU call (``components.recorded``), and how many of its
    steps the page has stepped through."""

    run: Run
    revealed: int = 0

    @property
    def ahead(self) -> bool:
        return self.revealed < len(self.run.steps)

    def reveal_next(self) -> None:
        self.revealed = min(self.revealed + 1, len(self.run.steps))

    def view(self) -> RunView:
        return replace(RunView.of_run(self.run, timed_here=True), replayed=False).first(self.revealed)


@dataclass
class Cursor:
    """What the panels show of the run: the step (None: the latest), Teach mode's phase frame (0: the
    whole step) and the tree node clicked."""

    shown: int | None = None
    frame: int = 0
    picked: int | None = None
    method: str = "tr"  # the method the Method box names: the panels describe it before any step

    def show(self, step: int | None, frame: int | None = None) -> None:
        """Move to ``step`` (and ``frame``, when given); a node picked on another step is let go."""
        self.shown, self.picked = step, None
        if frame is not None:
            self.frame = frame


@dataclass
class InFlight:
    """What is under way in the tab: steps running, Play and Run to end, Stop, and when it last acted."""

    busy: int = 0  # steps in flight (Reset waits for them)
    turn: threading.Lock = field(default_factory=threading.Lock, repr=False)  # one step of this tab at a time
    queued: int = 0  # this tab's events waiting for their turn: each draws after the one that has it
    tally: threading.Lock = field(default_factory=threading.Lock, repr=False)  # guards ``queued``
    epoch: int = 0  # counts resets: a run set up across one is dropped
    stop: bool = False  # Stop or Reset pressed while a run holds the session
    running: object = None  # the run Run to end steps (its ticks never start another)
    playing: bool = False  # Play is on (its beat asks for the next step)
    held: bool = False  # a step that was running when Stop or Pause came is not shown yet: the next Step shows it
    resetting: int = 0  # Resets under way: a step that ends meanwhile draws nothing (:meth:`resetting_now`)
    last_active: float = field(default_factory=time.monotonic)  # for freeing an idle tab's KV caches

    @contextmanager
    def working(self):
        """Marks a step in flight (Reset waits for it: :meth:`wait_idle`); the tab's steps run one at a
        time (other tabs' steps run alongside, their forwards shared: ``tr_core.batching``)."""
        with self.tally:
            self.queued += 1
        with self.turn:
            with self.tally:
                self.queued -= 1
            self.busy += 1
            try:
                yield
            finally:
                self.busy -= 1

    @contextmanager
    def resetting_now(self):
        """Reset waits for the step in flight and starts over; a step that ends meanwhile draws nothing.
        Its outputs and Reset's reach the page in either order, so Reset's must be the only draw."""
        with self.tally:
            self.resetting += 1
        try:
            yield
        finally:
            with self.tally:
                self.resetting -= 1

    def superseded(self, epoch: int) -> bool:
        """Whether Reset came (or is under way) since ``epoch``: a step that had to wait for the tab's turn
        then takes no step (Reset's page stands)."""
        return self.epoch != epoch or self.resetting > 0

    def drawn_later(self) -> bool:
        """Another event of this tab waits for its turn, and will draw the panels after this one: with tabs
        side by side, two events of one tab run alongside and their outputs may reach the page in either
        order, so only the last one's panels are sent."""
        return self.queued > 0

    def wait_idle(self, timeout: float) -> bool:
        """Wait until no step of this tab is in flight (at most ``timeout`` seconds); True if none is."""
        end = time.monotonic() + timeout
        while self.busy > 0 and time.monotonic() < end:
            time.sleep(0.02)
        return self.busy <= 0

    def touch(self) -> None:
        self.last_active = time.monotonic()


@dataclass
class Session:
    """What one browser tab owns: the live run, a ZeroGPU recording or an opened run file, what the panels
    show of it, TR's matrix (hot start), what is in flight, and the status line's words."""

    live: LiveRun = field(default_factory=LiveRun)
    recorded: RecordedRun | None = None  # ZeroGPU: the run decoded in one GPU call
    replay: RunView | None = None  # a run opened from a file (no model needed)
    cursor: Cursor = field(default_factory=Cursor)
    matrix_state: MatrixState = field(default_factory=MatrixState)
    flight: InFlight = field(default_factory=InFlight)
    message: str = ""  # the status line
    notice: str = ""  # said once with the next status message
    verdict: tuple[int, str] | None = None  # (step, words): the status line ends with that step's verdict
    run_folder: str | None = None  # where its run file is written for download
    closed: bool = False  # freed when its tab closed or its state expired
    batcher: Batcher | None = field(default=None, repr=False)  # the server's: forwards shared with other tabs

    @classmethod
    def starting_from(cls, start_file: str | None = None, warm_file: str | None = None) -> Session:
        """A new tab whose matrices start from the server's file (``start_file``), else the shipped one."""
        return cls(matrix_state=MatrixState(start_file=start_file, warm_file=warm_file))

    # ---- a live race ---------------------------------------------------------------------
    def begin(self, hub: ModelHub, prompt: str, s: Settings, cap: int) -> Race:
        """A new race on ``prompt`` (returned); the matrix carries over when hot start is on."""
        check_prompt(prompt)
        s.validate(cap)
        self.cursor.method = s.method
        epoch = self.flight.epoch
        if self.live.started_with is not None and self.live.started_with[1].model != s.model:
            self.keep_shown()  # the run stays on screen, whether or not the new model loads
            self.live.race = self.flight.running = None  # let the old model go
            self.matrix_state.forget_planner()
        try:
            lm = hub.get(s.model)
        except ModelLoadError as err:
            raise UserError(f"{err} The run shown stays.") from None
        try:
            race = self.new_race(lm, s)
            race.start(lm.encode_prompt(prompt))
        except (DecodeError, TreeError, ValueError, OSError) as err:
            raise UserError(str(err)) from None
        if self.flight.epoch != epoch:
            raise Superseded()  # Reset while this race was being set up: Reset's page stands
        header = run_header(lm, s.method, asdict(s), prompt, race.decoder.prompt)
        if s.method == "tr":
            header["matrix_start"] = self.matrix_state.origin.note()
        self.live.race, self.live.started_with, self.live.header, self.live.kept = race, (prompt, s), header, None
        self.replay, self.recorded = None, None
        return race

    def new_race(self, lm: LoadedModel, s: Settings) -> Race:
        """The method's decoder (TR from this tab's matrix and planner) against greedy, not started."""
        sampling, k, tokens = s.sampling(), int(s.k), int(s.max_new_tokens)
        if s.method == "ptd":
            config = replace(PTDConfig.default(), min_draft=PAGE_MIN_DRAFT)
            decoder = ProgressiveTreeDecoder(lm, tokens, config, sampling=sampling)
        else:
            matrix = self.matrix_state.for_race(lm, k, s.hot_start, cold=s.start == COLD)
            self.notice = self.matrix_state.take_notice() or self.notice
            planner = self.matrix_state.planner_for(lm, k, s.hot_start) if s.tree == "auto" else None
            decoder = TokenRecyclingDecoder(lm, tree=s.tree, k=k, matrix=matrix, planner=planner,
                                            max_new_tokens=tokens, lookup=int(s.lookup), sampling=sampling)
        return Race(decoder, GreedyDecoder(lm, tokens, sampling=sampling), batcher=self.batcher)

    def needs_new_race(self, prompt: str, s: Settings) -> bool:
        race = self.live.race
        return race is None or race.done or not self.live.same_run(prompt, s)

    def step(self, hub: ModelHub, prompt: str, s: Settings, cap: int) -> Race:
        """One step of the race on ``prompt`` (a new race when the prompt or settings changed); the race."""
        if not self.needs_new_race(prompt, s):
            return self.advance(self.live.race)
        again = self.live.race is not None and self.live.race.done and self.live.same_run(prompt, s)
        race = self.begin(hub, prompt, s, cap)
        if again:  # said, never silent: the finished run is replaced
            self.notice += "The last run had ended: this Step started it again from step 1. "
        return self.advance(race)

    def advance(self, race: Race | None = None) -> Race:
        """One step of ``race`` (default: the current one); the panels follow it to the latest step.
        Reset may drop the race while it steps (it does not wait for the model): the step then
        belongs to a race nobody shows, and the session is left as Reset made it."""
        race = race or self.live.race
        if race is None:
            raise UserError("Nothing to step: the session was reset. Press Step to start again.")
        race.step()
        if race.done:
            race.release_caches()  # a finished race never steps again: its KV caches go at once
        if race is self.live.race:
            self.cursor.show(None)
            n = len(race.decoder.steps)
            self.verdict = (n, DONE if race.done else stepped(race.decoder.steps[-1], n))
            self.say(self.verdict[1])
        return race

    def say(self, words: str) -> None:
        """The status line: the notice kept for it, then ``words``."""
        self.message, self.notice = self.notice + words, ""

    def status_line(self) -> str:
        """The status line as the page shows it.  While an earlier step is shown (the history slider, a
        clicked token, ◀ Phase), it says which, before the latest step's words.  While Teach mode shows
        anything before the accept phase of the step whose verdict ends the line (that step's retrieve
        or verify, or an earlier step's frames), the verdict is kept back; the panels tell it at phase
        3, accept."""
        view, c = self.view(), self.cursor
        if self.verdict is None or view is None or not self.message.endswith(self.verdict[1]):
            return self.message
        n, words = self.verdict
        shown, head = view.clamp(c.shown), self.message[:len(self.message) - len(self.verdict[1])]
        if c.frame and (shown, c.frame) < (n, 3):
            words = TEACH_BEFORE_VERDICT.format(n=n)
        return head + (f"Showing step {shown} of {n}. " if shown < n else "") + words

    # ---- ZeroGPU: a run recorded in one GPU call, stepped through here ------------------------
    def reveal(self, record, prompt: str, s: Settings, cap: int) -> Run:
        """The next step of the recorded run; the whole run is first decoded in one GPU call
        (:meth:`record_run`) when there is none yet, the prompt or settings changed, or the last one
        was shown to its end."""
        if self.recorded is None or not self.live.same_run(prompt, s) or not self.in_progress:
            self.record_run(record, prompt, s, cap)
        self.show_next()
        return self.recorded.run

    def record_run(self, record, prompt: str, s: Settings, cap: int) -> None:
        """``record(prompt, settings, cap, matrix_state) -> Recording``: the run decoded whole, from the
        matrix this tab hands it (``MatrixState.handed``)."""
        check_prompt(prompt)
        s.validate(cap)
        self.cursor.method = s.method
        epoch, cold = self.flight.epoch, s.start == COLD
        rec = record(prompt, s, cap, self.matrix_state.handed(cold))
        if self.flight.epoch != epoch:
            raise Superseded()  # Reset while the GPU call ran: its recording is dropped
        if rec.error:
            raise UserError(rec.error)
        self.live.race, self.replay, self.recorded = None, None, RecordedRun(rec.run)
        self.live.started_with, self.live.header = (prompt, s), rec.run.header
        self.matrix_state.took_back(rec.matrix, rec.origin, cold)
        self.notice = rec.notice

    def show_next(self) -> None:
        self.recorded.reveal_next()
        self.cursor.show(None)
        self.verdict = None if self.in_progress else (self.recorded.revealed, DONE)
        self.say("" if self.in_progress else DONE)

    # ---- either kind of run ---------------------------------------------------------------
    def current(self):
        """The run being stepped: the recording (ZeroGPU) or the live race; None."""
        return self.recorded.run if self.recorded is not None else self.live.race

    def stepping(self):
        """What Step, Play and Run to end walk: an opened run file's recorded steps, else ``current()``."""
        return self.replay if self.replay is not None else self.current()

    def replay_next(self, teach: bool = False) -> None:
        """The opened run's next recorded step (no model runs); in Teach mode from its first frame."""
        replay = self.replay
        shown = replay.clamp(self.cursor.shown)
        if shown < len(replay.steps):
            self.cursor.show(shown + 1, frame=1 if teach else 0)
            self.message = (f"Replay: step {shown + 1} of {len(replay.steps)} of the opened run, as recorded "
                            "(no model runs). “Run its prompt live” runs it with the model; Reset closes the replay.")
        else:
            self.message = (f"The end of the replay ({len(replay.steps)} steps). “Run its prompt live” runs it "
                            "with the model; Reset closes the replay.")

    @property
    def in_progress(self) -> bool:
        """Whether the run being stepped (a replay included) has steps to come."""
        if self.replay is not None:
            return self.replay.clamp(self.cursor.shown) < len(self.replay.steps)
        if self.recorded is not None:
            return self.recorded.ahead
        return self.live.race is not None and not self.live.race.done

    def next_step(self, run) -> None:
        """One more step of ``run`` (what ``stepping()`` was when the run began)."""
        if run is not None and run is self.replay:
            self.replay_next()
        elif run is not None and self.recorded is not None and run is self.recorded.run:
            self.show_next()
        else:
            self.advance(run)

    # ---- lifecycle -------------------------------------------------------------------------
    def release_caches(self) -> bool:
        """Free the live race's KV caches (an idle tab); its next step rebuilds them."""
        return self.live.race is not None and self.live.race.release_caches()

    def forget(self, lm) -> None:
        """Drop every reference to model ``lm`` (the hub evicted it): its race and planner go."""
        if self.live.race is not None and self.live.race.decoder.lm is lm:
            self.live.race, self.live.started_with = None, None
        if getattr(getattr(self.flight.running, "decoder", None), "lm", None) is lm:
            self.flight.running = None
        self.matrix_state.forget_planner(lm)

    def reset(self, keep_run: bool = False) -> None:
        """Start over (Reset); ``keep_run``: the run shown stays on screen, detached (after an error)."""
        self.flight.epoch += 1  # a step or recording begun before this is dropped when it ends (Superseded)
        self.live = LiveRun(kept=self.detached_view() if keep_run else None)
        self.replay, self.recorded, self.cursor = None, None, Cursor(method=self.cursor.method)
        self.flight.running, self.message = None, "Reset."  # until the next step says more

    def close(self) -> bool:
        """Free what the session holds (decoders, KV caches, matrix, planner); True when it was open
        or held something, False for a session already closed and empty (nothing to report)."""
        ms = self.matrix_state
        held = self.current() is not None or ms.matrix is not None or ms.planner is not None
        self.reset()
        ms.drop()
        was_open, self.closed = not self.closed, True
        return was_open or held

    # ---- matrix file --------------------------------------------------------------------
    def save_matrix(self, folder: str | None = None) -> str:
        """Write the matrix for download (and to the server's hot-start file: ``MatrixState.save``)."""
        if self.matrix_state.matrix is None or self.current() is None:
            raise UserError("There is no matrix yet: decode something first.")
        race = self.live.race
        name = race.decoder.lm.name if race is not None else (self.live.header or {}).get("model", "")
        return self.matrix_state.save(name, folder)

    def load_matrix(self, hub: ModelHub, path: str, s: Settings) -> None:
        try:
            self.matrix_state.load(path, hub.get(s.model))
        except (MatrixFileError, ModelLoadError) as err:
            raise UserError(str(err)) from None
        self.live.race, self.recorded, self.live.started_with = None, None, None

    # ---- views and run files ----------------------------------------------------------------
    def view(self) -> RunView | None:
        if self.replay is not None:
            return self.replay
        if self.recorded is not None:
            return self.recorded.view()
        race = self.live.race
        if race is None or not race.decoder.steps:
            return self.live.kept
        return RunView.of_race(race, self.live.header or {})

    def detached_view(self) -> RunView | None:
        """The run shown, detached from its model (its token texts copied): it can stay on screen after
        the race is dropped, while a new run cannot start (a model that fails to load, an error)."""
        view = self.view()
        if view is None or view.replayed:
            return view
        return replace(RunView.of_run(view.to_run(), timed_here=view.timed_here), replayed=False)

    def keep_shown(self) -> None:
        self.live.kept = self.detached_view()

    def views(self) -> Panels:
        """Every panel at the step shown, by name."""
        from .panels import draw_panels

        view, c = self.view(), self.cursor
        return draw_panels(view, view.clamp(c.shown) if view else None, c.frame, c.picked, c.method)

    def open_run(self, run: Run) -> None:
        """Replay a run file: the race stops, the panels show the file's steps from the first."""
        self.reset()
        self.replay = RunView.of_run(run)
        self.cursor.shown = 1
        if self.replay.method in METHODS.values():  # the Method box follows the replay, the panels after Reset too
            self.cursor.method = self.replay.method


def stepped(step, n: int) -> str:
    """The status line after a live step: that it ended, and what it committed."""
    k, drafted = len(step.committed), min(step.accepted_drafts, len(step.committed))
    return f"Step {n} done: {k} token{'s' * (k != 1)} committed ({drafted} from the draft)."


def check_prompt(prompt) -> None:
    """Refuse an empty or over-long prompt with words a visitor can act on."""
    if not prompt or not str(prompt).strip():
        raise UserError("The prompt is empty: type something or pick an example.")
    if len(prompt) > MAX_PROMPT_CHARS:
        raise UserError(f"The prompt is {len(prompt):,} characters; the limit is {MAX_PROMPT_CHARS:,}.")
