"""Launching a sweep's one shared replica fleet, before its members' trainers (`recipe.FleetJobs`)."""

import dataclasses
import json
import time
from dataclasses import dataclass, field
from secrets import token_urlsafe

from backend.executors.base import Executor
from backend.plan import recipe
from backend.plan.engines import engine
from backend.plan.jobspec import JobSpec
from backend.plan.spec import RunSpec
from backend.runs.launch_errors import LaunchError, RunIdTaken, SubmitFailed, space_or
from backend.runs.run_files import remove_quietly
from backend.runs.submit import cancel_all, claim_launch, submit_jobs
from backend.runtime import RUNTIME_DIR, layout
from backend.storage.journal import FAILED, LAUNCHED, RUN, LaunchJournal
from backend.storage.store import BucketStore


@dataclass(frozen=True)
class LaunchedFleet:
    """A sweep's shared fleet, submitted: its id (the sweep's), its replica jobs by role, and where every member's
    trainer reaches its servers."""

    fleet_id: str
    job_ids: dict[str, str]
    urls: tuple[str, ...]
    # The job secrets its replicas were given beyond the launch's own: where an engine's replicas demand a key
    # (`replicas_need_key`), the fleet's, which every member's trainer needs too. Never shown.
    secrets: dict[str, str] = field(default_factory=dict, repr=False)


def launch_fleet(members: list[RunSpec], slots: int, rank: int, executor: Executor, store: BucketStore,
                 secrets: dict[str, str] | None = None, journal: LaunchJournal | None = None) -> LaunchedFleet:
    """Start a sweep's one replica fleet (`recipe.FleetJobs`), before its members' trainers: its runtime code and
    record into `runs/<fleet>/` (`fleet.json`: the sweep, its members, the slots and rank, its name and attempts),
    then its replica jobs, journaled as a run's launch is. A submission that fails, or replicas whose URLs cannot be
    found, cancel what it started (never a job of an earlier launch). Where the engine's replicas demand a key, the
    fleet gets one of its own, which it hands back for its members' trainers. A fleet already launched under the
    sweep's id is refused, with nothing written or submitted (a retry of a whole sweep finds the sweep's record
    first: `Operations.launch_sweep`)."""
    began = time.time()
    where = engine(executor.name)
    secrets = secrets or {}
    own = {}
    if where.replicas_need_key and recipe.REPLICA_KEY_SECRET not in secrets:
        own = {recipe.REPLICA_KEY_SECRET: token_urlsafe(32)}
        secrets = {**secrets, **own}
    fleet = recipe.FleetJobs(tuple(members), slots, rank)
    spec = fleet.spec
    fleet = dataclasses.replace(fleet, place=where.placement(spec, preview=False))
    prefix = layout.run_prefix(spec.run_id)
    # What the fleet's own readers need of a spec (it has no spec.json): its name and mode for the runs list, its
    # replicas' attempts for their end events (`runtime.serving.serve_replica`).
    record = {"sweep_id": members[0].sweep_id, "members": {m.sweep_member: m.run_id for m in members},
              "max_loras": slots, "max_lora_rank": rank, "name": spec.name, "mode": spec.mode,
              "executor": executor.name, "attempts": spec.attempts}
    jobs = fleet.jobs()
    claim = claim_launch(journal, spec.run_id)
    try:
        _write_fleet_files(spec, store, record)
    except BaseException:
        if claim is not None:
            claim.close()
        raise
    launch = None
    if journal is not None:
        launch = journal.begin(RUN, spec.run_id, run_id=spec.run_id, executor=executor.name,
                               namespace=executor.namespace, bucket=spec.bucket, folder=prefix,
                               planned=[job.role for job in jobs], store=store, claimed=claim)
    try:
        ids = submit_jobs(executor, jobs, secrets, created=launch.created if launch else None, since=began)
        urls = _fleet_urls(executor, jobs, ids)
    except SubmitFailed as exc:
        if launch:
            launch.finish(FAILED, str(exc))
        raise
    except BaseException as exc:
        if launch:
            launch.abandon(f"the launch stopped part way: {type(exc).__name__}: {exc}")
        raise
    if launch:
        launch.finish(LAUNCHED)
    return LaunchedFleet(spec.run_id, {job.role: job_id for job, job_id in zip(jobs, ids)}, tuple(urls), own)


def _write_fleet_files(spec: RunSpec, store: BucketStore, record: dict) -> None:
    """Under the fleet's lock: its runtime code and `fleet.json`, unless a fleet of that id is there already
    (RunIdTaken, nothing written); a write that fails removes what was written."""
    prefix = layout.run_prefix(spec.run_id)
    try:
        store.ensure_bucket()
        taken = f"{prefix}/{layout.FLEET_FILE}" in store.sizes([f"{prefix}/{layout.FLEET_FILE}"])
    except Exception as exc:
        raise LaunchError(f"could not write the sweep's fleet into bucket {spec.bucket}: {space_or(exc, str(exc))}. "
                          "No job was submitted.") from exc
    if taken:
        raise RunIdTaken(f"the sweep's fleet {spec.run_id} was launched already (bucket {spec.bucket}): nothing was "
                         "submitted. Preview the sweep again for a new sweep id.")
    try:
        store.upload_folder(RUNTIME_DIR, f"{prefix}/{layout.CODE_DIR}/runtime")
        store.write_bytes(f"{prefix}/{layout.FLEET_FILE}", json.dumps(record).encode())
    except Exception as exc:
        left = remove_quietly(store, prefix)
        raise LaunchError(f"could not write the sweep's fleet into bucket {spec.bucket}: {space_or(exc, str(exc))}. "
                          f"No job was submitted{left}.") from exc


def _fleet_urls(executor: Executor, jobs: list[JobSpec], ids: list[str]) -> list[str]:
    """Where the members' trainers reach the fleet's servers; where that cannot be found (a Ray replica the cluster
    never placed), the fleet's jobs are cancelled and the launch fails as a failed submission does."""
    try:
        return recipe.server_urls(jobs, lambda i, job, port: executor.exposed_url(ids[i], port))
    except Exception as exc:
        errors = cancel_all(executor, ids)
        said = f" Could NOT cancel: {'; '.join(errors)} - cancel them by hand." if errors else ""
        raise SubmitFailed(f"could not find where the fleet's replicas answer: {exc}. Cancelled the {len(ids)} "
                           f"job(s) submitted ({', '.join(ids)}).{said}", canceled=ids) from exc
