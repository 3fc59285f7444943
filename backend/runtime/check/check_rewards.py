"""The task check's reward calls, from the harness's side: every reward function called in the worker process
(reward_worker.py) on the sample rows x sample completions, each call timed, and only well-formed answers relayed
into the report.
"""

import json
import math
import os
import queue
import secrets
import subprocess
import sys
import threading
import time

from ..records import CHECK_CALLING, CHECK_FAILED, CHECK_IMPORTED, CHECK_SAMPLES, CHECK_SCORES, CHECK_SKIPPED
from ..redact import is_secret_env_name
from ..spec_file import SpecFile
from ..task import parse_reward_columns
from ..user_code import FILENAME, reward_function_names
from .check_protocol import Channel

MAX_MESSAGE_CHARS = 4000
MAX_TRACEBACK_CHARS = 20000


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


def reward_batch(spec: SpecFile, tasks: list[dict], tokenizer) -> tuple[dict, list[dict]]:
    """TRL's keyword arguments (JSON) for one call over the sample rows x sample completions, and a label per item."""
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
    return dict(prompts=prompts, completions=completions, completion_ids=ids, **columns), labels


class Worker:
    """The process that runs the reward functions: one call at a time, each answer tied to its call's own id."""

    def __init__(self, spec: SpecFile, kwargs: dict, expected: int):
        env = {k: v for k, v in os.environ.items() if not is_secret_env_name(k)}
        self.proc = subprocess.Popen([sys.executable, "-m", "runtime.check.check_task", "--worker"], env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=None, close_fds=True,
                                     text=True, bufsize=1)
        self.answers: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        self._send({"spec": spec, "kwargs": kwargs, "expected": expected})

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.answers.put(line)
        self.answers.put(None)

    def _send(self, message: dict) -> bool:
        try:
            self.proc.stdin.write(json.dumps(message, default=str) + "\n")
            self.proc.stdin.flush()
            return True
        except (BrokenPipeError, OSError):
            return False

    def call(self, op: str, name: str, timeout_s: float) -> dict | str:
        """The worker's answer to one call, "timeout", or "ended" (the worker is gone)."""
        call_id = secrets.token_hex(8)
        if not self._send({"id": call_id, "op": op, "name": name}):
            return "ended"
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                line = self.answers.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                return "timeout"
            if line is None:
                return "ended"
            try:
                answer = json.loads(line)
            except ValueError:
                continue
            if isinstance(answer, dict) and answer.get("id") == call_id:
                return answer

    def stop(self) -> int | None:
        if self.proc.poll() is None:
            self.proc.kill()
        return self.proc.wait()


def field_of(name: str, chosen: list[str], monitored: tuple = ()) -> str:
    return "rewards" if name in chosen else "monitor_rewards" if name in monitored else "reward_code"


def valid_answer(answer: dict, name: str, field: str, expected: int) -> dict:
    """The worker's answer as the report may show it, or a failure saying what was wrong with it."""
    kind = answer.get("event")
    if kind == CHECK_SCORES:
        scores = answer.get("scores")
        if (isinstance(scores, list) and len(scores) == expected and all(
                s is None or (isinstance(s, (int, float)) and not isinstance(s, bool) and math.isfinite(s))
                for s in scores)):
            return {"event": CHECK_SCORES, "name": name, "scores": scores}
    elif kind == CHECK_SKIPPED and isinstance(answer.get("reason"), str):
        return {"event": CHECK_SKIPPED, "name": name, "reason": answer["reason"][:MAX_MESSAGE_CHARS]}
    elif kind == CHECK_FAILED and isinstance(answer.get("message"), str):
        failed = {"event": CHECK_FAILED, "name": name, "field": field, "message": answer["message"][:MAX_MESSAGE_CHARS]}
        if isinstance(answer.get("traceback"), str):
            failed["traceback"] = answer["traceback"][:MAX_TRACEBACK_CHARS]
        return failed
    return {"event": CHECK_FAILED, "name": name, "field": field, "message": f"{name} answered the check with something "
            "that is not a result (did the code write to the check's own output?)"}


def check_rewards(request: dict, tasks: list[dict], tokenizer, channel: Channel, timeout_s: float) -> None:
    spec = request["spec"]
    kwargs, labels = reward_batch(spec, tasks[:request["sample_rows"]], tokenizer)
    channel.emit(event=CHECK_SAMPLES, samples=labels)
    monitored = tuple(spec.get("monitor_rewards") or ())
    calls = [("builtin", name, name) for name in (*spec["rewards"], *monitored)]
    code_names = reward_function_names(spec.get("reward_code") or "")
    if code_names:
        calls += [("import", FILENAME, f"import of {FILENAME}")] + [("user", n, n) for n in code_names]
    worker = Worker(spec, kwargs, len(labels))
    try:
        for op, name, calling in calls:
            field = field_of(name, spec["rewards"], monitored)
            channel.emit(event=CHECK_CALLING, name=calling)
            answer = worker.call(op, name, timeout_s)
            if answer == "timeout":
                channel.emit(event=CHECK_FAILED, name=name, field=field,
                             message=f"{calling} did not return within {timeout_s:g} s on {len(labels)} sample "
                                     "completions (an endless loop?)")
                return
            if answer == "ended":
                status = worker.stop()
                channel.emit(event=CHECK_FAILED, name=name, field=field,
                             message=f"the check process stopped before it finished: {calling} ended it (exit "
                                     f"status {status}); what it printed is below")
                return
            if op == "import" and answer.get("event") == CHECK_IMPORTED:
                continue
            answer = valid_answer(answer, name, field, len(labels))
            channel.emit(**answer)
            if op == "import":
                return
    finally:
        worker.stop()
