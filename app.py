"""Token Recycling, step by step, against plain greedy decoding (``python app.py``).

The page's outline and its wiring: the method lives in ``tr_core``, the handlers and panels in
``components`` (``handlers`` for stepping, ``run_files`` for saving and replaying runs, ``compare``
for all methods on one prompt, ``startup`` for loading).
"""
from __future__ import annotations

import argparse
import functools
import json
import os
from dataclasses import dataclass
from pathlib import Path

import gradio as gr

from components.compare import CompareSteps, compare_handler
from components.handlers import DRAWN, Handlers, gpu_wrapped, ui_running
from components.memory import set_aside_long_lived
from components.model_hub import ModelHub
from components.recorded import Recorder, load_at_start_up
from components.run_files import RunFiles, example_choices
from components.session import COLD, METHODS, PAGE_TOKENS, SETTINGS_FIELDS
from components.startup import warm_up
from components.zerogpu import gpu_task
from tr_core.decoders.recycling import DEFAULT_LOOKUP, DEFAULT_TREE
from tr_core.devices import on_zero_gpu
from tr_core.models import EMBEDDED_LABEL
from tr_core.trees import list_presets

ASSETS = Path(__file__).with_name("assets")
BATCH_TABS = 16  # tabs whose steps run alongside, their forwards shared (1: one step at a time, all in one queue)
MODEL_CHOICES = [EMBEDDED_LABEL, "Qwen/Qwen2.5-0.5B-Instruct", "meta-llama/Llama-3.2-1B-Instruct",
                 "lmsys/vicuna-7b-v1.3"]
KEYS = ("<span class='keys'>Keys: <kbd>S</kbd> step <kbd>P</kbd> play <kbd>R</kbd> run/stop <kbd>N</kbd>/<kbd>B</kbd> "
        "next/previous phase</span>")  # hidden on a touch screen (style.css), which has no keys to press
INTROS = {  # the page's header, by method: it describes the method the Method box shows
    "tr": "<b>♻️ Token Recycling, step by step</b>: drafts a tree from the matrix <b>M</b> (each token's k likeliest "
          "next tokens, recycled from earlier forwards), checks it in one forward pass, races plain greedy decoding. ",
    "ptd": "<b>Progressive Tree Drafting, step by step</b>: a draft tree rides along in each forward pass and "
           "grows by one level each step from the model's own predictions; its paths become n-gram tries, and the "
           "trie of the last token is checked in the same forward, racing plain greedy decoding (no matrix). "}
INTRO = INTROS["tr"] + KEYS
# Before each step of Run to end and Play: the browser first finishes drawing the last step (two animation
# frames, then until the panels have not changed for 150 ms, then until its main thread is idle; 2 s at most
# before that idle wait, and 1 s for it; the status line and the queue's clocks, which tick while a step
# waits, do not count), so the step's timed work never shares the processor with that drawing when the
# browser runs on the server's machine: the race times both sides under the same conditions.  A hidden tab
# draws nothing and goes on at once.
SETTLE = ("(...args) => new Promise((done) => { if (document.hidden) { done(args); return; } "
          "const clock = (n) => (n.nodeType === 1 ? n : n.parentElement)?.closest('#status, .progress-text, .eta-bar, .progress-level'); "
          "const seen = new MutationObserver((changes) => { if (changes.some((c) => !clock(c.target))) wait(); }); "
          "let quiet; const go = () => { clearTimeout(quiet); clearTimeout(cap); seen.disconnect(); "
          "requestIdleCallback(() => done(args), {timeout: 1000}); }; "
          "const cap = setTimeout(go, 2000); const wait = () => { clearTimeout(quiet); quiet = setTimeout(go, 150); }; "
          "requestAnimationFrame(() => requestAnimationFrame(() => { seen.observe(document.body, "
          "{subtree: true, childList: true, attributes: true, characterData: true}); wait(); })); })")

# Play's beat: SETTLE, then at most the "Play: steps/s" slider's pace (counted from when the last step was asked for)
PACED = ("(...args) => (" + SETTLE + ")(...args).then((a) => new Promise((done) => { "
         "const rate = Math.max(0.1, parseFloat(document.querySelector('#speed input')?.value) || 2); "
         "const wait = Math.max(0, 1000 / rate - (performance.now() - (window.trPlayAsked || 0))); "
         "setTimeout(() => { window.trPlayAsked = performance.now(); done(a); }, wait); }))")


def intro_for(method_label: str) -> str:
    """The header for the method chosen in the Method box (``METHODS``' labels)."""
    return INTROS.get(METHODS.get(method_label, "tr"), INTROS["tr"]) + KEYS


def fields_for_method(method_label: str, fields: int) -> list:
    """What the Method box changes: TR's ``fields`` settings (the tree, k, the matrix and its buttons)
    shown for TR and hidden for PTD, which keeps no matrix; then the method's header."""
    return [gr.update(visible=METHODS.get(method_label) == "tr")] * fields + [intro_for(method_label)]


def build_app(hub: ModelHub, cap: int = 256, default_tokens: int = PAGE_TOKENS, matrix_path: str | None = None,
              on_session_end=None, batch_tabs: int = BATCH_TABS) -> gr.Blocks:
    """``matrix_path``: a hot-start matrix file shared on purpose (each session starts from its own copy;
    "Save matrix" writes it back).  ``on_session_end(session)`` is called after a session is freed.
    ``batch_tabs``: how many tabs' steps run alongside, their forwards shared (more wait in the queue)."""
    recorder = Recorder(hub) if on_zero_gpu() else None  # ZeroGPU: one GPU call per run (components.recorded)
    if recorder is not None:  # ZeroGPU: each run is one GPU call of its own, no forward to share
        batch_tabs = 1
    h = Handlers(hub, cap, matrix_path, on_session_end,
                 record=gpu_task(duration=recorder.record_seconds)(recorder.record) if recorder else None,
                 one_thread=batch_tabs <= 1)
    def end_session(sess) -> None:  # a function, which a copy shares: Gradio copies the app's config for
        h.end_session(sess)  # every page and client, and a bound method's copy would copy the model's weights

    with gr.Blocks(title="Token Recycling, step by step") as demo:
        session = gr.State(None, time_to_live=3600, delete_callback=end_session)
        kept = gr.BrowserState(None, storage_key="token-recycling-tab")  # the tab's prompt, settings and run
        intro = gr.HTML(INTRO, elem_id="intro")
        with gr.Tabs():
            with gr.Tab("Step by step", elem_id="steps-tab"):
                ui = step_tab(hub, cap, default_tokens)
            with gr.Tab("Compare methods", elem_id="compare"):
                cmp = compare_tab()
        ui["intro"] = intro
        ui["kept"] = kept
        wire(demo, h, session, ui, cmp, hub, cap, recorder, batch_tabs)
    return demo


def step_tab(hub: ModelHub, cap: int, default_tokens: int) -> dict:
    """The step-by-step view: control bar, history, phase strip, tree | matrix | text and counters, charts."""
    ui: dict = {}
    examples = json.loads((ASSETS / "examples.json").read_text())
    with gr.Row(elem_id="control-bar", equal_height=False):
        ui["prompt"] = gr.Textbox(label="Prompt (Ctrl+Enter steps)", lines=2, max_lines=4, elem_id="prompt",
                                  placeholder="Ask something…", scale=4)
        with gr.Column(scale=4, min_width=320):
            with gr.Row():
                ui["step"] = gr.Button("Step", variant="primary", elem_id="step", min_width=50, size="sm")
                ui["play"] = gr.Button("▶ Play", elem_id="play", min_width=50, size="sm")
                ui["run"] = gr.Button("Run to end", elem_id="run", min_width=70, size="sm")
                ui["stop"] = gr.Button("■ Stop", elem_id="stop", variant="stop", visible=False, min_width=70, size="sm")
                ui["reset"] = gr.Button("Reset", elem_id="reset", min_width=50, size="sm")
            with gr.Row():
                ui["teach"] = gr.Checkbox(False, label="Teach mode (phase by phase)", elem_id="teach", min_width=120)
                ui["prev"] = gr.Button("◀ Phase", elem_id="phase-prev", size="sm", min_width=60)
                ui["next"] = gr.Button("Phase ▶", elem_id="phase-next", size="sm", min_width=60)
        with gr.Column(scale=3, min_width=260):
            ui["method"] = gr.Dropdown(list(METHODS), value=next(iter(METHODS)), label="Method", elem_id="method")
            ui["start"] = gr.Radio([("Hot start (warmed matrix)", "hot"), ("Cold start (empty)", COLD)], value="hot",
                                   label="TR's matrix at the first step", elem_id="start")
    with gr.Row(elem_id="history-bar", equal_height=True):
        ui["history"] = gr.Slider(1, 2, value=1, step=1, label="History (steps appear here)", elem_id="history",
                                  interactive=False, scale=5)
        ui["speed"] = gr.Slider(0.5, 5, value=2, step=0.5, label="Play: steps/s", scale=1, min_width=120,
                                elem_id="speed")
        ui["example_run"] = gr.Dropdown(example_choices(), value=None, label="Example runs",
                                        elem_id="example-runs", scale=2, min_width=160)
        ui["example"] = gr.Dropdown([(f"{e['category']}: {e['prompt'][:50]}", e["prompt"]) for e in examples],
                                    value=None, label="Example prompts", elem_id="examples", scale=2, min_width=160)
        ui["open"] = gr.UploadButton("Open run…", file_types=[".json"], elem_id="open-run", size="sm", min_width=90)
        ui["live"] = gr.Button("Run its prompt live", elem_id="run-live", size="sm", min_width=90, visible=False)
        ui["save"] = gr.DownloadButton("Save run", elem_id="save-run", size="sm", interactive=False, min_width=90)
    ui["status"] = gr.Markdown(elem_id="status")
    ui["phases"] = gr.HTML(elem_id="phases")
    # the first screen (1280x800): tree | matrix | the text being generated over the counters; a phone
    # (style.css) lifts the text right under the controls
    with gr.Row(elem_id="views", equal_height=False):
        with gr.Column(scale=5, min_width=300, elem_id="tree-col"):
            with gr.Tabs():
                with gr.Tab("Verified tree"):
                    ui["tree"] = gr.Plot(elem_id="tree-plot", show_label=False)
                with gr.Tab("Acceptance", elem_id="acceptance-tab"):  # short: three tabs fit a phone's width
                    ui["acceptance"] = gr.Plot(elem_id="acceptance-map", show_label=False)
                with gr.Tab("PTD draft tree", elem_id="draft-tab"):
                    ui["draft"] = gr.Plot(elem_id="draft-plot", show_label=False)
        with gr.Column(scale=4, min_width=280, elem_id="matrix-col"):
            ui["heatmap"] = gr.Plot(elem_id="matrix-heatmap", show_label=False)
        with gr.Column(scale=3, min_width=240, elem_id="side-col"):
            ui["text"] = gr.HTML(elem_id="output-text")
            ui["counters"] = gr.HTML(elem_id="counters")
            ui["settings"] = settings_panel(hub, cap, default_tokens)
    with gr.Row(elem_id="text-row"):  # the charts, below the first screen
        ui["charts"] = gr.Plot(elem_id="charts", show_label=False)
    ui["alt"] = gr.HTML(elem_id="plot-alt")
    ui["node_pick"] = gr.Textbox(visible="hidden", elem_id="node-pick")
    ui["token_pick"] = gr.Textbox(visible="hidden", elem_id="token-pick")
    # Run to end and Play: each step's handler sets a new beat, whose change asks for the next step once the
    # page has drawn this one (SETTLE; Play then also keeps to its steps/s, PACED); one step in flight at a time,
    # each queued on its own
    ui["run_beat"] = gr.State(0)
    ui["play_beat"] = gr.State(0)
    return ui


def settings_panel(hub: ModelHub, cap: int, default_tokens: int) -> dict:
    """Model, tree, k, tokens, hot start, lookup, sampling; the matrix file (TR's settings)."""
    s: dict = {}
    with gr.Accordion("Settings", open=False, elem_id="settings"):
        default_model = EMBEDDED_LABEL if hub.default == "embedded" else hub.default
        s["model"] = gr.Dropdown(list(dict.fromkeys([default_model, *MODEL_CHOICES])), value=default_model,
                                 allow_custom_value=True, label="Model (a Hugging Face id; a GPU host for big ones)",
                                 elem_id="model-field")
        s["tree"] = gr.Dropdown(["auto", *list_presets(), "chain-4"], value=DEFAULT_TREE,
                                allow_custom_value=True, elem_id="tree-field",
                                label="Draft tree (a preset, chain-N, or JSON rank paths like [[0],[1],[0,0]])",
                                info="A rank path is a node's ranks from the root: [0] is the root's 1st candidate, "
                                     "[1] its 2nd, [0,1] the 2nd candidate under the 1st. List a node's parent too.")
        s["k"] = gr.Slider(1, 8, value=8, step=1, label="k (candidates per matrix row)")
        s["max_new"] = gr.Number(min(default_tokens, cap), precision=0, label=f"Max new tokens (1-{cap})",
                                 elem_id="max-new")  # not a slider: a value out of range gets words, not a clamp
        s["hot"] = gr.Checkbox(True, label="Keep the matrix between prompts")
        s["lookup"] = gr.Checkbox(DEFAULT_LOOKUP > 0, label="Merge prompt lookup into the tree")
        s["temperature"] = gr.Slider(0, 2, value=0, step=0.05, elem_id="temperature",
                                     label="Temperature (0 = greedy; above 0 = lossless sampling)")
        s["top_p"] = gr.Slider(0.05, 1, value=1, step=0.05, label="Top-p", elem_id="top-p")
        s["seed"] = gr.Number(0, precision=0, label="Seed", minimum=0)
        with gr.Row():
            s["reset_matrix"] = gr.Button("Reset matrix", size="sm")
            s["save_matrix"] = gr.Button("Save matrix", size="sm")
            s["load_matrix"] = gr.UploadButton("Load matrix", size="sm", file_types=[".safetensors"])
        s["matrix_file"] = gr.File(label="Matrix file", visible=False)
    return s


def compare_tab() -> dict:
    c: dict = {}
    gr.Markdown("One prompt (the one in the step-by-step tab), each method run to the end from scratch: greedy, "
                "TR with the auto tree, TR with the paper's 80-node tree, PTD and prompt lookup (PLD). TR starts "
                "here from an empty matrix (a cold start), where the step-by-step tab starts, by default, from a "
                "warmed one.")
    with gr.Row():
        c["go"] = gr.Button("Run all five methods", variant="primary", elem_id="compare-run")
        c["cancel"] = gr.Button("Cancel", variant="stop", elem_id="compare-cancel", visible=False)
    c["state"] = gr.State(None, time_to_live=3600)
    c["timer"] = gr.Timer(0.05, active=False)  # a slice of the run per tick, each queued on its own
    c["api"] = gr.Button(visible=False)
    c["plot"] = gr.Plot(elem_id="compare-plot", show_label=False)
    c["table"] = gr.HTML(elem_id="compare-table")
    return c


@dataclass(frozen=True)
class Wiring:
    """What the step view's events share: the handlers, the tab's session, the components, the panels a
    step draws (``views``), the model's group (one event at a time), and what follows an event that
    changes the run shown: ``prepare`` (the run file and the browser's copy of the tab) and ``follow``
    (the boxes that follow a replay: method, example run, prompt, "Run its prompt live")."""
    h: Handlers
    files: RunFiles
    session: gr.State
    ui: dict
    views: list
    model: dict
    prepare: dict
    follow: dict

    @classmethod
    def of(cls, h: Handlers, session: gr.State, ui: dict) -> Wiring:
        files = RunFiles(h)
        views = [session] + [ui[k] for k in DRAWN]
        # a step waiting for the model keeps the panels as they are; its place in the queue shows on the status line
        model = dict(concurrency_id="model", concurrency_limit=1)
        # the run file and the browser's copy, after a step; never while a step runs (the race's times stay its own)
        prepare = dict(fn=files.prepare, inputs=session, outputs=[ui["save"], ui["kept"]], show_progress="hidden",
                       **model)
        follow = dict(fn=h.replay_controls, inputs=[session, ui["prompt"]], outputs=cls.replay_boxes(ui),
                      show_progress="hidden", queue=False)  # they follow a replay, at once and quietly
        return cls(h, files, session, ui, views, model, prepare, follow)

    @staticmethod
    def replay_boxes(ui: dict) -> list:
        return [ui["method"], ui["example_run"], ui["prompt"], ui["live"]]


def wire(demo: gr.Blocks, h: Handlers, session, ui: dict, cmp: dict, hub: ModelHub, cap: int,
         recorder: Recorder | None = None, batch_tabs: int = BATCH_TABS) -> None:
    """Events: steps in their own concurrency group, up to ``batch_tabs`` tabs at once, whose forwards the
    handlers' batcher shares (a tab alone steps as it would by itself); other model work (start-up,
    Compare, Reset, matrix files) one at a time; the rest answers at once."""
    w = Wiring.of(h, session, ui)
    wire_steps(w, batch_tabs)
    wire_views(w)
    wire_settings(h, session, ui, w.views, w.model)
    wire_compare(h, ui, cmp, hub, cap, w.model, recorder)
    wire_page(demo, w, hub, recorder)


def wire_steps(w: Wiring, batch_tabs: int) -> None:
    """Step, Enter, Phase ▶ and ◀, Run to end (and the API's ``do_step`` and ``do_run``), Stop, Play,
    Reset.  The stepping handlers take their inputs by name (``inputs_kwargs``), in the order of the
    API's parameters: the prompt, the settings fields, Teach mode (and the tab's session, which the API
    hides)."""
    h, ui, views, model, prepare, follow = w.h, w.ui, w.views, w.model, w.prepare, w.follow
    gpu = gpu_wrapped(h)
    step_in = {"prompt": ui["prompt"], **settings_inputs(ui), "teach": ui["teach"], "sess": w.session}
    # steps of different tabs run alongside: their forwards are shared (Handlers.batcher), a tab's own one at a time
    steps = model if batch_tabs <= 1 else dict(concurrency_id="steps", concurrency_limit=batch_tabs)
    # the queue's place and clock on the status line, without Gradio's animated logo: redrawn at every frame,
    # it kept a quarter of a core busy in the browser while the step it stood for was being timed
    stepping = dict(steps, show_progress_on=[ui["status"]], show_progress="minimal")
    play = [ui["play_beat"], ui["play"]]
    buttons = [ui["step"], ui["play"], ui["run"], ui["stop"]]

    for pressed in (ui["step"].click, ui["prompt"].submit, ui["run"].click, ui["play"].click):
        pressed(h.note_if_starting, None, None, show_progress="hidden")  # at once: not behind start-up
    ui["step"].click(gpu["step"], inputs_kwargs=step_in, outputs=views, api_name="do_step", **stepping).then(
        **prepare).then(**follow)
    ui["live"].click(gpu["run_live"], inputs_kwargs=step_in, outputs=views, **stepping).then(**prepare).then(
        lambda sess: h.replay_controls(sess, live=True), w.session, Wiring.replay_boxes(ui), show_progress="hidden",
        queue=False)
    ui["prompt"].submit(gpu["step"], inputs_kwargs=step_in, outputs=views, **stepping).then(**prepare).then(**follow)
    ui["next"].click(gpu["next_frame"], inputs_kwargs=step_in, outputs=views, **stepping).then(**prepare)
    ui["prev"].click(h.prev_frame, w.session, views)
    # Run to end: the first step, then one per tick of its timer; between two of a tab's steps, other
    # tabs' queued steps run (no tab waits for another's whole run).  do_run: the whole run in one call (API).
    ui["run"].click(lambda: ui_running(True), None, buttons).then(  # at once: the run has begun
        gpu["run_start"], inputs_kwargs=step_in, outputs=views + [ui["run_beat"], *buttons], **stepping).then(
        **prepare).then(**follow)
    ui["run_beat"].change(gpu["run_tick"], inputs_kwargs=step_in, outputs=views + [ui["run_beat"], *buttons],
                          trigger_mode="always_last", js=SETTLE, **stepping).then(**prepare)
    gr.Button(visible=False).click(gpu["run"], inputs_kwargs=step_in, outputs=views, api_name="do_run",
                                   **(model if batch_tabs <= 1 else dict(concurrency_id="steps")))
    ui["stop"].click(h.stop, w.session, buttons).then(**prepare)
    ui["play_beat"].change(gpu["tick"], inputs_kwargs=step_in, outputs=views + play, trigger_mode="always_last",
                           js=PACED, **stepping).then(**prepare).then(**follow)
    ui["play"].click(h.toggle_play, [ui["play"], w.session], play).then(**prepare)
    # Reset waits for the tab's step in flight (drawn before it); a step that waited across it draws Reset's page
    ui["reset"].click(h.reset, w.session, views + buttons, **model).then(**prepare).then(**follow)


def wire_views(w: Wiring) -> None:
    """What changes the view, not the run: the history slider, Teach mode, a clicked node or token, an
    example prompt; and what opens another run: a run file, an example run."""
    h, ui, session, views = w.h, w.ui, w.session, w.views
    ui["history"].input(h.history, [ui["history"], session], views, trigger_mode="always_last")  # lands where released
    ui["teach"].change(h.teach_toggled, [ui["teach"], session], views)
    # the hidden fields are written by keyboard.js; Gradio's .input fires on typed keys only, .change on any value
    ui["node_pick"].change(h.pick_node, [ui["node_pick"], session], views)
    ui["token_pick"].change(h.pick_token, [ui["token_pick"], session], views)
    ui["example"].input(lambda p: p or gr.skip(), ui["example"], ui["prompt"])
    ui["open"].upload(w.files.upload, [ui["open"], session], views).then(**w.prepare).then(  # a refused file: as it was
        lambda sess, typed, said: h.replay_controls(sess, typed, opened_file=not str(said).startswith("⚠️")),
        [session, ui["prompt"], ui["status"]], Wiring.replay_boxes(ui), show_progress="hidden", queue=False)
    ui["example_run"].input(w.files.example, [ui["example_run"], session], views).then(**w.prepare).then(**w.follow)


def wire_page(demo: gr.Blocks, w: Wiring, hub: ModelHub, recorder: Recorder | None) -> None:
    """A page's load (start-up, and the tab's kept prompt, settings and run) and its close."""
    if recorder is not None:  # ZeroGPU: the handlers stay in this process; their GPU work is one call each
        warm = warm_or_say_handler(hub, curve_on_gpu=gpu_task(recorder.cost_curve), done=w.h)
    else:
        warm = gpu_task(w.h.model_thread.wrap(warm_or_say_handler(hub, done=w.h)))
    demo.load(warm, None, w.ui["status"], show_progress="minimal", **w.model)  # its bar, not Gradio's animated logo
    # a new page, or a reload: the tab's prompt, settings and run come back (not the status: warm-up's)
    demo.load(w.files.restore, [w.ui["kept"], w.session],
              w.views[:-1] + [w.ui["prompt"], *settings_inputs(w.ui).values()])
    demo.unload(w.h.on_unload)


def wire_settings(h: Handlers, session, ui: dict, views: list, model: dict) -> None:
    """A settings change says what the next Step does; the Method box shows TR's settings or not; the
    matrix file's buttons."""
    s, settings_in = ui["settings"], settings_inputs(ui)
    for field in settings_in.values():  # a change that must start a new run says so (the run shown stays)
        field.input(h.settings_changed, inputs_kwargs={"sess": session, "prompt": ui["prompt"], **settings_in},
                    outputs=ui["status"])
    tr_only = [s["tree"], s["k"], s["hot"], s["lookup"], ui["start"], s["reset_matrix"], s["save_matrix"],
               s["load_matrix"]]
    ui["method"].change(functools.partial(fields_for_method, fields=len(tr_only)), ui["method"],
                        tr_only + [ui["intro"]])
    ui["method"].input(h.method_chosen, [ui["method"], session], views[:-1],  # the panels before a step
                       show_progress="hidden")
    s["reset_matrix"].click(h.reset_matrix, session, views, **model)
    s["save_matrix"].click(h.save_matrix, session, [session, s["matrix_file"], ui["status"]], **model)
    s["load_matrix"].upload(h.load_matrix, inputs_kwargs={"sess": session, "file": s["load_matrix"], **settings_in},
                            outputs=views, **model)


def wire_compare(h: Handlers, ui: dict, cmp: dict, hub: ModelHub, cap: int, model: dict,
                 recorder: Recorder | None) -> None:
    """The Compare tab: the API's compare runs every method in one call; the page's a slice of work per
    queued tick (ZeroGPU: one GPU call)."""
    s = ui["settings"]
    if recorder is not None:
        compare = compare_handler(hub, cap, rows_on_gpu=gpu_task(duration=recorder.compare_seconds)(recorder.compare))
    else:
        compare = gpu_task(h.model_thread.wrap(compare_handler(hub, cap)))
    cmp["api"].click(compare, [ui["prompt"], s["model"], s["max_new"]], [cmp["plot"], cmp["table"]],
                     api_name="compare", **model)
    if recorder is not None:
        cmp["go"].click(compare, [ui["prompt"], s["model"], s["max_new"]], [cmp["plot"], cmp["table"]],
                        show_progress_on=[cmp["table"]], **model)
    else:
        steps = CompareSteps(hub, cap)  # each slice on the model thread, where every forward runs: none beside it
        running = [cmp["state"], cmp["plot"], cmp["table"], cmp["timer"], cmp["go"], cmp["cancel"]]
        cmp["go"].click(h.model_thread.wrap(steps.begin), [ui["prompt"], s["model"], s["max_new"]], running,
                        show_progress="hidden", **model)
        cmp["timer"].tick(gpu_task(h.model_thread.wrap(steps.tick)), cmp["state"], running, trigger_mode="once",
                          show_progress="hidden",
                          **model)
        cmp["cancel"].click(steps.cancel, cmp["state"], [cmp["state"], cmp["table"], cmp["timer"], cmp["go"],
                                                         cmp["cancel"]], queue=False)


def settings_inputs(ui: dict) -> dict:
    """The page's settings fields by name, in ``SETTINGS_FIELDS`` order (a reload restores them in it)."""
    s = ui["settings"]
    by_name = {**s, "max_new_tokens": s["max_new"], "hot_start": s["hot"], "method": ui["method"], "start": ui["start"]}
    return {name: by_name[name] for name in SETTINGS_FIELDS}


def warm_or_say_handler(hub: ModelHub, curve_on_gpu=None, done: Handlers | None = None):
    """The page-load handler: the model and its cost curve (``curve_on_gpu``: measured in a ZeroGPU call);
    ``done.ready`` is set once it has ended, so that a step pressed earlier is said to wait."""
    def warm_up(progress=gr.Progress()) -> str:
        if done is None:
            return warm_or_say(hub, progress, curve_on_gpu)
        with done.starting_up():
            return warm_or_say(hub, progress, curve_on_gpu)
    return warm_up


def warm_or_say(hub: ModelHub, progress, curve_on_gpu=None) -> str:
    """Start-up in words: ready, or why not (the page still opens and replays run files)."""
    from components.handlers import error_text
    from tr_core.models import ModelLoadError

    try:
        return warm_up(hub, progress, curve_on_gpu)
    except ModelLoadError as err:
        return f"⚠️ {err} Example runs and run files still replay without a model."
    except Exception as err:
        return error_text(err).replace("; this session was reset (the run shown stays).", ".") + \
            " Example runs and run files still replay without a model."


def main(argv: list[str] | None = None) -> None:
    env = os.environ.get
    ap = argparse.ArgumentParser(description="Token Recycling, step by step (Gradio app)")
    ap.add_argument("--model", default=env("TR_MODEL"), help="default model: 'embedded' or a HF id")
    ap.add_argument("--device", default=env("TR_DEVICE"), help="cpu, cuda, cuda:1 (default: cuda if present)")
    ap.add_argument("--dtype", default=env("TR_DTYPE"), help="float32 or bfloat16 (default: float32 on a CPU; on a GPU, by the rule of tr_core.devices)")
    ap.add_argument("--host", default=env("GRADIO_SERVER_NAME", "127.0.0.1"))
    ap.add_argument("--port", type=int, default=int(env("GRADIO_SERVER_PORT", "7860")))
    ap.add_argument("--max-new-tokens-cap", type=int, default=int(env("TR_MAX_NEW_TOKENS", "256")))
    ap.add_argument("--queue-size", type=int, default=int(env("TR_QUEUE_SIZE", "64")))
    ap.add_argument("--batch-tabs", type=int, default=int(env("TR_BATCH_TABS", str(BATCH_TABS))),
                    help="tabs whose steps run alongside, their forwards shared in one (more wait in the queue)")
    ap.add_argument("--matrix", default=env("TR_MATRIX"),
                    help="hot-start matrix file shared by all sessions (each starts from a copy; operator only)")
    args = ap.parse_args(argv)
    hub = ModelHub(args.device, args.dtype, default=args.model)
    if on_zero_gpu():
        load_at_start_up(hub)  # outside any GPU call: a GPU call's memory is thrown away when it returns
    demo = build_app(hub, cap=args.max_new_tokens_cap, matrix_path=args.matrix, batch_tabs=max(1, args.batch_tabs))
    serve(demo, args.host, args.port, args.queue_size)


def serve(demo: gr.Blocks, host: str = "127.0.0.1", port: int = 7860, queue_size: int = 64, **launch_kw):
    """Queue and launch with the app's stylesheet and keyboard script (on localhost unless told; never shared).
    No run history: the browser would keep every step's outputs (the figures) in its storage, re-reading and
    re-writing all of them at each step, which kept a core busy while the next step was timed."""
    demo.queue(max_size=queue_size)
    set_aside_long_lived()  # the libraries and the app: a closed tab's collection walks only its own objects
    return demo.launch(server_name=host, server_port=port, css=(ASSETS / "style.css").read_text(),
                       js=(Path(__file__).with_name("components") / "keyboard.js").read_text(),
                       show_error=False, share=False, run_history=False, **launch_kw)


if __name__ == "__main__":
    main()
