"""Launching a run: validate, write spec.json and the runtime code into the bucket, submit its jobs.

Nothing is submitted before the whole RunSpec validates, and a launch that fails half way cancels every
job it already submitted, so no orphan keeps running (or billing).
"""

import json
import os
from dataclasses import dataclass
from secrets import token_urlsafe

from backend.executors.base import Executor
from backend.plan import recipe
from backend.plan.engines import engine
from backend.plan.jobspec import TERMINAL_STAGES, JobSpec
from backend.plan.spec import RunSpec
from backend.runtime import RUNTIME_DIR, layout, records
from backend.runtime.task import is_local_file, local_copy_path
from backend.storage.store import BucketStore

LAUNCH_WRITER = f"{layout.PANEL_WRITER}-launch"


class LaunchError(RuntimeError):
    """A launch failed; `canceled` lists the job ids that were submitted and then cancelled."""

    def __init__(self, message: str, canceled: list[str] | None = None):
        self.canceled = canceled or []
        super().__init__(message)


class SubmitFailed(LaunchError):
    """A job of the run could not be submitted (after its files were written); what was submitted is cancelled."""


class RunIdTaken(LaunchError):
    """A run with this id already has files in the bucket: launching again would mix two runs."""


@dataclass(frozen=True)
class LaunchedRun:
    run_id: str
    job_ids: dict[str, str]   # role -> job id
    note: str = ""            # what a resume continues from


def submit_jobs(executor: Executor, jobs: list[JobSpec], secrets: dict[str, str],
                already: list[str] | None = None) -> list[str]:
    """Submit `jobs` in order. If one fails, cancel every job of the run (and `already`), then raise.

    A failed answer does not prove that nothing was created (the Hub may create a job and then time out), so
    after a failure the run's label is swept as well and whatever it finds is cancelled too."""
    submitted: list[str] = []
    for job in jobs:
        try:
            submitted.append(executor.submit(job, secrets))
        except Exception as exc:
            started = [*(already or []), *submitted]
            cancel_errors = _cancel_all(executor, started)
            found, sweep_errors = _sweep_run_label(executor, job.run_id, started)
            message = (f"could not submit job '{job.role}': {exc}. "
                       + (f"Cancelled the {len(started)} job(s) already submitted ({', '.join(started)})."
                          if started else "No job had been submitted."))
            if found:
                message += (f" The failed request had created {len(found)} job(s) anyway, found by the run's label "
                            f"and cancelled: {', '.join(found)}.")
            if cancel_errors or sweep_errors:
                message += " Could NOT cancel: " + "; ".join(cancel_errors + sweep_errors) + " - cancel them by hand."
            raise SubmitFailed(message, canceled=started + found) from exc
    return submitted


def _cancel_all(executor: Executor, job_ids: list[str]) -> list[str]:
    errors = []
    for job_id in job_ids:
        try:
            executor.cancel(job_id)
        except Exception as exc:  # keep cancelling the others: each is billing
            errors.append(f"{job_id}: {exc}")
    return errors


def _sweep_run_label(executor: Executor, run_id: str, known: list[str]) -> tuple[list[str], list[str]]:
    """Cancel the run's jobs that are running but were never confirmed to us; (cancelled ids, errors)."""
    try:
        records = executor.list_jobs(run_id=run_id)
    except Exception as exc:   # the listing failing too: say so, the user must check by hand
        return [], [f"could not list the run's jobs to check for strays ({exc})"]
    strays = [r.job_id for r in records if r.job_id not in known and r.stage not in TERMINAL_STAGES]
    return strays, _cancel_all(executor, strays)


def write_run_files(spec: RunSpec, store: BucketStore) -> None:
    """spec.json, the runtime code, the run's own reward code and dataset file, so the run can always be
    explained, relaunched and resumed, and a job on another machine finds everything in the bucket."""
    prefix = layout.run_prefix(spec.run_id)
    store.ensure_bucket()
    if any(f.path == f"{prefix}/{layout.SPEC_FILE}" for f in store.list_files(prefix)):
        raise RunIdTaken(f"run id {spec.run_id} is already used in bucket {spec.bucket}")
    store.upload_folder(RUNTIME_DIR, f"{prefix}/{layout.CODE_DIR}/runtime")
    if spec.reward_code.strip():
        store.write_bytes(f"{prefix}/{layout.CODE_DIR}/{layout.USER_REWARDS_MODULE}.py", spec.reward_code.encode())
    if is_local_file(spec.dataset):
        _upload_dataset(spec, store, prefix)
    if spec.eval_source == "file":
        _upload_dataset(spec, store, prefix, held_out=True)
    store.write_bytes(f"{prefix}/{layout.SPEC_FILE}", spec.to_json().encode())


def _upload_dataset(spec: RunSpec, store: BucketStore, prefix: str, held_out: bool = False) -> None:
    """The run's own copy of a local dataset file (or of its held-out file): its jobs (and a resume, long after)
    read that one."""
    path = spec.eval_file if held_out else spec.dataset
    source = os.path.expanduser(path)
    if not os.path.isfile(source):
        raise FileNotFoundError(f"{'held-out' if held_out else 'dataset'} file {path} is gone")
    name = os.path.basename(local_copy_path("", path, held_out))
    with open(source, "rb") as f:
        store.write_bytes(f"{prefix}/{layout.DATA_DIR}/{name}", f.read())


def preview_jobs(spec: RunSpec) -> list[JobSpec]:
    """Every job of the run as it will be submitted, placed as its engine places them (a local run: this interpreter,
    its CPU and GPU split, FREE_PORT_i where the launch picks a free port), each replica reached where the engine
    says (an HF Jobs replica's URL is a placeholder: it is known once the replica is submitted)."""
    where = spec.engine
    return recipe.RunJobs(spec, where.placement(spec, preview=True)).preview(where.replica_url)


def launch_run(spec: RunSpec, executor: Executor, store: BucketStore,
               secrets: dict[str, str] | None = None, resume: bool = False) -> LaunchedRun:
    """Submit a run's jobs. A new run writes spec.json and the runtime code first; a resumed one runs again on
    the files it was launched with (the code that ran is the code archived beside its results).

    A submission that fails is remembered in the run's folder (a `launch_failed` event): the Hub's job list can lag
    a job it created behind an error answer, so the sweep right after the failure may not see it; the orphan finder
    and the panel's background sweep look again."""
    spec.check()
    secrets = secrets or {}
    where = engine(executor.name)      # the engine of the executor that runs the jobs
    if where.replicas_need_key and spec.mode == "distributed":
        # A key of this launch's own (a resume's jobs get a new one): its replicas answer only its trainer.
        secrets = {**secrets, recipe.REPLICA_KEY_SECRET: token_urlsafe(32)}
    try:
        if not resume:
            write_run_files(spec, store)
    except RunIdTaken as exc:
        raise LaunchError(f"{exc}: preview the run again for a new id. No job was submitted.") from exc
    except Exception as exc:
        raise LaunchError(f"could not write the run's files into bucket {spec.bucket}: {exc}. "
                          "No job was submitted.") from exc
    try:
        return _submit_run(recipe.RunJobs(spec, where.placement(spec, preview=False)), executor, secrets)
    except SubmitFailed as exc:
        try:
            remember_failed_launch(store, spec.run_id, str(exc), exc.canceled)
        except Exception:  # a failing bucket: the sweep right after the failure is all there is
            raise exc from None
        if not where.job_list_lags:
            raise
        raise SubmitFailed(f"{exc} The Hub's job list can lag behind a job it created anyway: the panel keeps looking "
                          "for one with the run's label for a few minutes and cancels it (the orphan finder lists it "
                          "too).", canceled=exc.canceled) from exc


def remember_failed_launch(store: BucketStore, run_id: str, message: str, known: list[str]) -> None:
    """A `launch_failed` event in the run's folder: when, why, and the job ids the launch knew of."""
    folder = f"{layout.run_prefix(run_id)}/{layout.EVENTS_DIR}"
    seq = sum(1 for f in store.list_files(folder) if f.path.rsplit("/", 1)[-1].startswith(LAUNCH_WRITER + "-"))
    record = records.event_record(records.LAUNCH_FAILED, message=message, known=known)
    store.write_bytes(f"{folder}/{layout.fragment_name(LAUNCH_WRITER, seq)}", (json.dumps(record) + "\n").encode())


def _submit_run(jobs: recipe.RunJobs, executor: Executor, secrets: dict[str, str]) -> LaunchedRun:
    first = jobs.first()
    ids = submit_jobs(executor, first, secrets)
    roles = {j.role: i for j, i in zip(first, ids)}
    if jobs.spec.mode == "colocated":
        return LaunchedRun(jobs.spec.run_id, roles)
    urls = recipe.server_urls(first, lambda i, job, port: executor.exposed_url(ids[i], port))
    trainer_id = submit_jobs(executor, [jobs.trainer(urls)], secrets, already=ids)[0]
    return LaunchedRun(jobs.spec.run_id, {**roles, "trainer": trainer_id})
