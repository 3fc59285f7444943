"""An outcome you can trust (issue 32): a task whose training reward can be gamed, trained for real on the tiny model.

The run: the *Tiny task* preset with three rewards of the user's own, `mostly_digits` (weight 1: "6666666666" scores
1), `right_answer` (weight 0: what the user wants) and `varied` (weight 0: share of distinct characters), a high
learning rate and 12 steps, so the policy learns to write one repeated digit within the test. In a real browser on
the real panel process: the base model is version 0 (the first row of evaluations, a row of the adapters table), the
reward-hacking alert is raised (header and an event), "best by right_answer" stars no hacked version (none beats the
base model, and the header says so), and the choice is changed back on the finished run, best/ republished each
time with the version it names. Bad choices are refused through Gradio's own request path, with nothing written.

Set OUTCOME_SCREENSHOTS=<folder> to keep the before/after screenshots of the header and the adapters table.
"""

import json
import os
import re

import pytest

from backend.runtime import layout, records
from panel.actions import Panel, Settings
from panel.presets import TINY_TASK, TINY_TASK_CODE, preset_values
from tests.browser_helpers import CHROMIUM, panel_page, running_panel, wait_for_text

pytestmark = [pytest.mark.browser, pytest.mark.full,
              pytest.mark.skipif(not os.path.exists(CHROMIUM), reason="Debian chromium is not installed")]

VARIED = '''

def varied(completions, **kwargs) -> list[float]:
    """Share of distinct characters: one character repeated scores low."""
    texts = [completion[0]["content"] for completion in completions]
    return [len(set(t)) / len(t) if t else 0.0 for t in texts]
'''
GAMED = dict(name="gamed", reward_code=TINY_TASK_CODE + VARIED, monitor_rewards=[],
             reward_weights="mostly_digits=1, right_answer=0, varied=0",
             max_steps=12, adapter_every=3, checkpoint_every=12, learning_rate=0.03)


@pytest.fixture(scope="module")
def gamed(tmp_path_factory):
    """The gamed run, trained to its end by a panel over `home`; then the panel process a browser opens."""
    home = tmp_path_factory.mktemp("outcome-home")
    panel = Panel(Settings(home=str(home), on_space=False, budget_check_s=0))
    try:
        result = panel.launch({**preset_values(TINY_TASK), **GAMED})
        assert result.run_id, result.message
        view = panel.view(result.run_id)
        status = panel.local.wait(view.jobs["trainer"].job_id, timeout=600)
        assert status.stage == "COMPLETED", (status, list(view.jobs["trainer"].logs)[-30:])
        run_dir = os.path.join(panel.local.bucket_root("local/grpo-runs"), "runs", result.run_id)
    finally:
        panel.shutdown()
    with running_panel("app.py", {"GRPO_PANEL_BUDGET_CHECK_S": "1"}, home,
                       unset=("SPACE_ID", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")) as url:
        yield url, home, result.run_id, run_dir


def evals(run_dir: str) -> dict[int, dict]:
    folder = os.path.join(run_dir, layout.EVALS_DIR)
    return {r["policy_version"]: r for name in sorted(os.listdir(folder))
            for r in map(json.loads, open(os.path.join(folder, name)).read().splitlines())}


def events(run_dir: str) -> list[dict]:
    folder = os.path.join(run_dir, layout.EVENTS_DIR)
    return [json.loads(line) for name in sorted(os.listdir(folder))
            for line in open(os.path.join(folder, name)).read().splitlines()]


def best_bytes(run_dir: str) -> bytes | None:
    path = os.path.join(run_dir, layout.BEST_DIR, "adapter_model.safetensors")
    return open(path, "rb").read() if os.path.exists(path) else None


def shot(page, name: str) -> None:
    folder = os.environ.get("OUTCOME_SCREENSHOTS")
    if folder:
        os.makedirs(folder, exist_ok=True)
        page.locator("#run-status").screenshot(path=os.path.join(folder, f"{name}-header.png"))
        page.locator("#adapters-table").screenshot(path=os.path.join(folder, f"{name}-adapters.png"))


def apply_best_by(page, text: str, expected: str) -> str:
    box = page.locator("#best-by textarea, #best-by input").first
    box.fill(text)
    page.locator("#best-by-btn").click()
    return wait_for_text(page, "best-by-msg", expected, 60000)


def test_the_gamed_run_shows_v0_raises_the_alert_and_best_by_right_answer_stars_no_hacked_version(gamed, request):
    url, home, run_id, run_dir = gamed
    scored = evals(run_dir)
    assert sorted(scored) == [0, 1, 2, 3, 4] and scored[0]["step"] == 0, "the base model first, as version 0"
    newest = scored[4]["rewards"]
    assert scored[4]["score"] - scored[0]["score"] >= 0.3, ("the policy gamed mostly_digits", scored)
    assert newest["varied"]["mean"] < scored[0]["rewards"]["varied"]["mean"] / 2, "while its answers lost variety"
    hacked = min(v for v in scored if v and scored[v]["score"] == max(r["score"] for r in scored.values()))
    assert best_bytes(run_dir) == open(os.path.join(run_dir, "adapters", layout.adapter_name(hacked),
                                                    "adapter_model.safetensors"), "rb").read(), (
        "by the default rule (the trained score) the trainer kept the hacked version")
    with panel_page(url, home, request) as page:
        page.get_by_role("tab", name="Runs").click()
        wait_for_text(page, "runs-table", re.escape(run_id))
        page.locator("#run-pick input").first.click()
        page.get_by_role("option", name=run_id).click()
        header = wait_for_text(page, "run-status", "reward hacking suspected", 60000)
        assert f"best {layout.adapter_name(hacked)}" in header and "by the trained rewards' weighted score" in header
        assert "monitor varied fell" in header and "from the base model (v0)" in header, header
        table = wait_for_text(page, "adapters-table", r"base model \(v0\)")
        assert "right_answer (monitor)" in table and "varied (monitor)" in table and "mostly_digits (×1)" in table
        assert table.count("★") == 1
        shot(page, "before")
        # The user's choice, from the page: what they want is the right answer.
        message = apply_best_by(page, "right_answer", "Best version now by held-out right_answer")
        assert "no version beats the base model" in message, message
        header = wait_for_text(page, "run-status", "no version beats the base model")
        assert "by held-out right_answer" in header and "none is starred" in header
        table = wait_for_text(page, "adapters-table", r"right_answer \(monitor\) ◆")
        assert "★" not in table, "the hacked version is no longer starred"
        assert best_bytes(run_dir) is None, "best/ holds nothing: no version to download or push as best"
        shot(page, "after")
        changed = [e for e in events(run_dir) if e["event"] == records.BEST_BY_CHANGED]
        assert [(e["best_by"], e["previous"], e["version"]) for e in changed] == [({"right_answer": 1.0}, {}, None)]
        alerts = [e for e in events(run_dir) if e["event"] == records.ALERT and e["kind"] == "reward-hacking"]
        assert len(alerts) == 1 and "varied" in alerts[0]["message"], "the alert is recorded once, as an event"
        # Changed back on the finished run: the trained score decides again, best/ republished with its version.
        message = apply_best_by(page, "", "Best version now by the trained rewards")
        assert f"{layout.adapter_name(hacked)} (1.000, base model " in message, message
        wait_for_text(page, "run-status", f"best {layout.adapter_name(hacked)}")
        assert best_bytes(run_dir) == open(os.path.join(run_dir, "adapters", layout.adapter_name(hacked),
                                                        "adapter_model.safetensors"), "rb").read()
        best = json.loads(open(os.path.join(run_dir, layout.BEST_DIR, layout.BEST_FILE)).read())
        assert best["policy_version"] == hacked and best["best_by"] == {}


def test_a_best_by_naming_no_held_out_reward_or_weighing_all_zero_is_refused_and_nothing_is_written(gamed):
    from gradio_client import Client

    url, _home, run_id, run_dir = gamed
    before = (len(events(run_dir)), best_bytes(run_dir))
    client = Client(url, verbose=False)
    try:
        for text, why in (("accuracy", ("no held-out reward named accuracy; the held-out rewards are mostly_digits, "
                                        "right_answer, varied")),
                          ("right_answer=0, varied=0", "the weights are all zero"),
                          ("right_answer=much", "the weight of right_answer is not a number")):
            message = client.predict(run_id, text, api_name="/on_best_by")[0]
            assert message.startswith("**Not changed.** best_by: ") and why in message, message
        message = client.predict("not-a-run", "right_answer", api_name="/on_best_by")[0]
        assert message.startswith("**Not changed.**"), message
    finally:
        client.close()
    assert (len(events(run_dir)), best_bytes(run_dir)) == before, "nothing recorded, best/ untouched"
