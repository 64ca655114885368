"""Token Recycling, step by step, against plain greedy decoding (``python app.py``).

Layout and event wiring only: the method lives in ``tr_core``, the panels in ``components``.
"""
from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import gradio as gr
import torch

from components.memory import release_freed_memory
from components.model_hub import ModelHub
from components.session import METHODS, Session, Settings, UserError
from components.zerogpu import gpu_task
from tr_core.decoders.recycling import default_lookup, default_tree_name
from tr_core.models import EMBEDDED_LABEL, pick_device
from tr_core.planner import cost_curve_for
from tr_core.trees import list_presets

ASSETS = Path(__file__).with_name("assets")
MODEL_CHOICES = [EMBEDDED_LABEL, "Qwen/Qwen2.5-0.5B-Instruct", "meta-llama/Llama-3.2-1B-Instruct",
                 "lmsys/vicuna-7b-v1.3"]


def _error_text(err: BaseException) -> str:
    if isinstance(err, UserError):
        return f"⚠️ {err}"
    if isinstance(err, torch.OutOfMemoryError):
        return "⚠️ The device ran out of memory; this session was reset. Try a smaller tree or fewer tokens."
    return f"⚠️ Something went wrong ({type(err).__name__}: {err}); this session was reset."


def build_app(hub: ModelHub, cap: int = 256, default_tokens: int = 96, matrix_path: str | None = None,
              on_session_end=None) -> gr.Blocks:
    """``matrix_path``: a hot-start matrix file shared on purpose: every session's matrix starts as
    its own copy of it, and "Save matrix" writes it back (atomically).  ``on_session_end(session)``
    is called after a session's state is freed (tests, monitoring)."""
    device = pick_device(hub.device)
    examples = json.loads((ASSETS / "examples.json").read_text())
    trees = ["auto"] + list_presets() + ["chain-4"]

    with gr.Blocks(title="Token Recycling, step by step") as demo:
        # Per-tab state.  A closed tab's session is freed at once by the unload event below (its
        # decoders, KV caches and matrix); Gradio deletes the state object itself an hour later, or
        # an hour after last use, and end_session runs again then (a no-op for a freed session).
        live: dict[str, Session] = {}  # this app's sessions by browser session id

        def end_session(sess: Session | None) -> None:
            for key in [key for key, s in live.items() if s is sess]:
                live.pop(key, None)
            if sess is not None and sess.close():
                release_freed_memory()
                if on_session_end is not None:
                    on_session_end(sess)

        def on_unload(request: gr.Request) -> None:
            end_session(live.get(request.session_hash))

        session = gr.State(None, time_to_live=3600, delete_callback=end_session)
        gr.Markdown("## ♻️ Token Recycling, step by step\nWatch a lossless speculative decoder draft a tree "
                    "from recycled candidates, verify it in one forward pass, and race plain greedy decoding.")
        with gr.Row():
            with gr.Column(scale=3):
                prompt = gr.Textbox(label="Prompt", lines=3, elem_id="prompt", placeholder="Ask something…")
                gr.Examples([[e["prompt"]] for e in examples], inputs=[prompt],
                            example_labels=[e["category"] for e in examples], label="Examples")
                with gr.Row():
                    step_btn = gr.Button("Step", variant="primary", elem_id="step")
                    play_btn = gr.Button("▶ Play", elem_id="play")
                    run_btn = gr.Button("Run to end", elem_id="run")
                    reset_btn = gr.Button("Reset", elem_id="reset")
                speed = gr.Slider(0.5, 5, value=2, step=0.5, label="Play speed (steps per second)")
            with gr.Column(scale=2):
                method = gr.Radio(list(METHODS), value=next(iter(METHODS)), label="Method", elem_id="method")
                with gr.Accordion("Settings", open=False):
                    default_model = EMBEDDED_LABEL if hub.default == "embedded" else hub.default
                    model = gr.Dropdown(list(dict.fromkeys([default_model, *MODEL_CHOICES])), value=default_model,
                                        allow_custom_value=True,
                                        label="Model (any Hugging Face id on a GPU host)")
                    tree = gr.Dropdown(trees, value=default_tree_name(device), label="Draft tree",
                                       allow_custom_value=True)
                    k = gr.Slider(1, 8, value=8, step=1, label="k (candidates per matrix row)")
                    max_new = gr.Slider(1, cap, value=min(default_tokens, cap), step=1, label="Max new tokens")
                    hot = gr.Checkbox(True, label="Hot start (keep the matrix between prompts)")
                    lookup = gr.Checkbox(default_lookup(device) > 0,
                                         label="Merge prompt lookup into the tree (off = the paper's method alone)")
                    with gr.Row():
                        temperature = gr.Slider(0, 2, value=0, step=0.05, elem_id="temperature",
                                                label="Temperature (0 = greedy; above 0 = lossless sampling)")
                        top_p = gr.Slider(0.05, 1, value=1, step=0.05, label="Top-p", elem_id="top-p")
                        seed = gr.Number(0, precision=0, label="Seed", minimum=0)
                    with gr.Row():
                        reset_matrix_btn = gr.Button("Reset matrix", size="sm")
                        save_btn = gr.Button("Save matrix", size="sm")
                        load_btn = gr.UploadButton("Load matrix", size="sm", file_types=[".safetensors"])
                    matrix_file = gr.File(label="Matrix file", visible=False)
                counters = gr.HTML(elem_id="counters")
                status = gr.Markdown(elem_id="status")
        phases = gr.HTML(elem_id="phases")
        with gr.Row():
            with gr.Tabs():
                with gr.Tab("Verified tree"):
                    tree_plot = gr.Plot(elem_id="tree-plot", label="Draft tree")
                with gr.Tab("PTD draft tree", elem_id="draft-tab"):
                    draft_plot = gr.Plot(elem_id="draft-plot", label="PTD's evolving draft tree")
            heatmap = gr.Plot(elem_id="matrix-heatmap", label="Matrix")
        with gr.Row():
            with gr.Column(scale=3):
                text = gr.HTML(elem_id="output-text")
            with gr.Column(scale=2):
                charts = gr.Plot(elem_id="charts", label="Acceptance and speedup")
        timer = gr.Timer(0.5, active=False)

        settings_inputs = [model, tree, k, max_new, hot, lookup, method, temperature, top_p, seed]
        views = [tree_plot, draft_plot, heatmap, text, counters, charts, phases]

        def settings(model_, tree_, k_, max_new_, hot_, lookup_, method_, temperature_=0.0, top_p_=1.0,
                     seed_=0) -> Settings:
            return Settings(str(model_ or ""), str(tree_ or "default"), int(k_ or 8),
                            int(max_new_) if max_new_ is not None else 0, bool(hot_), 10 if lookup_ else 0,
                            METHODS.get(method_, str(method_)), float(temperature_ or 0.0),
                            float(top_p_ if top_p_ is not None else 1.0), int(seed_ or 0))

        def render(sess: Session, message: str = ""):
            return (sess, *sess.views(), message or sess.message)

        def failed(sess: Session, err: Exception):
            """Every failure becomes words in the page; an unexpected one also resets the session."""
            if not isinstance(err, UserError):
                sess.reset()
            return render(sess, _error_text(err))

        def new_session(request: gr.Request | None) -> Session:
            sess = Session(start_file=matrix_path)
            if request is not None and request.session_hash:
                live[request.session_hash] = sess
            return sess

        @gpu_task
        def do_step(request: gr.Request, prompt_, *args):
            *rest, sess = args
            sess = sess or new_session(request)
            try:
                sess.step(hub, prompt_, settings(*rest), cap)
                return render(sess)
            except Exception as err:
                return failed(sess, err)

        @gpu_task(duration=120)
        def do_run(request: gr.Request, prompt_, *args):
            *rest, sess = args
            sess = sess or new_session(request)
            try:
                sess.step(hub, prompt_, settings(*rest), cap)
                yield render(sess)
                while not sess.closed and not sess.race.done:  # closed: its tab went away
                    sess.advance()
                    yield render(sess)
            except Exception as err:
                yield failed(sess, err)

        def do_tick(request: gr.Request, prompt_, *args):
            out = do_step(request, prompt_, *args)
            sess = out[0]
            if sess.race is not None and not sess.race.done and not out[-1].startswith("⚠️"):
                return (*out, gr.skip(), gr.skip())  # keep playing, unless Pause was pressed meanwhile
            return (*out, gr.Timer(active=False), gr.Button(value="▶ Play"))

        def toggle_play(label, steps_per_s):
            start = label.startswith("▶")
            return (gr.Timer(value=1.0 / float(steps_per_s), active=start),
                    gr.Button(value="⏸ Pause" if start else "▶ Play"))

        def do_reset(request: gr.Request, sess):
            sess = sess or new_session(request)
            sess.reset()
            return (*render(sess, "Reset."), gr.Timer(active=False), gr.Button(value="▶ Play"))

        def do_reset_matrix(request: gr.Request, sess):
            sess = sess or new_session(request)
            if sess.matrix is not None:
                sess.matrix.reset()
            return render(sess, "The matrix is back to zeros: drafts start from token 0 until rows fill.")

        def do_save(request: gr.Request, sess):
            sess = sess or new_session(request)
            try:
                path = sess.save_matrix()
                where = f" and to {matrix_path}, which new sessions start from" if matrix_path else ""
                return sess, gr.File(value=path, visible=True), f"Matrix saved{where}: download it below."
            except UserError as err:
                return sess, gr.File(visible=False), _error_text(err)

        def do_load(request: gr.Request, file, *args):
            *rest, sess = args
            sess = sess or new_session(request)
            try:
                sess.load_matrix(hub, file if isinstance(file, str) else file.name, settings(*rest))
                return render(sess, "Matrix loaded: the next step drafts from it.")
            except UserError as err:
                return render(sess, _error_text(err))

        @gpu_task
        def warm_up(progress=gr.Progress()):
            progress(0.1, desc="Loading the model (about 15 s on a CPU)…")
            try:
                lm = hub.get(None)
                progress(0.7, desc="Measuring the forward cost curve for the auto tree…")
                cost_curve_for(lm)
            except Exception as err:
                return _error_text(err)
            return f"Ready: {lm.name} on {lm.device} ({str(lm.dtype).replace('torch.', '')})."

        model_work = dict(concurrency_id="model", concurrency_limit=1)
        step_inputs = [prompt, *settings_inputs, session]
        step_btn.click(do_step, step_inputs, [session, *views, status], **model_work)
        prompt.submit(do_step, step_inputs, [session, *views, status], **model_work)
        run_btn.click(do_run, step_inputs, [session, *views, status], **model_work)
        timer.tick(do_tick, step_inputs, [session, *views, status, timer, play_btn], **model_work)
        play_btn.click(toggle_play, [play_btn, speed], [timer, play_btn])
        speed.change(lambda s: gr.Timer(value=1.0 / float(s)), speed, timer)
        reset_btn.click(do_reset, session, [session, *views, status, timer, play_btn])
        reset_matrix_btn.click(do_reset_matrix, session, [session, *views, status], **model_work)
        save_btn.click(do_save, session, [session, matrix_file, status], **model_work)
        load_btn.upload(do_load, [load_btn, *settings_inputs, session], [session, *views, status], **model_work)
        demo.load(warm_up, None, status, **model_work)
        demo.unload(on_unload)
        demo.load(lambda: render(Session())[1:-1], None, views)
    return demo


def main(argv: list[str] | None = None) -> None:
    env = os.environ.get
    ap = argparse.ArgumentParser(description="Token Recycling, step by step (Gradio app)")
    ap.add_argument("--model", default=env("TR_MODEL"), help="default model: 'embedded' or a HF id")
    ap.add_argument("--device", default=env("TR_DEVICE"), help="cpu, cuda, cuda:1 (default: cuda if present)")
    ap.add_argument("--dtype", default=env("TR_DTYPE"), help="float32 (CPU default), bfloat16 (GPU default)")
    ap.add_argument("--host", default=env("GRADIO_SERVER_NAME", "127.0.0.1"))
    ap.add_argument("--port", type=int, default=int(env("GRADIO_SERVER_PORT", "7860")))
    ap.add_argument("--max-new-tokens-cap", type=int, default=int(env("TR_MAX_NEW_TOKENS", "256")))
    ap.add_argument("--queue-size", type=int, default=int(env("TR_QUEUE_SIZE", "64")))
    ap.add_argument("--matrix", default=env("TR_MATRIX"),
                    help="hot-start matrix file shared by all sessions (each starts from a copy; Save writes it)")
    args = ap.parse_args(argv)
    hub = ModelHub(args.device, args.dtype, default=args.model)
    demo = build_app(hub, cap=args.max_new_tokens_cap, matrix_path=args.matrix)
    serve(demo, args.host, args.port, args.queue_size)


def serve(demo: gr.Blocks, host: str = "127.0.0.1", port: int = 7860, queue_size: int = 64, **launch_kw):
    """Queue and launch with the app's stylesheet (on localhost unless told otherwise; never shared)."""
    demo.queue(max_size=queue_size)
    return demo.launch(server_name=host, server_port=port, css=(ASSETS / "style.css").read_text(),
                       show_error=False, share=False, **launch_kw)


if __name__ == "__main__":
    main()
