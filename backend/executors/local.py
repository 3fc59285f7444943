"""LocalExecutor: runs a JobSpec's command as local processes, under a wrapper that outlives the panel.

Volumes are mapped onto local folders (`<home>/buckets/<namespace>/<name>`) by rewriting the mount path in
the command and env. Each job gets `<home>/jobs/<job_id>/` (made as `.new-<job_id>` and renamed once its `job.json` is
in, so a listing never finds a job without its record); what it holds and how it is read: `local_files.py`. The job's
wrapper (`backend/runtime/job/job_wrapper.py`) enforces the timeout and removes the job's own TMPDIR
(`<system temp>/grpo-job-<hex>-*`) when the job ends. A job's status is read from its folder alone
(`local_status.py`), and the jobs are listed from their folders (`local_listing.py`). This module starts and stops
jobs.
"""

import getpass
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
from dataclasses import asdict

from backend.executors.base import SubmitError
from backend.executors.local_files import JOB_FILE, Unreadable, write_json
from backend.executors.local_listing import LocalJobListing
from backend.executors.local_status import CANCELED_BY_USER
from backend.plan.engines.local import ENGINE, as_run, loopback_url
from backend.plan.jobspec import CANCELED, ERROR, JobSpec, JobStatus
from backend.runtime import BACKEND_DIR
from backend.runtime.job import job_wrapper as wrapper
from backend.runtime.redact import is_secret_env_name, remember_secret
from backend.runtime.tiny_model import CACHE_ENV as MODEL_CACHE_ENV


class LocalExecutor(LocalJobListing):
    name = ENGINE.name
    namespace = None

    def __init__(self, home: str, grace_s: float = wrapper.DEFAULT_GRACE_S):
        super().__init__(home)
        self.grace_s = grace_s

    def exposed_url(self, job_id: str, port: int) -> str:
        return loopback_url(port)

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
            write_json(os.path.join(staging, JOB_FILE), record)
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
                write_json(self._file(job_id, wrapper.EXIT_FILE),
                            {"stage": ERROR, "message": f"could not start: {exc}", "time": time.time()})
                raise SubmitError(f"job {job.role}: could not start its wrapper: {exc}") from exc
        with self._lock:
            self._secrets[job_id] = tuple(secrets[k] for k in job.secrets)
        record.update(pid=proc.pid, pid_started_at=wrapper.process_start_time(proc.pid))
        write_json(os.path.join(job_dir, JOB_FILE), record)
        # Only reaping: the wrapper watches the job. An unreaped wrapper would look alive until the panel exits.
        threading.Thread(target=proc.wait, name=f"reap-{job_id}", daemon=True).start()
        return job_id

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
            write_json(self._file(job_id, wrapper.CANCEL_FILE), {"reason": reason, "time": time.time()})
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
            write_json(self._file(job_id, wrapper.EXIT_FILE), ended)

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


def _stop_group(pgid: int, grace_s: float) -> None:
    wrapper.signal_group(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while wrapper.group_alive(pgid) and time.monotonic() < deadline:
        time.sleep(0.1)
    wrapper.signal_group(pgid, signal.SIGKILL)
