"""The task check on a panel that serves others: the visitor's reward code runs in their own short CPU job.

A Space (or any panel other machines reach) never runs a visitor's code on its own machine. The check's request,
the runtime and the code go into the visitor's bucket under `checks/<check id>/`; one `cpu-basic` job in the
bucket's namespace, created with the visitor's own token, mounts it read-only and runs `runtime.check.check_task`
there, installing what the run's trainer installs. Its report comes back through the job's log, framed with a
nonce; the panel follows the log and the job's stage, says what it costs while it
runs, and cancels it if it outlives its deadline. Then the check's folder is deleted from the bucket.
"""

import json
import logging
import os
import secrets
import shlex
import time
import uuid
from collections import deque
from collections.abc import Callable

from backend.executors.base import Executor
from backend.plan import recipe
from backend.plan.jobspec import CHECK_APP_LABEL, LABEL_APP, LABEL_ROLE, LABEL_RUN, JobSpec, VolumeSpec
from backend.plan.spec import FieldError, RunSpec
from backend.runtime import RUNTIME_DIR
from backend.runtime.check.check_protocol import NONCE_ENV
from backend.runtime.redact import redact_tokens
from backend.runtime.tiny_model import BUILTIN_MODELS
from backend.storage.journal import CHECK, LAUNCHED, Launch, LaunchJournal
from backend.storage.store import BucketStore
from backend.task.check import (
    SETUP_TIMEOUT_S,
    ReportReader,
    TaskReport,
    calls_deadline_s,
    check_request,
)

CHECK_FLAVOR = "cpu-basic"
CHECK_ROLE = "task-check"
logger = logging.getLogger(__name__)
CHECKS_DIR = "checks"
START_TIMEOUT_S = 15 * 60           # the image pulled, what the trainer installs installed, the job started
POLL_S = 1.0
LOG_DRAIN_S = 10.0                # after the job ended, its log's last lines may take this long to arrive


def check_job_spec(spec: RunSpec, check_id: str, nonce: str) -> JobSpec:
    """The check job: the run's image and installs, the bucket read-only, the harness on the staged request."""
    folder = shlex.quote(f"{spec.mount_path}/{CHECKS_DIR}/{check_id}")
    install = f"pip install --quiet {' '.join([recipe.RUNTIME_PIP, *recipe.reward_packages(spec)])}"
    script = (f'{install} && work=$(mktemp -d) && cp {folder}/code/user_rewards.py "$work" && cd "$work" && '
              f"exec python -m runtime.check.check_task --request {folder}/request.json")
    timeout_s = int(START_TIMEOUT_S + SETUP_TIMEOUT_S + calls_deadline_s(spec, 15.0))
    return JobSpec(
        run_id=check_id, role=CHECK_ROLE, image=spec.image, command=["bash", "-c", script],
        flavor=CHECK_FLAVOR, timeout_s=timeout_s,
        env={"PYTHONPATH": f"{spec.mount_path}/{CHECKS_DIR}/{check_id}/code", "PYTHONUNBUFFERED": "1",
             "HF_HUB_DISABLE_TELEMETRY": "1", NONCE_ENV: nonce},
        secrets=(recipe.TOKEN_SECRET,), volumes=(VolumeSpec(spec.bucket, spec.mount_path, read_only=True),),
        labels={LABEL_APP: CHECK_APP_LABEL, LABEL_RUN: check_id, LABEL_ROLE: CHECK_ROLE},
        namespace=spec.bucket_namespace)


def stage_check(spec: RunSpec, request: dict, store: BucketStore, check_id: str) -> None:
    """Everything the check job reads, into the bucket: the runtime, the code, the dataset file, the request."""

    folder = f"{CHECKS_DIR}/{check_id}"
    store.ensure_bucket()
    store.upload_folder(RUNTIME_DIR, f"{folder}/code/runtime")
    store.write_bytes(f"{folder}/code/user_rewards.py", spec.reward_code.encode())
    for key, prefix in (("file", ""), ("eval_file", "heldout-")):
        if request.get(key):
            name = prefix + os.path.basename(request[key])
            with open(request[key], "rb") as f:
                store.write_bytes(f"{folder}/data/{name}", f.read())
            request[key] = f"data/{name}"    # the harness reads it beside the request
    store.write_bytes(f"{folder}/request.json", json.dumps(request, default=str).encode())


def check_in_job(spec: RunSpec, token: str, datasets_server: str, executor: Executor, store: BucketStore,
                 price_per_hour: float | None, timeout_s: float = 15.0,
                 progress: Callable[[str], None] | None = None, journal: LaunchJournal | None = None) -> TaskReport:
    """Check `spec`'s task in a job of the visitor's own (`token`), reporting progress lines as it goes. With
    `journal` (the panel home's `LaunchJournal`), the check is recorded before its folder is staged and its job id as
    it is created: a panel that stops mid-check leaves a record the next one acts on (its job cancelled, its
    folder removed)."""
    say = progress or (lambda _line: None)
    report = TaskReport()
    request = check_request(spec, token, datasets_server, report)
    if request is None:
        return report
    request["tokenizer"] = "builtin" if spec.model in BUILTIN_MODELS else (
        None if os.path.isdir(os.path.expanduser(spec.model)) else f"hub:{spec.model}")
    request["timeout_s"] = timeout_s
    check_id = f"check-{uuid.uuid4().hex[:12]}"
    say("Staging the check in your bucket ...")
    try:
        record = None if journal is None else journal.begin(
            CHECK, check_id, run_id=check_id, executor=executor.name, namespace=executor.namespace,
            bucket=spec.bucket, folder=f"{CHECKS_DIR}/{check_id}", planned=[CHECK_ROLE])
    except Exception as exc:
        report.errors.append(FieldError("bucket", redact_tokens(f"could not record the check before staging it: "
                                                                f"{exc}", (token,))))
        return report
    try:
        stage_check(spec, request, store, check_id)
    except Exception as exc:
        report.errors.append(FieldError("bucket", redact_tokens(f"could not write the check's files into bucket "
                                                                f"{spec.bucket}: {exc}", (token,))))
        _end_record(record, _remove_staged(store, check_id, token))
        return report
    # The nonce is no secret from the visitor (it is their own job): it keeps the report apart from what else the
    # log holds. As a job secret it would be masked in the log, like every secret.
    nonce = secrets.token_hex(16)
    job = check_job_spec(spec, check_id, nonce)
    try:
        try:
            job_id = executor.submit(job, {recipe.TOKEN_SECRET: token})
        except Exception as exc:
            report.errors.append(FieldError("bucket", redact_tokens(f"could not start the check job: {exc}",
                                                                    (token,))))
            return report
        if record is not None:
            record.created(CHECK_ROLE, job_id)
        report.check_job = job_id
        _follow(executor, job_id, job.timeout_s, nonce, report, price_per_hour, say)
    finally:
        _end_record(record, _remove_staged(store, check_id, token))
    return report


def _end_record(record: Launch | None, removed: bool) -> None:
    """The check's record closed once its folder is gone; otherwise left for the panel's next pass, which cancels
    the job (if it still runs) and removes the folder."""
    if record is None:
        return
    if removed:
        record.finish(LAUNCHED)
    else:
        record.abandon("the check's folder could not be removed")


def _remove_staged(store: BucketStore, check_id: str, token: str) -> bool:
    """The check's copy of the runtime, the code and the data, out of the visitor's bucket once it is done (each
    check would leave one behind otherwise); whether it is gone. A failure to delete leaves them there, said in the
    panel's log (and the panel's next pass tries again)."""
    try:
        store.delete_folder(f"{CHECKS_DIR}/{check_id}")
        return True
    except Exception as exc:
        logger.warning("could not remove the check's files %s/%s: %s", CHECKS_DIR, check_id,
                       redact_tokens(str(exc), (token,)))
        return False


def _follow(executor: Executor, job_id: str, timeout_s: int, nonce: str, report: TaskReport,
            price_per_hour: float | None, say: Callable[[str], None]) -> None:
    reader, output, cursor = ReportReader(nonce), deque(maxlen=40), 0
    started, stage, ended_at, last_line = time.monotonic(), "SCHEDULING", None, time.monotonic()
    while not reader.done:
        lines, cursor = executor.read_logs(job_id, cursor)
        for line in lines:
            if not reader.feed(line, report) and reader.events.seq_seen:
                output.append(line)       # what the code printed (the lines before the report are the install's)
        now = time.monotonic()
        last_line = now if lines else last_line
        if reader.done or (ended_at is not None and now - max(ended_at, last_line) > LOG_DRAIN_S):
            break                         # the job ended and its log stream has gone quiet
        if ended_at is None:
            status = executor.status(job_id)
            stage = status.stage
            ended_at = now if status.done else None
            report.cost_usd = None if price_per_hour is None else price_per_hour * (now - started) / 3600
            say(_progress_line(job_id, stage, now - started, report.cost_usd, price_per_hour, timeout_s, reader))
        if now - started > timeout_s + 60:
            executor.cancel(job_id)
            report.errors.append(FieldError("reward_code", f"the check job {job_id} did not finish within "
                                                           f"{timeout_s // 60} minutes and was cancelled"))
            break
        time.sleep(POLL_S if ended_at is None else 0.2)
    report.cost_usd = None if price_per_hour is None else price_per_hour * (time.monotonic() - started) / 3600
    report.output = redact_tokens("\n".join(output))
    if not reader.done and not report.errors:
        tail = " ".join(list(output)[-3:]) or status_message(executor, job_id)
        report.errors.append(FieldError("reward_code", redact_tokens(
            f"the check job {job_id} ended ({stage}) before it finished: {tail or 'no output'}")))


def status_message(executor: Executor, job_id: str) -> str:
    try:
        return executor.status(job_id).message
    except Exception:
        return ""


def _progress_line(job_id: str, stage: str, elapsed: float, cost: float | None, price: float | None,
                   timeout_s: int, reader: ReportReader) -> str:
    doing = ("waiting for a machine" if stage == "SCHEDULING" else
             f"calling {reader.calling}" if reader.calling else
             "reading the dataset" if stage == "RUNNING" and reader.events.seq_seen else
             "installing TRL and starting" if stage == "RUNNING" else stage.lower())
    money = "" if price is None else (f", ${cost:.4f} so far (at most ${price * timeout_s / 3600:.3f} if it ran "
                                      f"its whole {timeout_s // 60}-minute limit)")
    return (f"Checking your task in job `{job_id}` on {CHECK_FLAVOR} in your own account: {doing}, "
            f"{elapsed:.0f} s{money}.")
