"""A lesson with no surprises, in a real browser (Debian's chromium via Playwright) at 1280x800: the
counters' speedup agrees with the benchmark's on the same prompt, a failed model load and a reload
lose nothing, a step pressed during start-up says that it waits, and Compare lets other tabs step."""
from __future__ import annotations

import re
import threading
from pathlib import Path

import pytest

from .conftest import free_port
from .test_browser_teaching import open_page

pytestmark = pytest.mark.browser

CHAT = "Why do cats purr? Explain briefly."
KINDS = {"chat": CHAT,
         "code": "Write a Python function that returns the n-th Fibonacci number, with a short docstring.",
         # long enough for about 17 steps: a figure over a handful of steps would time little but the first one
         "rewrite": "Rewrite this paragraph in the passive voice: The committee approved the new budget on Monday. "
                    "The mayor announced the plan at a press conference, and local businesses welcomed it. The city "
                    "will repair three bridges next spring. Volunteers planted two hundred trees along the river "
                    "last year. The council hired a new engineer to oversee the work."}


def set_max_new(page, tokens: int) -> None:
    page.locator("#settings").get_by_text("Settings").first.click()
    box = page.locator("#max-new input")
    box.fill(str(tokens))
    box.press("Tab")


def counters_figures(page) -> dict:
    text = page.locator("#counters").inner_text()
    return {"speedup": float(re.search(r"speedup here\s+([\d.]+)×", text).group(1)),
            "mat": float(re.search(r"MAT\s+([\d.]+) tokens per forward pass", text).group(1))}


def page_run_to_end(browser, url: str, prompt: str, tokens: int) -> dict:  
    """Run to end on a fresh page with the page's defaults (hot start, auto tree); the counters."""
    from playwright.sync_api import expect

    page = open_page(browser, url)
    set_max_new(page, tokens)
    page.locator("#prompt textarea").fill(prompt)
    page.locator("#run").click()
    expect(page.locator("#status")).to_contain_text("Done", timeout=600_000)
    figures = counters_figures(page)
    page.close()
    return figures


def bench_on(lm, prompt: str, tokens: int, warmup: int = 1) -> dict:
    """``python -m tr_core.bench --methods tr --matrix <the shipped matrix>`` on one prompt, in process:
    TR from the matrix a new tab starts from, against the same greedy decoder the page races.
    ``warmup=0`` where only the tokens and the MAT are read, not the timing."""
    from components.session import SHIPPED_MATRIX
    from tr_core.bench.data import BenchPrompt
    from tr_core.bench.harness import parse_methods, run_benchmark

    specs = parse_methods("tr", lm, matrix_file=str(SHIPPED_MATRIX))
    runs = {r.method: r for r in run_benchmark(lm, [BenchPrompt("page", "page", prompt)], specs, tokens,
                                                warmup=warmup, progress=False)}
    rate = {m: r.new_tokens / r.seconds for m, r in runs.items()}
    greedy = (rate["greedy"] + rate["greedy-aa"]) / 2  # the page's greedy decoder, both of the bench's copies
    return {"speedup": rate["tr"] / greedy, "mat": runs["tr"].new_tokens / runs["tr"].steps,
            "aa": rate["greedy-aa"] / rate["greedy"], "identical": runs["tr"].identical}


def bench_in_own_process(prompt: str, tokens: int) -> dict:
    """:func:`bench_on` in a Python process of its own, as ``python -m tr_core.bench`` runs beside a server:
    in the server's process its thread would keep torch workers of its own, which slow the server's."""
    import json
    import subprocess
    import sys

    code = ("import json, sys; from tests.test_browser_lesson import bench_on; from tr_core import load_model; "
            "print(json.dumps(bench_on(load_model(), sys.argv[1], int(sys.argv[2]))))")
    done = subprocess.run([sys.executable, "-c", code, prompt, str(tokens)], capture_output=True, text=True,
                          check=True, cwd=Path(__file__).resolve().parents[1])
    return json.loads(done.stdout.strip().splitlines()[-1])


def counters_cost(page) -> float:
    """The counters' "a step of the method took N× as long as a greedy step"."""
    return float(re.search(r"took\s+([\d.]+)× as long as a greedy step", page.locator("#counters").inner_text()).group(1))


def test_the_counters_figures_are_the_races_own_and_the_bench_decodes_the_same(browser, launched, hub):
    """Run to end on a fresh page and the benchmark on the same prompt: the same tokens at the same MAT,
    and the counters' speedup is MAT ÷ the measured cost of a step (what the figure says it is).  How
    far the two speedups agree is a timing: it is measured side by side, with the A/A row, by
    ``python -m tests.test_browser_lesson``, not asserted in a test."""
    tokens = 24  # enough steps for a MAT; each step is a page redraw in Chromium
    page = open_page(browser, launched[1])
    set_max_new(page, tokens)
    page.locator("#prompt textarea").fill(CHAT)
    page.locator("#run").click()
    from playwright.sync_api import expect
    expect(page.locator("#status")).to_contain_text("Done", timeout=600_000)
    shown, cost = counters_figures(page), counters_cost(page)
    page.close()
    bench = bench_on(hub.get(None), CHAT, tokens, warmup=0)  # its MAT and tokens are checked, not its timing
    print(f"page: MAT {shown['mat']:.2f}, {shown['speedup']:.2f}x; bench: MAT {bench['mat']:.2f}, "
          f"{bench['speedup']:.2f}x (A/A {bench['aa']:.2f})")
    assert bench["identical"]
    assert abs(shown["mat"] - bench["mat"]) <= 0.15 * bench["mat"], (shown, bench)  # the same method, the same start
    assert shown["speedup"] == pytest.approx(shown["mat"] / cost, abs=0.02), (shown, cost)


def test_a_failed_model_load_keeps_the_run_and_a_reload_brings_it_back(browser, launched):  
    from playwright.sync_api import expect

    page = open_page(browser, launched[1])
    page.locator("#prompt textarea").fill(CHAT)
    for i in (1, 2, 3):
        page.locator("#step").click()
        expect(page.locator("#history")).to_contain_text(f"step {i} of {i}", timeout=60_000)
    text = page.locator("#output-text").inner_text()
    page.locator("#settings").get_by_text("Settings").first.click()
    model = page.locator("#model-field input")
    model.fill("nobody/nothing-7b")
    model.press("Enter")
    page.locator("#step").click()
    expect(page.locator("#status")).to_contain_text("The run shown stays", timeout=60_000)
    assert "step 3 of 3" in page.locator("#history").inner_text()
    assert page.locator("#output-text").inner_text() == text
    assert "speedup" in page.locator("#counters").inner_text()
    page.reload()  # the browser kept the tab's prompt, settings and run
    expect(page.locator("#history")).to_contain_text("step 3 of 3", timeout=60_000)
    expect(page.locator("#prompt textarea")).to_have_value(CHAT, timeout=30_000)
    expect(page.locator(".toast-body")).to_contain_text("Restored", timeout=30_000)
    assert "speedup" in page.locator("#counters").inner_text()
    page.close()


def test_a_step_pressed_during_start_up_says_it_waits_and_runs_afterwards(browser, hub):  
    from playwright.sync_api import expect

    from app import build_app, serve
    from components.model_hub import ModelHub

    release = threading.Event()

    class SlowStart(ModelHub):
        def get(self, spec=None):
            release.wait(120)  # start-up holds here until the test lets it go
            return super().get(spec)

    demo = build_app(SlowStart(loaded={"embedded": hub.get(None)}))
    port = free_port()
    serve(demo, "127.0.0.1", port, prevent_thread_lock=True, quiet=True)
    try:
        page = browser.new_page(viewport={"width": 1280, "height": 800})
        page.goto(f"http://127.0.0.1:{port}/")
        page.locator("#prompt textarea").fill(CHAT)
        page.locator("#step").click()
        expect(page.locator(".toast-body")).to_contain_text("Start-up is still running", timeout=30_000)
        assert "speedup" not in page.locator("#counters").inner_text()
        release.set()
        expect(page.locator("#counters")).to_contain_text("speedup", timeout=120_000)
        expect(page.locator("#history")).to_contain_text("step 1 of 1")
        page.close()
    finally:
        release.set()
        demo.close()


def test_compare_shows_progress_per_step_lets_another_tab_step_and_cancels(browser, launched):  
    from playwright.sync_api import expect

    a = open_page(browser, launched[1])
    set_max_new(a, 96)
    a.locator("#prompt textarea").fill(CHAT)
    a.get_by_role("tab", name="Compare methods").click()
    a.locator("#compare-run").click()
    table = a.locator("#compare-table")
    expect(table).to_contain_text("Method 1 of 5: greedy", timeout=60_000)
    b = open_page(browser, launched[1])
    b.locator("#prompt textarea").fill(KINDS["rewrite"])
    b.locator("#step").click()
    expect(b.locator("#counters")).to_contain_text("speedup", timeout=60_000)
    assert "Method" in table.inner_text(), "the other tab's step is served while Compare runs"
    a.locator("#compare-cancel").click()
    expect(table).to_contain_text("Cancelled after", timeout=30_000)
    expect(a.locator("#compare-run")).to_be_enabled(timeout=30_000)
    a.close()
    b.close()


if __name__ == "__main__":  # the page's figures against the bench's:
    # python -m tests.test_browser_lesson [tokens] [repeats] [batch_tabs]  (batch_tabs: the app's --batch-tabs)
    import platform
    import shutil
    import statistics
    import subprocess
    import sys

    from playwright.sync_api import sync_playwright

    from app import build_app, serve
    from components.model_hub import ModelHub
    from tests.conftest import BROWSER_ARGS as ARGS

    tokens = int(sys.argv[1]) if len(sys.argv) > 1 else 96
    repeats = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    batch_tabs = int(sys.argv[3]) if len(sys.argv) > 3 else None
    cpu = next((line.split(":", 1)[1].strip() for line in subprocess.run(["lscpu"], capture_output=True, text=True)
                .stdout.splitlines() if line.startswith("Model name")), platform.processor())
    hub_ = ModelHub()
    demo = build_app(hub_) if batch_tabs is None else build_app(hub_, batch_tabs=batch_tabs)
    port = free_port()
    serve(demo, "127.0.0.1", port, prevent_thread_lock=True, quiet=True)
    rows = []
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=shutil.which("chromium"), args=ARGS)
        for r in range(repeats):
            for kind, prompt in KINDS.items():  # page first, then bench; the next repeat the other way round
                order = ("page", "bench") if r % 2 == 0 else ("bench", "page")
                got = {}
                for side in order:
                    got[side] = (page_run_to_end(b, f"http://127.0.0.1:{port}/", prompt, tokens) if side == "page"
                                 else bench_in_own_process(prompt, tokens))
                rows.append((kind, got["page"], got["bench"]))
                print(f"{kind}: page MAT {got['page']['mat']:.2f} {got['page']['speedup']:.2f}x | bench MAT "
                      f"{got['bench']['mat']:.2f} {got['bench']['speedup']:.2f}x (A/A {got['bench']['aa']:.2f}, "
                      f"identical {got['bench']['identical']})", flush=True)
        b.close()
    demo.close()
    tabs = "the app's default" if batch_tabs is None else f"--batch-tabs {batch_tabs}"
    print(f"\n{cpu}, {tokens} tokens, {repeats} repeats, {tabs}, the browser on the same machine\n")
    print("| prompt | page: MAT, speedup | bench: MAT, speedup | bench A/A | page ÷ bench |\n|---|---|---|---|---|")
    for kind in KINDS:
        mine = [(pg, bn) for k, pg, bn in rows if k == kind]
        med = lambda xs: statistics.median(xs)  # noqa: E731
        print(f"| {kind} | {med([pg['mat'] for pg, _ in mine]):.2f}, {med([pg['speedup'] for pg, _ in mine]):.2f}x | "
              f"{med([bn['mat'] for _, bn in mine]):.2f}, {med([bn['speedup'] for _, bn in mine]):.2f}x | "
              f"{med([bn['aa'] for _, bn in mine]):.2f} | {med([pg['speedup'] / bn['speedup'] for pg, bn in mine]):.2f} |")
