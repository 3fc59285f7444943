"""Compare two real local runs in a real browser: two tiny demo runs launched from the form with different
learning rates, overlaid on the Compare tab, with a settings diff that lists exactly the learning rate.

Set COMPARE_SCREENSHOT=docs/compare.png to write the README's screenshot of the comparison.
"""

import os
import re

import pytest

from panel.runs_list import RUNS_HEADERS
from tests.browser_helpers import (
    CHROMIUM,
    open_runs_list,
    panel_page,
    running_panel,
    set_number,
    table_rows,
    text_of,
    wait_for_text,
)

pytestmark = [pytest.mark.browser, pytest.mark.full,
              pytest.mark.skipif(not os.path.exists(CHROMIUM), reason="Debian chromium is not installed")]
STEPS = 40


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    home = tmp_path_factory.mktemp("compare-home")
    with running_panel("app.py", {}, home, unset=("SPACE_ID", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")) as url:
        yield url, home


@pytest.fixture
def page(app, request):
    url, home = app
    with panel_page(url, home, request) as page:
        yield page


def _launch(page, learning_rate: str, before: str = "") -> str:
    """Launch the tiny reward-hacking demo with this learning rate and wait for its final adapter; `before` is the run
    launched last (the launch message shows it, with a busy overlay, until the new launch answers)."""
    page.get_by_role("tab", name="Launch").click()
    # The digits demo (no longer the default preset): its rule weighs distinct_chars, which the comparison shows.
    page.locator("#preset input").first.click()
    page.get_by_role("option", name="Tiny reward-hacking demo (CPU)").click()
    if not page.locator("#f-learning_rate input").first.is_visible():
        page.get_by_text("GRPO training", exact=True).click()
    set_number(page, "f-max_steps", STEPS)
    set_number(page, "f-learning_rate", learning_rate)
    page.locator("#launch-btn").click()
    page.wait_for_function("""(before) => {
        const m = /Launched run (\\S+)|not launched|nothing was launched/i.exec(
            document.getElementById('launch-msg').innerText);
        return m && m[1] !== before;
    }""", arg=before, timeout=60000)
    message = text_of(page, "launch-msg")
    match = re.search(r"Launched run (\S+)", message)
    assert match and match.group(1) != before, message
    run_id = match.group(1)
    page.wait_for_function("""(id) => {
        const t = document.getElementById('run-status').innerText;
        return t.includes(id) && t.includes('final adapter ready');
    }""", arg=run_id, timeout=300000)
    assert "Time:" in text_of(page, "run-cost") and "local runs cost nothing" in text_of(page, "run-cost")
    return run_id


def _traces(page, plot_id: str) -> list[dict]:
    return page.evaluate("""(id) => {
        const el = document.querySelector('#' + id + ' .js-plotly-plot');
        return el && el.data ? el.data.map(t => ({name: t.name, x: Array.from(t.x || [])})) : [];
    }""", plot_id)


def test_two_local_runs_with_different_learning_rates_are_overlaid_with_their_settings_diff(page):
    fast = _launch(page, "0.005")
    slow = _launch(page, "0.001", before=fast)
    wait_for_text(page, "runs-table", re.escape(slow))

    page.get_by_role("tab", name="Compare").click()
    picker = page.locator("#compare-pick input").first
    for run_id in (fast, slow):
        picker.click()
        page.get_by_role("option", name=run_id).click()
    page.locator("#compare-btn").click()
    wait_for_text(page, "compare-note", "2 runs; 1 setting")
    page.wait_for_function("() => { const el = document.querySelector('#compare-reward .js-plotly-plot');"
                           " return el && el.data && el.data.length === 2; }", timeout=30000)
    for plot in ("compare-reward", "compare-step-time", "compare-throughput"):
        traces = _traces(page, plot)
        assert [t["name"].split(" · ")[1] for t in traces] == [fast, slow], (plot, traces)
        assert all(len(t["x"]) == STEPS for t in traces), (plot, [len(t["x"]) for t in traces])
    assert all(t["x"][-1] == STEPS for t in _traces(page, "compare-reward"))

    rows = table_rows(page, "compare-diff")
    assert rows == [["learning_rate", "0.005", "0.001"]], rows
    # The outcome: each run's held-out score by version under its own best-by rule, from the base model (v0) on,
    # and each run's best version listed.
    lines = [t for t in _traces(page, "compare-heldout") if not t["name"].startswith("best: ")]
    assert [t["name"].split(" · ")[1] for t in lines] == [fast, slow], lines
    assert all(t["x"][0] == 0 and t["x"][-1] == STEPS for t in lines), [t["x"] for t in lines]
    best = table_rows(page, "compare-best")
    assert [r[0] for r in best] == [fast, slow], best
    for row in best:
        assert row[1] == "held-out 1 x digits + 1 x distinct_chars" and re.fullmatch(r"\d\.\d{3}", row[2]), row
        assert re.fullmatch(r"v\d+|none beats the base model", row[3]) and row[5] == "2", row
    headers = page.evaluate("() => Array.from(document.querySelectorAll('#compare-diff [role=columnheader]'))"
                            ".map(c => c.getAttribute('title'))")
    assert headers == ["setting", fast, slow], headers
    shot = os.environ.get("COMPARE_SCREENSHOT")
    if shot:
        page.screenshot(path=shot, full_page=True)

    page.locator("#compare-x input[value='wall time']").check()
    page.wait_for_function("() => { const el = document.querySelector('#compare-reward .js-plotly-plot');"
                           " return el && el.layout.xaxis.title.text === 'wall time (min)'; }", timeout=30000)
    for trace in _traces(page, "compare-reward"):
        # Minutes since each run's spec was created (as on its dashboard): its first step comes after start-up.
        assert 0 < trace["x"][0] < 5 and trace["x"] == sorted(trace["x"]) and trace["x"][-1] > trace["x"][0], trace

    # The single-run dashboard's charts follow the x-axis choice too (a local run has no dollars: wall time).
    page.get_by_role("tab", name="Runs").click()
    wait_for_text(page, "run-status", re.escape(slow))
    for choice, title in (("wall time", "wall time (min)"), ("dollars", "wall time (min) (local runs cost nothing)")):
        page.locator(f"#x-axis input[value='{choice}']").check()
        page.wait_for_function("(t) => { const el = document.querySelector('#reward-plot .js-plotly-plot');"
                               " return el && el.layout.xaxis.title.text === t; }", arg=title, timeout=30000)
    mean = next(t for t in _traces(page, "reward-plot") if t["name"] == "mean reward")
    assert mean["x"][0] >= 0 and len(mean["x"]) == STEPS and mean["x"][-1] > mean["x"][0], mean

    # The runs list shows each run's best held-out score and version, as the Compare tab ranks them.
    open_runs_list(page)
    column = RUNS_HEADERS.index("best held-out")
    listed = {r[0]: r for r in table_rows(page, "runs-table") if r}
    for row in best:
        want = f"{row[4]} · {row[3]}" if row[3].startswith("v") else "none beats base"
        assert listed[row[0]][column] == want, (row, listed[row[0]])
