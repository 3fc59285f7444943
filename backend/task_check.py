"""The pre-launch check of a run's task: can its dataset be read and shaped, and do its rewards score it?

Pure rules live in `RunSpec.validate`; this module does the checks that need I/O. It fetches what needs the
visitor's token here (the first rows of a Hub dataset through the dataset viewer, the model's tokenizer files),
then runs `runtime.check_task` in a separate process: a scratch folder as its working directory, the reward
code as `user_rewards.py` there, no token anywhere in its environment, and a time limit on each reward call.
The panel never runs visitor code in its own process. Problems come back as `FieldError`s, like validation.
"""

import json
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from dataclasses import dataclass, field

from huggingface_hub import snapshot_download

from backend.dataset_viewer import DatasetUnreadable, first_rows
from backend.runtime.redact import redact_tokens
from backend.runtime.task import is_local_file
from backend.runtime.tiny_model import BUILTIN_MODELS
from backend.spec import FieldError, RunSpec

BACKEND_DIR = os.path.dirname(os.path.abspath(__file__))
PREVIEW_ROWS = 5
SAMPLE_ROWS = 3
STATS_ROWS = 200            # rows measured for the prompt-length share (the viewer gives at most 100)
SETUP_TIMEOUT_S = 180.0     # imports, reading the file, building the tokenizer: before any reward code runs
MAX_EVENT_BYTES = 16 * 2**20       # one report line (a long prompt, rendered, is the largest part)
MAX_OUTPUT_LINE_BYTES = 64 * 2**10  # what the reward code prints: a line longer than this arrives in pieces
SECRET_NAME = re.compile(r"TOKEN|SECRET|PASSWORD|API_KEY|ACCESS_KEY|CREDENTIAL", re.IGNORECASE)
TOKENIZER_FILES = ["tokenizer*", "special_tokens_map.json", "vocab*", "merges.txt", "*.model", "*.tiktoken",
                   "chat_template*", "config.json"]
# The RunSpec fields a task check reads; the preview names only their problems.
TASK_FIELDS = ("model", "dataset", "dataset_config", "dataset_split", "prompt_column", "reward_columns",
               "system_prompt", "max_prompt_tokens", "rewards", "reward_weights", "reward_code",
               "overlong_max_tokens", "overlong_cache_tokens", "repetition_ngram_size", "repetition_max_penalty")
# Checks run visitor code: a few at a time, whatever the number of visitors.
_SLOTS = threading.BoundedSemaphore(2)


@dataclass
class TaskReport:
    """What the check found: problems by field, warnings, and what the preview shows."""
    errors: list[FieldError] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    columns: list[str] = field(default_factory=list)
    num_rows: int | None = None
    preview: list[dict] = field(default_factory=list)
    prompt_text: str | None = None
    prompt_messages: list[dict] | None = None
    prompt_tokens: int | None = None
    checked_rows: int = 0
    long_rows: int = 0
    longest: int | None = None
    samples: list[dict] = field(default_factory=list)          # {"row", "completion", "text"}
    scores: dict[str, list] = field(default_factory=dict)      # reward name -> one score per sample
    tracebacks: dict[str, str] = field(default_factory=dict)   # reward name -> the failing frames of its code
    output: str = ""                                           # what the reward code printed (tail)

    @property
    def ok(self) -> bool:
        return not self.errors


def task_field_errors(spec: RunSpec) -> list[FieldError]:
    """The validation problems of the task's own fields (the rest of the form does not stop a task preview)."""
    return [e for e in spec.validate() if e.field in TASK_FIELDS]


def secret_free_env(scratch: str) -> dict[str, str]:
    """The environment of the check process: no variable that could hold a secret, no Hub login, no network."""
    env = {k: v for k, v in os.environ.items() if not SECRET_NAME.search(k)}
    env.update(PYTHONPATH=BACKEND_DIR, HF_HOME=os.path.join(scratch, "hf-home"), HF_HUB_OFFLINE="1",
               HF_HUB_DISABLE_TELEMETRY="1", TOKENIZERS_PARALLELISM="false", PYTHONDONTWRITEBYTECODE="1",
               PYTHONUNBUFFERED="1")
    return env


def tokenizer_source(spec: RunSpec, token: str | None, report: TaskReport) -> str | None:
    """What the check process loads the tokenizer from: "builtin", a local folder, or None (with a warning)."""
    if spec.model in BUILTIN_MODELS:
        return "builtin"   # every builtin model's tokenizer encodes text byte by byte, as this one does
    path = os.path.expanduser(spec.model)
    if os.path.isdir(path):
        return os.path.abspath(path)
    try:
        return snapshot_download(spec.model, allow_patterns=TOKENIZER_FILES, token=token or False)
    except Exception as exc:
        report.warnings.append(f"could not fetch the tokenizer of {spec.model} ({type(exc).__name__}); the prompt "
                               "is shown without its chat template and token counts are unknown")
        return None


def check_task(spec: RunSpec, token: str | None, datasets_server: str, timeout_s: float = 15.0,
               python: str = sys.executable) -> TaskReport:
    """Check and preview `spec`'s task. `timeout_s` bounds each reward call (and the import of the code)."""
    report = TaskReport()
    request = {"spec": spec.to_dict(), "rows": None, "file": None, "preview_rows": PREVIEW_ROWS,
               "sample_rows": SAMPLE_ROWS, "stats_rows": STATS_ROWS}
    if is_local_file(spec.dataset):
        request["file"] = os.path.abspath(os.path.expanduser(spec.dataset))
    elif not spec.dataset.startswith("builtin:"):
        try:
            viewer = first_rows(datasets_server, spec.dataset, spec.dataset_config, spec.dataset_split, STATS_ROWS,
                                token)
        except DatasetUnreadable as exc:
            report.errors.append(FieldError("dataset", redact_tokens(str(exc), (token or "",))))
            return report
        request.update(rows=viewer.rows, num_rows=viewer.num_rows_total, columns=viewer.columns)
    request["tokenizer"] = tokenizer_source(spec, token, report)
    with _SLOTS:
        _run_check_process(request, spec.reward_code, python, timeout_s, report)
    return report


def _run_check_process(request: dict, code: str, python: str, timeout_s: float, report: TaskReport) -> None:
    scratch = tempfile.mkdtemp(prefix="grpo-task-check-")
    try:
        with open(os.path.join(scratch, "user_rewards.py"), "w") as f:
            f.write(code)
        proc = subprocess.Popen([python, "-m", "runtime.check_task"], cwd=scratch, env=secret_free_env(scratch),
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                start_new_session=True)
        try:
            _converse(proc, request, timeout_s, report)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _converse(proc: subprocess.Popen, request: dict, timeout_s: float, report: TaskReport) -> None:
    events: queue.Queue = queue.Queue()
    stderr: deque = deque(maxlen=40)
    readers = [threading.Thread(target=_pump, args=(proc.stdout, events.put, MAX_EVENT_BYTES), daemon=True),
               threading.Thread(target=_pump, args=(proc.stderr, lambda line: line is None or stderr.append(line),
                                                    MAX_OUTPUT_LINE_BYTES), daemon=True)]
    for reader in readers:
        reader.start()
    try:
        proc.stdin.write(json.dumps(request, default=str).encode())
        proc.stdin.close()
    except BrokenPipeError:
        pass
    deadline, calling, done = time.monotonic() + SETUP_TIMEOUT_S, None, False
    while not done:
        try:
            line = events.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            _timed_out(calling, request["spec"]["rewards"], timeout_s, report)
            break
        if line is None:
            break
        try:
            event = json.loads(line)
        except ValueError:
            continue   # not a report line (it would take a deliberate write to the report's descriptor)
        done = event["event"] == "done"
        if event["event"] == "calling":
            calling, deadline = event["name"], time.monotonic() + timeout_s
        _apply(event, report)
    if proc.poll() is None and not done:
        os.killpg(proc.pid, signal.SIGKILL)   # timed out: stop it now, so the readers see the end of its output
    if not done and not report.errors:
        report.errors.append(FieldError(_field_of(calling, request["spec"]["rewards"]),
                                        "the check process stopped before it finished: "
                                        + (" ".join(list(stderr)[-3:]) or "no output")))
    for reader in readers:
        reader.join(timeout=2)
    report.output = redact_tokens("\n".join(stderr))


def _pump(stream, put, max_bytes: int) -> None:
    for raw in iter(lambda: stream.readline(max_bytes), b""):
        put(raw.decode(errors="replace").rstrip("\n"))
    put(None)


def _field_of(calling: str | None, chosen: list[str]) -> str:
    """The field to blame for what the check process was doing: reading data, or calling one of the rewards."""
    if calling is None:
        return "dataset"
    return "rewards" if calling in chosen else "reward_code"


def _timed_out(calling: str | None, chosen: list[str], timeout_s: float, report: TaskReport) -> None:
    if calling is None:
        report.errors.append(FieldError("dataset", f"reading the dataset and the tokenizer took over "
                                                   f"{SETUP_TIMEOUT_S:.0f} s"))
        return
    report.errors.append(FieldError(_field_of(calling, chosen), f"{calling} did not return within {timeout_s:g} s "
                                                                f"on {len(report.samples)} sample completions "
                                                                "(an endless loop?)"))


def _apply(event: dict, report: TaskReport) -> None:
    kind = event["event"]
    if kind == "data":
        report.errors += [FieldError(f, redact_tokens(m)) for f, m in event.get("errors", [])]
        report.warnings += [redact_tokens(w) for w in event.get("warnings", [])]
        for name in ("columns", "num_rows", "preview", "prompt_text", "prompt_messages", "prompt_tokens",
                     "checked_rows", "long_rows", "longest"):
            if event.get(name) is not None:
                setattr(report, name, event[name])
    elif kind == "samples":
        report.samples = event["samples"]
    elif kind == "scores":
        report.scores[event["name"]] = event["scores"]
        if event["scores"] and all(score is None for score in event["scores"]):
            report.warnings.append(f"{event['name']} skipped every sample (it returned None): TRL does that when it "
                                   "cannot parse the reference answer; check the mapped column's values")
    elif kind == "skipped":
        report.warnings.append(f"{event['name']}: {event['reason']}")
    elif kind == "failed":
        report.errors.append(FieldError(event["field"], redact_tokens(event["message"])))
        if event.get("traceback"):
            report.tracebacks[event["name"]] = redact_tokens(event["traceback"])
