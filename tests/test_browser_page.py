"""The page at a laptop's size (1440x900) in a real browser: what a newcomer sees first and what a run shows first.

The Launch button is on the first screen, without scrolling; the task check's tables are hidden until a check fills
them. The run is a synthetic finished run folder in the project's own format (see test_browser_views.py).
"""

import json
import os
import time

import pytest

from benchmarks.dashboard_scale import JOBS, SyntheticRun
from tests.browser_helpers import CHROMIUM, CHROMIUM_ARGS, running_panel, tail

pytestmark = pytest.mark.skipif(not os.path.exists(CHROMIUM), reason="Debian chromium is not installed")

SCREEN = {"width": 1440, "height": 900}


def _finished_run(home: str) -> SyntheticRun:
    """A run that completed at step 30."""
    run = SyntheticRun(home, 30)
    for role in JOBS:
        with open(os.path.join(home, "jobs", run.job_ids[role], "exit.json"), "w") as f:
            json.dump({"stage": "COMPLETED", "code": 0, "message": "", "time": time.time()}, f)
    return run


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    home = tmp_path_factory.mktemp("page-home")
    run = _finished_run(str(home))
    with running_panel("app.py", {}, home, unset=("SPACE_ID", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")) as url:
        yield url, home, run


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


@pytest.fixture
def screen(app, browser, request):
    """A fresh page at 1440x900 on the panel, once its form is up (a full-page screenshot left on failure)."""
    url, home, _ = app
    page = browser.new_page(viewport=SCREEN)
    page.goto(url)
    page.locator("#launch-btn").wait_for(state="visible", timeout=60000)
    yield page
    report = getattr(request.node, "rep_call", None)
    if report is not None and report.failed:
        page.screenshot(path=os.path.join(str(home), f"{request.node.name}.png"), full_page=True)
        print(f"--- panel log tail:\n{tail(os.path.join(str(home), 'app.log'))}")
    page.close()


def box(page, elem_id: str) -> dict | None:
    """The element's box in the viewport (top, bottom), None where it is absent or hidden."""
    return page.evaluate("""(id) => {
        const e = document.getElementById(id);
        if (!e || e.offsetParent === null) return null;
        const r = e.getBoundingClientRect();
        return {top: r.top, bottom: r.bottom};
    }""", elem_id)


def on_first_screen(page, elem_id: str) -> bool:
    shown = box(page, elem_id)
    return shown is not None and shown["bottom"] <= SCREEN["height"] and page.evaluate("() => window.scrollY") == 0


def test_launch_and_the_settings_changed_first_are_on_the_first_screen(screen):
    for elem_id in ("preset", "f-name", "f-model", "f-max_steps", "f-learning_rate", "f-executor", "preview-btn",
                    "launch-btn"):
        assert on_first_screen(screen, elem_id), f"#{elem_id} at {box(screen, elem_id)}, below 900 px"
    labels = screen.locator("#f-executor label").all_inner_texts()
    assert [label.strip() for label in labels] == ["This machine", "Hugging Face Jobs"], labels
    values = screen.locator("#f-executor input").evaluate_all("(els) => els.map(e => e.value)")
    assert values == ["local", "hf_jobs"], "the words are labels; the spec keeps the executor's name"


def test_the_task_checks_tables_show_only_once_a_check_fills_them(screen):
    for elem_id in ("task-scores", "task-rows", "task-prompt"):
        assert box(screen, elem_id) is None, f"#{elem_id} shows before any check"
    screen.locator("#check-task-btn").click()
    screen.locator("#task-rows").wait_for(state="visible", timeout=120000)
    assert "prompt" in screen.locator("#task-rows").inner_text(), "the dataset's first rows, with their columns"
