"""The pre-launch check of a run's task, in a process of its own: `python -m runtime.check_task < request.json`.

The panel starts it with a timeout and no token in its environment, in a scratch folder that holds the run's
reward code as `user_rewards.py`. It reads a few rows of the dataset (given in the request, or from a local
file, or a builtin set), shapes them as the trainer does (task.py), renders the first prompt with the model's
chat template, counts prompt tokens, then calls every reward function exactly as TRL would, with the loader the
trainer uses (rewards.py), on sample completions. It reports JSON lines on its stdout; whatever the reward code
prints goes to stderr. A `calling` line comes before each call, so the panel can time each one and name the
one that never returned.
"""

import importlib
import json
import os
import sys
import traceback
import types

from .layout import USER_REWARDS_MODULE
from .prompts import BUILTIN_PREFIX, builtin_rows
from .rewards import TRL_REWARDS, RewardFunctionError, UserReward, checked_scores, reward_functions
from .task import (
    TaskDataError,
    count_tokens,
    is_local_file,
    missing_columns,
    parse_reward_columns,
    read_file_rows,
    render_prompt,
    task_row,
)
from .tiny_model import build_tokenizer
from .user_code import FILENAME, code_traceback, reward_function_names

PREVIEW_CELL_CHARS = 300
MOST = 0.5   # prompts over the limit on more than this share of rows: refused, not just warned about


def sample_completions(solution) -> list[tuple[str, str]]:
    """(label, text) completions to score each sample row with: from a well-formed right answer to nothing."""
    answer = "42" if solution in (None, "") else str(solution)
    return [
        ("reasoned, boxed answer",
         f"<think>\nLet me work it out step by step.\n</think>\nThe answer is \\boxed{{{answer}}}."),
        ("bare answer", answer),
        ("unsure", "I am not sure."),
        ("empty", ""),
    ]


def load_rows(request: dict) -> tuple[list[dict], int | None]:
    spec, limit = request["spec"], request["stats_rows"]
    if request.get("rows") is not None:
        return request["rows"], request.get("num_rows")
    if is_local_file(spec["dataset"]):
        return read_file_rows(request["file"] or spec["dataset"], limit)
    if spec["dataset"].startswith(BUILTIN_PREFIX):
        rows = builtin_rows(spec["dataset"][len(BUILTIN_PREFIX):])
        return rows[:limit], len(rows)
    raise TaskDataError("no rows were given for a Hub dataset")


def load_tokenizer(source: str | None):
    if source is None:
        return None
    if source == "builtin":
        return build_tokenizer()
    from transformers import AutoTokenizer  # noqa: PLC0415 transformers loads slowly: only for a model's own tokenizer

    return AutoTokenizer.from_pretrained(source)


def _cell(value):
    text = value if isinstance(value, str) else json.dumps(value, default=str, ensure_ascii=False)
    return text if len(text) <= PREVIEW_CELL_CHARS else text[:PREVIEW_CELL_CHARS] + " ..."


def check_data(request: dict) -> tuple[dict, list[dict], object]:
    """The data report (columns, preview, the templated prompt, token counts, problems), task rows, tokenizer."""
    spec = request["spec"]
    report = {"errors": [], "warnings": [], "columns": [], "preview": [], "num_rows": None}
    try:
        rows, report["num_rows"] = load_rows(request)
    except (TaskDataError, ValueError, OSError) as exc:
        report["errors"].append(["dataset", f"cannot read {spec['dataset']}: {exc}"])
        return report, [], None
    if not rows:
        report["errors"].append(["dataset", f"{spec['dataset']} has no rows"])
        return report, [], None
    columns = request.get("columns") or list(dict.fromkeys(k for row in rows for k in row))
    report["columns"] = columns
    report["preview"] = [{k: _cell(row.get(k)) for k in columns} for row in rows[:request["preview_rows"]]]
    prompt_column = spec.get("prompt_column") or "prompt"
    mapped = parse_reward_columns(spec.get("reward_columns") or [])
    for field, column in missing_columns(columns, prompt_column, mapped):
        report["errors"].append([field, f"no column {column!r} in the dataset; its columns are {', '.join(columns)}"])
    if report["errors"]:
        return report, [], None
    tasks = []
    for i, row in enumerate(rows):
        try:
            tasks.append(task_row(row, prompt_column, mapped, spec.get("system_prompt") or ""))
        except (TaskDataError, KeyError) as exc:
            report["errors"].append(["prompt_column", f"row {i}: {exc}"])
            return report, [], None
    report["prompt_messages"] = tasks[0]["prompt"]
    tokenizer = _measure_prompts(request, tasks, report)
    return report, tasks, tokenizer


def _measure_prompts(request: dict, tasks: list[dict], report: dict):
    spec = request["spec"]
    try:
        tokenizer = load_tokenizer(request.get("tokenizer"))
    except Exception as exc:  # a tokenizer is a folder of files from anywhere: any failure is only a warning
        report["warnings"].append(f"could not load the tokenizer of {spec['model']} ({type(exc).__name__}: {exc}); "
                                  "prompts are shown without the chat template")
        return None
    if tokenizer is None:
        return None
    try:
        texts = [render_prompt(tokenizer, t["prompt"]) for t in tasks]
    except Exception as exc:
        report["errors"].append(["model", (f"the tokenizer of {spec['model']} cannot format a conversation "
                                           f"({type(exc).__name__}: {exc}); TRL needs a chat template")])
        return None
    counts = [count_tokens(tokenizer, text) for text in texts]
    limit = spec.get("max_prompt_tokens") or 0
    long_rows = sum(c > limit for c in counts) if limit else 0
    report.update(prompt_text=texts[0], prompt_tokens=counts[0], checked_rows=len(counts), longest=max(counts),
                  long_rows=long_rows)
    if long_rows:
        share = long_rows / len(counts)
        message = (f"{share:.0%} of the {len(counts)} rows checked ({long_rows}) have prompts longer than {limit} "
                   f"tokens (the longest has {max(counts)}); the trainer skips them. Raise max_prompt_tokens or "
                   "shorten the prompts or the system prompt")
        if share > MOST:
            report["errors"].append(["max_prompt_tokens", message])
        else:
            report["warnings"].append(message)
    return tokenizer


def reward_batch(spec: dict, tasks: list[dict], tokenizer) -> tuple[dict, list[dict]]:
    """TRL's keyword arguments for one call over the sample rows x sample completions, and one label per item."""
    mapped = parse_reward_columns(spec.get("reward_columns") or [])
    labels, prompts, completions, columns = [], [], [], {k: [] for k in mapped}
    for i, task in enumerate(tasks):
        for label, text in sample_completions(task.get("solution")):
            labels.append({"row": i, "completion": label, "text": text})
            prompts.append(task["prompt"])
            completions.append([{"role": "assistant", "content": text}])
            for key in mapped:
                columns[key].append(task[key])
    texts = [c[0]["content"] for c in completions]
    ids = ([tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts] if tokenizer is not None
           else [list(t.encode()) for t in texts])
    kwargs = dict(prompts=prompts, completions=completions, completion_ids=ids, **columns)
    if spec.get("mode") != "distributed":   # only GRPOTrainer passes these; TRL's async trainer does not
        kwargs.update(trainer_state=types.SimpleNamespace(global_step=0, max_steps=spec.get("max_steps"), epoch=0.0,
                                                          log_history=[]),
                      log_extra=lambda *a, **k: None, log_metric=lambda *a, **k: None)
    return kwargs, labels


def your_code_traceback(error: BaseException) -> tuple[str, int | None]:
    """The frames of the run's own code in the error's traceback, and the last such line number."""
    found = code_traceback("".join(traceback.format_exception(error)))
    return found or (f"{type(error).__name__}: {error}", None)


def check_rewards(request: dict, tasks: list[dict], tokenizer, emit) -> None:
    spec = request["spec"]
    kwargs, labels = reward_batch(spec, tasks[:request["sample_rows"]], tokenizer)
    emit(event="samples", samples=labels)
    for name in spec["rewards"]:
        emit(event="calling", name=name)
        try:
            scores = checked_scores(name, reward_functions([name], spec)[0](**kwargs), len(labels), allow_none=True)
        except ImportError as exc:
            if name in TRL_REWARDS:
                emit(event="skipped", name=name, reason=f"not previewed here ({exc}); it runs in the job")
                continue
            emit(event="failed", name=name, field="rewards", message=f"{name}: {type(exc).__name__}: {exc}")
            continue
        except Exception as exc:
            emit(event="failed", name=name, field="rewards",
                 message=f"{name} failed on the sample rows: {type(exc).__name__}: {exc}")
            continue
        emit(event="scores", name=name, scores=scores)
    if reward_function_names(spec.get("reward_code") or ""):
        _check_code(spec, kwargs, len(labels), emit)


def _check_code(spec: dict, kwargs: dict, expected: int, emit) -> None:
    sys.path.insert(0, os.getcwd())
    emit(event="calling", name=f"import of {FILENAME}")
    try:
        importlib.import_module(USER_REWARDS_MODULE)
    except BaseException as exc:   # SystemExit and KeyboardInterrupt too: it is someone's code
        tb, line = your_code_traceback(exc)
        emit(event="failed", name=FILENAME, field="reward_code", traceback=tb,
             message=f"importing your code raised {type(exc).__name__}: {exc}" + (f" (line {line})" if line else ""))
        return
    for name in reward_function_names(spec["reward_code"]):
        emit(event="calling", name=name)
        try:
            scores = UserReward(name)(**kwargs)
        except BaseException as exc:
            tb, line = your_code_traceback(exc)
            message = str(exc) if isinstance(exc, RewardFunctionError) else (
                f"reward function {name!r} raised {type(exc).__name__}: {exc}")
            emit(event="failed", name=name, field="reward_code", traceback=tb,
                 message=message + (f" (line {line})" if line else ""))
            continue
        emit(event="scores", name=name, scores=checked_scores(name, scores, expected))


def main() -> None:
    protocol = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)             # anything the checked code prints goes to stderr, not into the report
    sys.stdout = sys.stderr

    def emit(**event):
        protocol.write(json.dumps(event, default=str) + "\n")

    request = json.load(sys.stdin)
    report, tasks, tokenizer = check_data(request)
    emit(event="data", **report)
    if not report["errors"]:
        check_rewards(request, tasks, tokenizer, emit)
    emit(event="done")


if __name__ == "__main__":
    main()
