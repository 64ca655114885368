"""Load: several gradio_client sessions step concurrently (loopback only); each gets what it would alone.

Size by ``LOAD_SESSIONS`` and ``LOAD_STEPS`` (default 8 x 5; ``LOAD_STEPS=50`` for a longer run).
"""
from __future__ import annotations

import os
import threading

import pytest

from components.model_hub import ModelHub
from components.session import SETTINGS_FIELDS, SHIPPED_MATRIX, Session, Settings
from tr_core.models import EMBEDDED_LABEL

from .conftest import free_port, local_client

pytestmark = pytest.mark.slow

SESSIONS = int(os.environ.get("LOAD_SESSIONS", "8"))
STEPS = int(os.environ.get("LOAD_STEPS", "5"))
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


def visible(html: str) -> str:
    """The text a panel shows, without its marks."""
    import re

    return re.sub(r"<[^>]+>", "", html)


def alone(hub, i: int) -> str:
    """The output text panel the same session would show after STEPS steps with the server to itself."""
    prompt, *settings = args_for(i)
    sess = Session.starting_from(warm_file=str(SHIPPED_MATRIX))  # as the page makes a tab: the shipped hot start
    s = Settings.from_inputs(dict(zip(SETTINGS_FIELDS, settings)))  # the API's values, in its order
    for _ in range(STEPS):
        if sess.live.race is not None and sess.live.race.done:
            break
        sess.step(hub, prompt, s, cap=256)
    return sess.views().text


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads memory from /proc")
def test_concurrent_sessions_are_isolated_and_memory_is_stable(embedded_lm):
    """Two rounds of SESSIONS concurrent visitors, a class on a server whose tabs step side by side (their
    forwards shared, on the model thread); between rounds every visitor leaves (its client closes, as a
    tab does) and the unload event frees its session.  Each session's text equals what it shows alone;
    memory grows while sessions live and does not keep growing round after round."""
    import time

    from app import build_app, serve

    hub = ModelHub(loaded={"embedded": embedded_lm})
    freed: list = []
    demo = build_app(hub, on_session_end=freed.append, batch_tabs=SESSIONS)  # a class: steps side by side
    port = free_port()
    serve(demo, "127.0.0.1", port, prevent_thread_lock=True, quiet=True)
    url = f"http://127.0.0.1:{port}/"

    def one_round() -> tuple[dict, list, float]:
        texts, errors, clients = {}, [], [local_client(url) for _ in range(SESSIONS)]

        def user(i: int) -> None:
            try:
                out = None
                for _ in range(STEPS):
                    out = clients[i].predict(*args_for(i), api_name="/do_step")
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
        live = rss_mb()
        for c in clients:
            c.close()  # the visitors leave
        return texts, errors, live

    try:
        def wait_freed(count: int) -> None:
            deadline = time.time() + 60
            while len(freed) < count and time.time() < deadline:
                time.sleep(0.1)
            assert len(freed) == count, f"{len(freed)} of {count} sessions freed"

        warm = local_client(url)
        warm.predict(*args_for(0), api_name="/do_step")
        warm.close()
        wait_freed(1)
        before = rss_mb()
        rounds, expected = [], {}
        for r in range(2):
            texts, errors, live = one_round()
            assert not errors, errors
            assert len(texts) == SESSIONS
            for i in range(SESSIONS):
                if i not in expected:  # what a session shows alone does not change between rounds
                    expected[i] = alone(hub, i)
                if i % 4 == 3:  # PTD's planner sizes drafts by measured forward times: its tokens, not its steps
                    assert visible(texts[i]) == visible(expected[i]), f"round {r + 1}: session {i}'s text differs"
                else:
                    assert texts[i] == expected[i], f"round {r + 1}: session {i} saw something other than alone"
            wait_freed(1 + SESSIONS * (r + 1))
            assert all(s.closed and s.live.race is None and s.matrix_state.matrix is None for s in freed)
            rounds.append((live, rss_mb()))
        (live1, after1), (live2, after2) = rounds
        print(f"\nload: {SESSIONS} sessions x {STEPS} steps, 2 rounds; RSS {before:.0f} MB before, "
              f"{live1:.0f} / {after1:.0f} MB (live / left) after round 1, {live2:.0f} / {after2:.0f} MB after round 2")
        # Live sessions each hold two KV caches, step records and a matrix; freed ones give their
        # memory back (the app trims the allocator), so a second round ends where the first did.  The
        # first round also pays once for the server's worker threads, their allocator arenas and caches
        # (how much depends on what ran before in the process: 35 to 110 MB a session measured), so a
        # session's own memory is read in round 2.  What round 2 leaves over round 1 is allocator noise
        # (measured +4, +21 and +54 MB for 8 sessions); the bound catches two sessions' memory not given
        # back (45-60 MB each), the check of `freed` above any one session.
        per_session = (live2 - after1) / SESSIONS
        assert per_session < 80, f"memory grew by {live2 - after1:.0f} MB in round 2, {per_session:.0f} MB a session"
        assert after2 - after1 < 10 * SESSIONS, f"memory kept growing: {after2 - after1:.0f} MB more after round 2"
    finally:
        demo.close()


PAGE = (EMBEDDED_LABEL, "auto", 8, 64, True, True, "Token Recycling (TR)")  # the page's defaults


def press_together(url: str, n: int, presses: int) -> dict:
    """``n`` ``gradio_client`` sessions press Step ``presses`` times together; the steps per second
    and each press's wait (``waits``, and their median, p95 and longest: :func:`summary`)."""
    import time

    clients = [local_client(url) for _ in range(n)]
    waits: list[float] = []

    def user(i: int) -> None:
        for _ in range(presses):
            t0 = time.perf_counter()
            clients[i].predict(PROMPTS[i % len(PROMPTS)], *PAGE, api_name="/do_step")
            waits.append(time.perf_counter() - t0)

    threads = [threading.Thread(target=user, args=(i,)) for i in range(n)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    took = time.perf_counter() - t0
    for c in clients:
        c.close()
    return summary(n, [len(waits) / took], waits)


def summary(n: int, rates: list[float], waits: list[float]) -> dict:
    """One N's figures over its rounds: the median of the rounds' steps per second, and the waits of
    every round's presses together."""
    import statistics

    waits = sorted(waits)
    return {"tabs": n, "steps_per_s": statistics.median(rates), "rates": rates, "waits": waits,
            "median": statistics.median(waits), "p95": waits[min(len(waits) - 1, int(0.95 * len(waits)))],
            "longest": waits[-1]}


def measure_class(tabs: list[int], presses: int, batch_tabs: int, apart: bool = True, nice: int = 19,
                  rounds: int = 3) -> list[dict]:
    """For each N of ``tabs``: N ``gradio_client`` sessions press Step ``presses`` times together (the
    page's defaults: TR, auto tree, 64 new tokens); the server's steps per second and each press's wait.
    ``rounds``: the whole series again, interleaved (1, 8, 16, 1, 8, 16, ...), the rates' median kept
    (a lone tab's six presses, one of them reading its prompt, are a noisy denominator alone).
    ``apart``: the clients run in a process of their own at CPU priority ``nice`` (default the lowest),
    as a class's browsers run on the students' machines (the server's cores go to the server first);
    else as threads of the server's process.  At the lowest priority a busy server also starves the
    clients' own work between two presses; at ``nice=0`` they take the server's processor time instead:
    neither is quite a class on other machines, so the docs give both."""
    import json
    import subprocess
    import sys
    from concurrent.futures import ThreadPoolExecutor

    from app import build_app, serve
    from components.model_hub import ModelHub
    from tr_core.models import load_model

    with ThreadPoolExecutor(1) as pool:  # loaded as the app loads it, off the main thread (that thread then ends):
        lm = pool.submit(load_model).result()  # the server's model thread alone keeps torch workers (tr_core.model_thread)
    hub = ModelHub(loaded={"embedded": lm})
    demo = build_app(hub, batch_tabs=batch_tabs)
    port = free_port()
    serve(demo, "127.0.0.1", port, queue_size=256, prevent_thread_lock=True, quiet=True)
    url = f"http://127.0.0.1:{port}/"
    found: dict[int, list[dict]] = {n: [] for n in tabs}
    try:
        warm = local_client(url)
        warm.predict(PROMPTS[0], *PAGE, api_name="/do_step")
        warm.close()
        for _ in range(rounds):
            for n in tabs:
                if not apart:
                    found[n].append(press_together(url, n, presses))
                    continue
                out = subprocess.run([sys.executable, "-m", "tests.test_load", "--clients", url, str(n), str(presses)],
                                     capture_output=True, text=True, check=True, timeout=1800,
                                     preexec_fn=lambda: os.setpriority(os.PRIO_PROCESS, 0, nice))
                found[n].append(json.loads(out.stdout.strip().splitlines()[-1]))
    finally:
        demo.close()
    return [summary(n, [r["steps_per_s"] for r in runs], [w for r in runs for w in r["waits"]])
            for n, runs in found.items()]


def class_arguments(argv: list[str]):
    """The command line of ``python -m tests.test_load``, checked before anything loads."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m tests.test_load",
                                     description="A class on one server: 1, 8 and 16 gradio_client sessions "
                                                 "pressing Step together (the page's defaults).")
    parser.add_argument("batch_tabs", nargs="?", type=int, default=16, help="tabs whose steps run side by side")
    parser.add_argument("--rounds", type=int, default=3, help="the series 1, 8, 16 this many times, interleaved")
    parser.add_argument("--nice", type=int, default=19, choices=range(0, 20), metavar="0-19",
                        help="the clients' process's niceness (default the lowest priority)")
    parser.add_argument("--inside", action="store_true", help="the clients as threads of the server's process")
    args = parser.parse_args(argv)
    if args.batch_tabs < 1 or args.rounds < 1:
        parser.error("batch_tabs and --rounds are at least 1")
    return args


if __name__ == "__main__":  # python -m tests.test_load [batch_tabs] [--rounds R] [--nice N] [--inside]
    import json
    import sys

    from tr_core.bench.report import cpu_words
    from tr_core.devices import cpu_info

    if sys.argv[1:2] == ["--clients"]:  # the class's clients, in a process of their own
        print(json.dumps(press_together(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))))
        sys.exit(0)
    args = class_arguments(sys.argv[1:])
    found = measure_class([1, 8, 16], presses=6, batch_tabs=args.batch_tabs, apart=not args.inside, nice=args.nice,
                          rounds=args.rounds)
    where = "in the server's process" if args.inside else f"in a process of their own at niceness {args.nice}"
    print(f"class on one server ({cpu_words(cpu_info())}), batch_tabs={args.batch_tabs}, 6 presses a tab, "
          f"64 new tokens, clients {where}, {args.rounds} round(s) interleaved (steps/s: their median; waits: "
          "every round's presses)")
    print("| tabs | steps/s (each round) | vs one tab | wait median | p95 | longest |")
    for row in found:
        each = ", ".join(f"{r:.2f}" for r in row["rates"])
        print(f"| {row['tabs']} | {row['steps_per_s']:.2f} ({each}) "
              f"| {row['steps_per_s'] / found[0]['steps_per_s']:.2f}x "
              f"| {row['median']:.2f} s | {row['p95']:.2f} s | {row['longest']:.2f} s |")
