"""Controls that never lose work, in a real browser (Debian's chromium via Playwright) at 1280x800:
Teach frames that hide what is to come, Reset with a step in flight, Step on a replay, the history
slider's last position."""
from __future__ import annotations

import re

from .test_browser_teaching import open_page

PROMPT = "List the days of the week, one per line, then the months of the year."


def passes(page) -> int:
    found = re.search(r"forward passes\s+(\d+)", page.locator("#counters").inner_text())
    return int(found.group(1)) if found else 0


def step_to(page, n: int) -> None:
    from playwright.sync_api import expect

    for i in range(1, n + 1):
        page.locator("#step").click()
        expect(page.locator("#history")).to_contain_text(f"step {i} of {i}", timeout=60_000)


def test_teach_frames_hide_the_verdict_until_it_happens(browser, launched):  # noqa: F811
    from playwright.sync_api import expect

    page = open_page(browser, launched[1])
    page.locator("#prompt textarea").fill(PROMPT)
    step_to(page, 2)
    page.locator("#teach input").check()
    expect(page.locator("#phases .ph-now")).to_contain_text("retrieve", timeout=30_000)
    expect(page.locator("#counters")).to_contain_text("Not counted yet", timeout=30_000)
    assert passes(page) == 1  # step 2 is not counted while its drafts are shown
    assert page.locator("#output-text .tok[data-step='2']").count() == 0  # nor its tokens in the text
    assert "phase ▶ shows it" in page.locator("#phases").inner_text().lower().split("accept")[1]
    page.locator("#phase-next").click()  # verify: the verdict at each node, still not counted
    expect(page.locator("#phases .ph-now")).to_contain_text("verify", timeout=30_000)
    assert passes(page) == 1
    page.locator("#phase-next").click()  # accept: now the tokens and the counters
    expect(page.locator("#phases .ph-now")).to_contain_text("accept", timeout=30_000)
    expect(page.locator("#counters")).not_to_contain_text("Not counted yet", timeout=30_000)
    assert passes(page) == 2 and page.locator("#output-text .tok[data-step='2']").count() > 0
    page.close()


def test_reset_with_a_step_in_flight_is_final(browser, launched):  # noqa: F811
    from playwright.sync_api import expect

    page = open_page(browser, launched[1])
    page.locator("#prompt textarea").fill(PROMPT)
    page.locator("#run").click()
    expect(page.locator("#counters table.counters")).to_contain_text("speedup", timeout=60_000)
    page.locator("#reset").click()  # Run to end's next step is queued or running now
    expect(page.locator("#status")).to_contain_text("Reset.", timeout=30_000)
    page.wait_for_timeout(3000)  # any late step would have drawn by now
    assert "Reset." in page.locator("#status").inner_text()
    assert "steps appear here" in page.locator("#history").inner_text()
    expect(page.locator("#run")).to_be_visible()
    page.locator("#step").click()  # a new run, from step 1
    expect(page.locator("#history")).to_contain_text("step 1 of 1", timeout=60_000)
    page.close()


def test_a_replay_steps_through_its_recording_and_runs_live_only_when_asked(browser, launched):  # noqa: F811
    from playwright.sync_api import expect

    page = open_page(browser, launched[1])
    page.locator("#example-runs input").click()
    page.get_by_role("option").first.click()
    expect(page.locator("#status")).to_contain_text("Replay of", timeout=30_000)
    said = page.locator("#status").inner_text()
    assert "“" in said  # the replay shows its prompt
    assert page.locator("#example-runs input").input_value().startswith("PTD: ")  # the first example, named in words
    expect(page.locator("#method input")).to_have_value("Progressive Tree Drafting (PTD)", timeout=10_000)
    expect(page.locator("#intro")).to_contain_text("Progressive Tree Drafting")  # the header follows the method
    expect(page.locator("#run-live")).to_be_visible(timeout=10_000)
    total = int(re.search(r"of (\d+)", page.locator("#history").inner_text()).group(1))
    page.locator("#step").click()  # Step walks the recording: no model runs
    expect(page.locator("#tree-plot")).to_contain_text("Step 2:", timeout=30_000)
    expect(page.locator("#status")).to_contain_text(f"Replay: step 2 of {total}", timeout=30_000)
    page.locator("#play").click()  # so does Play: one step per beat, at its pace (2 steps/s), none skipped
    seen = []
    for _ in range(100):
        found = re.search(rf"Replay: step (\d+) of {total}", page.locator("#status").inner_text())
        if found and (not seen or int(found.group(1)) != seen[-1]):
            seen.append(int(found.group(1)))
        if len(seen) >= 4:
            break
        page.wait_for_timeout(100)
    page.locator("#play").click()  # pause
    assert len(seen) >= 4 and seen == list(range(seen[0], seen[0] + len(seen))), seen
    assert f"of {total}" in page.locator("#history").inner_text()  # the recording, not a new run
    page.locator("#run-live").click()  # the named action: its prompt, live, from step 1
    expect(page.locator("#status")).to_contain_text("live run of the opened run's prompt", timeout=60_000)
    expect(page.locator("#history")).to_contain_text("step 1 of 1", timeout=30_000)
    expect(page.locator("#example-runs input")).to_have_value("", timeout=10_000)  # the replay is closed
    expect(page.locator("#run-live")).to_be_hidden(timeout=10_000)
    assert page.locator("#prompt textarea").input_value().strip()  # the prompt running live is in the box
    assert "trie" in page.locator("#tree-plot").inner_text()  # the live run is the replay's method
    page.locator("#step").click()
    expect(page.locator("#history")).to_contain_text("step 2 of 2", timeout=60_000)
    page.close()


def test_the_history_slider_lands_where_it_is_released(browser, launched):  # noqa: F811
    from playwright.sync_api import expect

    page = open_page(browser, launched[1])
    page.locator("#prompt textarea").fill(PROMPT)
    step_to(page, 5)
    slider = page.locator("#history input[type=range]")
    for value in ("4", "2", "5", "1", "3"):  # a quick drag: no waiting between moves
        slider.fill(value)
    expect(page.locator("#tree-plot")).to_contain_text("Step 3:", timeout=30_000)
    page.wait_for_timeout(1500)
    assert "Step 3:" in page.locator("#tree-plot").inner_text() and slider.input_value() == "3"
    slider.focus()
    for _ in range(2):  # quick key presses: each moves one step
        page.keyboard.press("ArrowLeft")
    expect(page.locator("#tree-plot")).to_contain_text("Step 1:", timeout=30_000)
    page.wait_for_timeout(1500)
    assert slider.input_value() == "1" and "step 1 of 5" in page.locator("#history").inner_text()
    page.close()
