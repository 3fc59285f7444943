"""Launching a run: validate, write spec.json and the runtime code into the bucket, submit its jobs.

Nothing is submitted before the whole RunSpec validates, and a launch that fails half way cancels every
job it already submitted, so no orphan keeps running (or billing): only those, never a job of an earlier launch.

A launch is idempotent: it holds its run id's lock in the launch journal while it looks, and a second launch of a
run id that already holds this very spec (a retry after a lost answer) answers with that run and submits nothing
(`existing_launch`); one that holds another run, or a launch that failed, is refused.
"""

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from secrets import token_urlsafe

from backend.executors.base import Executor
from backend.plan import recipe
from backend.plan.engines import engine
from backend.plan.jobspec import CODE_LAYOUT_MARK, FLAT_CODE_MARK, JobSpec
from backend.plan.spec import RunSpec
from backend.runs.fleet_launch import LaunchedFleet, launch_fleet
from backend.runs.launch_errors import LaunchError, LaunchUnderWay, RunIdTaken, SubmitFailed, space_or
from backend.runs.run_files import (
    LAUNCH_WRITER,
    remember_failed_launch,
    remove_quietly,
    write_files,
    write_run_files,
)
from backend.runs.submit import CLOCK_SLACK_S, claim_launch, submit_jobs
from backend.runtime import layout
from backend.storage.journal import (
    FAILED,
    LAUNCHED,
    LAUNCHING,
    ROLLED_BACK,
    RUN,
    Launch,
    LaunchJournal,
    bucket_copy_path,
)
from backend.storage.store import BucketStore

# Names other code imports from here: a launch's answers and errors, its files, its submissions, a sweep's fleet.
__all__ = ["CLOCK_SLACK_S", "LAUNCH_WRITER", "LaunchError", "LaunchUnderWay", "LaunchedFleet", "LaunchedRun",
           "RunIdTaken", "SubmitFailed", "existing_launch", "launch_fleet", "launch_run", "preview_jobs",
           "remember_failed_launch", "submit_jobs", "write_run_files"]


@dataclass(frozen=True)
class LaunchedRun:
    run_id: str
    job_ids: dict[str, str]   # role -> job id
    note: str = ""            # what a resume continues from
    # A retry of a launch already made (`existing_launch`): its state as found (`launched`, or `launching` while
    # the first request still submits). Nothing was submitted by this call.
    existing: str = ""


def preview_jobs(spec: RunSpec, on_fleet: bool = False) -> list[JobSpec]:
    """Every job of the run as it will be submitted, placed as its engine places them (a local run: this interpreter,
    its CPU and GPU split, FREE_PORT_i where the launch picks a free port), each replica reached where the engine
    says (an HF Jobs replica's URL is a placeholder: it is known once the replica is submitted). `on_fleet`: a sweep
    member launched on its sweep's shared fleet, its trainer alone (`recipe.FleetJobs` previews the fleet)."""
    where = spec.engine
    return recipe.RunJobs(spec, where.placement(spec, preview=True), on_fleet=on_fleet).preview(where.replica_url)


def launch_run(spec: RunSpec, executor: Executor, store: BucketStore,
               secrets: dict[str, str] | None = None, resume: bool = False,
               journal: LaunchJournal | None = None, fleet_urls: tuple[str, ...] | None = None) -> LaunchedRun:
    """Submit a run's jobs. A new run writes spec.json and the runtime code first; a resumed one runs again on
    the files it was launched with (the code that ran is the code archived beside its results).

    Before the first submission the launch is recorded in `journal` (and the run's `launch.json`) with the roles it
    will create, then each job id as it is created (`backend/storage/journal.py`): a panel that stops part way leaves a
    record the next one rolls back.

    A submission that fails is remembered in the run's folder (a `launch_failed` event): the Hub's job list can lag
    a job it created behind an error answer, so the sweep right after the failure may not see it; the orphan finder
    and the panel's background sweep look again.

    `fleet_urls`: a sweep member's trainer uses its sweep's shared fleet there (`launch_fleet`), starting no
    replicas of its own.

    A new run's launch first takes its run id's lock in `journal` and looks in the bucket (`existing_launch`): a
    retry of a launch already made answers with that run (`LaunchedRun.existing`) and submits nothing; a run id
    that holds another run is refused (RunIdTaken), and one being launched by another request right now too
    (LaunchUnderWay). Nothing of the earlier launch is written or cancelled."""
    spec.check()
    began = time.time()
    secrets = secrets or {}
    where = engine(executor.name)      # the engine of the executor that runs the jobs
    if where.replicas_need_key and spec.mode == "distributed" and recipe.REPLICA_KEY_SECRET not in secrets:
        # A key of this launch's own (a resume's jobs get a new one): its replicas answer only its trainer.
        secrets = {**secrets, recipe.REPLICA_KEY_SECRET: token_urlsafe(32)}
    jobs = recipe.RunJobs(spec, where.placement(spec, preview=False), fleet_urls=fleet_urls,
                          flat_code=resume and _flat_code(store, spec.run_id))
    claim = claim_launch(journal, spec.run_id)
    try:
        if not resume:
            if claim is None:
                write_run_files(spec, store)
            else:
                found = _claimed_run_id(spec, store, journal)
                if found is not None:
                    claim.close()
                    return found
                write_files(spec, store, layout.run_prefix(spec.run_id))
    except BaseException:
        if claim is not None:
            claim.close()
        raise
    try:
        record = _begin(journal, spec, executor, store, jobs, claim)
    except Exception as exc:
        if claim is not None:
            claim.close()
        left = "" if resume else remove_quietly(store, layout.run_prefix(spec.run_id))
        raise LaunchError(f"{space_or(exc, f'could not record the launch before submitting it: {exc}')}. "
                          f"No job was submitted{left}.") from exc
    try:
        launched = _submit_run(jobs, executor, secrets, record.created if record else None, began)
    except SubmitFailed as exc:
        if record:
            record.finish(FAILED, str(exc))
        try:
            remember_failed_launch(store, spec.run_id, str(exc), exc.canceled)
        except Exception:  # a failing bucket: the sweep right after the failure is all there is
            raise exc from None
        if not where.job_list_lags:
            raise
        raise SubmitFailed(f"{exc} The Hub's job list can lag behind a job it created anyway: the panel keeps looking "
                          "for one with the run's label for a few minutes and cancels it (the orphan finder lists it "
                          "too).", canceled=exc.canceled) from exc
    except BaseException as exc:
        # Anything else left the launch half done: the record stays `launching`, its lock goes, and the panel's
        # next background pass rolls it back (cancels what was created, marks the run failed).
        if record:
            record.abandon(f"the launch stopped part way: {type(exc).__name__}: {exc}")
        raise
    if record:
        record.finish(LAUNCHED)
    return launched


def _begin(journal: LaunchJournal | None, spec: RunSpec, executor: Executor, store: BucketStore,
           jobs: recipe.RunJobs, claim: Launch | None) -> Launch | None:
    """The launch's record, before anything is submitted; a launch that cannot be recorded submits nothing."""
    if journal is None:
        return None
    planned = [job.role for job in jobs.first()] + (["trainer"] if spec.mode == "distributed" else [])
    return journal.begin(RUN, spec.run_id, run_id=spec.run_id, executor=executor.name, namespace=executor.namespace,
                         bucket=spec.bucket, folder=layout.run_prefix(spec.run_id), planned=planned, store=store,
                         claimed=claim)


def _claimed_run_id(spec: RunSpec, store: BucketStore, journal: LaunchJournal) -> LaunchedRun | None:
    """Under the run id's lock: None when the id is free (its bucket made if new), else the run a retry finds
    (`existing_launch`); raises RunIdTaken or LaunchError, having written nothing."""
    try:
        store.ensure_bucket()
        return existing_launch(spec, store, journal, held=True)
    except LaunchError:
        raise
    except Exception as exc:
        raise LaunchError(f"could not read bucket {spec.bucket} to check run id {spec.run_id}: "
                          f"{space_or(exc, str(exc))}. No job was submitted.") from exc


def existing_launch(spec: RunSpec, store: BucketStore, journal: LaunchJournal | None,
                    held: bool = False) -> LaunchedRun | None:
    """What a launch of `spec` finds already made under its run id: None when the id holds no run yet; that run
    (`LaunchedRun.existing`: launched, or launching while an earlier request still submits) when it holds this very
    spec (the same settings, so the same review code): a retry after a lost answer; raises RunIdTaken when it
    holds a run of other settings, or one whose launch failed or stopped part way. Reads the run's spec.json and
    its launch record (this home's, else the bucket's `launch.json`); changes nothing. `held`: this process holds
    the run id's lock, so a record still `launching` was left by a panel that stopped."""
    prefix = layout.run_prefix(spec.run_id)
    spec_path, record_path = f"{prefix}/{layout.SPEC_FILE}", bucket_copy_path(spec.run_id)
    present = store.sizes([spec_path, record_path])
    if spec_path not in present:
        return None
    try:
        same = RunSpec.from_dict(json.loads(store.read_bytes(spec_path))).fingerprint() == spec.fingerprint()
    except Exception:       # an unreadable or foreign spec.json is not this spec
        same = False
    if not same:
        raise RunIdTaken(f"run id {spec.run_id} is already used in bucket {spec.bucket} by a run with other "
                         "settings: nothing was launched. Preview again for a new run id.")
    record = _launch_record(store, journal, spec.run_id, record_path in present)
    state = record.get("state") if record else LAUNCHED   # no record: launched before launches were journaled
    if state == LAUNCHING and (held or journal is None or not journal.under_way(spec.run_id)):
        state = "stopped"
    if state not in (LAUNCHED, LAUNCHING):
        why = record.get("why") if record else ""
        said = {FAILED: "failed", ROLLED_BACK: "was rolled back"}.get(state, "stopped part way")
        raise RunIdTaken(f"run {spec.run_id} was launched before and its launch {said}"
                         + (f" ({why})" if why else "") + ": nothing was launched now. Preview again for a new run id.")
    return LaunchedRun(spec.run_id, dict(record.get("jobs") or {}) if record else {}, existing=state)


def _launch_record(store: BucketStore, journal: LaunchJournal | None, run_id: str, in_bucket: bool) -> dict | None:
    record = journal.get(run_id) if journal is not None else None
    if record is not None and record.get("kind") == RUN:
        return record
    if not in_bucket:
        return None
    try:
        record = json.loads(store.read_bytes(bucket_copy_path(run_id)))
    except Exception:       # unreadable: as if none (its spec.json says it was launched)
        return None
    return record if isinstance(record, dict) and isinstance(record.get("jobs", {}), dict) else None


def _flat_code(store: BucketStore, run_id: str) -> bool:
    """Whether the run's code in the bucket is the flat runtime of a panel from before its sub-packages (a run
    launched then and resumed now runs that code, so its jobs must name the modules it has)."""
    code = f"{layout.run_prefix(run_id)}/{layout.CODE_DIR}"
    have = store.sizes([f"{code}/{CODE_LAYOUT_MARK}", f"{code}/{FLAT_CODE_MARK}"])
    return f"{code}/{FLAT_CODE_MARK}" in have and f"{code}/{CODE_LAYOUT_MARK}" not in have


def _submit_run(jobs: recipe.RunJobs, executor: Executor, secrets: dict[str, str],
                created: Callable[[str, str], None] | None, began: float) -> LaunchedRun:
    first = jobs.first()
    ids = submit_jobs(executor, first, secrets, created=created, since=began)
    roles = {j.role: i for j, i in zip(first, ids)}
    if jobs.spec.mode == "colocated":
        return LaunchedRun(jobs.spec.run_id, roles)
    urls = recipe.server_urls(first, lambda i, job, port: executor.exposed_url(ids[i], port))
    trainer_id = submit_jobs(executor, [jobs.trainer(urls)], secrets, already=ids, created=created, since=began)[0]
    return LaunchedRun(jobs.spec.run_id, {**roles, "trainer": trainer_id})
