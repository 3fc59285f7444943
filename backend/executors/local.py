"""LocalExecutor: runs a JobSpec's command as a local process group (the embedded default: no account).

Volumes are mapped onto local folders (`<home>/buckets/<namespace>/<name>`) by rewriting the mount path in
the command and env; each job gets `<home>/jobs/<job_id>/` with `job.json`, `log.txt`, `resources.jsonl`
and `status.json`, so a restarted panel rebuilds its run list from disk.
"""

import json
import os
import secrets as _secrets
import signal
import subprocess
import threading
import time
from dataclasses import asdict

from backend.executors.base import ResourceSample, SubmitError
from backend.jobspec import (
    CANCELED,
    COMPLETED,
    ERROR,
    RUNNING,
    SCHEDULING,
    TERMINAL_STAGES,
    JobRecord,
    JobSpec,
    JobStatus,
)
from backend.runtime.redact import TOKEN_ENV_VARS, redact_tokens, remember_secret
from backend.runtime.sampler import ResourceSampler, visible_gpu_indices

GRACE_S = 5.0


class LocalExecutor:
    name = "local"

    def __init__(self, home: str):
        self.home = os.path.abspath(home)
        self.jobs_dir = os.path.join(self.home, "jobs")
        os.makedirs(self.jobs_dir, exist_ok=True)
        self._procs: dict[str, subprocess.Popen] = {}
        self._canceled: set[str] = set()
        self._secrets: dict[str, tuple[str, ...]] = {}
        self._lock = threading.Lock()

    # ---- paths
    def bucket_root(self, bucket: str) -> str:
        return os.path.join(self.home, "buckets", *bucket.split("/"))

    def _dir(self, job_id: str) -> str:
        if "/" in job_id or job_id.startswith("."):
            raise ValueError(f"bad job id {job_id!r}")
        return os.path.join(self.jobs_dir, job_id)

    def log_path(self, job_id: str) -> str:
        return os.path.join(self._dir(job_id), "log.txt")

    def exposed_url(self, job_id: str, port: int) -> str:
        return f"http://127.0.0.1:{port}"

    # ---- submit
    def _map_volumes(self, job: JobSpec, text: str) -> str:
        for vol in job.volumes:
            text = text.replace(vol.mount_path.rstrip("/"), self.bucket_root(vol.bucket))
        return text

    def submit(self, job: JobSpec, secrets: dict[str, str] | None = None) -> str:
        secrets = secrets or {}
        missing = [name for name in job.secrets if name not in secrets]
        if missing:
            raise SubmitError(f"job {job.role}: no value for secret(s) {', '.join(missing)}")
        job_id = f"{job.run_id}--{job.role}--{_secrets.token_hex(3)}"
        job_dir = self._dir(job_id)
        os.makedirs(job_dir)
        for vol in job.volumes:
            os.makedirs(self.bucket_root(vol.bucket), exist_ok=True)
        # The panel's own token stays with the panel: a local job gets only the secrets its JobSpec names.
        inherited = {k: v for k, v in os.environ.items() if k not in TOKEN_ENV_VARS}
        env = {**inherited, **{k: self._map_volumes(job, v) for k, v in job.env.items()},
               **{k: secrets[k] for k in job.secrets}}
        for name in job.secrets:
            remember_secret(secrets[name])
        if "PYTHONPATH" in job.env and os.environ.get("PYTHONPATH"):
            # Locally the job runs in the panel's environment: keep what that environment adds to the path.
            env["PYTHONPATH"] += os.pathsep + os.environ["PYTHONPATH"]
        command = [self._map_volumes(job, arg) for arg in job.command]
        record = {"job_id": job_id, "spec": asdict(job), "created_at": time.time(), "command": command}
        _write_json(os.path.join(job_dir, "job.json"), record)
        self._set_status(job_id, SCHEDULING)
        log = open(self.log_path(job_id), "ab")
        try:
            # A new session makes the job its own process group, so cancel reaches every child.
            proc = subprocess.Popen(command, cwd=job_dir, env=env, stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
        except OSError as exc:
            self._set_status(job_id, ERROR, f"could not start: {exc}")
            raise SubmitError(f"job {job.role}: could not start {command[0]!r}: {exc}") from exc
        finally:
            log.close()
        with self._lock:
            self._procs[job_id] = proc
            self._secrets[job_id] = tuple(secrets[k] for k in job.secrets)
        record["pid"] = proc.pid
        _write_json(os.path.join(job_dir, "job.json"), record)
        self._set_status(job_id, RUNNING)
        sampler = ResourceSampler(proc.pid, os.path.join(job_dir, "resources.jsonl"),
                                  gpu_indices=visible_gpu_indices(env)).start()
        threading.Thread(target=self._watch, args=(job_id, proc, job.timeout_s, sampler), daemon=True).start()
        return job_id

    def _watch(self, job_id: str, proc: subprocess.Popen, timeout_s: int, sampler: ResourceSampler) -> None:
        try:
            code = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            self._set_status(job_id, ERROR, f"timed out after {timeout_s} s; the job was stopped")
            return
        finally:
            sampler.stop()
        if job_id in self._canceled:
            self._set_status(job_id, CANCELED, "canceled by the user")
        elif code == 0:
            self._set_status(job_id, COMPLETED)
        else:
            self._set_status(job_id, ERROR, f"exited with code {code}; see the log")

    # ---- observe
    def _set_status(self, job_id: str, stage: str, message: str = "") -> None:
        _write_json(os.path.join(self._dir(job_id), "status.json"),
                    {"stage": stage, "message": message, "time": time.time()})

    def status(self, job_id: str) -> JobStatus:
        try:
            with open(os.path.join(self._dir(job_id), "status.json")) as f:
                data = json.load(f)
        except FileNotFoundError:
            raise KeyError(f"no local job {job_id!r}") from None
        if data["stage"] == RUNNING and job_id not in self._procs and not _pid_alive(self._pid(job_id)):
            # Launched by an earlier panel process that is gone: nobody watched it end.
            return JobStatus(ERROR, "the panel restarted and this job is no longer running")
        return JobStatus(data["stage"], data.get("message", ""))

    def _pid(self, job_id: str) -> int | None:
        with open(os.path.join(self._dir(job_id), "job.json")) as f:
            return json.load(f).get("pid")

    def read_logs(self, job_id: str, cursor: int) -> tuple[list[str], int]:
        data = _read_complete_lines(self.log_path(job_id), cursor)
        text = data.decode("utf-8", errors="replace")
        lines = [redact_tokens(line, self._secrets.get(job_id, ())) for line in text.splitlines()]
        return lines, cursor + len(data)

    def all_logs(self, job_id: str) -> list[str]:
        return self.read_logs(job_id, 0)[0]

    def read_resources(self, job_id: str, cursor: int) -> tuple[list[ResourceSample], int]:
        path = os.path.join(self._dir(job_id), "resources.jsonl")
        data = _read_complete_lines(path, cursor)
        samples = [_sample(json.loads(line)) for line in data.decode().splitlines() if line.strip()]
        return samples, cursor + len(data)

    # ---- control
    def cancel(self, job_id: str) -> None:
        proc = self._procs.get(job_id)
        if self.status(job_id).stage in TERMINAL_STAGES:
            return
        self._canceled.add(job_id)
        if proc is not None:
            _kill_group(proc)
        else:
            pid = self._pid(job_id)
            if pid and _pid_alive(pid):
                _kill_pgid(pid)
            self._set_status(job_id, CANCELED, "canceled by the user")

    def wait(self, job_id: str, timeout: float) -> JobStatus:
        """Block until the job reaches a terminal stage (for tests and scripts)."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            status = self.status(job_id)
            if status.done:
                return status
            time.sleep(0.2)
        return self.status(job_id)

    def list_jobs(self, run_id: str | None = None) -> list[JobRecord]:
        records = []
        for job_id in os.listdir(self.jobs_dir):
            if run_id and not job_id.startswith(f"{run_id}--"):
                continue
            try:
                with open(os.path.join(self._dir(job_id), "job.json")) as f:
                    data = json.load(f)
                status = self.status(job_id)
            except (OSError, ValueError, KeyError):
                continue
            spec = data["spec"]
            bucket = spec["volumes"][0]["bucket"] if spec["volumes"] else None
            records.append(JobRecord(job_id, spec["run_id"], spec["role"], status.stage, data["created_at"],
                                     flavor=spec["flavor"], bucket=bucket))
        return sorted(records, key=lambda r: r.created_at, reverse=True)

    def shutdown(self) -> None:
        """Stop every job this executor started (the panel is exiting)."""
        for job_id in list(self._procs):
            self.cancel(job_id)


def _write_json(path: str, data: dict) -> None:
    from backend.runtime.layout import atomic_write_bytes

    atomic_write_bytes(path, json.dumps(data).encode())


def _read_complete_lines(path: str, cursor: int) -> bytes:
    """Bytes after `cursor` up to the last newline: a line still being written waits for the next read."""
    try:
        with open(path, "rb") as f:
            f.seek(cursor)
            data = f.read()
    except FileNotFoundError:
        return b""
    end = data.rfind(b"\n")
    return data[: end + 1] if end >= 0 else b""


def _sample(d: dict) -> ResourceSample:
    return ResourceSample(time=d["time"], cpu_percent=d.get("cpu_percent"), ram_bytes=d.get("ram_bytes"),
                          gpu_util=tuple(d.get("gpu_util", ())), gpu_mem_bytes=tuple(d.get("gpu_mem_bytes", ())),
                          gpu_mem_total_bytes=tuple(d.get("gpu_mem_total_bytes", ())),
                          gpu_index=tuple(d.get("gpu_index", ())))


def _pid_alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _kill_pgid(pgid: int) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return
        deadline = time.time() + GRACE_S
        while time.time() < deadline:
            try:
                os.killpg(pgid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.1)


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGTERM the whole process group, then SIGKILL whatever is left after a grace period."""
    _kill_pgid(proc.pid)
    try:
        proc.wait(timeout=GRACE_S)
    except subprocess.TimeoutExpired:
        pass
