"""Launching a run: validate, write spec.json and the runtime code into the bucket, submit its jobs.

Nothing is submitted before the whole RunSpec validates, and a launch that fails half way cancels every
job it already submitted, so no orphan keeps running (or billing).
"""

import os
import socket
import sys
from dataclasses import dataclass

from backend import recipe
from backend.executors.base import Executor
from backend.jobspec import JobSpec
from backend.runtime import layout
from backend.spec import RunSpec
from backend.store import BucketStore

RUNTIME_DIR = os.path.join(os.path.dirname(__file__), "runtime")


class LaunchError(RuntimeError):
    """A launch failed; `canceled` lists the job ids that were submitted and then cancelled."""

    def __init__(self, message: str, canceled: list[str] | None = None):
        self.canceled = canceled or []
        super().__init__(message)


@dataclass(frozen=True)
class LaunchedRun:
    run_id: str
    job_ids: dict[str, str]   # role -> job id
    note: str = ""            # what a resume continues from


def submit_jobs(executor: Executor, jobs: list[JobSpec], secrets: dict[str, str],
                already: list[str] | None = None) -> list[str]:
    """Submit `jobs` in order. If one fails, cancel every job submitted so far (and `already`), then raise."""
    submitted: list[str] = []
    for job in jobs:
        try:
            submitted.append(executor.submit(job, secrets))
        except Exception as exc:
            started = [*(already or []), *submitted]
            cancel_errors = _cancel_all(executor, started)
            message = (f"could not submit job '{job.role}': {exc}. "
                       + (f"Cancelled the {len(started)} job(s) already submitted ({', '.join(started)})."
                          if started else "No job had been submitted."))
            if cancel_errors:
                message += " Could NOT cancel: " + "; ".join(cancel_errors) + " - cancel them by hand."
            raise LaunchError(message, canceled=started) from exc
    return submitted


def _cancel_all(executor: Executor, job_ids: list[str]) -> list[str]:
    errors = []
    for job_id in job_ids:
        try:
            executor.cancel(job_id)
        except Exception as exc:  # keep cancelling the others: each is billing
            errors.append(f"{job_id}: {exc}")
    return errors


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_run_files(spec: RunSpec, store: BucketStore) -> None:
    """spec.json and the runtime code, so the run can always be explained, relaunched and resumed."""
    prefix = layout.run_prefix(spec.run_id)
    store.ensure_bucket()
    store.upload_folder(RUNTIME_DIR, f"{prefix}/{layout.CODE_DIR}/runtime")
    store.write_bytes(f"{prefix}/{layout.SPEC_FILE}", spec.to_json().encode())


def launch_run(spec: RunSpec, executor: Executor, store: BucketStore,
               secrets: dict[str, str] | None = None) -> LaunchedRun:
    spec.check()
    secrets = secrets or {}
    local = executor.name == "local"
    python = sys.executable if local else "python"
    try:
        write_run_files(spec, store)
    except Exception as exc:
        raise LaunchError(f"could not write the run's files into bucket {spec.bucket}: {exc}. "
                          "No job was submitted.") from exc
    if spec.mode == "colocated":
        jobs = recipe.colocated_jobs(spec, python=python)
        ids = submit_jobs(executor, jobs, secrets)
        return LaunchedRun(spec.run_id, {j.role: i for j, i in zip(jobs, ids)})
    ports = [free_port() for _ in range(spec.replicas)] if local else None
    replicas = recipe.replica_jobs(spec, ports=ports, python=python)
    replica_ids = submit_jobs(executor, replicas, secrets)
    urls = [executor.exposed_url(job_id, job.expose[0]) for job, job_id in zip(replicas, replica_ids)]
    trainer = recipe.trainer_job(spec, urls, python=python)
    trainer_id = submit_jobs(executor, [trainer], secrets, already=replica_ids)[0]
    roles = {j.role: i for j, i in zip(replicas, replica_ids)}
    return LaunchedRun(spec.run_id, {**roles, "trainer": trainer_id})
