"""The task check's worker: the only process that runs the visitor's code (`python -m runtime.check.check_task
--worker`). It reads its calls from stdin and answers each on what was its stdout, while whatever the code prints
goes to stderr.
"""

import importlib
import json
import os
import sys
import traceback
import types

from ..layout import USER_REWARDS_MODULE
from ..records import CHECK_FAILED, CHECK_IMPORTED, CHECK_SCORES, CHECK_SKIPPED
from ..rewards import TRL_REWARDS, RewardFunctionError, UserReward, checked_scores, reward_functions
from ..spec_file import SpecFile
from ..user_code import code_traceback


def trainer_kwargs(spec: SpecFile, kwargs: dict) -> dict:
    """`kwargs` plus what only GRPOTrainer passes (TRL's async trainer does not)."""
    if spec.get("mode") == "distributed":
        return kwargs
    state = types.SimpleNamespace(global_step=0, max_steps=spec.get("max_steps"), epoch=0.0, log_history=[])
    return {**kwargs, "trainer_state": state, "log_extra": lambda *a, **k: None, "log_metric": lambda *a, **k: None}


def your_code_traceback(error: BaseException) -> tuple[str, int | None]:
    """The frames of the run's own code in the error's traceback, and the last such line number."""
    found = code_traceback("".join(traceback.format_exception(error)))
    return found or (f"{type(error).__name__}: {error}", None)


def run_call(op: str, name: str, spec: SpecFile, kwargs: dict, expected: int) -> dict:
    if op == "builtin":
        try:
            return {"event": CHECK_SCORES, "scores": checked_scores(
                name, reward_functions([name], spec)[0](**kwargs), expected, allow_none=True)}
        except ImportError as exc:
            if name in TRL_REWARDS:
                return {"event": CHECK_SKIPPED, "reason": f"not previewed here ({exc}); it runs in the job"}
            return {"event": CHECK_FAILED, "message": f"{name}: {type(exc).__name__}: {exc}"}
        except Exception as exc:
            return {"event": CHECK_FAILED, "message": f"{name} failed on the sample rows: {type(exc).__name__}: {exc}"}
    if op == "import":
        try:
            importlib.import_module(USER_REWARDS_MODULE)
            return {"event": CHECK_IMPORTED}
        except BaseException as exc:   # SystemExit and KeyboardInterrupt too: it is someone's code
            tb, line = your_code_traceback(exc)
            return {"event": CHECK_FAILED, "traceback": tb, "message": f"importing your code raised "
                    f"{type(exc).__name__}: {exc}" + (f" (line {line})" if line else "")}
    try:
        return {"event": CHECK_SCORES, "scores": checked_scores(name, UserReward(name)(**kwargs), expected)}
    except BaseException as exc:
        tb, line = your_code_traceback(exc)
        message = str(exc) if isinstance(exc, RewardFunctionError) else (
            f"reward function {name!r} raised {type(exc).__name__}: {exc}")
        return {"event": CHECK_FAILED, "traceback": tb, "message": message + (f" (line {line})" if line else "")}


def worker() -> None:
    answers = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)             # what the code prints goes to stderr, not into the answers
    sys.stdout = sys.stderr
    init = json.loads(sys.stdin.readline())
    spec, expected = init["spec"], init["expected"]
    kwargs = trainer_kwargs(spec, init["kwargs"])
    sys.path.insert(0, os.getcwd())
    for line in sys.stdin:
        call = json.loads(line)
        answer = run_call(call["op"], call["name"], spec, kwargs, expected)
        answers.write(json.dumps({"id": call["id"], **answer}, default=str) + "\n")
