"""Real local runs of tasks of your own, launched through the panel as a user launches them (tiny builtin model,
three or four steps each): TRL's accuracy_reward and reward code on a math JSONL file, and a reward that raises
mid-run."""

import json
import math
import time

import pytest

from panel import chart_parts, charts, run_header
from panel.actions import Panel, Settings

pytestmark = [pytest.mark.integration, pytest.mark.full]

RUN_TIMEOUT_S = 240
MATH = [{"question": f"What is {a} + {b}?", "solution": str(a + b)} for a in range(1, 5) for b in range(1, 5)]
CODE = '''import re


def numeric(completions, **kwargs) -> list[float]:
    texts = [c[0]["content"] for c in completions]
    return [sum(ch.isdigit() for ch in t) / len(t) if t else 0.0 for t in texts]


def right_answer(completions, solution, **kwargs) -> list[float]:
    found = [re.search(r"\\d+", c[0]["content"]) for c in completions]
    return [1.0 if f and f.group() == s else 0.0 for f, s in zip(found, solution)]
'''
FLAKY = '''calls = 0


def flaky(completions, **kwargs):
    global calls
    calls += 1
    if calls > 2:   # the pre-launch check calls it once; the run's third step fails
        raise ValueError(f"boom at call {calls}")
    return [0.5] * len(completions)
'''


@pytest.fixture(scope="module")
def panel(tmp_path_factory):
    p = Panel(Settings(home=str(tmp_path_factory.mktemp("home")), on_space=False))
    yield p
    p.shutdown()


def _run(panel: Panel, form: dict):
    message, run_id = panel.launch({"max_steps": 3, "adapter_every": 3, "checkpoint_every": 100,
                                    "prompt_column": "question", **form})
    assert run_id, message
    view = panel.view(run_id)
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while not view.done and time.monotonic() < deadline:
        time.sleep(0.5)
        view.refresh()
    view.refresh()
    assert view.done, "the run did not end in time:\n" + "\n".join(list(view.jobs["trainer"].logs)[-40:])
    return view


@pytest.fixture(scope="module")
def math_run(panel, tmp_path_factory):
    path = tmp_path_factory.mktemp("data") / "math.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in MATH))
    return _run(panel, {"dataset": str(path), "reward_columns": "solution", "system_prompt": "Answer with a number.",
                        "rewards": ["accuracy_reward"], "reward_code": CODE,
                        "reward_weights": "numeric=0.5, right_answer=2"})


def test_reward_code_on_a_jsonl_file_trains_and_each_function_is_its_own_series(math_run):
    view = math_run
    assert view.stage == "COMPLETED", run_header.status_markdown(view)
    assert [r["step"] for r in view.metrics] == [1, 2, 3]
    for record in view.metrics:
        parts = {name: record[f"rewards/{name}"] for name in ("accuracy_reward", "numeric", "right_answer")}
        assert all(math.isfinite(v) for v in parts.values())
        # GRPOConfig.reward_weights: the reward is the weighted sum of the per-function means.
        weighted = parts["accuracy_reward"] + 0.5 * parts["numeric"] + 2 * parts["right_answer"]
        assert record["reward"] == pytest.approx(weighted, abs=1e-4)
    traces = {t["name"] for t in charts.reward_figure(view.table, chart_parts.ChartOptions())["data"]}
    assert {"accuracy_reward", "numeric", "right_answer", "mean reward"} <= traces
    code_file = view.store.read_bytes(f"runs/{view.run_id}/code/user_rewards.py").decode()
    assert code_file == CODE.strip(), "the code that ran is kept with the run"
    assert view.store.read_bytes(f"runs/{view.run_id}/data/math.jsonl").decode().count("\n") == len(MATH)


def test_trl_accuracy_reward_is_computed_on_a_math_jsonl_even_when_no_answer_is_right(math_run):
    scores = [r.get("rewards/accuracy_reward") for r in math_run.metrics]
    assert len(scores) == 3 and all(isinstance(s, float) and 0.0 <= s <= 1.0 for s in scores), scores


def test_a_reward_that_raises_mid_run_fails_the_run_with_its_traceback_on_the_dashboard(panel):
    view = _run(panel, {"dataset": "builtin:count-to-ten", "prompt_column": "prompt", "rewards": [],
                        "reward_code": FLAKY, "max_steps": 4})
    assert view.stage == "ERROR"
    [failed] = [e for e in view.events if e["event"] == "failed"]
    assert failed["error"] == "RewardFunctionError: reward function 'flaky' raised ValueError: boom at call 3"
    assert failed["code_traceback"].splitlines() == [
        "Traceback (your code, most recent call last):", '  File "user_rewards.py", line 8, in flaky',
        '    raise ValueError(f"boom at call {calls}")', "ValueError: boom at call 3"]
    status = run_header.status_markdown(view)
    assert "✗ Failed: **RewardFunctionError: reward function 'flaky' raised ValueError: boom at call 3**" in status
    assert 'File "user_rewards.py", line 8, in flaky' in status
    assert [r["step"] for r in view.metrics] == [1, 2], "the steps before the failure are kept"


def test_a_math_task_no_completion_of_which_is_ever_right_raises_the_no_learning_signal_alert(panel,
                                                                                             tmp_path_factory):
    """TRL's accuracy_reward on sums no random tiny model writes: every group scores all 0, every step. The alert
    fires while the run trains (recorded in its events) and the finished run's header still says so."""
    from backend.view import diagnose

    hard = [{"question": f"What is {a} + {b}?", "solution": str(a + b)} for a in (48213, 70117) for b in (51789, 9)]
    path = tmp_path_factory.mktemp("hard") / "hard.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in hard))
    message, run_id = panel.launch({"max_steps": 60, "adapter_every": 100, "checkpoint_every": 100,
                                    "dataset": str(path), "prompt_column": "question", "reward_columns": "solution",
                                    "rewards": ["accuracy_reward"]})
    assert run_id, message
    view = panel.view(run_id)
    fired = []
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while not view.done and time.monotonic() < deadline:
        time.sleep(0.5)
        view.refresh()
        fired += panel.watch.alerts(view)
    view.refresh()
    assert view.stage == "COMPLETED", run_header.status_markdown(view)
    assert all(r["reward"] == 0.0 and r["frac_reward_zero_std"] == 1.0 for r in view.metrics)
    assert [a.kind for a in fired] == ["no-signal"], fired
    recorded = [e for e in view.events if e.get("event") == "alert"]
    assert [e["kind"] for e in recorded] == ["no-signal"] and "num_generations" in recorded[0]["message"]
    status = run_header.status_markdown(view)
    assert "nothing is learned" in status and "Alert:" not in status, status
    assert len(view.metrics) >= diagnose.NO_SIGNAL_STEPS
