"""A class on one server: 8 tabs pressing Step while a ninth runs to the end.

Run to end takes one queued event per step, so every tab's Step is served between two of the
running tab's steps: none waits for the whole run.  The test's server takes 4 tabs' steps side by side,
so the presses queue and each waiting tab says its place; for the first presses the model's forwards
wait at a gate, so that the queue forms however fast the machine serves it.
``python -m tests.test_browser_class`` launches the app on the embedded model and prints each tab's
longest wait (the figure the note reports)."""
from __future__ import annotations

import re
import shutil
import threading
import time

import pytest

from .conftest import served, stop_cleanly

RUNNER = "Write the numbers from one to forty in words, one per line."
PROMPTS = ["Name three colours and say why you like each one.", "Describe a cat in two sentences.",
           "What is the capital of France? Explain briefly.", "Give me a short tip for learning to cook.",
           "Why is the sky blue? Keep it short.", "List four fruits and their colours.",
           "Write one sentence about the sea.", "What does a teacher do? Answer in a sentence."]


def forward_passes(page) -> int:
    found = re.search(r"forward passes\s+(\d+)", page.locator("#counters").inner_text())
    return int(found.group(1)) if found else 0


def class_load(url: str, tabs: int = 8, steps: int = 3, browser=None, hold=None) -> dict:
    """One tab runs ``RUNNER`` towards the end while ``tabs`` others each press Step ``steps`` times (the
    next press once the last one is drawn).  Returns each tab's waits (seconds from a press to its
    drawn step), whether the run was still going when every other tab had its steps, the wait notes
    each tab showed meanwhile (``components/keyboard.js``) and every tab's counters.  Then the running tab stops.
    ``browser``: a Playwright browser, each tab in a context of its own (default: Debian's chromium).
    ``hold``: a ``threading.Event`` the server's forwards wait on (:func:`held_forwards`): cleared for the
    first presses, so that they all meet a busy server however fast it is, and set once a waiting tab
    says it stands behind more than one (or after a minute)."""
    if browser is None:
        from playwright.sync_api import sync_playwright

        with sync_playwright() as p:
            launched = p.chromium.launch(executable_path=shutil.which("chromium"), args=["--no-sandbox", "--disable-gpu"])
            try:
                return class_load(url, tabs, steps, launched, hold)
            finally:
                launched.close()
    from playwright.sync_api import expect

    contexts = [browser.new_context() for _ in range(tabs + 1)]
    try:
        pages = [c.new_page() for c in contexts]
        for page in pages:  # the tabs open together, as a class's do
            page.goto(url, wait_until="commit")
        for page in pages:
            expect(page.locator("#status")).to_contain_text("Ready", timeout=300_000)
        runner, others = pages[0], pages[1:]
        runner.locator("#settings").get_by_text("Settings").click()
        runner.locator("#max-new input").fill("256")
        runner.locator("#prompt textarea").fill(RUNNER)
        for page, prompt in zip(others, PROMPTS * tabs):
            page.locator("#prompt textarea").fill(prompt)
        runner.locator("#run").click()
        expect(runner.locator("#counters table.counters")).to_contain_text("speedup", timeout=60_000)
        waits: list[list[float]] = [[] for _ in others]
        pressed = [0.0] * len(others)
        for n in range(1, steps + 1):
            for page in others:
                expect(page.locator("#step")).to_be_enabled()
            if hold is not None and n == 1:
                hold.clear()  # the forwards stop where they are: every press below meets a busy server
            try:
                # every tab presses at about the same moment: a click event, without a pointer's waits
                for i, page in enumerate(others):
                    pressed[i] = time.monotonic()
                    page.locator("#step").dispatch_event("click")
                if hold is not None and n == 1:
                    wait_for_places(others)
            finally:
                if hold is not None:
                    hold.set()
            pending = set(range(len(others)))
            deadline = time.monotonic() + 300
            while pending and time.monotonic() < deadline:
                for i in list(pending):
                    if forward_passes(others[i]) >= n:
                        waits[i].append(time.monotonic() - pressed[i])
                        pending.discard(i)
                time.sleep(0.05)
            assert not pending, f"tabs {sorted(pending)} never got step {n}"
        still_running = "Done" not in runner.locator("#status").inner_text()
        notes = [page.evaluate("window.trWaitNotes || []") for page in others]  # what each waiting tab said
        counters = [page.locator("#counters").inner_text() for page in pages]
        stop_cleanly(runner)  # the class has had its steps
        return {"waits": waits, "run_still_going": still_running, "run_steps": forward_passes(runner),
                "wait_notes": notes, "counters": counters}
    finally:
        for c in contexts:
            c.close()


def places_behind(notes: list[str]) -> list[int]:
    """How many steps each "n ahead of this one" note put before its own."""
    return [int(m.group(1)) for m in (re.search(r"(\d+) ahead", n) for n in notes) if m]


def wait_for_places(pages, seconds: float = 60.0) -> None:
    """Until a tab's wait note says it stands behind more than one step (or ``seconds`` pass)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if any(a > 1 for page in pages for a in places_behind(page.evaluate("window.trWaitNotes || []"))):
            return
        time.sleep(0.1)


@pytest.fixture
def held_forwards(hub):
    """A gate on the embedded model's forwards (its decoder body's): each waits while the event is clear."""
    gate = threading.Event()
    gate.set()
    body = hub.get(None).model.get_decoder()
    own, plain = vars(body).get("forward"), body.forward

    def forward(*args, **kwargs):
        gate.wait(120)
        return plain(*args, **kwargs)

    body.forward = forward
    try:
        yield gate
    finally:
        gate.set()
        if own is None:
            del body.forward  # the module's class's forward again
        else:
            body.forward = own


@pytest.fixture
def four_side_by_side(hub):
    """The app with 4 tabs' steps side by side, so that 8 tabs pressing at once queue: its URL."""
    with served(hub, batch_tabs=4) as (_, url):
        yield url


def test_eight_tabs_are_served_while_a_ninth_runs_to_the_end(browser, four_side_by_side, held_forwards):
    out = class_load(four_side_by_side, tabs=8, steps=2, browser=browser, hold=held_forwards)
    assert out["run_still_going"], "every tab's steps should be served before the other tab's run ends"
    assert all(len(w) == 2 for w in out["waits"])
    said = [n for notes in out["wait_notes"] for n in notes]
    assert said, "a tab whose step waits in the queue should say why it waits"
    assert all(re.match(r"Waiting for the model: (\d+ ahead of this one|this one is next) in the queue\.", n)
               for n in said), said
    ahead = places_behind(said)  # the gate held the forwards until this showed: the notes' wording is checked
    assert any(a > 1 for a in ahead), f"9 tabs on 4 places: some step waits behind more than one ({said})"
    shared = [c for c in out["counters"] if "A class on this server" in c]
    assert shared, "tabs whose forwards ran together should say what their speedup then means"
    assert all(re.search(r"\d+ of the method's \d+ forward passes", c) for c in shared)
    print("longest waits (s):", [round(max(w), 1) for w in out["waits"]], "run steps:", out["run_steps"])


if __name__ == "__main__":
    from app import build_app, serve
    from components.model_hub import ModelHub

    from .conftest import free_port

    demo = build_app(ModelHub())
    port = free_port()
    serve(demo, "127.0.0.1", port, prevent_thread_lock=True, quiet=True)
    try:
        result = class_load(f"http://127.0.0.1:{port}/", tabs=8, steps=3)
        for i, w in enumerate(result["waits"], 1):
            print(f"tab {i}: waits {', '.join(f'{x:.1f}' for x in w)} s; longest {max(w):.1f} s")
        print("wait notes seen:", sorted({n for notes in result["wait_notes"] for n in notes})[:4])
        print(f"the running tab was still running when all had their steps: {result['run_still_going']}; "
              f"it had taken {result['run_steps']} steps when it was stopped")
    finally:
        demo.close()
