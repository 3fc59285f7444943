"""Launching a run: validate, write spec.json and the runtime code into the bucket, submit its jobs.

Nothing is submitted before the whole RunSpec validates, and a launch that fails half way cancels every
job it already submitted, so no orphan keeps running (or billing): only those, never a job of an earlier launch.

A launch is idempotent: it holds its run id's lock in the launch journal while it looks, and a second launch of a
run id that already holds this very spec (a retry after a lost answer) answers with that run and submits nothing
(`existing_launch`); one that holds another run, or a launch that failed, is refused.
"""

import dataclasses
import errno
import json
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from secrets import token_urlsafe

from backend.executors.base import Executor
from backend.plan import recipe
from backend.plan.engines import engine
from backend.plan.jobspec import TERMINAL_STAGES, JobSpec
from backend.plan.spec import RunSpec
from backend.runtime import RUNTIME_DIR, layout, records
from backend.runtime.task import is_local_file, local_copy_path
from backend.storage.journal import (
    FAILED,
    LAUNCHED,
    LAUNCHING,
    ROLLED_BACK,
    RUN,
    Launch,
    LaunchJournal,
    UnderWay,
    bucket_copy_path,
)
from backend.storage.store import BucketStore

LAUNCH_WRITER = f"{layout.PANEL_WRITER}-launch"
# Clocks differ a little (the Hub's and ours): a job the Hub created for a launch is dated up to this much before the
# launch began, or after its failure was recorded. A job of the run's label dated earlier is an earlier launch's, and
# a launch's rollback leaves it alone.
CLOCK_SLACK_S = 30.0


class LaunchError(RuntimeError):
    """A launch failed; `canceled` lists the job ids that were submitted and then cancelled."""

    def __init__(self, message: str, canceled: list[str] | None = None):
        self.canceled = canceled or []
        super().__init__(message)


class SubmitFailed(LaunchError):
    """A job of the run could not be submitted (after its files were written); what was submitted is cancelled."""


class RunIdTaken(LaunchError):
    """A run with this id already has files in the bucket: launching again would mix two runs."""


class LaunchUnderWay(LaunchError):
    """Another request is launching this run id (or sweep) right now: a retry sent while the first still runs."""


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


@dataclass(frozen=True)
class LaunchedRun:
    run_id: str
    job_ids: dict[str, str]   # role -> job id
    note: str = ""            # what a resume continues from
    # A retry of a launch already made (`existing_launch`): its state as found (`launched`, or `launching` while
    # the first request still submits). Nothing was submitted by this call.
    existing: str = ""


def submit_jobs(executor: Executor, jobs: list[JobSpec], secrets: dict[str, str],
                already: list[str] | None = None, created: Callable[[str, str], None] | None = None,
                since: float | None = None) -> list[str]:
    """Submit `jobs` in order, handing each (role, job id) to `created` as it exists. If one fails, cancel every job
    this launch submitted (and `already`), then raise.

    A failed answer does not prove that nothing was created (the Hub may create a job and then time out), so
    after a failure the run's label is swept as well and whatever it finds created since the launch began (`since`,
    epoch seconds; None: any time) is cancelled too: a job of an earlier launch with the same label is not this
    launch's to cancel."""
    since = time.time() if since is None else since
    submitted: list[str] = []
    for job in jobs:
        try:
            submitted.append(executor.submit(job, secrets))
            if created is not None:
                created(job.role, submitted[-1])
        except Exception as exc:
            started = [*(already or []), *submitted]
            cancel_errors = _cancel_all(executor, started)
            found, sweep_errors = _sweep_run_label(executor, job.run_id, started, since)
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


def _sweep_run_label(executor: Executor, run_id: str, known: list[str], since: float) -> tuple[list[str], list[str]]:
    """Cancel the run's jobs created since the launch began that are running but were never confirmed to us;
    (cancelled ids, errors)."""
    try:
        records = executor.list_jobs(run_id=run_id)
    except Exception as exc:   # the listing failing too: say so, the user must check by hand
        return [], [f"could not list the run's jobs to check for strays ({exc})"]
    strays = [r.job_id for r in records if r.job_id not in known and r.stage not in TERMINAL_STAGES
              and r.created_at >= since - CLOCK_SLACK_S]
    return strays, _cancel_all(executor, strays)


def write_run_files(spec: RunSpec, store: BucketStore) -> None:
    """spec.json, the runtime code, the run's own reward code and dataset file, so the run can always be
    explained, relaunched and resumed, and a job on another machine finds everything in the bucket. All or nothing:
    a write that fails (a full disk) removes what was written, and the launch is refused in one sentence."""
    prefix = layout.run_prefix(spec.run_id)
    try:
        store.ensure_bucket()
        if any(f.path == f"{prefix}/{layout.SPEC_FILE}" for f in store.list_files(prefix)):
            raise RunIdTaken(f"run id {spec.run_id} is already used in bucket {spec.bucket}: preview the run again "
                             "for a new id. No job was submitted.")
    except RunIdTaken:
        raise
    except Exception as exc:
        raise LaunchError(f"could not write the run's files into bucket {spec.bucket}: {_space_or(exc, str(exc))}. "
                          "No job was submitted.") from exc
    _write_files(spec, store, prefix)


def _write_files(spec: RunSpec, store: BucketStore, prefix: str) -> None:
    try:
        store.upload_folder(RUNTIME_DIR, f"{prefix}/{layout.CODE_DIR}/runtime")
        if spec.reward_code.strip():
            store.write_bytes(f"{prefix}/{layout.CODE_DIR}/{layout.USER_REWARDS_MODULE}.py",
                              spec.reward_code.encode())
        if is_local_file(spec.dataset):
            _upload_dataset(spec, store, prefix)
        if spec.eval_source == "file":
            _upload_dataset(spec, store, prefix, held_out=True)
        store.write_bytes(f"{prefix}/{layout.SPEC_FILE}", spec.to_json().encode())
    except Exception as exc:
        left = _remove_quietly(store, prefix)
        raise LaunchError(f"could not write the run's files into bucket {spec.bucket}: {_space_or(exc, str(exc))}. "
                          f"No job was submitted{left}.") from exc


def _remove_quietly(store: BucketStore, prefix: str) -> str:
    """Remove a half-written run folder; '' when it is gone, else what is left and where."""
    try:
        store.delete_folder(prefix)
        return ", and nothing was left in the bucket"
    except Exception as exc:
        return f"; its half-written folder {prefix} could not be removed ({exc})"


def _space_or(exc: BaseException, otherwise: str) -> str:
    """'the disk is full (...)' when `exc` (or, for a copy of many files, any of its errors) says the disk is
    full, else `otherwise`: a full disk is said in one sentence, not as the copy's list of failed files."""
    if _no_space(exc):
        where = getattr(exc, "filename", None)
        return ("the disk is full (No space left on device" + (f" writing {where}" if isinstance(where, str) else "")
                + "): free some space and launch again")
    return otherwise


def _no_space(exc: BaseException) -> bool:
    if getattr(exc, "errno", None) == errno.ENOSPC:
        return True
    if isinstance(exc, shutil.Error):       # copytree: a list of (source, destination, why)
        return any("No space left on device" in str(item) for item in (exc.args[0] if exc.args else []))
    cause = exc.__cause__ or exc.__context__
    return cause is not None and cause is not exc and _no_space(cause)


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
    claim = _claim(journal, spec.run_id)
    try:
        if not resume:
            if claim is None:
                write_run_files(spec, store)
            else:
                found = _claimed_run_id(spec, store, journal)
                if found is not None:
                    claim.close()
                    return found
                _write_files(spec, store, layout.run_prefix(spec.run_id))
    except BaseException:
        if claim is not None:
            claim.close()
        raise
    try:
        record = _begin(journal, spec, executor, store, jobs, claim)
    except Exception as exc:
        if claim is not None:
            claim.close()
        left = "" if resume else _remove_quietly(store, layout.run_prefix(spec.run_id))
        raise LaunchError(f"{_space_or(exc, f'could not record the launch before submitting it: {exc}')}. "
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
    claim = _claim(journal, spec.run_id)
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
        raise LaunchError(f"could not write the sweep's fleet into bucket {spec.bucket}: {_space_or(exc, str(exc))}. "
                          "No job was submitted.") from exc
    if taken:
        raise RunIdTaken(f"the sweep's fleet {spec.run_id} was launched already (bucket {spec.bucket}): nothing was "
                         "submitted. Preview the sweep again for a new sweep id.")
    try:
        store.upload_folder(RUNTIME_DIR, f"{prefix}/{layout.CODE_DIR}/runtime")
        store.write_bytes(f"{prefix}/{layout.FLEET_FILE}", json.dumps(record).encode())
    except Exception as exc:
        left = _remove_quietly(store, prefix)
        raise LaunchError(f"could not write the sweep's fleet into bucket {spec.bucket}: {_space_or(exc, str(exc))}. "
                          f"No job was submitted{left}.") from exc


def _fleet_urls(executor: Executor, jobs: list[JobSpec], ids: list[str]) -> list[str]:
    """Where the members' trainers reach the fleet's servers; where that cannot be found (a Ray replica the cluster
    never placed), the fleet's jobs are cancelled and the launch fails as a failed submission does."""
    try:
        return recipe.server_urls(jobs, lambda i, job, port: executor.exposed_url(ids[i], port))
    except Exception as exc:
        errors = _cancel_all(executor, ids)
        said = f" Could NOT cancel: {'; '.join(errors)} - cancel them by hand." if errors else ""
        raise SubmitFailed(f"could not find where the fleet's replicas answer: {exc}. Cancelled the {len(ids)} "
                           f"job(s) submitted ({', '.join(ids)}).{said}", canceled=ids) from exc


def _begin(journal: LaunchJournal | None, spec: RunSpec, executor: Executor, store: BucketStore,
           jobs: recipe.RunJobs, claim: Launch | None) -> Launch | None:
    """The launch's record, before anything is submitted; a launch that cannot be recorded submits nothing."""
    if journal is None:
        return None
    planned = [job.role for job in jobs.first()] + (["trainer"] if spec.mode == "distributed" else [])
    return journal.begin(RUN, spec.run_id, run_id=spec.run_id, executor=executor.name, namespace=executor.namespace,
                         bucket=spec.bucket, folder=layout.run_prefix(spec.run_id), planned=planned, store=store,
                         claimed=claim)


def _claim(journal: LaunchJournal | None, launch_id: str) -> Launch | None:
    """The launch's lock (`LaunchJournal.claim`), held while it looks whether its id is free and then while it
    launches; None without a journal."""
    if journal is None:
        return None
    try:
        return journal.claim(launch_id)
    except UnderWay as exc:
        raise LaunchUnderWay(f"{exc} (an earlier request is launching it): this one submitted nothing.") from None
    except Exception as exc:
        raise LaunchError(f"{_space_or(exc, f'could not record the launch before submitting it: {exc}')}. "
                          "No job was submitted.") from exc


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
                          f"{_space_or(exc, str(exc))}. No job was submitted.") from exc


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


def remember_failed_launch(store: BucketStore, run_id: str, message: str, known: list[str]) -> None:
    """A `launch_failed` event in the run's folder: when, why, and the job ids the launch knew of."""
    folder = f"{layout.run_prefix(run_id)}/{layout.EVENTS_DIR}"
    seq = sum(1 for f in store.list_files(folder) if f.path.rsplit("/", 1)[-1].startswith(LAUNCH_WRITER + "-"))
    record = records.event_record(records.LAUNCH_FAILED, message=message, known=known)
    store.write_bytes(f"{folder}/{layout.fragment_name(LAUNCH_WRITER, seq)}", (json.dumps(record) + "\n").encode())


def _flat_code(store: BucketStore, run_id: str) -> bool:
    """Whether the run's code in the bucket is the flat runtime of a panel from before its sub-packages (a run
    launched then and resumed now runs that code, so its jobs must name the modules it has)."""
    code = f"{layout.run_prefix(run_id)}/{layout.CODE_DIR}"
    have = store.sizes([f"{code}/{recipe.LAYOUT_MARK}", f"{code}/runtime/train.py"])
    return f"{code}/runtime/train.py" in have and f"{code}/{recipe.LAYOUT_MARK}" not in have


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
