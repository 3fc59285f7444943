"""Orphan finder: jobs carrying the panel's labels that still run (and bill) although their run is over.

A job is an orphan when it is not over and
- its run's folder is gone from the bucket (no file left under `runs/<run_id>/`, or no bucket at all), or
- it was created by a launch that failed (the run's folder holds a `launch_failed` event from after its creation):
  the Hub may create a job behind an error answer and list it only later, after the launch's own sweep, or
- its run's launch never completed: its `launch.json` (`backend/storage/journal.py`) still says `launching` and has
  not changed for LAUNCH_STALE_S (its panel stopped between two submissions), or
- it is a trainer, and a newer launch of the run (a resume) has a trainer of its own, or
- it serves a trainer (a vLLM replica) whose trainer, the first one submitted after it, is over, or for which no
  trainer was submitted within LAUNCH_STALE_S (a sweep's shared fleet, `fleet.json`: every member's trainer
  submitted after it is over, or none was), or
- it is a task-check job whose check is over: its staged `checks/<id>/` folder is gone, or the panel home that ran
  it says the check ended or its panel stopped.
A run whose bucket cannot be read is not judged on its folder: a failing read never cancels anything.
"""

import json
import posixpath
import time
from dataclasses import dataclass

from backend.plan.jobspec import TERMINAL_STAGES, JobRecord
from backend.runs.registry import cancel_jobs
from backend.runs.run_files import LAUNCH_WRITER, remember_failed_launch
from backend.runs.submit import CLOCK_SLACK_S
from backend.runtime import layout
from backend.runtime.records import LAUNCH_FAILED
from backend.storage.journal import CHECK, LAUNCHING, ROLLED_BACK, STOPPED_DURING_LAUNCH, Launch, bucket_copy_path
from backend.task.check_job import CHECKS_DIR

# A job the Hub created behind a failed answer was created before the panel recorded the failure; CLOCK_SLACK_S
# (submit.py's: the launch's own rollback uses it too) later still counts, while a resume started after it does not.
# A launch submits its jobs within seconds; one still `launching` (or a replica still without its trainer) this long
# after was left half done. Well above the Hub's job-list lag, so a trainer listed late is not missed.
LAUNCH_STALE_S = 300.0


@dataclass(frozen=True)
class Orphan:
    record: JobRecord
    why: str


def find_orphans(registry, now: float | None = None) -> list[Orphan]:
    """Every orphan among the registry's jobs and task-check jobs, asked of the executor now (not a cached
    listing)."""
    now = time.time() if now is None else now
    by_run: dict[str, list[JobRecord]] = {}
    for record in registry.executor.list_jobs():
        by_run.setdefault(record.run_id, []).append(record)
    orphans = []
    for run_id, records in by_run.items():
        live = [r for r in records if r.stage not in TERMINAL_STAGES]
        if not live:
            continue
        gone, failed, launch = _run_folder(registry, run_id, records)
        members = _fleet_members(registry, run_id, records) if not gone else None
        trainers = sorted((r for r in records if r.role == "trainer"), key=lambda r: r.created_at)
        for record in live:
            why = (f"its run folder runs/{run_id} is gone from bucket {record.bucket}" if gone
                   else _why_from_failed_launch(record, failed) or _why_unfinished_launch(launch, now)
                   or (_why_fleet_left(record, members, by_run, now) if members is not None
                       else _why_left_over(record, trainers, now)))
            if why:
                orphans.append(Orphan(record, why))
    orphans += _check_orphans(registry)
    return sorted(orphans, key=lambda o: (o.record.run_id, o.record.role))


def cancel_orphans(registry) -> tuple[list[str], list[str]]:
    """Cancel the orphans found now; (cancelled job ids, errors)."""
    cancelled, errors = [], []
    for orphan in find_orphans(registry):
        try:
            registry.executor.cancel(orphan.record.job_id)
            cancelled.append(orphan.record.job_id)
        except Exception as exc:   # keep going: each orphan is billing
            errors.append(f"{orphan.record.job_id}: {exc}")
    if cancelled:
        registry.forget_listing()
    return cancelled, errors


def sweep_failed_launch(registry, run_id: str, failed_at: float, checks: bool = False, began: float = 0.0) -> list[str]:
    """Cancel the live jobs of `run_id` (a task check's, with `checks`) created by its launch that began at `began`
    and failed at `failed_at` (epoch seconds): a job of an earlier launch with the same label stays; the ids."""
    strays = [r.job_id for r in registry.executor.list_jobs(run_id=run_id, checks=checks)
              if r.stage not in TERMINAL_STAGES and began - CLOCK_SLACK_S <= r.created_at <= failed_at + CLOCK_SLACK_S]
    for job_id in strays:
        registry.executor.cancel(job_id)
    if strays:
        registry.forget_listing()
    return strays


def roll_back(registry, launch: Launch, now: float | None = None) -> list[str]:
    """Undo a launch its panel left half done (`LaunchJournal.abandoned`): cancel every job it recorded and any
    other live job with the run's label (a submission in flight when the panel stopped), mark the run failed (a
    `launch_failed` event saying why), remove a task check's staged folder; the ids cancelled. The registry keeps
    sweeping the run's label for jobs the Hub lists late. Raises, leaving the launch to the next pass, when a job
    could not be cancelled."""
    now = time.time() if now is None else now
    record = launch.record
    recorded = list(launch.jobs.values())
    errors = cancel_jobs(registry.executor, recorded)
    began = float(record.get("started") or 0.0)
    strays = sweep_failed_launch(registry, record["run_id"], now, checks=record.get("kind") == CHECK, began=began)
    if errors:
        raise RuntimeError("could not cancel " + "; ".join(errors))
    why = str(record.get("why") or STOPPED_DURING_LAUNCH)
    store = registry.store_for(record["bucket"])
    if record.get("kind") == CHECK:
        store.delete_folder(record["folder"])
    else:
        registry.failed_launches[record["run_id"]] = (began, now)
        cancelled = [*recorded, *strays]
        message = (f"{why}: the launch was rolled back"
                   + (f", its job(s) cancelled: {', '.join(cancelled)}" if cancelled else ", no job had been created")
                   + f" (planned: {', '.join(record.get('planned') or []) or 'none'}).")
        remember_failed_launch(store, record["run_id"], message, cancelled)
    launch.finish(ROLLED_BACK, why)
    registry.forget_listing()
    return [*recorded, *strays]


def _why_from_failed_launch(record: JobRecord, failed: list[float]) -> str | None:
    after = [t for t in failed if record.created_at <= t + CLOCK_SLACK_S]
    if not after:
        return None
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(min(after)))
    return f"its run's launch failed at {when}; the Hub created this job anyway and listed it only later"


def _why_left_over(record: JobRecord, trainers: list[JobRecord], now: float) -> str | None:
    if record.role == "trainer":
        newer = [t for t in trainers if t.created_at > record.created_at]
        return f"a newer launch of the run has its own trainer ({newer[-1].job_id})" if newer else None
    # Replicas are submitted just before their trainer: theirs is the first trainer submitted after them.
    own = next((t for t in trainers if t.created_at >= record.created_at), None)
    if own is not None and own.stage in TERMINAL_STAGES:
        return f"its run's trainer {own.job_id} is {own.stage}"
    if own is None and now - record.created_at > LAUNCH_STALE_S:
        return (f"no trainer was submitted for it in the {(now - record.created_at) / 60:.0f} minutes since it was "
                "created: its launch never completed")
    return None


def _fleet_members(registry, run_id: str, records: list[JobRecord]) -> list[str] | None:
    """The member run ids a sweep's shared fleet serves (its `fleet.json`), or None: not a fleet (or unreadable)."""
    bucket = next((r.bucket for r in records if r.bucket), None)
    if bucket is None or any(r.role == "trainer" for r in records):
        return None
    try:
        record = json.loads(registry.store_for(bucket).read_bytes(f"{layout.run_prefix(run_id)}/{layout.FLEET_FILE}"))
        return [str(member) for member in record["members"].values()]
    except Exception:   # no fleet.json: an ordinary run's replicas
        return None


def _why_fleet_left(record: JobRecord, members: list[str], by_run: dict[str, list[JobRecord]],
                    now: float) -> str | None:
    """A sweep's fleet replica serves every member's trainer submitted after it: left over once all are over, or
    when none was submitted within LAUNCH_STALE_S."""
    trainers = [r for member in members for r in by_run.get(member, [])
                if r.role == "trainer" and r.created_at >= record.created_at]
    if trainers and all(t.stage in TERMINAL_STAGES for t in trainers):
        return f"every member's trainer of its sweep is over ({len(trainers)})"
    if not trainers and now - record.created_at > LAUNCH_STALE_S:
        return (f"no member's trainer was submitted for it in the {(now - record.created_at) / 60:.0f} minutes since "
                "it was created: its sweep's launch never completed")
    return None


def _why_unfinished_launch(launch: dict | None, now: float) -> str | None:
    if not launch or launch.get("state") != LAUNCHING:
        return None
    updated = launch.get("updated")
    if not isinstance(updated, (int, float)) or now - updated <= LAUNCH_STALE_S:
        return None
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(updated))
    made = ", ".join(f"{role} {job_id}" for role, job_id in (launch.get("jobs") or {}).items()) or "none"
    return (f"its run's launch never completed: its panel stopped at {when} (planned: "
            f"{', '.join(launch.get('planned') or [])}; created: {made})")


def _check_orphans(registry) -> list[Orphan]:
    """Live task-check jobs whose check is over (see the module docstring)."""
    orphans = []
    for record in registry.executor.list_jobs(checks=True):
        if record.stage in TERMINAL_STAGES:
            continue
        why = _why_check_left(registry, record)
        if why:
            orphans.append(Orphan(record, why))
    return orphans


def _why_check_left(registry, record: JobRecord) -> str | None:
    journal = registry.journal
    noted = journal.get(record.run_id) if journal is not None else None
    if noted is not None and noted.get("kind") == CHECK:
        if noted.get("state") != LAUNCHING:
            return f"its task check {record.run_id} is over ({noted.get('state')})"
        if not journal.under_way(record.run_id):
            return f"the panel that ran its task check {record.run_id} stopped during the check"
        return None
    if record.bucket is None:
        return None
    try:
        files = registry.store_for(record.bucket).list_files(f"{CHECKS_DIR}/{record.run_id}")
    except Exception:       # unreadable is not gone
        return None
    return None if files else f"its task check's folder {CHECKS_DIR}/{record.run_id} is gone: the check is over"


def _run_folder(registry, run_id: str, records: list[JobRecord]) -> tuple[bool, list[float], dict | None]:
    """(whether the run's folder is gone, when its launches failed, its launch record) from one listing of the
    folder."""
    bucket = next((r.bucket for r in records if r.bucket), None)
    if bucket is None:
        return False, [], None
    store = registry.store_for(bucket)
    try:
        files = store.list_files(layout.run_prefix(run_id))
    except Exception as exc:    # unreadable is not gone; a bucket the Hub no longer has is
        return getattr(getattr(exc, "response", None), "status_code", None) == 404, [], None
    launch = _launch_record(store, run_id) if any(f.path == bucket_copy_path(run_id) for f in files) else None
    failed = []
    for f in files:
        if posixpath.basename(f.path).startswith(LAUNCH_WRITER + "-"):
            try:
                events, _ = layout.fragment_records(store.read_bytes(f.path))
            except OSError:
                continue
            # A torn or foreign record is skipped; one bad record never hides the others.
            failed += [float(e["time"]) for e in events if e is not None and e.get("event") == LAUNCH_FAILED
                       and isinstance(e.get("time"), (int, float)) and not isinstance(e.get("time"), bool)]
    return not files, failed, launch


def _launch_record(store, run_id: str) -> dict | None:
    try:
        record = json.loads(store.read_bytes(bucket_copy_path(run_id)))
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None
