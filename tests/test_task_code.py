"""Your own reward code: read without running it (RunSpec.validate), then run before launch in a separate process
with no token and a time limit. Every bad case is refused with a message naming reward_code, and nothing is
launched or written."""

import base64
import json
import multiprocessing
import os
import pickle
import subprocess
import sys

import pytest

from backend.plan.spec import RunSpec
from backend.task.check import check_task
from tests.helpers import files_under

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GOOD = '''
def short(completions, **kwargs) -> list[float]:
    return [1.0 if len(c[0]["content"]) < 10 else 0.0 for c in completions]
'''


def _code_errors(code: str, **overrides) -> list[str]:
    return [e.message for e in RunSpec(reward_code=code, **overrides).validate() if e.field == "reward_code"]


# ---- read, not run: RunSpec.validate

@pytest.mark.parametrize("code,fragment", [
    ("def f(completions, **kwargs):\n    return [1.0 for c in completions\n", "line 2: syntax error"),
    ("x = 1\n\ndef _helper(completions, **kwargs):\n    return []\n", "defines no reward function"),
    ("def f(completions):\n    return []\n", "line 1: f has no **kwargs"),
    ("def f(completions, answer, **kwargs):\n    return []\n", "f needs 'answer', which TRL does not pass"),
    ("def f(completions, /, **kwargs):\n    return []\n", "positional-only"),
    ("async def f(completions, **kwargs):\n    return []\n", "f is async"),
    ("def f(completions, **kw):\n    return []\n\ndef f(completions, **kw):\n    return []\n",
     "line 4: f is defined twice"),
    ("def digits(completions, **kw):\n    return []\n", "digits is already a reward name"),
], ids=["syntax", "no-function", "no-kwargs", "unknown-argument", "positional-only", "async", "twice", "clash"])
def test_code_that_trl_could_not_call_is_refused_with_its_line(code, fragment):
    errors = _code_errors(code)
    assert any(fragment in e for e in errors), errors


def test_a_mapped_column_may_be_a_required_argument_and_helpers_are_not_rewards():
    code = "def _norm(x):\n    return x.strip()\n\ndef exact(completions, answer, **kwargs):\n    return []\n"
    spec = RunSpec(reward_code=code, reward_columns=["answer=solution"], rewards=[])
    assert spec.validate() == [] and spec.reward_names == ["exact"]


def test_reward_weights_name_the_runs_rewards():
    spec = RunSpec(reward_code=GOOD, reward_weights={"short": 2.0, "digits": 0.5})
    assert spec.validate() == [] and spec.reward_names == ["digits", "short"]
    errors = RunSpec(reward_code=GOOD, reward_weights={"shrot": 2.0}).validate()
    assert [(e.field, "no reward named shrot" in e.message) for e in errors] == [("reward_weights", True)]
    assert RunSpec.from_dict({"reward_weights": "digits=1, format=0.25"}).reward_weights == {"digits": 1.0,
                                                                                            "format": 0.25}


# ---- run before launch: a separate process, no token, a time limit

RUN_BAD = [
    ("def f(completions, **kwargs):\n    return [1 / 0 for c in completions]\n",
     "reward function 'f' raised ZeroDivisionError: division by zero (line 2)"),
    ("def f(completions, **kwargs):\n    return [1.0]\n", "returned 1 scores for 12 completions"),
    ("def f(completions, **kwargs):\n    return [float('nan')] * len(completions)\n",
     "returned nan (float) at index 0"),
    ("def f(completions, **kwargs):\n    return ['good'] * len(completions)\n", "returned 'good' (str) at index 0"),
    ("def f(completions, **kwargs):\n    return [None] * len(completions)\n",
     "returned None (NoneType) at index 0; return a float for every completion: 0.0 for one your code cannot judge"),
    ("def f(completions, **kwargs):\n    return 1.0\n",
     "returned float, not a list of floats; return one float per completion, a list of len(completions)"),
    ("def f(completions, **kwargs):\n    return {'score': [1.0] * len(completions)}\n",
     "returned dict, not a list of floats; return one float per completion, a list of len(completions)"),
    ("import no_such_package\n\ndef f(completions, **kwargs):\n    return []\n",
     "importing your code raised ModuleNotFoundError: No module named 'no_such_package' (line 1)"),
    ("def f(completions, **kwargs):\n    while True:\n        pass\n", "f did not return within 2 s"),
]


pytestmark = [pytest.mark.integration, pytest.mark.panel_settings(task_check_timeout_s=2.0)]


@pytest.mark.parametrize("code,fragment", RUN_BAD,
                         ids=["raises", "wrong-length", "nan", "string", "none", "not-a-list", "dict", "import",
                              "forever"])
def test_code_that_fails_on_sample_completions_is_refused_and_nothing_is_launched(panel, code, fragment):
    message, run_id = panel.launch({"reward_code": code, "rewards": []})
    assert run_id is None and "nothing was launched" in message
    assert "**reward_code**" in message and fragment in message, message
    assert panel.local.list_jobs() == []
    assert files_under(os.path.join(panel.settings.home, "buckets")) == []


def test_a_raising_reward_shows_its_own_frames_and_what_it_printed(panel):
    code = "def f(completions, **kwargs):\n    print('scoring', len(completions))\n    return [completions[99]]\n"
    report = panel.check_task({"reward_code": code, "rewards": []})
    assert [e.field for e in report.errors] == ["reward_code"]
    assert report.tracebacks["f"].splitlines() == [
        "Traceback (your code, most recent call last):", '  File "user_rewards.py", line 3, in f',
        "    return [completions[99]]", "IndexError: list index out of range"]
    assert report.output == "scoring 12", "what the code printed is shown, and kept out of the report's own data"


def test_good_code_is_scored_on_real_rows_with_sample_completions(panel):
    report = panel.check_task({"reward_code": GOOD, "rewards": ["digits"]})
    assert report.ok, report.errors
    assert set(report.scores) == {"digits", "short"} and len(report.samples) == 12
    by_kind = {s["completion"]: score for s, score in zip(report.samples, report.scores["short"])}
    assert by_kind["empty"] == 1.0 and by_kind["reasoned, boxed answer"] == 0.0


def test_the_code_runs_in_another_process_with_no_token_anywhere(tmp_path, monkeypatch):
    token = "hf_" + "S3cretTokenValue" * 2
    monkeypatch.setenv("HF_TOKEN", token)
    monkeypatch.setenv("MY_SERVICE_TOKEN", "another-secret-value")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))   # where a `hf auth login` token would be
    (tmp_path / "hf-home").mkdir()
    (tmp_path / "hf-home" / "token").write_text(token)
    code = """import base64, json, os
from huggingface_hub import get_token

def spy(completions, **kwargs):
    seen = {"pid": os.getpid(), "env": dict(os.environ), "hub_token": get_token()}
    print("SEEN", base64.b64encode(json.dumps(seen).encode()).decode())
    return [0.0] * len(completions)
"""
    spec = RunSpec(reward_code=code, rewards=[]).check()
    report = check_task(spec, token, "http://127.0.0.1:9", timeout_s=10)
    assert report.ok, report.errors
    seen = json.loads(base64.b64decode(report.output.split("SEEN ", 1)[1].split()[0]))
    assert seen["pid"] != os.getpid()
    assert [k for k in seen["env"] if "TOKEN" in k and k != "TOKENIZERS_PARALLELISM"] == []
    assert token not in json.dumps(seen) and "another-secret-value" not in json.dumps(seen)
    assert seen["hub_token"] is None, "no Hub login either"


def test_user_rewards_pickle_into_a_spawned_process_as_the_async_rollout_worker_needs(tmp_path):
    """TRL's async trainer sends its reward functions to a spawned child: they must pickle by reference."""
    (tmp_path / "user_rewards.py").write_text(GOOD)
    code = f"""
import multiprocessing, pickle, sys
sys.path[:0] = [{str(tmp_path)!r}, {os.path.join(ROOT, 'backend')!r}]
from runtime.rewards import UserReward, Weighted
from tests.test_task_code import call_in_child
if __name__ == "__main__":
    rewards = [UserReward("short"), Weighted(UserReward("short"), 0.5)]
    pickle.dumps(rewards)
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(1) as pool:
        print(pool.map(call_in_child, rewards))
"""
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                            env={**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}"})
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == "[[1.0, 0.0], [0.5, 0.0]]"


def call_in_child(reward) -> list:
    assert multiprocessing.current_process().name != "MainProcess"
    return reward(completions=[[{"content": "short"}], [{"content": "much longer than ten"}]])


def test_rewards_round_trip_through_pickle_with_their_names():
    from backend.runtime.rewards import UserReward, Weighted

    weighted = pickle.loads(pickle.dumps(Weighted(UserReward("short"), 2.0)))
    assert weighted.__name__ == "short" and weighted.reward.module == "user_rewards"


def test_without_trl_its_rewards_are_skipped_with_a_note(tmp_path):
    """A Space installs the panel without TRL (it needs torch): the check says so instead of refusing the run."""
    from backend.task.check import TaskReport, _apply

    shadow = tmp_path / "no-trl" / "trl"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError(\"No module named 'trl'\")\n")
    call = ("import json; from runtime.check.reward_worker import run_call; "
            "print(json.dumps(run_call('builtin', 'think_format_reward', {'rewards': []}, "
            "{'completions': [[{'content': 'x'}]]}, 1)))")
    done = subprocess.run([sys.executable, "-c", call], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": f"{tmp_path / 'no-trl'}{os.pathsep}{ROOT}/backend"})
    answer = json.loads(done.stdout.strip().splitlines()[-1])
    report = TaskReport()
    _apply({**answer, "name": "think_format_reward"}, report)
    assert report.ok and report.scores == {}
    assert report.warnings == ["think_format_reward: not previewed here (No module named 'trl'); it runs in the job"]


def test_a_failed_event_names_the_reward_and_its_frames_in_both_trainers(tmp_path, monkeypatch):
    """Colocated, the reward's error reaches the trainer itself; async, TRL's rollout worker passes it on as text
    inside a RuntimeError (type, message and the child's traceback)."""
    import traceback

    from backend.runtime.rewards import UserReward
    from backend.runtime.trainer.common import failure_fields

    token = "hf_" + "Q" * 30
    (tmp_path / "user_rewards.py").write_text(
        "import os\n\n\ndef bad(completions, **kwargs):\n    raise ValueError('token ' + os.environ['HF_TOKEN'])\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("HF_TOKEN", token)
    try:
        UserReward("bad")(completions=[["x"]])
    except Exception as error:
        colocated = failure_fields(error)
        child = RuntimeError(f"{type(error).__name__}: {error}\n{traceback.format_exc()}")
    try:
        raise RuntimeError("Rollout worker child has failed; see chained exception.") from child
    except RuntimeError as error:
        distributed = failure_fields(error)
    sys.modules.pop("user_rewards", None)   # imported from this test's folder: no other test may find it
    reason = "RewardFunctionError: reward function 'bad' raised ValueError: token hf_***"
    assert colocated["error"] == reason
    assert distributed["error"] == ("RuntimeError: Rollout worker child has failed; see chained exception. "
                                    f"(cause: RuntimeError: {reason})")
    frames = ['  File "user_rewards.py", line 5, in bad', "    raise ValueError('token ' + os.environ['HF_TOKEN'])",
              "ValueError: token hf_***"]
    for fields in (colocated, distributed):
        assert fields["code_traceback"].splitlines()[1:] == frames
        assert token not in json.dumps(fields), "the job's token is masked in what goes into the bucket"
