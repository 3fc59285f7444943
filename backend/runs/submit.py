"""Submitting a launch's jobs: in order, each recorded as it exists, and a failure cancels what this launch submitted
(and what a failed request created anyway, found by the run's label), never a job of an earlier launch; the launch's
lock in the journal."""

import time
from collections.abc import Callable

from backend.executors.base import Executor
from backend.plan.jobspec import TERMINAL_STAGES, JobSpec
from backend.runs.launch_errors import LaunchError, LaunchUnderWay, SubmitFailed, space_or
from backend.storage.journal import Launch, LaunchJournal, UnderWay

# Clocks differ a little (the Hub's and ours): a job the Hub created for a launch is dated up to this much before the
# launch began, or after its failure was recorded. A job of the run's label dated earlier is an earlier launch's, and
# a launch's rollback leaves it alone.
CLOCK_SLACK_S = 30.0


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
            cancel_errors = cancel_all(executor, started)
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


def cancel_all(executor: Executor, job_ids: list[str]) -> list[str]:
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
    return strays, cancel_all(executor, strays)


def claim_launch(journal: LaunchJournal | None, launch_id: str) -> Launch | None:
    """The launch's lock (`LaunchJournal.claim`), held while it looks whether its id is free and then while it
    launches; None without a journal."""
    if journal is None:
        return None
    try:
        return journal.claim(launch_id)
    except UnderWay as exc:
        raise LaunchUnderWay(f"{exc} (an earlier request is launching it): this one submitted nothing.") from None
    except Exception as exc:
        raise LaunchError(f"{space_or(exc, f'could not record the launch before submitting it: {exc}')}. "
                          "No job was submitted.") from exc
