"""LocalExecutor: runs a JobSpec's command as local processes, under a wrapper that outlives the panel.

Volumes are mapped onto local folders (`<home>/buckets/<namespace>/<name>`) by rewriting the mount path in
the command and env. Each job gets `<home>/jobs/<job_id>/` (made as `.new-<job_id>` and renamed once its `job.json` is
in, so a listing never finds a job without its record): `job.json` (the spec, and the wrapper's pid with its start
time) and `log.txt`, written here; `process.json`, `resources.jsonl` and `exit.json`, written by the job's
wrapper (`backend/runtime/job/job_wrapper.py`), which also enforces the timeout and removes the job's own TMPDIR
(`<system temp>/grpo-job-<hex>-*`) when the job ends. A job's status is read from these
files alone, so a restarted panel (or a second one) tells the same story as the panel that launched it. A pid is
trusted only together with its start time: after a restart the same number may belong to another process.
"""

import dataclasses
import getpass
import json
import logging
import os
import re
import secrets as _secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict

import psutil

from backend.executors.base import ResourceSample, SubmitError
from backend.executors.wrapper_files import (
    SAMPLE_BYTES,
    ended_status,
    log_text,
    read_complete_lines,
    read_samples,
    tail_offset,
)
from backend.plan.engines.local import ENGINE, as_run
from backend.plan.jobspec import CANCELED, ERROR, RUNNING, SCHEDULING, TERMINAL_STAGES, JobRecord, JobSpec, JobStatus
from backend.runtime import BACKEND_DIR
from backend.runtime.job import job_wrapper as wrapper
from backend.runtime.job.shm import SHM_FILE, remove_left
from backend.runtime.layout import atomic_write_bytes
from backend.runtime.redact import is_secret_env_name, redact_tokens, remember_secret
from backend.runtime.tiny_model import CACHE_ENV as MODEL_CACHE_ENV

log = logging.getLogger(__name__)

JOB_FILE, LEGACY_STATUS_FILE = "job.json", "status.json"
START_WAIT_S = 60.0       # a job without a wrapper pid after this long never started
RECORD_WAIT_S = 10.0      # a job folder without a readable job.json this young may still be getting it
CANCELED_BY_USER = "canceled by the user"
FINAL_LISTING_S = 2.0      # a jobs folder unchanged this long before a listing: a later change gives a later mtime
FULL_DISK_BYTES = 1 << 20   # less free space than this where a job's records are: the disk counts as full


class Unreadable(ValueError):
    """A job file that exists but holds no usable record."""


class LocalExecutor:
    name = ENGINE.name
    namespace = None

    def __init__(self, home: str, grace_s: float = wrapper.DEFAULT_GRACE_S):
        self.home = os.path.abspath(home)
        self.jobs_dir = os.path.join(self.home, "jobs")
        os.makedirs(self.jobs_dir, exist_ok=True)
        self.grace_s = grace_s
        self._secrets: dict[str, tuple[str, ...]] = {}
        self._bad: dict[str, set[int]] = {}      # job file -> offsets of the records in it that were skipped
        # What does not change once written, kept so that listing 200 runs does not re-read 600 job files a tick:
        self._records: dict[str, dict] = {}      # job id -> its job.json once complete (with the wrapper's pid)
        self._ended: dict[str, JobStatus] = {}   # job id -> its final status
        self._ended_records: dict[str, JobRecord] = {}   # job id -> its listing record, once final
        self._final_listing: tuple[int, list[JobRecord]] | None = None    # (jobs folder's mtime, every job ended)
        self._ended_times: dict[str, tuple[float | None, float | None]] = {}   # job id -> (start, end) once ended
        self._lock = threading.Lock()

    # ---- paths
    def bucket_root(self, bucket: str) -> str:
        return os.path.join(self.home, "buckets", *bucket.split("/"))

    def _dir(self, job_id: str) -> str:
        if "/" in job_id or job_id.startswith("."):
            raise ValueError(f"bad job id {job_id!r}")
        return os.path.join(self.jobs_dir, job_id)

    def _file(self, job_id: str, name: str) -> str:
        return os.path.join(self._dir(job_id), name)

    def log_path(self, job_id: str) -> str:
        return self._file(job_id, wrapper.LOG_FILE)

    def exposed_url(self, job_id: str, port: int) -> str:
        return f"http://127.0.0.1:{port}"

    # ---- submit
    def as_run(self, job: JobSpec) -> JobSpec:
        """The job as this machine runs it: its run folder mapped to the local folder that stands for the bucket."""
        return as_run(job, self.bucket_root)

    def submit(self, job: JobSpec, secrets: dict[str, str] | None = None) -> str:
        secrets = secrets or {}
        missing = [name for name in job.secrets if name not in secrets]
        if missing:
            raise SubmitError(f"job {job.role}: no value for secret(s) {', '.join(missing)}")
        mapped = self.as_run(job)
        command = mapped.command
        if shutil.which(command[0]) is None:
            raise SubmitError(f"job {job.role}: could not start {command[0]!r}: no such program")
        job_id = f"{job.run_id}--{job.role}--{_secrets.token_hex(3)}"
        job_dir = self._dir(job_id)
        # A temp dir of the job's own, removed when it ends however it ends: vLLM leaves a `vllm_dist_<uuid>` file
        # per server and a killed replica its socket folder in TMPDIR. In the system's temp dir, not the job's
        # folder: vLLM's ZMQ socket paths under it must stay within the 107 bytes a Unix socket path may have.
        job_tmp = tempfile.mkdtemp(prefix=f"grpo-job-{job_id.rsplit('--', 1)[-1]}-")
        for vol in job.volumes:
            os.makedirs(self.bucket_root(vol.bucket), exist_ok=True)
        # The panel's secrets (its token, the OAuth client secret, the webhook key) stay with the panel: a local job
        # gets only the secrets its JobSpec names.
        inherited = {k: v for k, v in os.environ.items() if not is_secret_env_name(k)}
        env = {"TORCHINDUCTOR_CACHE_DIR": _shared_compile_cache(), **NO_PRIVATE_HEADER_BUILD,
               MODEL_CACHE_ENV: _shared_model_cache(), **inherited, **mapped.env, "TMPDIR": job_tmp,
               **{k: secrets[k] for k in job.secrets}}
        for name in job.secrets:
            remember_secret(secrets[name])
        if "PYTHONPATH" in job.env and os.environ.get("PYTHONPATH"):
            # Locally the job runs in the panel's environment: keep what that environment adds to the path.
            env["PYTHONPATH"] += os.pathsep + os.environ["PYTHONPATH"]
        record = {"job_id": job_id, "spec": asdict(job), "created_at": time.time(), "command": command,
                  "tmpdir": job_tmp}
        # The folder is made under a hidden name and renamed once its job.json is in: the panel lists jobs all the
        # time, and a listing that found the folder without its record would take the job for an unreadable one.
        staging = os.path.join(self.jobs_dir, f".new-{job_id}")
        try:
            os.makedirs(staging)
            _write_json(os.path.join(staging, JOB_FILE), record)
            os.rename(staging, job_dir)
        except OSError as exc:
            shutil.rmtree(staging, ignore_errors=True)
            shutil.rmtree(job_tmp, ignore_errors=True)
            raise SubmitError(f"job {job.role}: could not write its record in {self.jobs_dir}: {exc}") from exc
        wrapped = wrapper.wrapper_command(sys.executable, job_dir, command, timeout_s=job.timeout_s,
                                          attempts=job.attempts, grace_s=self.grace_s, tmpdir=job_tmp)
        with open(self.log_path(job_id), "ab") as log_file:
            try:
                # A session of its own: the job lives on when the panel exits, and no terminal signal reaches it.
                proc = subprocess.Popen(wrapped, cwd=BACKEND_DIR, env=env, stdout=log_file, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL, start_new_session=True)
            except OSError as exc:
                shutil.rmtree(job_tmp, ignore_errors=True)
                _write_json(self._file(job_id, wrapper.EXIT_FILE),
                            {"stage": ERROR, "message": f"could not start: {exc}", "time": time.time()})
                raise SubmitError(f"job {job.role}: could not start its wrapper: {exc}") from exc
        with self._lock:
            self._secrets[job_id] = tuple(secrets[k] for k in job.secrets)
        record.update(pid=proc.pid, pid_started_at=wrapper.process_start_time(proc.pid))
        _write_json(os.path.join(job_dir, JOB_FILE), record)
        # Only reaping: the wrapper watches the job. An unreaped wrapper would look alive until the panel exits.
        threading.Thread(target=proc.wait, name=f"reap-{job_id}", daemon=True).start()
        return job_id

    # ---- job files
    def _read_json(self, job_id: str, name: str) -> dict | None:
        """A job file as a dict; None if it does not exist. A file that is not a JSON object is counted, then None."""
        path = self._file(job_id, name)
        try:
            with open(path, "rb") as f:
                data = json.loads(f.read())
        except FileNotFoundError:
            return None
        except (OSError, ValueError):
            data = None
        if not isinstance(data, dict):
            self._count_bad(path, 0)
            return None
        return data

    def _count_bad(self, path: str, offset: int) -> None:
        with self._lock:
            seen = self._bad.setdefault(path, set())
            if offset not in seen:
                seen.add(offset)
                log.warning("skipped an unreadable record in %s (byte %d)", path, offset)

    def _job_record(self, job_id: str) -> dict:
        cached = self._records.get(job_id)
        if cached is not None:
            return cached
        data = self._read_json(job_id, JOB_FILE)
        if data is None:
            if not os.path.isdir(self._dir(job_id)):
                raise KeyError(f"no local job {job_id!r}")
            raise Unreadable(f"job {job_id}: no readable {JOB_FILE}")
        spec = data.get("spec")
        ok = (isinstance(spec, dict) and isinstance(spec.get("run_id"), str) and isinstance(spec.get("role"), str)
              and isinstance(spec.get("volumes", []), list) and isinstance(data.get("created_at"), (int, float)))
        if not ok:
            self._count_bad(self._file(job_id, JOB_FILE), 0)
            raise Unreadable(f"job {job_id}: {JOB_FILE} is not a job record")
        if "pid" in data:
            self._records[job_id] = data
        return data

    def unreadable_records(self, run_id: str) -> dict[str, int]:
        """Skipped records per job file of the run's jobs (paths relative to this executor's home)."""
        prefix = os.path.join(self.jobs_dir, f"{run_id}--")
        with self._lock:
            return {os.path.relpath(path, self.home): len(offsets) for path, offsets in self._bad.items()
                    if path.startswith(prefix)}

    # ---- processes
    def _wrapper_alive(self, record: dict) -> bool:
        return _same_process(record.get("pid"), record.get("pid_started_at"))

    def _job_group(self, job_id: str) -> int | None:
        """The job command's process group id, if any process of that group may still be alive."""
        proc = self._read_json(job_id, wrapper.PROCESS_FILE) or {}
        pid = proc.get("pid")
        if not isinstance(pid, int):
            return None
        started = wrapper.process_start_time(pid)
        if started is not None and not _same_start(started, proc.get("started_at")):
            return None     # that number is another process now, perhaps leading a group of its own
        # With its leader gone, a group's id cannot be reused while any member lives: the group is still ours.
        return pid if wrapper.group_alive(pid) else None

    def main_pid(self, job_id: str) -> int | None:
        """The pid of the job's own command (not its wrapper), once the wrapper has started it."""
        pid = (self._read_json(job_id, wrapper.PROCESS_FILE) or {}).get("pid")
        return pid if isinstance(pid, int) else None

    # ---- observe
    def status(self, job_id: str) -> JobStatus:
        if job_id in self._ended:
            return self._ended[job_id]
        try:
            status = self._status(job_id)
        except Unreadable as exc:
            # Not an end, so not kept: a record still being written (a folder made by another writer, which need not
            # make it whole, as submit does) or mended later is read again next time.
            return self._unreadable_status(job_id, exc)
        if status.done:
            self._ended[job_id] = status
            self._remove_tmpdir(job_id)
        return status

    def _remove_tmpdir(self, job_id: str) -> None:
        """The job's temp dir and the shared memory it left, once nothing of the job is left to use them: its
        wrapper removes them, unless the wrapper itself was killed."""
        try:
            record = self._job_record(job_id)
        except (Unreadable, KeyError):
            return
        if self._wrapper_alive(record) or self._job_group(job_id) is not None:
            return
        remove_left(self._file(job_id, SHM_FILE))      # what a killed wrapper could not remove
        folder = record.get("tmpdir")
        if isinstance(folder, str) and os.path.isdir(folder):
            shutil.rmtree(folder, ignore_errors=True)

    def _status(self, job_id: str) -> JobStatus:
        ended = ended_status(self._read_json(job_id, wrapper.EXIT_FILE), lambda text: self._redact(job_id, text))
        if ended is not None:
            return ended
        legacy = self._read_json(job_id, LEGACY_STATUS_FILE)    # jobs launched before the wrapper existed
        if legacy and legacy.get("stage") in TERMINAL_STAGES:
            return JobStatus(legacy["stage"], str(legacy.get("message") or ""))
        record = self._job_record(job_id)
        cancel = self._read_json(job_id, wrapper.CANCEL_FILE)
        if self._wrapper_alive(record):
            attempt = (self._read_json(job_id, wrapper.PROCESS_FILE) or {}).get("attempt")
            retried = f"attempt {attempt} of {record['spec'].get('attempts', 1)}" if isinstance(attempt, int) \
                and attempt > 1 else ""
            return JobStatus(RUNNING, f"stopping: {cancel.get('reason')}" if cancel else retried)
        if cancel:     # stopped while its wrapper was still starting, before it could record anything
            return JobStatus(CANCELED, str(cancel.get("reason") or CANCELED_BY_USER))
        if "pid" not in record and time.time() - record["created_at"] < START_WAIT_S:
            return JobStatus(SCHEDULING)
        return JobStatus(ERROR, self._unrecorded_end(job_id))

    def _unreadable_status(self, job_id: str, exc: Unreadable) -> JobStatus:
        """A job whose job.json cannot be read: starting while its folder changed within RECORD_WAIT_S (its record
        may be on its way), else failed, saying why."""
        try:
            age = time.time() - os.stat(self._dir(job_id)).st_mtime
        except OSError:
            age = RECORD_WAIT_S
        return JobStatus(SCHEDULING) if age < RECORD_WAIT_S else JobStatus(ERROR, str(exc))

    def _unrecorded_end(self, job_id: str) -> str:
        """Why a job whose wrapper is gone left no exit record: its folder's disk is full, when it is (the cause
        first), else the likely guess."""
        try:
            free = shutil.disk_usage(self._dir(job_id)).free
        except OSError:
            free = None
        if free is not None and free < FULL_DISK_BYTES:
            return (f"{wrapper.DISK_FULL}: its wrapper could not record how the job ended ({free} bytes free where "
                    f"its records are, {self._dir(job_id)})")
        return "its wrapper process ended without recording how the job ended (was the machine restarted?)"

    def _redact(self, job_id: str, text: str) -> str:
        return redact_tokens(text, self._secrets.get(job_id, ()))

    def read_logs(self, job_id: str, cursor: int) -> tuple[list[str], int]:
        data = read_complete_lines(self.log_path(job_id), cursor)
        text = data.decode("utf-8", errors="replace")
        lines = [self._redact(job_id, line) for line in text.splitlines()]
        return lines, cursor + len(data)

    def all_logs(self, job_id: str) -> Iterator[str]:
        return log_text(self.log_path(job_id), lambda text: self._redact(job_id, text))

    def tail_cursor(self, job_id: str, lines: int) -> int:
        """The offset of the line start `lines` lines before the log's end (0 for a shorter log)."""
        return tail_offset(self.log_path(job_id), lines, 400)

    def resources_tail_cursor(self, job_id: str, samples: int) -> int:
        """A cursor from which `read_resources` returns about the last `samples` samples (0 for fewer)."""
        return tail_offset(self._file(job_id, wrapper.RESOURCES_FILE), samples, SAMPLE_BYTES)

    def read_resources(self, job_id: str, cursor: int, limit: int | None = None) -> tuple[list[ResourceSample], int]:
        path = self._file(job_id, wrapper.RESOURCES_FILE)
        return read_samples(path, cursor, limit, skipped=lambda offset: self._count_bad(path, offset))

    # ---- control
    def cancel(self, job_id: str, reason: str = CANCELED_BY_USER) -> None:
        """Ask the job to stop (its wrapper sends SIGTERM, then SIGKILL after the grace). Returns at once, or once
        a job submitted a moment ago has started. Whatever the recorded stage, a process of the job's group still
        alive is stopped too."""
        try:
            record = self._job_record(job_id)
        except Unreadable:
            record = {}
        done = self.status(job_id).done
        if not done and not os.path.exists(self._file(job_id, wrapper.CANCEL_FILE)):
            _write_json(self._file(job_id, wrapper.CANCEL_FILE), {"reason": reason, "time": time.time()})
        if self._wrapper_alive(record):
            self._wait_for_start(job_id)
            try:
                os.kill(record["pid"], signal.SIGTERM)
            except ProcessLookupError:
                pass    # it ended meanwhile, and recorded how
            return
        group = self._job_group(job_id)
        if group is not None:
            threading.Thread(target=self._stop_group, args=(job_id, group), daemon=True).start()
        if not done:    # its wrapper is gone, so nobody else will record the end
            ended = {"stage": CANCELED, "message": f"{reason} (its wrapper had already ended)", "time": time.time()}
            _write_json(self._file(job_id, wrapper.EXIT_FILE), ended)

    def _stop_group(self, job_id: str, group: int) -> None:
        """Stop what is left of a job whose wrapper is gone, then remove the temp dir that wrapper would have."""
        _stop_group(group, self.grace_s)
        self._remove_tmpdir(job_id)

    def _wait_for_start(self, job_id: str, timeout: float = 5.0) -> None:
        """A wrapper handles SIGTERM once Python has started it (a fraction of a second after submit): a cancel
        right after a launch waits for that, so the job ends CANCELED, with its record, rather than killed."""
        deadline = time.monotonic() + timeout
        while self.main_pid(job_id) is None and time.monotonic() < deadline:
            if self._read_json(job_id, wrapper.EXIT_FILE):
                return
            time.sleep(0.05)

    def wait(self, job_id: str, timeout: float) -> JobStatus:
        """Block until the job reaches a terminal stage and its wrapper has exited (for tests and scripts: the
        wrapper records the end a moment before its own process is gone)."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            status = self.status(job_id)
            if status.done:
                try:
                    record = self._job_record(job_id)
                except (Unreadable, KeyError):
                    return status
                while self._wrapper_alive(record) and time.time() < deadline:
                    time.sleep(0.05)
                return status
            time.sleep(0.2)
        return self.status(job_id)

    def list_jobs(self, run_id: str | None = None, checks: bool = False) -> list[JobRecord]:
        """Every local job, newest first. A job whose job.json cannot be read is still listed (marked unreadable,
        its run and role read from its folder's name), so its run does not vanish from the runs list. (No task
        check runs as a local job: `checks` lists none.)"""
        if checks:
            return []
        if run_id is None:
            return self._all_jobs()
        return self._listed_jobs(run_id)

    def _all_jobs(self) -> list[JobRecord]:
        """Every job, newest first: the same list as last time while no job folder came or went and every job had
        ended (the folder's mtime says so once it is older than FINAL_LISTING_S: a change after that has a later
        one, however coarse the file system's clock), so a listing costs what changed, not every job ever run."""
        before = time.time()
        changed = os.stat(self.jobs_dir).st_mtime_ns
        kept = self._final_listing
        if kept is not None and kept[0] == changed:
            return kept[1]
        names = self._job_names()
        records = self._listed_jobs(None, names)
        # Final: every folder is a job that has ended (one still being written, or not a job's, is asked again).
        final = (before - changed / 1e9 > FINAL_LISTING_S and len(records) == len(names)
                 and all(self._ended_records.get(r.job_id) is r for r in records))
        self._final_listing = (changed, records) if final else None
        return records

    def _job_names(self) -> list[str]:
        """The jobs' folders (a hidden one is a job still being submitted)."""
        return [name for name in os.listdir(self.jobs_dir) if not name.startswith(".")]

    def _listed_jobs(self, run_id: str | None, names: list[str] | None = None) -> list[JobRecord]:
        records = []
        for job_id in self._job_names() if names is None else names:
            if run_id and not job_id.startswith(f"{run_id}--"):
                continue
            ended = self._ended_records.get(job_id)
            if ended is not None:      # an ended job's record is final: a listing costs the jobs that changed
                records.append(ended)
                continue
            try:
                status = self.status(job_id)
                started, finished = self._times(job_id, status)
            except (OSError, ValueError, KeyError):
                continue    # gone meanwhile, or not a job's folder
            try:
                data = self._job_record(job_id)
            except Unreadable:
                record = _unreadable_record(job_id, self._dir(job_id), status)
                if record is not None:
                    records.append(dataclasses.replace(record, started_at=started, finished_at=finished))
                continue    # counted by _job_record; one bad job must not take the list down
            except (OSError, ValueError, KeyError):
                continue
            spec = data["spec"]
            volumes = [v for v in spec.get("volumes") or [] if isinstance(v, dict)]
            records.append(JobRecord(job_id, spec["run_id"], spec["role"], status.stage, data["created_at"],
                                     flavor=spec.get("flavor"), bucket=volumes[0].get("bucket") if volumes else None,
                                     started_at=started, finished_at=finished, timed_out=status.timed_out))
            if status.done and finished is not None:
                self._ended_records[job_id] = records[-1]
        return sorted(records, key=lambda r: r.created_at, reverse=True)

    def _times(self, job_id: str, status: JobStatus) -> tuple[float | None, float | None]:
        """When the job's command started and when it ended (epoch seconds; None while unknown), from the files its
        wrapper wrote, so a restarted panel knows how long a finished run took."""
        if job_id in self._ended_times:
            return self._ended_times[job_id]
        started = (self._read_json(job_id, wrapper.PROCESS_FILE) or {}).get("started_at")
        started = float(started) if isinstance(started, (int, float)) else None
        finished = None
        if status.done:
            ended = (self._read_json(job_id, wrapper.EXIT_FILE) or {}).get("time")
            finished = float(ended) if isinstance(ended, (int, float)) else _last_write(self._dir(job_id))
            self._ended_times[job_id] = (started, finished)
        return started, finished

    def cancel_all(self, timeout: float = 60.0) -> None:
        """Cancel every job under this home and wait until they have ended (tests, and stopping a machine)."""
        jobs = [r.job_id for r in self.list_jobs()]
        for job_id in jobs:
            self.cancel(job_id)
        deadline = time.time() + timeout
        for job_id in jobs:
            self.wait(job_id, max(0.0, deadline - time.time()))


# torch precompiles a ~150 MB C++ header before it loads its first CPU kernel in a process, even when every kernel
# is already in the shared compile cache below and nothing is compiled. It puts the header in TMPDIR (no setting
# moves it), each local job's own: every replica job started (a run, a resume) built one that went unused and was
# deleted with the job, ~9 s of CPU (a process loading one cached kernel: 13.8 s of CPU with it, 4.9 s without, on
# the 2-core machine). Without it a cached kernel costs nothing, and one not yet cached is compiled once for the
# machine, from the full headers (8 s instead of 26 s for the first kernel: no header to build first).
NO_PRIVATE_HEADER_BUILD = {"TORCHINDUCTOR_CPP_CACHE_PRECOMPILE_HEADERS": "0"}


def _shared_compile_cache() -> str:
    """Where torch.compile keeps what it compiled (vLLM on CPU compiles at every start): torch puts it in TMPDIR by
    default, which is now each job's own and goes with it, so every replica would compile from scratch. The place it
    would be for the panel's own temp dir, shared by every job (torch's `default_cache_dir`)."""
    return _user_temp_folder("torchinductor_")


def _shared_model_cache() -> str:
    """Where local jobs keep the builtin models they build (deterministic, so a copy serves every later run of the
    machine: runtime/tiny_model.py), beside the compile cache; the environment may name another folder."""
    return _user_temp_folder("grpo-builtin-models_")


def _user_temp_folder(prefix: str) -> str:
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = f"uid_{os.getuid()}"
    return os.path.join(tempfile.gettempdir(), prefix + re.sub(r'[\\/:*?"<>|]', "_", user))


def _unreadable_record(job_id: str, folder: str, status: JobStatus) -> JobRecord | None:
    """A job whose job.json is unreadable, as far as its folder tells: `<run_id>--<role>--<hex>`, and its age."""
    parts = job_id.split("--")
    if len(parts) < 3 or not all(parts):
        return None
    try:
        created = os.stat(folder).st_mtime
    except OSError:
        return None
    return JobRecord(job_id, "--".join(parts[:-2]), parts[-2], status.stage, created, unreadable=True,
                     timed_out=status.timed_out)


def _last_write(folder: str) -> float | None:
    """When the job last wrote its log or a resource sample: its end, where its wrapper could not record one."""
    times = []
    for name in (wrapper.LOG_FILE, wrapper.RESOURCES_FILE):
        try:
            times.append(os.stat(os.path.join(folder, name)).st_mtime)
        except OSError:
            pass
    return max(times, default=None)


def _same_start(started: float | None, recorded) -> bool:
    return started is not None and isinstance(recorded, (int, float)) and abs(started - recorded) < 1.0


def _same_process(pid, started_at) -> bool:
    """Whether `pid` is still the process that started at `started_at` (and not a zombie)."""
    if not isinstance(pid, int):
        return False
    try:
        proc = psutil.Process(pid)
        return proc.status() != psutil.STATUS_ZOMBIE and _same_start(proc.create_time(), started_at)
    except psutil.Error:
        return False


def _stop_group(pgid: int, grace_s: float) -> None:
    wrapper.signal_group(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while wrapper.group_alive(pgid) and time.monotonic() < deadline:
        time.sleep(0.1)
    wrapper.signal_group(pgid, signal.SIGKILL)


def _write_json(path: str, data: dict) -> None:
    atomic_write_bytes(path, json.dumps(data).encode())
