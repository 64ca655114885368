"""The page's event handlers: step, run (with Stop), play, reset, history, Teach frames, linked views.

Every handler takes the tab's ``Session`` (``gr.State``) and returns it with every panel redrawn
(``VIEW`` outputs), so a live race, a run recorded on ZeroGPU (``components.recorded``) and a replayed
run file go through the same code.  The stepping handlers take their inputs by name (``app.wire``
passes them as ``inputs_kwargs``): ``sess``, ``prompt``, ``teach``, and the settings fields
(``SETTINGS_FIELDS``) gathered in ``**settings`` and read by ``Settings.from_inputs``.
"""
from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from dataclasses import replace

import gradio as gr
import torch

from tr_core.cost import cost_curve_for
from tr_core.devices import oom_message, release_device_memory, serial_torch_here
from tr_core.model_thread import ModelThread, wrap_handler
from tr_core.models import ModelLoadError
from tr_core.rounds import Batcher

from .memory import release_freed_memory

from .model_hub import ModelHub
from .panels import PANELS, draw_panels
from .session import COLD, METHODS, SHIPPED_MATRIX, Session, Settings, Superseded, UserError
from .zerogpu import gpu_task

START_WAIT = 600  # seconds a step pressed during start-up waits for it at most
IDLE_SECONDS = 300  # a tab idle this long gives its KV caches back (rebuilt when it steps again)
LONG_PROMPT = 2000  # characters: a prompt this long says that its first step reads it first
RESET_WAIT = 30.0  # Reset waits at most this long for the tab's step in flight to end
TOAST_S = 4  # seconds a warning's pop-up stays; warnings never pile up over the controls
DRAWN = (*PANELS, "history", "status")  # what a drawing handler gives after the tab's session, in this order


def error_text(err: BaseException, header: dict | None = None) -> str:
    if isinstance(err, UserError):
        return f"⚠️ {err}"
    if isinstance(err, torch.OutOfMemoryError):
        h = header or {}
        return (f"⚠️ {oom_message(h.get('model', 'the model'), h.get('dtype', '?'), h.get('device', 'cpu'))} "
                "This session was reset (the run shown stays).")
    return (f"⚠️ Something went wrong ({type(err).__name__}: {err}); this session was reset "
            "(the run shown stays).")


class Handlers:
    """Bound to one app: its model hub, token cap, hot-start file and live sessions (by browser tab)."""

    def __init__(self, hub: ModelHub, cap: int, matrix_path: str | None = None, on_session_end=None,
                 record=None, one_thread: bool = True):
        """``record``: ZeroGPU's way of stepping (``components.recorded.Recorder.record`` under
        ``spaces.GPU``): each run is decoded whole in one GPU call and stepped through here.
        ``one_thread``: the model's work (start-up, steps, Compare) runs on one thread
        (:mod:`tr_core.model_thread`), not on the thread of each event; off where tabs' steps run side by
        side: then their steps run there in rounds (``tr_core.rounds``: every waiting tab's step, its
        forwards shared), and each event's other torch work (drawing) runs serially on its own thread."""
        self.hub, self.cap, self.matrix_path, self.on_session_end = hub, cap, matrix_path, on_session_end
        self.record = record
        self.live: dict[str, Session] = {}  # each tab's session, by Gradio's session hash
        self._making = threading.Lock()  # a tab's first events, run alongside, make one session between them
        self.ready = False  # a start-up (the page-load handler) has ended, in success or not
        self._no_start_up = threading.Event()  # set while no start-up runs (steps wait for one that does)
        self._no_start_up.set()
        self.one_thread = one_thread
        self.model_thread = ModelThread()
        self.batcher = Batcher(submit=self.model_thread.submit)  # tabs' steps together, on the model thread
        hub.on_evict.append(self.forget_model)

    @contextmanager
    def starting_up(self):
        """Start-up (loading the model, measuring its forwards) runs inside: steps wait for its end, so
        that its measurements have the machine alone; then the tab is ``ready``."""
        self._no_start_up.clear()
        try:
            yield
        finally:
            self.ready = True
            self._no_start_up.set()

    def note_if_starting(self) -> None:
        """A Step (or Run) pressed during start-up: say that it waits, and why (it runs afterwards)."""
        if not self.ready:
            gr.Info("Start-up is still running (loading the model, then its first forwards): your step waits "
                    "in the queue and runs as soon as the model is ready.", duration=12)

    def forget_model(self, lm) -> None:
        """The hub evicted ``lm``: every tab drops its race and planner on it, so its memory goes."""
        for sess in list(self.live.values()):
            sess.forget(lm)

    # ---- sessions ---------------------------------------------------------------------------
    def session(self, sess: Session | None, request: gr.Request | None) -> Session:
        """The tab's session, made here on its first event, whichever that is (a Step, Teach mode, a
        slider move), and made once: a tab's first events may run alongside, before either has given
        its state back, and each gets the same session.  It starts with its own copy of the shipped
        matrix, or the server's file.  Off the model thread, the event's torch work runs serially
        (``serial_torch_here``): a thread of its own with a team of OpenMP workers would slow every
        forward of the model thread."""
        if not self.model_thread.here():
            serial_torch_here()
        if sess is not None:
            return sess
        key = request.session_hash if request is not None else None
        with self._making:  # a Step and a Teach-mode click sent at once both find the one this tab has
            if key and key in self.live:
                return self.live[key]
            sess = Session.starting_from(self.matrix_path, str(SHIPPED_MATRIX))
            sess.batcher = self.batcher
            if key:
                self.live[key] = sess
            return sess

    def end_session(self, sess: Session | None) -> None:
        for key in [key for key, s in self.live.items() if s is sess]:
            self.live.pop(key, None)
        if sess is not None and sess.close():
            release_freed_memory()
            if self.on_session_end is not None:
                self.on_session_end(sess)

    def on_unload(self, request: gr.Request) -> None:
        self.end_session(self.live.get(request.session_hash))

    def model_facts(self) -> dict:
        """Model, dtype and device of the loaded model (for a message when no run has a header yet)."""
        for key in self.hub.loaded():
            lm = self.hub.get(key)
            return {"model": lm.name, "dtype": str(lm.dtype).replace("torch.", ""), "device": str(lm.device)}
        return {}

    def free_idle(self, now: float | None = None) -> int:
        """Free the KV caches of tabs idle for ``IDLE_SECONDS``; how many were freed."""
        now = time.monotonic() if now is None else now
        freed = sum(s.release_caches() for s in list(self.live.values()) if now - s.flight.last_active > IDLE_SECONDS)
        if freed:
            release_freed_memory()
            release_device_memory()
        return freed

    def advance(self, sess: Session, prompt, s: Settings) -> None:
        """One step of the tab's run, live or (ZeroGPU) recorded, once start-up has ended (steps run
        alongside each other, start-up alone); every other tab's idle caches go."""
        self._no_start_up.wait(timeout=START_WAIT)
        sess.flight.touch()
        self.free_idle()
        if str(prompt or "").strip():
            sess.live.borrowed_prompt = None
        elif sess.live.borrowed_prompt is not None:
            prompt = sess.live.borrowed_prompt  # the empty box goes on with the replay's prompt (Handlers.step)
        if len(str(prompt or "")) > LONG_PROMPT and sess.needs_new_race(prompt, s):
            gr.Info(f"Reading the prompt ({len(prompt):,} characters) before the first step: the model reads all "
                    "of it in one forward pass, which takes a while for a long prompt.", duration=15)
        if self.record is not None:
            self.check_model(s.model)  # here, not inside the GPU call
            sess.reveal(self.record, prompt, s, self.cap)
        else:
            if (s.tree == "auto" or s.method == "ptd") and sess.needs_new_race(prompt, s):
                self.cost_curve_on_model_thread(s.model)
            sess.step(self.hub, prompt, s, self.cap)

    def cost_curve_on_model_thread(self, spec) -> None:
        """Time the model's forward cost curve (what the auto tree's and PTD's planners plan from) on the
        model thread, if no start-up has timed it yet (a client of the API never loads the page).  The
        model thread runs the forwards with the model's workers; an event thread runs torch on one core."""
        try:
            lm = self.hub.get(spec)
        except ModelLoadError:
            return  # the step says why (Session.begin)
        if lm.cost_curve is None:
            self.model_thread.run(cost_curve_for, lm)

    def check_model(self, spec) -> None:
        """ZeroGPU: the model asked for is one this server serves, checked in this process before the
        GPU call (a typed id is looked up on the Hub and refused here, at no GPU time)."""
        try:
            self.hub.get(spec)
        except ModelLoadError as err:
            raise UserError(str(err)) from None

    # ---- drawing ----------------------------------------------------------------------------
    def render(self, sess: Session, message: str = "", slider_value: bool = True) -> tuple:
        """(session, *panels, history slider, status): ``DRAWN`` after the session; status last, as in the API.
        ``slider_value`` False: the slider keeps the value it has in the page (its own move drew this:
        a value sent back would pull a slider still moving back to where it was)."""
        if sess.flight.resetting:  # Reset's own draw is the page (this one could reach the page after it)
            return (sess, *(gr.skip(),) * len(DRAWN))
        if sess.flight.drawn_later():  # the panels come with that event's draw (this one could reach the page last)
            return (sess, *(gr.skip(),) * (len(DRAWN) - 1), message or sess.status_line())
        view, c = sess.view(), sess.cursor
        count = len(view.steps) if view else 0
        shown = view.clamp(c.shown) if view else 0
        value = {"value": max(shown, 1)} if slider_value else {}
        slider = gr.Slider(minimum=1, maximum=max(count, 2), step=1, interactive=count > 1,
                           label=f"History: step {shown} of {count}" if count else "History (steps appear here)",
                           **value)
        return (sess, *draw_panels(view, shown, c.frame, c.picked, c.method), slider, message or sess.status_line())

    def failed(self, sess: Session, err: Exception) -> tuple:
        """Every failure becomes words in the page (and a toast); an unexpected one resets the session."""
        if isinstance(err, Superseded):
            return self.render(sess)  # Reset came first: its page stands
        if isinstance(err, gr.Error):  # e.g. ZeroGPU's own refusals (quota, a GPU task aborted): words, no reset
            err = UserError(str(getattr(err, "message", err)))
        text = error_text(err, sess.live.header or self.model_facts())
        if not isinstance(err, UserError):
            sess.reset(keep_run=True)
        if isinstance(err, torch.OutOfMemoryError):
            release_freed_memory()
            release_device_memory()
        gr.Warning(text.removeprefix("⚠️ "), duration=TOAST_S)  # brief: the status line keeps the words
        return self.render(sess, text)

    # ---- model work: inputs by name (sess, prompt, teach, and the settings fields in **settings) ------
    def step(self, request: gr.Request, sess: Session | None, prompt: str = "", teach: bool = False, **settings):
        """One step (in Teach mode: shown from its first frame); none where Reset came while it waited
        for the tab's turn (Reset's page stands)."""
        sess = self.session(sess, request)
        epoch = sess.flight.epoch
        if sess.replay is not None:  # an opened run: its next recorded step
            sess.replay_next(teach)
            return self.render(sess)
        if self.show_held(sess, teach):
            return self.render(sess)
        try:
            s = Settings.from_inputs(settings)
            with sess.flight.working():
                if sess.flight.superseded(epoch):  # Reset came while this step waited for the tab's turn
                    return self.render(sess)
                self.advance(sess, prompt, s)
                sess.cursor.frame = 1 if teach else 0
                return self.render(sess)  # before the turn is let go: a Phase ▶ pressed meanwhile draws after it
        except Exception as err:
            return self.failed(sess, err)

    def run_live(self, request: gr.Request, sess: Session | None, prompt: str = "", teach: bool = False,
                 **settings):
        """“Run its prompt live”: the opened run's prompt (not the box's), with its method, run with the model
        from step 1 (the prompt box then shows that prompt: :meth:`replay_controls`)."""
        sess = self.session(sess, request)
        replay = sess.replay
        if replay is None:
            return self.render(sess, "There is no opened run to run live: Step runs the prompt in the box.")
        try:
            s = replace(Settings.from_inputs(settings),
                        method=replay.method if replay.method in METHODS.values() else "tr")
        except (TypeError, ValueError) as err:
            return self.failed(sess, UserError(str(err)))
        sess.replay, sess.cursor.shown, sess.live.borrowed_prompt = None, None, str(replay.header.get("prompt", ""))
        label = next((k for k, v in METHODS.items() if v == s.method), s.method)
        sess.notice = f"A live run of the opened run's prompt with {label} (the run file is unchanged). "
        sess.live.race = sess.live.started_with = None  # from step 1, whatever ran before
        try:
            with sess.flight.working():
                self.advance(sess, "", s)  # the empty box goes on with the borrowed prompt
                sess.cursor.frame = 1 if teach else 0
                return self.render(sess)
        except Exception as err:
            return self.failed(sess, err)

    def run_start(self, request: gr.Request, sess: Session | None, prompt: str = "", teach: bool = False,
                  **settings):
        """Run to end on the page (whole steps, Teach mode or not): the first step now, then one step per
        beat (:meth:`run_tick`: a new beat asks for the next step once the page has drawn this one), each a
        queued event of its own, so other tabs' steps go in between."""
        sess = self.session(sess, request)
        sess.flight.stop, sess.cursor.frame = False, 0
        out = self.step(request, sess, prompt, False, **settings)
        sess = out[0]
        sess.flight.running = sess.stepping()  # the ticks step this run (or replay), whatever the fields say
        going = sess.in_progress and not went_wrong(out) and not sess.flight.stop
        return (*out, next_beat() if going else gr.skip(), *ui_running(going))

    def run_tick(self, request: gr.Request, sess: Session | None, **_edited):
        """One step of Run to end; the beat stops at the end, on Stop or Reset, or on an error.  The
        prompt and settings fields are not read: the run goes on as it began."""
        sess = self.session(sess, request)
        run = sess.flight.running
        if sess.flight.stop or run is None or sess.stepping() is not run or not sess.in_progress:
            sess.flight.running = None  # the run is over: its race (and model) is no longer held here
            message = "Stopped: Step or Run to end go on from here." if sess.flight.stop and sess.in_progress else ""
            return (*self.render(sess, message), gr.skip(), *ui_running(False))
        shown = self.shown_now(sess)
        try:
            with sess.flight.working():  # drawn before the turn is let go, as a step is
                sess.flight.touch()
                if sess.stepping() is run and not sess.flight.resetting:  # not Reset while it waited for the turn
                    sess.next_step(run)  # this run, even if the prompt or a setting was edited meanwhile
                out = self.render(sess, self.hold(sess, shown, "Stopped"))
        except Exception as err:
            out = self.failed(sess, err)
        if sess.in_progress and sess.stepping() is run and not went_wrong(out) and not sess.flight.stop:
            return (*out, next_beat(), gr.skip(), gr.skip(), gr.skip(), gr.skip())
        sess.flight.running = None
        return (*out, gr.skip(), *ui_running(False))

    def run(self, request: gr.Request, sess: Session | None, prompt: str = "", teach: bool = False, **settings):
        """Decode to the end in one call (the API's ``do_run``; the page's Run to end steps one queued
        event at a time: :meth:`run_start`), a step per redraw, until done, Stop, Reset or the tab goes away."""
        sess = self.session(sess, request)
        sess.flight.stop, sess.cursor.frame, sess.replay = False, 0, None
        # Held across each yield: Gradio resumes a generator only once its last output went to the page,
        # so Reset (which waits while the tab is working) always draws after this run's last redraw.
        with sess.flight.working():
            try:
                self.advance(sess, prompt, Settings.from_inputs(settings))
                run = sess.current()
                yield self.render(sess)
                while not sess.closed and not sess.flight.stop and sess.current() is run and sess.in_progress:
                    sess.flight.touch()
                    sess.next_step(run)
                    if sess.current() is not run:
                        return  # Reset meanwhile: its own redraw ("Reset.") stands
                    yield self.render(sess)
                if sess.flight.stop and sess.current() is run:
                    yield self.render(sess, "Stopped: Step or Run to end go on from here.")
            except Exception as err:
                yield self.failed(sess, err)

    def tick(self, request: gr.Request, sess: Session | None, prompt: str = "", teach: bool = False, **settings):
        """Play: the next frame in Teach mode, else the next step; stops at the end or on an error."""
        if sess is not None and (sess.flight.stop or not sess.flight.playing):  # a beat after Pause, Stop or Reset
            return (*self.render(sess), gr.skip(), gr.Button(value="▶ Play"))
        shown = self.shown_now(sess)
        out = (self.next_frame if teach else self.step)(request, sess, prompt, teach, **settings)
        sess = out[0]
        sess.flight.playing = not sess.flight.stop  # a tab's first press of Play had no session to mark yet
        if sess.flight.stop:  # Pause, Stop or Reset came while this step ran: it is not drawn (Step shows it)
            said = self.hold(sess, shown, "Paused")
            return (*self.render(sess, said), gr.skip(), gr.Button(value="▶ Play"))
        if sess.in_progress and not went_wrong(out):
            return (*out, next_beat(), gr.skip())
        if teach and sess.stepping() is not None and sess.cursor.frame < 4:
            return (*out, next_beat(), gr.skip())  # the last step's frames still play
        sess.flight.playing = False
        return (*out, gr.skip(), gr.Button(value="▶ Play"))

    def next_frame(self, request: gr.Request, sess: Session | None, prompt: str = "", teach: bool = True,
                   **settings):
        """Teach mode's Next phase: retrieve → verify → accept → recycle, then the next step (``teach`` is
        not read: Phase ▶ walks the frames whatever the box says)."""
        sess = self.session(sess, request)
        epoch = sess.flight.epoch
        with sess.flight.working():  # a step of this tab still running is drawn first: its frames come next
            if sess.flight.superseded(epoch) or self.walk_a_frame(sess):  # (Reset meanwhile: its page stands)
                return self.render(sess)
        if sess.replay is not None:
            return self.render(sess, "The end of the replay: the history slider goes back; “Run its prompt live” "
                                     "runs it with the model.")
        return self.step(request, sess, prompt, True, **settings)

    # ---- no model work ----------------------------------------------------------------------
    @staticmethod
    def replay_controls(sess: Session | None, typed: str = "", opened_file: bool = False, live: bool = False):
        """(Method box, example-run box, prompt box, “Run its prompt live” button) after a step or an
        opened run: the Method box shows a replay's method; the example-run box empties once no example
        is shown (``opened_file``: a file took its place); the prompt box shows a replay's prompt once it
        runs live (``live``: asked for by name, so over what was typed; else only into an empty box);
        the button shows while a run file is open."""
        if sess is None or sess.replay is None:
            borrowed = sess.live.borrowed_prompt if sess is not None and (live or not str(typed or "").strip()) \
                else None
            race = sess.live.race if sess is not None else None
            method = next((k for k, v in METHODS.items() if race is not None
                           and v == race.decoder.method), None) if live else None
            return (method or gr.skip(), None, borrowed if borrowed is not None else gr.skip(),
                    gr.Button(visible=False))
        label = next((k for k, v in METHODS.items() if v == sess.replay.method), None)
        return label or gr.skip(), None if opened_file else gr.skip(), gr.skip(), gr.Button(visible=True)

    @staticmethod
    def walk_a_frame(sess: Session) -> bool:
        """Phase ▶ within what is shown: the next frame of this step, or (in the history) the next step's
        first; False where a new step is due."""
        view, c = sess.view(), sess.cursor
        if view is not None and 0 < c.frame < 4:
            c.frame += 1
            return True
        if view is not None and view.clamp(c.shown) < len(view.steps):  # in the history: its next step
            c.show(view.clamp(c.shown) + 1, frame=1)
            return True
        return False

    def prev_frame(self, sess: Session | None, request: gr.Request = None):
        sess = self.session(sess, request)
        view, c = sess.view(), sess.cursor
        if view is None:
            return self.render(sess)
        if c.frame > 1:
            c.frame -= 1
        elif view.clamp(c.shown) > 1:
            c.show(view.clamp(c.shown) - 1, frame=4)
        else:
            c.frame = 1
        return self.render(sess)

    @staticmethod
    def shown_now(sess: Session | None) -> tuple[int, int]:
        """(steps in the run, the step shown) before a tick's step: what :meth:`hold` goes back to."""
        view = sess.view() if sess is not None else None
        return (len(view.steps), view.clamp(sess.cursor.shown)) if view is not None else (0, 0)

    @staticmethod
    def hold(sess: Session, before: tuple[int, int], what: str) -> str:
        """A step that ended after Stop or Pause: the panels stay on the step shown when it was pressed;
        the step is kept, in the history, and the next Step shows it.  The status line's words ("" where
        there is nothing to hold back)."""
        view = sess.view()
        count, shown = before
        if not sess.flight.stop or view is None or not count or len(view.steps) <= count or sess.replay is not None:
            return ""
        sess.cursor.show(shown, frame=4 if sess.cursor.frame else None)  # Teach mode: the whole of the step shown
        sess.flight.held = True
        return (f"{what} at step {shown}. Step {count + 1}, already running, is kept in the history; "
                "Step shows it.")

    @staticmethod
    def show_held(sess: Session, teach: bool) -> bool:
        """Step after Stop or Pause: the step held back then is shown first (no model work)."""
        held, sess.flight.held = sess.flight.held, False
        view = sess.view() if held else None
        if view is None or view.clamp(sess.cursor.shown) >= len(view.steps):
            return False
        sess.cursor.show(view.clamp(sess.cursor.shown) + 1, frame=1 if teach else 0)
        return True

    def stop(self, sess: Session | None):
        if sess is not None:
            sess.flight.stop, sess.flight.playing = True, False
        return ui_running(False)

    def toggle_play(self, label: str, sess: Session | None):
        """Play / Pause.  Play clears an earlier Stop or Reset and sets Play's beat, whose change asks for
        the first step (``app``: once the page has drawn, at the "steps/s" pace); each step then sets the
        next beat until Pause, the end or an error (the page itself reads the "steps/s" slider)."""
        start = str(label).startswith("▶")
        if sess is not None:
            sess.flight.stop, sess.flight.playing = not start, start
        return (next_beat() if start else gr.skip(), gr.Button(value="❚❚ Pause" if start else "▶ Play"))

    def reset(self, request: gr.Request, sess):
        """Final: a run in progress ends at its next step, and the step in flight (if any) is waited
        for; a step that ends meanwhile draws nothing (:meth:`render`), and one still waiting for the
        tab's turn takes no step, so no late step draws over this page."""
        sess = self.session(sess, request)
        sess.flight.stop = True
        with sess.flight.resetting_now():
            sess.flight.wait_idle(RESET_WAIT)
            sess.reset()
        return (*self.render(sess, "Reset."), *ui_running(False))

    def method_chosen(self, method: str, sess: Session | None, request: gr.Request = None):
        """The Method box changed: before any step the panels describe that method (a run shown stays as it
        is); the status line is left as it is."""
        sess = self.session(sess, request)
        sess.cursor.method = METHODS.get(method, "tr")
        return self.render(sess)[:-1]

    def history(self, n, sess: Session | None, request: gr.Request = None):
        sess = self.session(sess, request)
        sess.cursor.show(int(n or 1))
        return self.render(sess, slider_value=False)

    def pick_node(self, value: str, sess: Session | None, request: gr.Request = None):
        """A tree node clicked (its index): its matrix rows are outlined and listed first."""
        sess = self.session(sess, request)
        try:
            sess.cursor.picked = int(str(value).split(":")[0])
        except ValueError:
            sess.cursor.picked = None
        return self.render(sess)

    def pick_token(self, value: str, sess: Session | None, request: gr.Request = None):
        """A token clicked in the text (its output position): the history moves to its step."""
        sess = self.session(sess, request)
        view = sess.view()
        try:
            position = int(str(value).split(":")[0])
        except ValueError:
            return self.render(sess)
        if view is not None:
            sess.cursor.show(view.step_of_token(position))
        return self.render(sess)

    # ---- the matrix file (hot start) ------------------------------------------------------------
    def reset_matrix(self, request: gr.Request, sess):
        sess = self.session(sess, request)
        sess.matrix_state.empty()
        return self.render(sess, "The matrix is empty again (∅ rows): drafts start to hit after a few steps.")

    def save_matrix(self, request: gr.Request, sess):
        sess = self.session(sess, request)
        try:
            path = sess.save_matrix()
            where = f" and to {self.matrix_path}, which new sessions start from" if self.matrix_path else ""
            return sess, gr.File(value=path, visible=True), f"Matrix saved{where}: download it below."
        except UserError as err:
            return sess, gr.File(visible=False), error_text(err)

    def load_matrix(self, request: gr.Request, sess: Session | None, file=None, **settings):
        """"Load matrix": the file, for the model the settings name."""
        sess = self.session(sess, request)
        try:
            s = Settings.from_inputs(settings)
            sess.load_matrix(self.hub, file if isinstance(file, str) else file.name, s)
            return self.render(sess, "Matrix loaded: the next step drafts from it.")
        except UserError as err:
            return self.failed(sess, err)

    def settings_changed(self, sess: Session | None, prompt: str = "", **settings):
        """A setting changed while a run is shown: the status says that the next Step starts a new
        run (the one shown stays until then); else nothing to say."""
        began = sess.live.started_with if sess is not None else None
        if sess is None or sess.current() is None or began is None:
            return gr.skip()
        try:
            new = Settings.from_inputs(settings)
        except (TypeError, ValueError):
            return gr.skip()
        if (prompt, new) == began:
            return sess.status_line()
        what = "the cold start (an empty matrix)" if new.start == COLD != began[1].start else "the new settings"
        return f"Settings changed: the next Step starts a new run from step 1, with {what}. The run shown stays until then."

    def teach_toggled(self, teach: bool, sess: Session | None, request: gr.Request = None):
        """Teach mode on or off; a tab's first event may be this one: its session is made as every other's."""
        sess = self.session(sess, request)
        sess.cursor.frame = 1 if teach and sess.view() is not None else 0
        return self.render(sess)


def went_wrong(out: tuple) -> bool:
    """Whether a handler's outputs (status last) report a failure."""
    return isinstance(out[-1], str) and out[-1].startswith("⚠️")


def next_beat() -> int:
    """A new value for Run to end's or Play's beat (``app``: its change asks for the next step, once the page
    has drawn)."""
    return time.monotonic_ns()


def ui_running(running: bool) -> tuple:
    """Step, Play, Run to end and Stop while a run holds the session (True) or not (Play reads
    "▶ Play" then: it is not playing)."""
    play = gr.Button(interactive=False) if running else gr.Button(interactive=True, value="▶ Play")
    return gr.Button(interactive=not running), play, gr.Button(visible=not running), gr.Button(visible=running)


def gpu_wrapped(handlers: Handlers) -> dict:
    """The handlers that run the model, under ``spaces.GPU`` where the ``spaces`` package is (as is
    elsewhere).  On ZeroGPU they run in the main process instead: only ``handlers.record``, one GPU
    call per run (``components.recorded``), touches the GPU."""
    # each on the model's own thread (tr_core.model_thread); or, with tabs side by side, on its event's
    # thread (torch serially there: its step goes to the model thread in a round with the others')
    on = handlers.model_thread.wrap if handlers.one_thread else serially
    named = {name: on(getattr(handlers, name))
             for name in ("step", "run", "tick", "next_frame", "run_start", "run_tick", "run_live")}
    if handlers.record is not None:
        return named
    return {name: (gpu_task(duration=120) if name == "run" else gpu_task)(fn) for name, fn in named.items()}


def serially(fn):
    """``fn`` (a handler, or a generator handler's every step, which may resume on another thread of the
    pool) with its torch work serial on the thread that runs it."""
    return wrap_handler(fn, run_serially)


def run_serially(fn, /, *args, **kwargs):
    serial_torch_here()
    return fn(*args, **kwargs)
