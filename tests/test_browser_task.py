"""Your own task in a real browser: write a reward in the editor, preview its sample scores, launch, and see
its series on the dashboard. The same real `python app.py` process and Debian chromium as test_browser.py."""

import json
import os

import pytest

from tests import test_browser as shared
from tests.browser_helpers import CHROMIUM, inner_text, plot_points, set_number, wait_for_launch_answer

# The same fixtures (this module gets its own panel process): pytest finds them by name in the module.
app_home, app_url, page = shared.app_home, shared.app_url, shared.page

pytestmark = [pytest.mark.browser, pytest.mark.full,
              pytest.mark.skipif(not os.path.exists(CHROMIUM), reason="Debian chromium is not installed")]
REWARD = '''def short_answer(completions, **kwargs) -> list[float]:
    """1.0 for an answer of at most 12 characters."""
    return [1.0 if len(c[0]["content"]) <= 12 else 0.0 for c in completions]
'''


def _task_message(page) -> str:
    page.wait_for_function("() => /Task checked|Fix these/.test(document.querySelector('#task-msg').innerText)",
                           timeout=60000)
    return inner_text(page, "task-msg")


def _no_reference_column(page) -> None:
    """The form on a preset whose reward reads no reference column (the default's exact_answer reads `answer`), so a
    dataset of other columns is checked as it is."""
    page.locator("#preset input").first.click()
    page.get_by_role("option", name="Tiny reward-hacking demo (CPU)").click()
    page.wait_for_function("() => document.querySelector('#f-dataset input')?.value === 'builtin:count-to-ten'",
                           timeout=30000)


def _write_code(page, code: str) -> None:
    editor = page.locator("#f-reward_code .cm-content")
    editor.click()
    page.keyboard.press("Control+A")
    page.keyboard.press("Delete")
    editor.fill(code)


def test_write_a_reward_preview_its_scores_and_launch(page):
    page.locator("#preset input").first.click()
    page.get_by_role("option", name="Tiny task: your reward code on a JSONL file (CPU)").click()
    page.wait_for_function("() => document.querySelector('#f-dataset input')?.value.endsWith('tiny-math.jsonl')",
                           timeout=30000)

    # A reward that does not return a list is refused by the check, naming the field.
    _write_code(page, "def broken(completions, **kwargs):\n    return 1.0\n")
    page.locator("#f-reward_weights input, #f-reward_weights textarea").first.fill("")
    page.locator("#check-task-btn").click()
    message = _task_message(page)
    assert "reward_code" in message and "returned float, not a list of floats" in message, message

    _write_code(page, REWARD)
    page.locator("#check-task-btn").click()
    page.wait_for_function("() => document.querySelector('#task-msg').innerText.includes('Task checked')",
                           timeout=60000)
    message = inner_text(page, "task-msg")
    # The user's function and the preset's monitor-only `distinct_chars` (scored on the held-out set).
    assert "48 rows, columns question, solution" in message and "2 reward function(s) scored 12" in message, message
    assert "Answer with the number only." in page.locator("#task-prompt textarea").input_value()
    scores = inner_text(page, "task-scores")
    assert "short_answer" in scores and "bare answer" in scores and "1.000" in scores and "0.000" in scores
    folder = os.environ.get("DASHBOARD_SCREENSHOTS")
    if folder:
        page.locator("#task-section").screenshot(path=os.path.join(folder, "task.png"))

    page.get_by_text("GRPO training", exact=True).click()
    set_number(page, "f-max_steps", 6)
    page.locator("#launch-btn").click()
    assert "Launched run" in wait_for_launch_answer(page, timeout_ms=60000)
    page.wait_for_function("() => document.getElementById('run-status').innerText.includes('final adapter ready')",
                           timeout=240000)
    # One reward function weighing 1 is the mean reward: the chart names it instead of drawing it twice.
    # Plotly draws after the header's text: wait for the chart, then count.
    page.wait_for_function("() => { const el = document.querySelector('#reward-plot .js-plotly-plot');"
                           " const t = el && el.data ? el.data.find(d => d.name === 'mean reward') : null;"
                           " return t && t.x.length >= 6; }", timeout=30000)
    assert plot_points(page, "reward-plot", "mean reward") == 6, "the reward code's series, every step"
    assert "Reward (short_answer)" in inner_text(page, "reward-plot")


def test_upload_a_jsonl_and_preview_its_rows(page, tmp_path):
    data = tmp_path / "qa.jsonl"
    data.write_text('{"q": "Name a prime.", "a": "7"}\n{"q": "Name an even number.", "a": "4"}\n')
    _no_reference_column(page)
    page.locator("#dataset-upload").locator("xpath=..").locator("input[type=file]").set_input_files(str(data))
    page.wait_for_function("() => document.querySelector('#f-dataset input')?.value.endsWith('qa.jsonl')",
                           timeout=30000)
    page.locator("#f-prompt_column input, #f-prompt_column textarea").first.fill("q")
    page.locator("#check-task-btn").click()
    message = _task_message(page)
    assert "Task checked." in message and "2 rows, columns q, a" in message, message
    assert "Name a prime." in inner_text(page, "task-rows")


def test_column_names_and_printed_output_with_markup_show_as_text(page, tmp_path):
    """A dataset's column names and what reward code prints are a visitor's: an image, an HTML tag, a link and a
    line of backticks in them show as the characters they are; nothing is loaded from the host they name."""
    from tests.test_webhook import recording

    with recording() as host:
        at = f"http://127.0.0.1:{host.port}"
        columns = [f"![pixel]({at}/column.png)", f"[Sign in again]({at}/login)", f"<img src={at}/tag.png>"]
        rows = [{"q": "Name a prime.", **{c: "x" for c in columns}}, {"q": "Name an even number.",
                                                                     **{c: "y" for c in columns}}]
        data = tmp_path / "markup.jsonl"
        data.write_text("".join(json.dumps(r) + "\n" for r in rows))
        _no_reference_column(page)
        printed = f"```\\n**bold** ![leak]({at}/printed.png) <img src={at}/printed-tag.png>\\n````"
        _write_code(page, f'def loud(completions, **kwargs):\n    print("{printed}")\n'
                          "    return [0.0] * len(completions)\n")
        page.locator("#dataset-upload").locator("xpath=..").locator("input[type=file]").set_input_files(str(data))
        page.wait_for_function("() => document.querySelector('#f-dataset input')?.value.endsWith('markup.jsonl')",
                               timeout=30000)
        page.locator("#f-prompt_column input, #f-prompt_column textarea").first.fill("q")
        page.locator("#f-reward_weights input, #f-reward_weights textarea").first.fill("")
        page.locator("#check-task-btn").click()
        message = _task_message(page)
        assert "Task checked." in message, message
        for column in columns:
            assert column in message, (column, message)
        assert "**bold**" in message and f"![leak]({at}/printed.png)" in message and "````" in message, message
        assert page.locator("#task-msg img, #task-msg a, #task-rows img, #task-rows a").count() == 0
        page.wait_for_timeout(500)
        assert host.seen == [], "the page loaded something from a host named in the data or the output"
