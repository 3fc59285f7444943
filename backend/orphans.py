"""Orphan finder: jobs carrying the panel's labels that still run (and bill) although their run is over.

A job is an orphan when it is not over and
- its run's folder is gone from the bucket (no file left under `runs/<run_id>/`, or no bucket at all), or
- it is a trainer, and a newer launch of the run (a resume) has a trainer of its own, or
- it serves a trainer (a vLLM replica) whose trainer, the first one submitted after it, is over.
A run whose bucket cannot be read is not judged on its folder: a failing read never cancels anything.
"""

from dataclasses import dataclass

from backend.jobspec import TERMINAL_STAGES, JobRecord
from backend.runtime import layout


@dataclass(frozen=True)
class Orphan:
    record: JobRecord
    why: str


def find_orphans(registry) -> list[Orphan]:
    """Every orphan among the registry's jobs, asked of the executor now (not a cached listing)."""
    by_run: dict[str, list[JobRecord]] = {}
    for record in registry.executor.list_jobs():
        by_run.setdefault(record.run_id, []).append(record)
    orphans = []
    for run_id, records in by_run.items():
        live = [r for r in records if r.stage not in TERMINAL_STAGES]
        if not live:
            continue
        gone = _folder_gone(registry, run_id, records)
        trainers = sorted((r for r in records if r.role == "trainer"), key=lambda r: r.created_at)
        for record in live:
            why = (f"its run folder runs/{run_id} is gone from bucket {record.bucket}" if gone
                   else _why_left_over(record, trainers))
            if why:
                orphans.append(Orphan(record, why))
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


def _why_left_over(record: JobRecord, trainers: list[JobRecord]) -> str | None:
    if record.role == "trainer":
        newer = [t for t in trainers if t.created_at > record.created_at]
        return f"a newer launch of the run has its own trainer ({newer[-1].job_id})" if newer else None
    # Replicas are submitted just before their trainer: theirs is the first trainer submitted after them.
    own = next((t for t in trainers if t.created_at >= record.created_at), None)
    if own is not None and own.stage in TERMINAL_STAGES:
        return f"its run's trainer {own.job_id} is {own.stage}"
    return None


def _folder_gone(registry, run_id: str, records: list[JobRecord]) -> bool:
    bucket = next((r.bucket for r in records if r.bucket), None)
    if bucket is None:
        return False
    try:
        return not registry.store_for(bucket).list_files(layout.run_prefix(run_id))
    except Exception as exc:    # unreadable is not gone; a bucket the Hub no longer has is
        return getattr(getattr(exc, "response", None), "status_code", None) == 404
