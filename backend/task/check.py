"""The pre-launch check of a run's task: can its dataset be read and shaped, and do its rewards score it?

Pure rules live in `RunSpec.validate`, which only reads the code (parse, signatures). This module does the
checks that need I/O. Here, in the panel, it fetches what needs the visitor's token (the first rows of a Hub
dataset through the dataset viewer, the model's tokenizer files) and builds the check's request; the part that
runs code runs elsewhere: `runtime.check.check_task` in the bubblewrap sandbox of `backend.task.sandbox` on a local
panel (`check_task`), or in a short CPU job in the visitor's own account on a panel that serves others
(`backend.task.check_job`). Both speak the same framed report (`runtime.check.check_protocol`), read here into a
`TaskReport`. Problems come back as `FieldError`s, like validation.
"""

import fnmatch
import json
import os
import queue
import secrets
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from dataclasses import dataclass, field

from huggingface_hub import snapshot_download

from backend.plan.spec import TASK_FIELDS, FieldError, RunSpec
from backend.runtime import records
from backend.runtime.check.check_data import TOKENIZER_FILES
from backend.runtime.check.check_protocol import Reassembler
from backend.runtime.redact import redact_tokens
from backend.runtime.task import is_local_file
from backend.runtime.tiny_model import BUILTIN_MODELS
from backend.runtime.user_code import reward_function_names
from backend.task.dataset_viewer import DatasetUnreadable, first_rows
from backend.task.sandbox import ALLOW_UNSANDBOXED_ENV, INSIDE_WORK, LIMITS, Sandbox, local_sandbox

PREVIEW_ROWS = 5
SAMPLE_ROWS = 3
STATS_ROWS = 200            # rows measured for the prompt-length share (the viewer gives at most 100)
SETUP_TIMEOUT_S = 180.0     # imports, reading the file, building the tokenizer: before any reward code runs
MAX_EVENT_BYTES = 16 * 2**20       # one report line (a long prompt, rendered, is the largest part)
MAX_OUTPUT_LINE_BYTES = 64 * 2**10  # what the reward code prints: a line longer than this arrives in pieces
CALL_MARGIN_S = 5.0         # per reward call, on top of its own limit (the harness enforces that one)
# The fields a check's answer may blame (anything else a check job's log claims is blamed on the code).
REPORT_FIELDS = frozenset({"dataset", "prompt_column", "reward_columns", "model", "max_prompt_tokens", "rewards",
                           "reward_code", "eval_split", "eval_file", "eval_rows", "monitor_rewards"})
SANDBOX_FIELD = "sandbox"   # what a check refused for want of a sandbox blames (no form field: the machine)
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
    held_out_rows: int | None = None                           # held-out rows checked, where the run has a set
    samples: list[dict] = field(default_factory=list)          # {"row", "completion", "text"}
    scores: dict[str, list] = field(default_factory=dict)      # reward name -> one score per sample
    tracebacks: dict[str, str] = field(default_factory=dict)   # reward name -> the failing frames of its code
    output: str = ""                                           # what the reward code printed (tail)
    check_job: str | None = None                               # the check job's id, where it ran in one
    cost_usd: float | None = None                              # what that job cost (price x time it ran)

    @property
    def ok(self) -> bool:
        return not self.errors


def task_field_errors(spec: RunSpec) -> list[FieldError]:
    """The validation problems of the task's own fields (the rest of the form does not stop a task preview)."""
    return [e for e in spec.validate() if e.field in TASK_FIELDS]


def tokenizer_source(spec: RunSpec, token: str | None, report: TaskReport) -> str | None:
    """What the check loads the tokenizer from: "builtin", a local folder, or None (with a warning)."""
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


def check_request(spec: RunSpec, token: str | None, datasets_server: str, report: TaskReport) -> dict | None:
    """What the check process is asked, with the rows of a Hub dataset read here; None (and errors) if unreadable."""
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
            return None
        request.update(rows=viewer.rows, num_rows=viewer.num_rows_total, columns=viewer.columns)
    return held_out_request(spec, token, datasets_server, request, report)


def held_out_request(spec: RunSpec, token: str | None, datasets_server: str, request: dict,
                     report: TaskReport) -> dict | None:
    """`request` with where the check reads the held-out set: a file's path, or a Hub split's first rows read here
    (a builtin set's, and rows held out of the dataset, the check takes itself)."""
    if spec.eval_source == "file":
        path = os.path.abspath(os.path.expanduser(spec.eval_file))
        if not os.path.isfile(path):
            report.errors.append(FieldError("eval_file", f"no file at {spec.eval_file}"))
            return None
        request["eval_file"] = path
    elif spec.eval_source == "split" and not spec.dataset.startswith("builtin:"):
        try:
            viewer = first_rows(datasets_server, spec.dataset, spec.dataset_config, spec.eval_split, STATS_ROWS,
                                token)
        except DatasetUnreadable as exc:
            report.errors.append(FieldError("eval_split", redact_tokens(str(exc), (token or "",))))
            return None
        request.update(eval_rows=viewer.rows, eval_columns=viewer.columns)
    return request


def calls_deadline_s(spec: RunSpec, timeout_s: float) -> float:
    """The longest the reward calls of a check may take in all (each has its own limit in the harness)."""
    calls = len(spec.rewards) + (1 + len(reward_function_names(spec.reward_code)) if spec.reward_code.strip() else 0)
    return (calls + 1) * (timeout_s + CALL_MARGIN_S)


def check_task(spec: RunSpec, token: str | None, datasets_server: str, timeout_s: float = 15.0,
               sandbox: Sandbox | None = None) -> TaskReport:
    """Check and preview `spec`'s task on this machine, its code in the sandbox. `timeout_s` bounds each reward
    call (and the import of the code)."""
    report = TaskReport()
    box = sandbox or local_sandbox()
    refusal = box.refusal()
    if refusal:     # fail closed: no sandbox, nothing run (unless the operator opted in)
        report.errors.append(FieldError(SANDBOX_FIELD, refusal))
        return report
    request = check_request(spec, token, datasets_server, report)
    if request is None:
        return report
    request["tokenizer"] = tokenizer_source(spec, token, report)
    with _SLOTS:
        run_in_sandbox(request, spec, timeout_s, report, box)
    return report


def run_in_sandbox(request: dict, spec: RunSpec, timeout_s: float, report: TaskReport, box: Sandbox) -> None:
    scratch = tempfile.mkdtemp(prefix="grpo-task-check-")
    try:
        binds = _stage_files(request, spec.reward_code, scratch, box)
        nonce = secrets.token_hex(16)
        request.update(nonce=nonce, limits=LIMITS, drop_uid=box.drop_uid, timeout_s=timeout_s)
        argv, env, cwd = box.command([sys.executable, "-m", "runtime.check.check_task"], scratch, binds)
        proc = subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, start_new_session=True)
        try:
            _converse(proc, request, nonce, calls_deadline_s(spec, timeout_s), report)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        if box.missing:
            report.warnings.append(f"The check ran without {', '.join(box.missing)} ({ALLOW_UNSANDBOXED_ENV} is "
                                   f"set): {box.reason}. Your code could reach what this machine's user can (files, "
                                   "processes, network).")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _stage_files(request: dict, code: str, scratch: str, box: Sandbox) -> dict[str, str]:
    """Put the code, the dataset file and the tokenizer where the check process finds them; returns the
    read-only binds (host path -> path inside)."""
    def inside(host: str, path: str) -> str:
        return path if box.bwrap else host

    binds = {}
    with open(os.path.join(scratch, "user_rewards.py"), "w") as f:
        f.write(code)
    for key, prefix in (("file", ""), ("eval_file", "heldout-")):
        if not request.get(key):
            continue
        name = prefix + os.path.basename(request[key])
        if box.drop_uid is not None and not os.stat(request[key]).st_mode & stat.S_IROTH:
            # Not readable by the unprivileged user the check becomes (Gradio keeps uploads private): a copy.
            os.makedirs(os.path.join(scratch, "data"), exist_ok=True)
            shutil.copyfile(request[key], os.path.join(scratch, "data", name))
            request[key] = inside(os.path.join(scratch, "data", name), f"{INSIDE_WORK}/data/{name}")
        else:
            binds[request[key]] = f"/check/data/{name}"
            request[key] = inside(request[key], f"/check/data/{name}")
    source = request.get("tokenizer")
    if source and source != "builtin":
        # Only the tokenizer's files (a model folder can hold gigabytes of weights), links resolved: a Hub cache
        # snapshot is links into its blobs, which the sandbox does not see.
        target = os.path.join(scratch, "tokenizer")
        os.makedirs(target)
        for name in os.listdir(source):
            path = os.path.join(source, name)
            if os.path.isfile(path) and any(fnmatch.fnmatch(name, p) for p in TOKENIZER_FILES):
                shutil.copyfile(path, os.path.join(target, name))
        request["tokenizer"] = inside(target, f"{INSIDE_WORK}/tokenizer")
    if box.drop_uid is not None:
        for folder, dirs, files in os.walk(scratch):
            for name in [folder, *(os.path.join(folder, n) for n in dirs + files)]:
                os.chown(name, box.drop_uid, box.drop_uid)
    return binds


class ReportReader:
    """Reads one check's framed report into a TaskReport: only lines with its nonce count."""

    def __init__(self, nonce: str):
        self.events = Reassembler(nonce)
        self.done = False
        self.started = False            # the data part is in: the reward calls come next
        self.calling: str | None = None

    def feed(self, line: str, report: TaskReport) -> bool:
        """Whether `line` belongs to the report."""
        event = self.events.feed(line)
        if event is None:
            return self.events.is_protocol(line)
        kind = event["event"]
        self.done = self.done or kind == records.CHECK_DONE
        self.started = self.started or kind == records.CHECK_DATA
        if kind == records.CHECK_CALLING:
            self.calling = str(event.get("name"))
        try:
            _apply(event, report)
        except (KeyError, TypeError, ValueError, AttributeError):
            pass    # a malformed event (a check job's log is the visitor's own to write into) is dropped
        return True


def _converse(proc: subprocess.Popen, request: dict, nonce: str, calls_s: float, report: TaskReport) -> None:
    lines: queue.Queue = queue.Queue()
    stderr: deque = deque(maxlen=40)
    readers = [threading.Thread(target=_pump, args=(proc.stdout, lines.put, MAX_EVENT_BYTES), daemon=True),
               threading.Thread(target=_pump, args=(proc.stderr, lambda line: line is None or stderr.append(line),
                                                    MAX_OUTPUT_LINE_BYTES), daemon=True)]
    for reader in readers:
        reader.start()
    try:
        proc.stdin.write(json.dumps(request, default=str).encode())
        proc.stdin.close()
    except BrokenPipeError:
        pass
    reader, deadline = ReportReader(nonce), time.monotonic() + SETUP_TIMEOUT_S
    while not reader.done:
        try:
            line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            report.errors.append(_overdue(reader, calls_s))
            break
        if line is None:
            break
        was_started = reader.started
        reader.feed(line, report)
        if reader.started and not was_started:
            deadline = time.monotonic() + calls_s
    if proc.poll() is None and not reader.done:
        os.killpg(proc.pid, signal.SIGKILL)   # overdue: stop it now, so the readers see the end of its output
    for thread in readers:
        thread.join(timeout=2)
    report.output = redact_tokens("\n".join(stderr))
    if not reader.done and not report.errors:
        report.errors.append(FieldError(_field_of(reader.calling, request["spec"]["rewards"]),
                                        "the check process stopped before it finished: "
                                        + (" ".join(list(stderr)[-3:]) or "no output")))


def _overdue(reader: ReportReader, calls_s: float) -> FieldError:
    if not reader.started:
        return FieldError("dataset", f"reading the dataset and the tokenizer took over {SETUP_TIMEOUT_S:.0f} s")
    return FieldError("reward_code", f"the reward functions did not finish within {calls_s:.0f} s in all "
                                     f"(last: {reader.calling})")


def _pump(stream, put, max_bytes: int) -> None:
    for raw in iter(lambda: stream.readline(max_bytes), b""):
        put(raw.decode(errors="replace").rstrip("\n"))
    put(None)


def _field_of(calling: str | None, chosen: list[str]) -> str:
    """The field to blame for what the check process was doing: reading data, or calling one of the rewards."""
    if calling is None:
        return "dataset"
    return "rewards" if calling in chosen else "reward_code"


def _apply(event: dict, report: TaskReport) -> None:
    kind = event["event"]
    if kind == records.CHECK_DATA:
        report.errors += [FieldError(f, redact_tokens(m)) for f, m in event.get("errors", [])]
        report.warnings += [redact_tokens(w) for w in event.get("warnings", [])]
        for name in ("columns", "num_rows", "preview", "prompt_text", "prompt_messages", "prompt_tokens",
                     "checked_rows", "long_rows", "longest", "held_out_rows"):
            if event.get(name) is not None:
                setattr(report, name, event[name])
    elif kind == records.CHECK_SAMPLES:
        report.samples = event["samples"]
    elif kind == records.CHECK_SCORES:
        report.scores[event["name"]] = event["scores"]
        if event["scores"] and all(score is None for score in event["scores"]):
            report.warnings.append(f"{event['name']} skipped every sample (it returned None): TRL does that when it "
                                   "cannot parse the reference answer; check the mapped column's values")
    elif kind == records.CHECK_SKIPPED:
        report.warnings.append(f"{event['name']}: {event['reason']}")
    elif kind == records.CHECK_FAILED:
        field_name = event["field"] if event.get("field") in REPORT_FIELDS else "reward_code"
        report.errors.append(FieldError(field_name, redact_tokens(str(event["message"]))))
        if event.get("traceback"):
            report.tracebacks[event["name"]] = redact_tokens(event["traceback"])
