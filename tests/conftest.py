"""Fixtures: a tiny Llama built from a config (random weights, a few hundred KB), the embedded model,
the app's model hub, a launched app and a browser.

Markers (registered in pyproject.toml): ``browser`` is set here on every test of a ``test_browser*``
module, ``slow`` on every test that runs the embedded model (it asks for ``embedded_lm``, directly
or through ``hub`` or ``launched``) and on those marked so in their module.  The fast part alone:
``python -m pytest -m "not slow and not browser"``."""
from __future__ import annotations

import contextlib
import os
import shutil
import socket
from pathlib import Path

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

TINY_VOCAB = 96
# The embedded-model tests pin their device (and the default dtype rule then gives float32 there):
# on a GPU host the suite still checks what it checks on a CPU.  The GPU has its own check:
# ``python -m tr_core.bench.gpu_check``.
DEVICE = os.environ.get("TR_TEST_DEVICE", "cpu")
# This project's copy of Spec-Bench's questions (the commands take the path as --prompts).
SPEC_BENCH = Path(__file__).resolve().parents[2] / "shared" / "data" / "spec_bench" / "question.jsonl"


@pytest.fixture
def spec_bench() -> Path:
    """The Spec-Bench questions beside the checkout; a clone without them skips what reads them."""
    if not SPEC_BENCH.is_file():
        pytest.skip(f"Spec-Bench's questions are not beside the checkout ({SPEC_BENCH})")
    return SPEC_BENCH


def make_tiny_tokenizer():
    """``<unk>``, ``<eos>``, ``w0`` ... ``w93``: the random models' word-level tokenizer at the tiny size."""
    from tr_core.bench.random_models import word_tokenizer

    return word_tokenizer(TINY_VOCAB)


def make_tiny_model(seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=TINY_VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                         eos_token_id=1, bos_token_id=0, pad_token_id=0, tie_word_embeddings=False)
    model = LlamaForCausalLM(config).eval()
    # Sharpen the output distribution so greedy paths repeat often and drafts get accepted.
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)
    model.generation_config.eos_token_id = 1
    model.generation_config.pad_token_id = 0
    return model


@pytest.fixture(scope="session")
def tiny_lm():
    from tr_core import wrap_model

    return wrap_model(make_tiny_model(), make_tiny_tokenizer(), name="tiny-llama")


# The embedded model's forward costs on a quiet 2-core CPU (AMD EPYC, AVX2; ``CostCurve.measure``, the
# median of three, 2026-12-07): seconds of q query tokens over 128 cached ones, and the cache parts.
QUIET_CPU_CURVE = dict(
    lengths=[1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 81, 96],
    seconds=[0.0471, 0.0493, 0.0544, 0.0577, 0.0613, 0.0651, 0.0736, 0.0819, 0.0974, 0.1136, 0.1606,
             0.1862, 0.2232, 0.2596],
    per_cache=1.1e-6, per_cache_fixed=6.0e-6, plain_ratio=0.975)


@pytest.fixture(scope="session")
def embedded_lm():
    """The embedded model, its planners starting from a quiet CPU's cost curve (``QUIET_CPU_CURVE``), not
    one timed here: the suite runs two workers side by side, and a curve timed while the other one
    computes is noise (a 2-token forward timed at 3x a 1-token one, a masked forward at 1.6x greedy's), so
    whether the first steps draft anything would depend on the neighbour.  The tests check outputs and
    what the page shows; the timing of curves has tests of its own, and the planners still refit theirs
    from every forward they run."""
    from tr_core import load_model
    from tr_core.cost import CostCurve

    lm = load_model(device=DEVICE)
    if DEVICE == "cpu":  # elsewhere the app's own timing, as on a GPU host
        lm.cost_curve = CostCurve(**QUIET_CPU_CURVE)
    return lm


def drawn(out: tuple) -> dict:
    """A drawing handler's outputs by name: the session, then ``handlers.DRAWN`` (the panels, the history
    slider, the status line)."""
    from components.handlers import DRAWN

    return dict(zip(("session", *DRAWN), out))


def reference_greedy(lm, ids: list[int], max_new_tokens: int) -> list[int]:
    """``model.generate(do_sample=False)``, with an explicit greedy generation config (the model's own
    ``generation_config.json`` cannot change it): the ground truth of losslessness."""
    from tr_core.models import greedy_generation_config

    x = torch.tensor([ids], device=lm.device)
    with torch.inference_mode():
        out = lm.model.generate(x, attention_mask=torch.ones_like(x),
                                generation_config=greedy_generation_config(lm, max_new_tokens))
    return out[0, len(ids):].tolist()


def decode_losslessly(lm, make, prompts, max_new_tokens: int) -> list:
    """Run ``make()`` (a fresh decoder) on each prompt, assert its output is greedy's; the decoders."""
    decoders = []
    for ids in prompts:
        dec = make()
        assert dec.generate(ids) == reference_greedy(lm, ids, max_new_tokens), f"mismatch on {ids}"
        decoders.append(dec)
    return decoders


def lockstep(lm, decoders, prompts) -> list[int]:
    """Decode every prompt together, as a class's tabs do: the prompts' prefills in one forward, then
    each round every live decoder's step in one (:func:`tr_core.batching.run_forwards`); returns the
    number of decoders in each step's forward."""
    from tr_core.batching import run_forwards

    filling = [dec for dec, ids in zip(decoders, prompts) if dec.prepare_start(ids)]
    requests = [dec.prefill_request() for dec in filling]
    for dec, request, logits in zip(filling, requests, run_forwards(lm, requests)):
        dec.finish_prefill(request, logits)
    sizes = []
    while live := [d for d in decoders if not d.done]:
        requests = [d.prepare_step() for d in live]
        for dec, request, logits in zip(live, requests, run_forwards(lm, requests)):
            dec.finish_step(request, logits)
        sizes.append(len(live))
    return sizes


def pytest_configure(config):
    """A worker of ``pytest -n N`` takes its share of the cores for torch, so that N workers do not
    run N times the cores' threads (which would make every forward of every worker wait).

    The servers the tests start send their heartbeat every half second, not every 15 s (Gradio's
    default, which ``python app.py`` and ``python -m tests.test_load`` keep).  A closing
    ``gradio_client`` keeps its heartbeat connection open until the server's next heartbeat message
    (its ``close`` waits a second for it, then leaves it running), and the server's unload event frees
    the client's session only when that connection ends; a browser tab closes its connection at once.
    A test that closes clients and waits for their sessions to go waited mostly for that (the load
    test: 56 s, 24 s now).  The servers' event streams also carry a heartbeat every half second."""
    os.environ.setdefault("GRADIO_HEARTBEAT_INTERVAL", "0.5")
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        torch.set_num_threads(max(1, cores // workers))


def pytest_report_header(config):
    """The CPU, in the run's header: how long the suite takes depends on it (README)."""
    from tr_core.bench.report import cpu_words
    from tr_core.devices import cpu_info

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return f"cpu: {cpu_words({**cpu_info(), 'cores': cores})}"


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.module.__name__.rsplit(".", 1)[-1].startswith("test_browser"):
            item.add_marker(pytest.mark.browser)
        if "embedded_lm" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.slow)
    # The modules with slow or browser tests first: ``pytest -n 2`` hands out whole modules in this order
    # (``--no-loadscope-reorder``), so the short ones fill the end and no worker runs a long module alone
    # while the other waits.
    heavy = {item.module.__name__ for item in items
             if item.get_closest_marker("slow") or item.get_closest_marker("browser")}
    items.sort(key=lambda item: item.module.__name__ not in heavy)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def local_client(url: str):
    """A ``gradio_client.Client`` of an app on this machine (plain HTTP on the loopback).  It loads no
    certificate bundle: with one, each call spends about 90 ms of this machine's CPU building TLS
    contexts it never uses, time a test of the server's own work would count against the server."""
    from gradio_client import Client

    return Client(url, verbose=False, ssl_verify=False)


@pytest.fixture(scope="session")
def hub(embedded_lm):
    """The app's model hub, holding the embedded model (loaded once for the whole run)."""
    from components.model_hub import ModelHub

    return ModelHub(loaded={"embedded": embedded_lm})


@contextlib.contextmanager
def served(hub, **options):
    """``build_app(hub, **options)`` served on a free local port until the block ends: ``(demo, url)``."""
    from app import build_app, serve

    demo = build_app(hub, **options)
    port = free_port()
    serve(demo, "127.0.0.1", port, prevent_thread_lock=True, quiet=True)
    try:
        yield demo, f"http://127.0.0.1:{port}/"
    finally:
        demo.close()


@pytest.fixture(scope="session")
def launched(hub):
    """The app on ``hub``, served on a free local port for the whole run: ``(demo, url)``.  Each
    browser tab or client is its own session, so tests do not see one another's state."""
    with served(hub) as app:
        yield app


BROWSER_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                "--no-first-run"]


@pytest.fixture(scope="session")
def browser():
    """Debian's chromium through Playwright (skipped where it is not installed)."""
    chromium = shutil.which("chromium")
    if chromium is None:
        pytest.skip("Debian's chromium is not installed (.ci/run installs it)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=chromium, args=BROWSER_ARGS)
        yield b
        b.close()


def stop_cleanly(page) -> None:
    """In a browser tab: stop its run if it still goes on; then Run is back, Step is enabled and the
    status says nothing went wrong."""
    from playwright.sync_api import expect

    if page.locator("#stop").is_visible():
        page.locator("#stop").click()
    expect(page.locator("#run")).to_be_visible(timeout=60_000)
    expect(page.locator("#step")).to_be_enabled()
    assert "went wrong" not in page.locator("#status").inner_text()


def is_skip(update) -> bool:
    """``gr.skip()``: the output is left as it is."""
    return isinstance(update, dict) and update == {"__type__": "update"}
