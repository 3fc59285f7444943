"""The pre-launch check of a run's task, in processes of its own, never in the panel's.

    python -m runtime.check.check_task                     # the harness: the request as JSON on stdin (a local check)
    python -m runtime.check.check_task --request FILE     # the same, the request from a file (the check job)

The harness reads a few rows of the dataset (given in the request, or from a file, or a builtin set), shapes them
as the trainer does (task.py), renders the first prompt with the model's chat template and counts prompt tokens.
Then a worker process of its own (`--worker`) calls every reward function exactly as TRL would, with the loader
the trainer uses (rewards.py), on sample completions: the visitor's code runs only there. The harness first
lowers its limits and drops privileges (`confine`, inherited by the worker), keeps the report channel to itself
(the worker never holds it), times each call, and relays only well-formed answers, framed with the check's
nonce (check_protocol.py). Whatever the code prints goes to stderr.
"""

import ctypes
import importlib
import json
import math
import os
import queue
import resource
import secrets
import subprocess
import sys
import threading
import time
import traceback
import types

from ..layout import USER_REWARDS_MODULE
from ..prompts import BUILTIN_PREFIX, builtin_eval_rows, builtin_rows
from ..records import (
    CHECK_CALLING,
    CHECK_DATA,
    CHECK_DONE,
    CHECK_FAILED,
    CHECK_IMPORTED,
    CHECK_SAMPLES,
    CHECK_SCORES,
    CHECK_SKIPPED,
)
from ..redact import is_secret_env_name
from ..rewards import TRL_REWARDS, RewardFunctionError, UserReward, checked_scores, reward_functions
from ..spec_file import SpecFile
from ..task import (
    TaskDataError,
    count_tokens,
    is_local_file,
    missing_columns,
    parse_reward_columns,
    prompt_key,
    read_file_rows,
    render_prompt,
    task_row,
    to_messages,
)
from ..tiny_model import build_tokenizer
from ..user_code import FILENAME, code_traceback, reward_function_names
from .check_protocol import NONCE_ENV, frame

TOKENIZER_FILES = ["tokenizer*", "special_tokens_map.json", "vocab*", "merges.txt", "*.model", "*.tiktoken",
                   "chat_template*", "config.json"]
MAX_MESSAGE_CHARS = 4000
MAX_TRACEBACK_CHARS = 20000
_LIMITS = {"address_space_bytes": resource.RLIMIT_AS, "cpu_seconds": resource.RLIMIT_CPU,
           "processes": resource.RLIMIT_NPROC, "file_bytes": resource.RLIMIT_FSIZE,
           "open_files": resource.RLIMIT_NOFILE}
PR_SET_DUMPABLE, PR_SET_NO_NEW_PRIVS = 4, 38
UNPRIVILEGED_UID = 65534      # "nobody"

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
    if source.startswith("hub:"):    # a check job fetches the model's tokenizer files itself
        from huggingface_hub import snapshot_download  # noqa: PLC0415 only a check job needs it

        source = snapshot_download(source[len("hub:"):], allow_patterns=TOKENIZER_FILES)
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
    check_held_out(request, rows, report)
    if report["errors"]:
        return report, [], None
    tokenizer = _measure_prompts(request, tasks, report)
    return report, tasks, tokenizer


HELD_OUT_FIELD = {"split": "eval_split", "file": "eval_file", "rows": "eval_rows"}


def held_out_and_training(request: dict, rows: list[dict]) -> tuple[list[dict], list[dict]]:
    """The held-out rows the check reads, and the training rows to compare them with (those read)."""
    spec = request["spec"]
    source = spec.get("eval_source")
    if source == "rows":
        kept = int(spec.get("eval_rows") or 0)
        return rows[:kept], rows[kept:]
    if source == "file":
        return read_file_rows(request["eval_file"], request["stats_rows"])[0], rows
    if request.get("eval_rows") is not None:
        return request["eval_rows"], rows
    if spec["dataset"].startswith(BUILTIN_PREFIX):
        return builtin_eval_rows(spec["dataset"][len(BUILTIN_PREFIX):]), rows
    raise TaskDataError("no rows were given for the Hub dataset's held-out split")


def check_held_out(request: dict, rows: list[dict], report: dict) -> None:
    """Refuse a held-out set that is empty, lacks a column the prompt or a reward needs, or shares prompts with the
    training rows (among the rows read), naming the held-out field."""
    spec = request["spec"]
    field = HELD_OUT_FIELD.get(spec.get("eval_source"))
    if field is None:
        return

    def refuse(message: str) -> None:
        report["errors"].append([field, message])

    try:
        held, training = held_out_and_training(request, rows)
    except (TaskDataError, ValueError, OSError) as exc:
        return refuse(f"cannot read the held-out set: {exc}")
    if not held:
        return refuse("the held-out set has no rows: give a split or file with rows, or hold out rows of the dataset")
    total = report["num_rows"] or len(rows)
    if spec.get("eval_source") == "rows" and total <= len(held):
        return refuse(f"eval_rows holds out {spec.get('eval_rows')} rows, but the dataset has {total}: training "
                      "would have none")
    prompt_column = spec.get("prompt_column") or "prompt"
    mapped = parse_reward_columns(spec.get("reward_columns") or [])
    columns = request.get("eval_columns") or list(dict.fromkeys(k for row in held for k in row))
    missing = missing_columns(columns, prompt_column, mapped)
    for where, column in missing:
        need = "the prompt" if where == "prompt_column" else "a reward (reward_columns)"
        refuse(f"the held-out set has no column {column!r}, which {need} reads; its columns are {', '.join(columns)}")
    if missing:
        return None
    system = spec.get("system_prompt") or ""
    try:
        trained = {prompt_key(to_messages(row[prompt_column], system)) for row in training if prompt_column in row}
        shared = [i for i, row in enumerate(held) if prompt_key(to_messages(row[prompt_column], system)) in trained]
    except TaskDataError as exc:
        return refuse(f"a held-out prompt: {exc}")
    if shared:
        return refuse(f"{len(shared)} of the {len(held)} held-out prompts checked are training prompts too (held-out "
                      f"row {shared[0]} first): a held-out score would measure memory, not the task; hold out other "
                      "prompts")
    report["held_out_rows"] = len(held)
    return None


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


# ---- the harness: confinement, the worker, the report channel

def confine(limits: dict, drop_uid: int | None) -> None:
    """Lower this process's limits (its children inherit them), become `drop_uid` if root, and make this process
    unreadable to its children (no ptrace, no /proc/<pid>/mem or environ): the worker cannot reach the channel."""
    for name, value in limits.items():
        resource.setrlimit(_LIMITS[name], (int(value), int(value)))
    if drop_uid is not None and os.geteuid() == 0:
        os.setgroups([])
        os.setresgid(drop_uid, drop_uid, drop_uid)
        os.setresuid(drop_uid, drop_uid, drop_uid)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)


class Channel:
    """The report, framed with the check's nonce, on a descriptor only the harness holds."""

    def __init__(self, stream, nonce: str):
        self.stream, self.nonce, self.seq = stream, nonce, 0

    def emit(self, **event) -> None:
        self.seq += 1
        self.stream.write("".join(line + "\n" for line in frame(event, self.nonce, self.seq)))
        self.stream.flush()


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


def harness(request: dict, nonce: str, protocol) -> None:
    confine(request.get("limits") or {}, request.get("drop_uid"))
    channel = Channel(protocol, nonce)
    report, tasks, tokenizer = check_data(request)
    channel.emit(event=CHECK_DATA, **report)
    if not report["errors"]:
        check_rewards(request, tasks, tokenizer, channel, float(request.get("timeout_s") or 15.0))
    channel.emit(event=CHECK_DONE)


# ---- the worker: the only process that runs the visitor's code

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


def main() -> None:
    if sys.argv[1:2] == ["--worker"]:
        worker()
        return
    protocol = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)             # nothing else this process (or a library) prints can land in the report
    sys.stdout = sys.stderr
    if sys.argv[1:2] == ["--request"]:
        path = sys.argv[2]
        with open(path) as f:
            request = json.load(f)
        for key in ("file", "eval_file"):
            if request.get(key):
                request[key] = os.path.join(os.path.dirname(os.path.abspath(path)), request[key])
        nonce = os.environ.pop(NONCE_ENV, "")
        if os.geteuid() == 0:
            # A job's container runs as root: the check drops to an unprivileged user there too, so the worker
            # cannot read the harness (its nonce, its channel) through /proc.
            work = os.getcwd()
            for name in [work, *(os.path.join(work, n) for n in os.listdir(work))]:
                os.chown(name, UNPRIVILEGED_UID, UNPRIVILEGED_UID)
            os.environ.update(HOME=work, HF_HOME=os.path.join(work, ".hf"))
            request["drop_uid"] = UNPRIVILEGED_UID
    else:
        request = json.load(sys.stdin)
        nonce = request.pop("nonce", "")
    harness(request, nonce, protocol)


if __name__ == "__main__":
    main()
