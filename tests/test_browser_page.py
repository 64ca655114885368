"""The page's layout in a real browser (Debian's chromium via Playwright): the answer and MAT's meaning in view
at 1280x800, the text first on a phone, finger-sized buttons, and Teach mode's accept frame telling nothing of the
recycling.
One app server for the module, few steps, few tokens."""
from __future__ import annotations


import pytest

from .conftest import served

pytestmark = [pytest.mark.browser, pytest.mark.slow]

PROMPT = "Why do cats purr? Explain briefly."
BUTTONS = ("#step", "#play", "#run", "#reset", "#phase-prev", "#phase-next")


@pytest.fixture(scope="module")
def small_app(hub):
    with served(hub, default_tokens=24) as (_, url):
        yield url


def open_page(browser, url, width, height):
    from playwright.sync_api import expect

    page = browser.new_page(viewport={"width": width, "height": height})
    page.goto(url)
    expect(page.locator("#status")).to_contain_text("Ready", timeout=300_000)
    page.locator("#prompt textarea").fill(PROMPT)
    return page


def steps(page, n: int) -> None:
    from playwright.sync_api import expect

    for _ in range(n):
        before = page.locator("#history").inner_text()
        page.locator("#step").click()
        expect(page.locator("#history")).not_to_have_text(before, timeout=120_000)
        expect(page.locator(".pending")).to_have_count(0, timeout=60_000)


def box(page, selector: str) -> dict:
    return page.locator(selector).first.bounding_box()


def test_the_answer_is_on_the_first_screen_at_1280x800(browser, small_app):
    """After 5 steps the generated text is in the viewport, whole, with the tree and the counters."""
    page = open_page(browser, small_app, 1280, 800)
    try:
        steps(page, 5)
        page.evaluate("window.scrollTo(0, 0)")
        page.wait_for_timeout(300)
        assert page.locator("#output-text .tok").count() >= 5
        text = box(page, "#output-text .gen-text")
        assert text["y"] >= 0 and text["y"] + text["height"] <= 800, text
        newest = box(page, "#output-text .tok >> nth=-1")  # the newest token, not scrolled away
        assert 0 <= newest["y"] and newest["y"] + newest["height"] <= 800, newest
        tree = box(page, "#tree-plot .js-plotly-plot")
        assert tree["y"] + tree["height"] / 2 < 800, tree  # the tree on the first screen too, most of it
        speedup = box(page, "#counters tr.speedup")
        assert speedup["y"] + speedup["height"] <= 800, speedup  # and the counters down to the speedup
        says = box(page, "#counters .mat-says")  # what MAT means, in one line beside the figure
        assert says["y"] + says["height"] <= 800 and says["height"] < 20, says
        assert "mean accepted tokens" in page.locator("#counters .mat-says").inner_text()
    finally:
        page.close()


def test_teach_mode_at_accept_tells_nothing_of_recycling(browser, small_app):
    """Phase 3 (accept): the matrix heading names no writes; phase 4 (recycle) does."""
    from playwright.sync_api import expect

    page = open_page(browser, small_app, 1280, 800)
    try:
        page.locator("#teach input").check()
        steps(page, 1)
        heading = page.locator("#matrix-heatmap .gtitle")
        phases = page.locator("#phases")
        for frame in (2, 3):
            page.locator("#phase-next").click()
            expect(phases.locator(".ph-now")).to_contain_text(f"{frame}.", timeout=30_000)
            text = heading.text_content().split("each row")[0]  # the heading, not the legend under it (SVG text)
            assert "written" not in text and "empty" not in text, (frame, text)
            assert "before" in page.locator("#matrix-heatmap").inner_text()
            assert "written into" not in phases.inner_text()  # the recycle card is still hidden
        page.locator("#phase-next").click()
        expect(heading).to_contain_text("written", timeout=30_000)
    finally:
        page.close()


def test_on_a_phone_the_text_follows_the_controls_and_buttons_fit_a_finger(browser, small_app):
    page = open_page(browser, small_app, 390, 844)
    try:
        steps(page, 2)
        controls = box(page, "#control-bar")
        text = box(page, "#output-text")
        assert text["y"] >= controls["y"] + controls["height"] - 1
        for later in ("#tree-plot", "#matrix-heatmap", "#counters", "#history-bar"):
            assert box(page, later)["y"] > text["y"], later
        tree, phases = box(page, "#tree-plot"), box(page, "#phases")  # what the tree did, right under it
        assert tree["y"] + tree["height"] <= phases["y"] < box(page, "#matrix-heatmap")["y"]
        assert page.locator("#output-text .tok").count() >= 2
        short = {b: box(page, b)["height"] for b in BUTTONS if box(page, b)["height"] < 44}
        assert not short, short
        page.locator("#settings").get_by_text("Settings").first.click()  # its buttons shown too
        page.wait_for_timeout(500)
        # everything a finger taps on the page: Plotly's own tool bar aside (it shows on hover only), and
        # Gradio's footer and its hidden copies of the tab buttons (it measures the tab bar with them)
        tappable = page.evaluate("""() => [...document.querySelectorAll(
              '.gradio-container button, .gradio-container [role=tab], .gradio-container .label-wrap')]
            .filter(e => !e.closest('.modebar, .visually-hidden, footer') && e.getClientRects().length > 0
                         && getComputedStyle(e).visibility !== 'hidden')
            .map(e => ({what: (e.id || e.getAttribute('aria-label') || e.textContent || '').trim().slice(0, 30),
                        height: e.getBoundingClientRect().height}))""")
        assert len(tappable) > len(BUTTONS)
        short = [t for t in tappable if t["height"] < 44]
        assert not short, short
    finally:
        page.close()
