"""RayExecutor: runs JobSpecs as Ray jobs on a Ray cluster, through Ray's Jobs API (`JobSubmissionClient`).

The cluster is the one whose dashboard answers at RAY_ADDRESS (default a cluster on this machine,
http://127.0.0.1:8265, as `ray start --head` starts it). Each JobSpec becomes one Ray job: its command as the
entrypoint, under the same wrapper as a local job (`runtime.job.job_wrapper`, from the run's own `code/`), with
`entrypoint_num_cpus` / `entrypoint_num_gpus` from the role's flavor, the labels as the job's metadata (so a
restarted panel finds its runs in `list_jobs`) and the job's environment as the runtime_env's env_vars.

The run folder is the bucket's folder at the run's mount path, which every node of the cluster and this panel must
see at that same path: the cluster's shared filesystem, or a Hub bucket mounted on every node. The wrapper keeps its
records in `runs/<run_id>/ray-jobs/<job id>/` there (process, resource samples, how the job ended, a cancel request),
so status, samples and cancel work alike from any panel that sees the folder, and a cancel lets the job stop as
gracefully as a local one (Ray's own stop signals every process of the job at once).

Ray shows a job's metadata, entrypoint and runtime_env to anyone who opens its dashboard: a secret never goes there.
It is written to a file only its job reads (0600, beside the bucket's runs, not in them), which the entrypoint
sources and deletes before anything else runs.

`ray` is imported on first use: without it the engine is simply not offered.
"""

import json
import logging
import os
import secrets as _secrets
import shlex
import threading
import time
from collections.abc import Iterator
from urllib.parse import urlparse

from backend.executors.base import ResourceSample, SubmitError
from backend.executors.wrapper_files import SAMPLE_BYTES, ended_status, read_samples, tail_offset
from backend.plan.engines.ray import (
    ENGINE,
    GRACE_S,
    LABEL_BUCKET,
    LABEL_JOB_DIR,
    LABEL_MOUNT,
    SECRETS_DIR,
    _client,
    address,
    known_folder,
    remember_folder,
    submit_args,
)
from backend.plan.jobspec import (
    APP_LABEL_VALUE,
    CANCELED,
    COMPLETED,
    ERROR,
    LABEL_APP,
    LABEL_ROLE,
    LABEL_RUN,
    RUNNING,
    SCHEDULING,
    TERMINAL_STAGES,
    JobRecord,
    JobSpec,
    JobStatus,
)
from backend.runtime.job import job_wrapper as wrapper
from backend.runtime.job.cause import cause_line
from backend.runtime.layout import atomic_write_bytes
from backend.runtime.redact import redact_tokens, remember_secret

log = logging.getLogger(__name__)
CAUSE_TAIL_BYTES = 16384     # of an ended job's log, where its cause is looked for (the wrapper reads as much)
START_WAIT_S = 120.0         # a replica must be placed and started by then for the trainer to be told where it is
_STAGES = {"PENDING": SCHEDULING, "RUNNING": RUNNING, "SUCCEEDED": COMPLETED, "FAILED": ERROR, "STOPPED": CANCELED}


class RayExecutor:
    """Submits, watches and cancels the jobs of runs on the Ray cluster at `where`."""

    name = ENGINE.name
    namespace = None

    def __init__(self, where: str | None = None):
        self.address = where or address()
        self._api = None
        self._lock = threading.Lock()
        self._secrets: tuple[str, ...] = ()
        self._meta: dict[str, dict] = {}          # job id -> its metadata (fixed at submit)
        self._ended: dict[str, JobStatus] = {}
        self._logs: dict[str, bytes] = {}         # job id -> its whole log, once the job has ended
        self._secret_files: dict[str, str] = {}   # job id -> the secrets file its entrypoint deletes

    @property
    def api(self):
        if self._api is None:
            self._api = _client(self.address)
        return self._api

    def bucket_root(self, bucket: str) -> str:
        """Where `bucket` is on this cluster (and on this panel): the mount path its runs were launched with."""
        known = known_folder(bucket)
        if known is None:
            self.list_jobs()
            known = known_folder(bucket)
        if known is None:
            raise KeyError(f"no run of bucket {bucket!r} on the Ray cluster at {self.address}")
        return known

    # ---- submit / status / cancel
    def submit(self, job: JobSpec, secrets: dict[str, str] | None = None) -> str:
        secrets = secrets or {}
        missing = [name for name in job.secrets if not secrets.get(name)]
        if missing:
            raise SubmitError(f"job {job.role}: no value for secret(s) {', '.join(missing)}")
        if not job.volumes:
            raise SubmitError(f"job {job.role}: a Ray job needs the run's folder (a volume)")
        job_id = f"{job.run_id}--{job.role}--{_secrets.token_hex(3)}"
        secret_file = self._write_secrets(job, job_id, secrets) if job.secrets else None
        args = submit_args(job, job_id, secret_file)
        os.makedirs(args["metadata"][LABEL_JOB_DIR], exist_ok=True)
        try:
            self.api.submit_job(submission_id=job_id, **args)
        except Exception as exc:
            if secret_file:
                _remove(secret_file)
            raise SubmitError(redact_tokens(f"job {job.role}: the Ray cluster at {self.address} refused it: {exc}",
                                            self._secrets)) from exc
        with self._lock:
            self._meta[job_id] = args["metadata"]
            if secret_file:
                self._secret_files[job_id] = secret_file
        remember_folder(job.volumes[0].bucket, args["metadata"][LABEL_MOUNT])
        return job_id

    def _write_secrets(self, job: JobSpec, job_id: str, secrets: dict[str, str]) -> str:
        folder = os.path.join(job.volumes[0].mount_path, SECRETS_DIR)
        os.makedirs(folder, mode=0o700, exist_ok=True)
        path = os.path.join(folder, f"{job_id}.env")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.writelines(f"{name}={shlex.quote(secrets[name])}\n" for name in job.secrets)
        for name in job.secrets:
            remember_secret(secrets[name])
        with self._lock:
            self._secrets = tuple(dict.fromkeys([*self._secrets, *(secrets[n] for n in job.secrets)]))
        return path

    def _metadata(self, job_id: str) -> dict:
        meta = self._meta.get(job_id)
        if meta is None:
            meta = self._meta[job_id] = dict(self.api.get_job_info(job_id).metadata or {})
        return meta

    def _file(self, job_id: str, name: str) -> str | None:
        folder = self._metadata(job_id).get(LABEL_JOB_DIR)
        return os.path.join(folder, name) if folder else None

    def _wrapper_record(self, job_id: str, name: str) -> dict | None:
        path = self._file(job_id, name)
        try:
            with open(path or "", "rb") as f:
                data = json.loads(f.read())
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) else None

    def status(self, job_id: str) -> JobStatus:
        if job_id in self._ended:
            return self._ended[job_id]
        status = self._status(job_id, None)
        if status.done:
            self._ended[job_id] = status
        return status

    def _status(self, job_id: str, info) -> JobStatus:
        """The wrapper's record of how the job ended where there is one, else Ray's word for the job."""
        ended = ended_status(self._wrapper_record(job_id, wrapper.EXIT_FILE),
                             lambda text: redact_tokens(text, self._secrets))
        if ended is not None:
            return ended
        info = info or self.api.get_job_info(job_id)
        stage = _STAGES.get(str(getattr(info.status, "value", info.status)), ERROR)
        if stage in TERMINAL_STAGES and stage != CANCELED:
            # The wrapper writes its record before it exits: a job done without one never ran it, or was killed.
            return JobStatus(ERROR, f"the Ray job ended without its wrapper's record: {self._cause(job_id, info)}")
        return JobStatus(stage, redact_tokens(info.message or "", self._secrets) if stage == CANCELED else "")

    def _cause(self, job_id: str, info) -> str:
        """Why an ended job failed before its wrapper could say: the error its log's last lines show (Ray's own
        message quotes the log from its start, cut before the error), else Ray's message's first line."""
        try:
            data = self._logs.get(job_id) or (self.api.get_job_logs(job_id) or "").encode()
            self._logs[job_id] = data
        except Exception as exc:  # a cluster that does not answer: Ray's message is all there is
            log.debug("no log of Ray job %s: %s", job_id, exc)
            data = b""
        lines = data[-CAUSE_TAIL_BYTES:].decode("utf-8", errors="replace").splitlines()
        message = (info.message or "").strip().splitlines()
        line = cause_line(lines) or next((x.strip() for x in reversed(lines) if x.strip()), "") \
            or (message[0] if message else "")
        return redact_tokens(line[:500], self._secrets)

    def cancel(self, job_id: str, reason: str = "canceled by the user") -> None:
        """Ask the job's wrapper to stop it (a file in its job folder: it stops the job as a local one), then, if
        it has not ended within the wrapper's grace (or never started), Ray's own stop."""
        if self.status(job_id).done:
            return
        path = self._file(job_id, wrapper.CANCEL_FILE)
        if path and os.path.isdir(os.path.dirname(path)) and not os.path.exists(path):
            atomic_write_bytes(path, json.dumps({"reason": reason, "time": time.time()}).encode())
        started = self._wrapper_record(job_id, wrapper.PROCESS_FILE) is not None
        if not started:     # its entrypoint never ran: the secrets it would have read and deleted go now
            _remove(self._secret_files.pop(job_id, ""))
        threading.Thread(target=self._stop_later, args=(job_id, 0.0 if not started else GRACE_S + 5),
                         name=f"ray-stop-{job_id}", daemon=True).start()

    def _stop_later(self, job_id: str, after_s: float) -> None:
        deadline = time.monotonic() + after_s
        while time.monotonic() < deadline and not self.status(job_id).done:
            time.sleep(1.0)
        try:
            if not self.status(job_id).done:
                self.api.stop_job(job_id)
        except Exception:   # the job is gone, or the cluster: its wrapper still has the cancel request
            pass

    def exposed_url(self, job_id: str, port: int) -> str:
        """Where the job's `port` answers: the node Ray started it on, once it has (a replica is placed first)."""
        deadline = time.monotonic() + START_WAIT_S
        while True:
            info = self.api.get_job_info(job_id)
            host = urlparse(info.driver_agent_http_address or "").hostname
            if host:
                return f"http://{host}:{port}"
            stage = _STAGES.get(str(getattr(info.status, "value", info.status)), ERROR)
            if stage in TERMINAL_STAGES or time.monotonic() > deadline:
                raise SubmitError(f"job {job_id} was not started on a node of the cluster within {START_WAIT_S:g} s "
                                  f"({stage}: {info.message or 'no free resources?'})")
            time.sleep(0.2)

    def list_jobs(self, run_id: str | None = None, checks: bool = False) -> list[JobRecord]:
        """Every job of this app on the cluster (or of one run), found by its metadata, newest first. (No task
        check runs on a cluster: `checks` lists none.)"""
        if checks:
            return []
        records = []
        for info in self.api.list_jobs():
            meta = info.metadata or {}
            if meta.get(LABEL_APP) != APP_LABEL_VALUE or not info.submission_id:
                continue
            if run_id and meta.get(LABEL_RUN) != run_id:
                continue
            job_id = info.submission_id
            with self._lock:
                self._meta.setdefault(job_id, dict(meta))
            remember_folder(meta.get(LABEL_BUCKET), meta.get(LABEL_MOUNT))
            status = self._ended.get(job_id) or self._status(job_id, info)
            if status.done:
                self._ended[job_id] = status
            process = self._wrapper_record(job_id, wrapper.PROCESS_FILE) or {}
            started = process.get("started_at")
            records.append(JobRecord(
                job_id, meta.get(LABEL_RUN, ""), meta.get(LABEL_ROLE, ""), status.stage,
                (info.start_time or 0) / 1000.0, flavor=None, bucket=meta.get(LABEL_BUCKET),
                started_at=float(started) if isinstance(started, (int, float)) else None,
                finished_at=info.end_time / 1000.0 if info.end_time and status.done else None,
                timed_out=status.timed_out))
        return sorted(records, key=lambda r: r.created_at, reverse=True)

    def unreadable_records(self, run_id: str) -> dict[str, int]:
        return {}

    def stop(self, timeout: float = 0.0) -> None:
        """Nothing to stop: no reader thread follows a Ray job (each read asks the cluster)."""

    # ---- logs and resources
    def _log(self, job_id: str) -> bytes:
        if job_id in self._logs:
            return self._logs[job_id]
        done = self.status(job_id).done
        data = (self.api.get_job_logs(job_id) or "").encode()
        if done:
            self._logs[job_id] = data
        return data

    def read_logs(self, job_id: str, cursor: int) -> tuple[list[str], int]:
        data = self._log(job_id)[cursor:]
        data = data[: data.rfind(b"\n") + 1]
        lines = [redact_tokens(line, self._secrets) for line in data.decode("utf-8", errors="replace").splitlines()]
        return lines, cursor + len(data)

    def tail_cursor(self, job_id: str, lines: int) -> int:
        data = self._log(job_id)
        end = len(data) - 1
        for _ in range(lines):
            end = data.rfind(b"\n", 0, end)
            if end < 0:
                return 0
        return end + 1

    def all_logs(self, job_id: str) -> Iterator[str]:
        """The whole log (Ray's Jobs API answers with the whole text: it is held once, as bytes), masked."""
        text = self._log(job_id).decode("utf-8", errors="replace")
        if text:
            yield redact_tokens(text if text.endswith("\n") else text + "\n", self._secrets)

    def read_resources(self, job_id: str, cursor: int, limit: int | None = None) -> tuple[list[ResourceSample], int]:
        return read_samples(self._file(job_id, wrapper.RESOURCES_FILE) or "", cursor, limit)

    def resources_tail_cursor(self, job_id: str, samples: int) -> int:
        return tail_offset(self._file(job_id, wrapper.RESOURCES_FILE) or "", samples, SAMPLE_BYTES)


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except OSError:
        pass


def shared_executor(home: str) -> RayExecutor:
    """The executor every permitted visitor of this deployment shares: the cluster's at RAY_ADDRESS."""
    return RayExecutor(address())
