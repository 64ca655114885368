"""Load: several gradio_client sessions step concurrently (loopback only); each gets what it would alone.

Size by ``LOAD_SESSIONS`` and ``LOAD_STEPS`` (CI: 8 x 12; the figures in the README are 8 x 50).
"""
from __future__ import annotations

import os
import threading

import pytest

from components.model_hub import ModelHub
from components.session import Session, Settings
from tr_core.models import EMBEDDED_LABEL

from .test_app import free_port

SESSIONS = int(os.environ.get("LOAD_SESSIONS", "8"))
STEPS = int(os.environ.get("LOAD_STEPS", "12"))
PROMPTS = ["Name three rivers in Europe.", "Write a haiku about autumn.", "What is 12 squared?",
           "Translate to German: good morning, my friend.", "List the days of the week.",
           "Give two uses of copper.", "Summarize: the cat sat on the mat because it was warm.",
           "Write one sentence about the moon."]
# Fixed trees (the auto tree adapts to measured forward times, which load changes by design): then the
# text panel, which marks every step's accepted drafts, shows whether a session's matrix was its own.
TREES = ["tr-16", "paper-80", "tr-10", "tr-20"]


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def args_for(i: int) -> tuple:
    method = "Progressive Tree Drafting (PTD)" if i % 4 == 3 else "Token Recycling (TR)"
    return (PROMPTS[i % len(PROMPTS)], EMBEDDED_LABEL, TREES[i % len(TREES)], 8, 64, True, i % 2 == 0, method)


def alone(hub, i: int) -> str:
    """The output text panel the same session would show after STEPS steps with the server to itself."""
    prompt, model, tree, k, max_new, hot, lookup, method = args_for(i)
    sess = Session()
    s = Settings(model, tree, k, max_new, hot, 10 if lookup else 0, "ptd" if "PTD" in method else "tr")
    for _ in range(STEPS):
        if sess.race is not None and sess.race.done:
            break
        sess.step(hub, prompt, s, cap=256)
    return sess.views()[3]


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads memory from /proc")
def test_concurrent_sessions_are_isolated_and_memory_is_stable(embedded_lm):
    from gradio_client import Client

    from app import build_app, serve

    hub = ModelHub(loaded={"embedded": embedded_lm})
    demo = build_app(hub)
    port = free_port()
    serve(demo, "127.0.0.1", port, prevent_thread_lock=True, quiet=True)
    url = f"http://127.0.0.1:{port}/"
    try:
        Client(url, verbose=False).predict(*args_for(0), api_name="/do_step")  # warm-up
        before = rss_mb()
        texts, errors = {}, []

        def user(i: int) -> None:
            try:
                client = Client(url, verbose=False)
                out = None
                for _ in range(STEPS):
                    out = client.predict(*args_for(i), api_name="/do_step")
                    assert not out[-1].startswith("⚠️"), out[-1]
                    if "Done" in out[-1]:
                        break
                texts[i] = out[3]
            except Exception as err:  # collected and reported below, with the session number
                errors.append(f"session {i}: {err!r}")

        threads = [threading.Thread(target=user, args=(i,)) for i in range(SESSIONS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=900)
        after = rss_mb()
        assert not errors, errors
        assert len(texts) == SESSIONS
        for i in range(SESSIONS):
            assert texts[i] == alone(hub, i), f"session {i} saw something other than it would alone"
        print(f"\nload: {SESSIONS} sessions x {STEPS} steps, RSS {before:.0f} -> {after:.0f} MB")
        # The sessions are still alive (an hour's time-to-live): each holds two KV caches, its step
        # records and its matrix, and the allocator keeps an arena per server thread.
        per_session = (after - before) / SESSIONS
        assert per_session < 80, f"memory grew by {after - before:.0f} MB, {per_session:.0f} MB a session"
    finally:
        demo.close()
