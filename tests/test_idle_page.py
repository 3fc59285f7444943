"""An idle page costs the browser little: it asks for no animation frames (Gradio 6.31's status tracker leaks a
frame loop that `panel/idle_frames.py` stops), and with nothing live it sends no Gradio event: its timer's idle
check asks only whether anything changed, while a run started elsewhere still appears and brings the fast tick back
(`panel/tick.py`).

Frames are counted where chromium is asked for them: a script Playwright runs before the page's own wraps
`requestAnimationFrame` and counts the calls that reach it (the panel's script, which comes after, passes on only the
frames it lets through)."""

import contextlib
import json
import os
import sys
import time

import gradio as gr
import pytest
from starlette.middleware import Middleware

from panel.idle_frames import StopLeakedFrames
from panel.tick import FULL_ID, IDLE_TICK_S, STAMP_API, TICK_S
from tests.browser_helpers import running_panel, wait_for_text
from tests.helpers import free_port

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
from dashboard_scale import SyntheticRun
from idle_page import NO_TOKENS, finished_run, run_ready

# Tier 2: two Gradio servers and a panel, each waited on until idle (about 2 minutes on the loaded 2-core box).
pytestmark = [pytest.mark.browser, pytest.mark.full, pytest.mark.usefixtures("no_hub_login")]

COUNT_FRAMES = """(() => {
    const frame = window.requestAnimationFrame.bind(window);
    window.__frames = 0;
    window.requestAnimationFrame = (callback) => { window.__frames += 1; return frame(callback); };
})();"""
LISTING_S = 5.0     # the local runs' listing is at most this old (backend/runs/directory.py)


def frames_asked(page, seconds: float) -> int:
    before = page.evaluate("window.__frames")
    page.wait_for_timeout(seconds * 1000)
    return page.evaluate("window.__frames") - before


def settled(page, deadline_s: float = 60.0) -> None:
    """Once a second passes with at most a frame or two asked for: the loading tracker's loader animation ends its
    cycle after the tracker is gone (seconds, by the frame rate), and a page may draw while it loads."""
    deadline = time.monotonic() + deadline_s
    while frames_asked(page, 1.0) > 2:
        assert time.monotonic() < deadline, f"the page still asks for frames {deadline_s:.0f} s after it loaded"


@contextlib.contextmanager
def markdown_page(middleware: list):
    """A Gradio page of one Markdown and no events, served in this process with `middleware`: its URL."""
    with gr.Blocks() as demo:
        gr.Markdown("An idle Gradio page.", elem_id="idle")
    port = free_port()
    demo.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True,
                app_kwargs={"middleware": middleware})
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        demo.close()


def test_an_idle_gradio_page_asks_for_no_frames_with_the_panels_script_and_for_a_loop_of_them_without(browser):
    counts = {}
    for name, middleware in (("without", []), ("with", [Middleware(StopLeakedFrames)])):
        with markdown_page(middleware) as url:
            page = browser.new_page()
            try:
                page.add_init_script(COUNT_FRAMES)
                page.goto(url)
                page.locator("#idle").wait_for(state="visible", timeout=60000)
                page.wait_for_timeout(1000)     # the app loaded: its loading tracker is off the page
                if middleware:
                    settled(page)
                counts[name] = frames_asked(page, 4.0)
            finally:
                page.close()
    # Without: a frame per display refresh (60 a second; fewer on a loaded machine, never near none).
    assert counts["without"] >= 40, f"Gradio's leaked frame loop is gone, or not counted here: {counts}"
    assert counts["with"] <= 4, f"an idle page still asks for frames: {counts}"


def test_a_finished_run_open_sends_no_full_update_while_nothing_changes_and_a_run_started_elsewhere_appears(
        tmp_path, browser):
    """The two-stage tick (panel/tick.py): with a finished run open and nothing live, the fast timer stops and only
    the idle check's stamp is asked for, no full update is sent (no Gradio event at all); a run started elsewhere
    changes the stamp, the full update lists it and the fast timer runs again."""
    home = tmp_path / "home"
    run_id = finished_run(str(home), 30)
    with running_panel(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "app.py"), {},
                       home, unset=NO_TOKENS) as url:
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        try:
            page.add_init_script(COUNT_FRAMES)
            full, stamps, events = [], [], []
            ids = {}

            def on_request(request):
                if request.method == "POST" and "/queue/join" in request.url:
                    events.append(time.monotonic())
                    with contextlib.suppress(ValueError, TypeError):
                        if json.loads(request.post_data or "{}").get("trigger_id") in ids.values():
                            full.append(time.monotonic())
                elif request.method == "POST" and f"/run/{STAMP_API}" in request.url:
                    # the page's own session named: without one Gradio builds a whole session's state for each check
                    with contextlib.suppress(ValueError, TypeError):
                        stamps.append(json.loads(request.post_data or "{}").get("session_hash"))
            page.on("request", on_request)
            page.goto(f"{url}/?run={run_id}")
            ids.update(page.evaluate("""([period, button]) => ({
                timer: window.gradio_config.components.find((c) => c.type === 'timer' && c.props.value === period).id,
                button: window.gradio_config.components.find((c) => c.props.elem_id === button).id})""",
                                     [TICK_S, FULL_ID]))
            run_ready(run_id)(page)
            # The first tick (TICK_S after the page opened) stops the fast timer; the first idle check after that
            # (IDLE_TICK_S later) runs one full update: what changed meanwhile is not lost.
            deadline = time.monotonic() + TICK_S + 2 * IDLE_TICK_S + 30
            while not stamps:
                assert time.monotonic() < deadline, f"no idle check in {deadline:.0f} s; full updates: {len(full)}"
                page.wait_for_timeout(500)
            page.wait_for_timeout(3000)
            settled(page)
            start_full, start_stamps, start_events = len(full), len(stamps), len(events)
            frames = frames_asked(page, 2 * IDLE_TICK_S)
            sent, checked = len(full) - start_full, len(stamps) - start_stamps
            assert checked >= 1, f"no idle check in {2 * IDLE_TICK_S:.0f} s"
            assert all(stamps), f"an idle check named no session: {stamps}"
            assert sent == 0 and len(events) == start_events, \
                f"{sent} full updates, {len(events) - start_events} events in {2 * IDLE_TICK_S:.0f} s with nothing " \
                f"changing ({checked} checks)"
            assert frames <= 10, f"{frames} frames asked for in {2 * IDLE_TICK_S:.0f} s with nothing changing"
            started = time.monotonic()
            other = SyntheticRun(str(home), 5)      # a run launched from another tab: live
            page.locator("#runs-list").get_by_text("All runs").first.click()      # folded away once a run opened
            wait_for_text(page, "runs-table", other.spec.run_id, int((IDLE_TICK_S + LISTING_S + 15) * 1000))
            seen_s = time.monotonic() - started
            start = len(full)
            page.wait_for_timeout(IDLE_TICK_S * 1000)
            fast = len(full) - start       # every TICK_S: 5 (fewer where a loaded machine answers late); idle: 0
            assert fast >= 2, f"a live run listed, yet only {fast} full updates in {IDLE_TICK_S:.0f} s"
            print(f"listed after {seen_s:.1f} s; idle: {checked} checks, {sent} full updates in "
                  f"{2 * IDLE_TICK_S:.0f} s; live: {fast} full updates in {IDLE_TICK_S:.0f} s; frames idle: {frames}")
        finally:
            page.close()
