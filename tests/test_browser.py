"""A real browser (Debian's chromium via Playwright) types a prompt, steps, and sees every panel change.
Every tab is a context of its own in the run's one browser (``conftest.browser``)."""
from __future__ import annotations

import os
import re
from pathlib import Path

from .conftest import local_client, stop_cleanly

PROMPT = "List the days of the week, one per line, then list them again in reverse order."

SCREENSHOT = Path(__file__).resolve().parents[1] / "assets" / "screenshot.png"


def test_browser_steps_draw_tree_heatmap_and_counters(browser, launched, tmp_path):  # noqa: F811
    from playwright.sync_api import expect

    url = launched[1]
    context = browser.new_context(viewport={"width": 1400, "height": 1250})
    try:
        page = context.new_page()
        page.goto(url)
        expect(page.locator("#status")).to_contain_text("Ready", timeout=300_000)
        page.locator("#prompt textarea").fill(PROMPT)
        counters = page.locator("#counters table.counters")  # not the progress overlay
        page.locator("#step").click()
        expect(counters).to_contain_text("speedup", timeout=60_000)
        idle = page.locator(".pending")  # Gradio's progress: on the status line only, the panels stay
        expect(page.locator("#tree-plot .js-plotly-plot")).to_have_count(1, timeout=30_000)
        expect(page.locator("#matrix-heatmap .js-plotly-plot")).to_have_count(1, timeout=30_000)
        before = counters.inner_text()
        tree_before = page.locator("#tree-plot").inner_text()
        for n in (2, 3, 4):
            page.locator("#step").click()
            expect(page.locator("#history")).to_contain_text(f"step {n} of {n}", timeout=60_000)
            expect(counters).not_to_have_text(before, timeout=60_000)
            expect(idle).to_have_count(0, timeout=60_000)
            before = counters.inner_text()
        expect(page.locator("#tree-plot")).not_to_have_text(tree_before, timeout=30_000)
        expect(page.locator("#tree-plot")).to_contain_text("Step 4:", timeout=30_000)
        assert "identical to greedy" in page.locator("#counters").inner_text()
        title = re.search(r"Step (\d+): the draft tree.*?,\s*(\d+) from the matrix(?: \+ (\d+) from prompt lookup)?",
                          page.locator("#tree-plot").inner_text(), re.S)
        assert title and title.group(1) == "4"
        drafted = int(title.group(2)) + int(title.group(3) or 0)
        # every drafted node, the root and the bonus token are drawn as points (besides any ∅ leaves)
        left_out = page.locator("#tree-plot .js-plotly-plot .textpoint").filter(has_text="∅").count()
        assert page.locator("#tree-plot .js-plotly-plot .point").count() == drafted + 2 + left_out
        assert page.locator("#matrix-heatmap .js-plotly-plot").inner_text().strip()
        assert page.locator("#output-text .tok").count() >= 4, page.locator("#output-text").inner_html()[:3000]
        # Play steps on its beat until paused
        def forward_passes() -> int:
            text = page.locator("#counters").inner_text()
            found = re.search(r"forward passes\s+(\d+)", text)
            return int(found.group(1)) if found else -1

        assert forward_passes() == 4
        page.locator("#play").click()
        expect(page.locator("#play")).to_have_text("❚❚ Pause", timeout=10_000)
        for _ in range(120):  # two more steps on its beat, within a minute
            if forward_passes() >= 6:
                break
            page.wait_for_timeout(500)
        assert forward_passes() >= 6
        page.locator("#play").click()
        expect(page.locator("#play")).to_have_text("▶ Play", timeout=10_000)
        expect(idle).to_have_count(0, timeout=60_000)
        target = SCREENSHOT if os.environ.get("UPDATE_SCREENSHOT") else tmp_path / "app.png"
        page.set_viewport_size({"width": 1280, "height": 800})  # the README's view: tree and matrix in it
        page.wait_for_timeout(500)
        page.screenshot(path=str(target))
        assert target.stat().st_size > 10_000
    finally:
        context.close()


def test_closed_tab_mid_run_frees_its_session_and_the_server_goes_on(browser, hub):  # noqa: F811
    """The tab's unload event frees its session at once (decoders, KV caches, matrix); Gradio itself
    would keep a closed tab's state for an hour."""
    import threading
    import time

    from app import build_app, serve

    from .test_app import PROMPT as SHORT
    from .conftest import free_port

    from playwright.sync_api import expect

    ended = threading.Event()
    freed = []
    demo = build_app(hub, on_session_end=lambda sess: (freed.append(sess), ended.set()))
    port = free_port()
    serve(demo, "127.0.0.1", port, prevent_thread_lock=True, quiet=True)
    try:
        context = browser.new_context()
        page = context.new_page()
        page.goto(f"http://127.0.0.1:{port}/")
        expect(page.locator("#status")).to_contain_text("Ready", timeout=300_000)
        page.locator("#prompt textarea").fill(PROMPT)
        page.locator("#run").click()
        expect(page.locator("#counters table.counters")).to_contain_text("speedup", timeout=60_000)
        page.close()  # mid-run: the tab goes away
        context.close()
        assert ended.wait(timeout=60), "the closed tab's session was not freed within a minute"
        sess = freed[0]
        assert sess.closed and sess.live.race is None and sess.matrix_state.matrix is None
        t0 = time.time()
        out = local_client(f"http://127.0.0.1:{port}/").predict(
            SHORT, "", "tr-16", 8, 8, True, True, "Token Recycling (TR)", api_name="/do_step")
        assert "speedup" in out[4] and time.time() - t0 < 120  # the server goes on serving others
    finally:
        demo.close()


def test_two_tabs_at_once_a_step_is_served_while_the_other_tab_runs_to_the_end(browser, launched):  # noqa: F811
    """Two visitors at once: while the first runs to the end (one queued event per step), the second's
    Step is served in between, its panels kept meanwhile, and each tab shows its own race."""
    from playwright.sync_api import expect

    def passes(page) -> int:
        found = re.search(r"forward passes\s+(\d+)", page.locator("#counters").inner_text())
        return int(found.group(1)) if found else 0

    url = launched[1]
    contexts = [browser.new_context(), browser.new_context()]
    try:
        first, second = (c.new_page() for c in contexts)
        for page in (first, second):
            page.goto(url)
            expect(page.locator("#status")).to_contain_text("Ready", timeout=300_000)
        first.locator("#prompt textarea").fill(PROMPT)
        second.locator("#prompt textarea").fill("Name three colours and say why you like each one.")
        first.locator("#run").click()
        expect(first.locator("#counters table.counters")).to_contain_text("speedup", timeout=60_000)
        second.locator("#step").click()
        expect(second.locator("#counters table.counters")).to_contain_text("speedup", timeout=60_000)
        assert "Done" not in first.locator("#status").inner_text()  # served while the other run goes on
        expect(second.locator("#counters")).to_contain_text("identical to greedy", timeout=30_000)
        assert passes(second) == 1
        second.locator("#step").click()
        for _ in range(120):
            if passes(second) == 2:
                break
            second.wait_for_timeout(500)
        assert passes(second) == 2
        for _ in range(240):
            if passes(first) > 2:
                break
            first.wait_for_timeout(500)
        assert passes(first) > 2  # the first tab's race is its own
        stop_cleanly(first)  # enough: the test has seen what it came for
    finally:
        for c in contexts:
            c.close()
