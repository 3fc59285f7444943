"""The run registry: launch, list, watch and cancel runs over one executor and the runs' buckets.

The run list is rebuilt from the executor's jobs (found by labels) every time it is asked for, so a
restarted panel shows every run it launched.
"""

import io
import os
import re
import threading
import time
import zipfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace

from backend.executors.base import Executor
from backend.outcome.best_version import FINAL, ChosenAdapter, choose
from backend.outcome.publish import card_repo_id, shipped_adapter
from backend.plan.engines import engine
from backend.plan.jobspec import TERMINAL_STAGES, JobRecord
from backend.plan.spec import RunSpec
from backend.runs.launch import (
    LaunchedFleet,
    LaunchedRun,
    LaunchError,
    RunIdTaken,
    SubmitFailed,
    existing_launch,
    launch_fleet,
    launch_run,
)
from backend.runs.resume import ResumePlan, resume_plan
from backend.runs.run_ids import RunIdBook
from backend.runs.run_listing import RunListing, RunSummary, own_jobs
from backend.runtime.layout import atomic_write_bytes
from backend.runtime.redact import redact_tokens
from backend.storage.adapters import final_adapter_files
from backend.storage.journal import LaunchJournal
from backend.storage.store import BucketStore
from backend.view.runview import RunView

# Names other code imports from here, the listing's (`run_listing.py`) among them.
__all__ = ["RunRegistry", "RunSummary", "cancel_jobs", "own_jobs", "write_adapter_zip"]


class RunRegistry(RunListing):
    """Launch, list, watch and cancel the runs of one executor over their buckets (its listing: `RunListing`)."""

    def __init__(self, executor: Executor, store_for: Callable[[str], BucketStore], list_every_s: float = 0.0,
                 journal: LaunchJournal | None = None, run_ids: RunIdBook | None = None):
        self.executor = executor
        self.journal = journal      # the panel home's record of launches (`backend/storage/journal.py`)
        self.run_ids = run_ids      # which run each id this panel launched names (`backend/runs/run_ids.py`)
        self.engine = engine(executor.name)     # what the executor answers before it runs, resolved once
        self.namespace = executor.namespace
        self.store_for = store_for
        self.list_every_s = list_every_s    # a remote job list is an API call: ask at most this often
        self._views: dict[str, RunView] = {}
        self._summaries: dict[str, RunView] = {}    # bounded views of live runs no dashboard opened (the watch's)
        self._listed: tuple[float, list[RunSummary]] = (0.0, [])
        self._records: dict[str, list[JobRecord]] = {}    # run id -> its jobs, as of the last listing
        self._built: dict[str, tuple] = {}    # run id -> (its job records, its summary), as of the last listing
        self._final: tuple[list | None, list[RunSummary]] = (None, [])     # (the executor's list, its summaries)
        # run id -> (when a launch of it that failed here began, when it failed): its label is swept again for jobs
        # created in between (the Hub lists a job created behind an error answer late), never for older ones.
        self.failed_launches: dict[str, tuple[float, float]] = {}
        self._launch_states: dict[tuple, bool] = {}       # (run id, its ended jobs) -> whether its launch failed
        self._lock = threading.Lock()       # handlers of several browser sessions run at once
        self._list_lock = threading.Lock()

    def launch(self, spec: RunSpec, secrets: dict[str, str] | None = None,
               fleet_urls: tuple[str, ...] | None = None) -> LaunchedRun:
        began = time.time()
        self._claim(spec.run_id, spec.bucket)
        try:
            launched = launch_run(spec, self.executor, self.store_for(spec.bucket), secrets, journal=self.journal,
                                  fleet_urls=fleet_urls)
        except SubmitFailed:
            self.failed_launches[spec.run_id] = (began, time.time())
            raise
        except BaseException:
            self._unclaim(spec.run_id)      # nothing was submitted: the id names no run
            raise
        self.forget_listing()
        if not launched.existing:       # a retry found the run: its view (if open) stays as it is
            self._views[spec.run_id] = RunView(spec.run_id, self.store_for(spec.bucket), self.executor,
                                               launched.job_ids)
        return launched

    def existing_launch(self, spec: RunSpec) -> LaunchedRun | None:
        """The run a launch of `spec` would find already made (`launch.existing_launch`), looked at without its
        lock and before anything else runs (the task check): None where it cannot be told (the bucket not there or
        failing: the launch itself looks again under the lock). Raises RunIdTaken where the id holds another run."""
        try:
            found = existing_launch(spec, self.store_for(spec.bucket), self.journal)
        except RunIdTaken:
            raise
        except Exception:
            return None
        if found is not None and not found.job_ids:     # launched before the journal, or by another panel
            jobs = {r.role: r.job_id for r in reversed(self.job_records(spec.run_id))}   # newest per role last
            found = replace(found, job_ids=jobs)
        return found

    def launch_fleet(self, members: list[RunSpec], slots: int, rank: int,
                     secrets: dict[str, str] | None = None) -> LaunchedFleet:
        """Start a sweep's shared fleet (`launch.launch_fleet`); it lists as a run of its own (its id the sweep's)."""
        began = time.time()
        self._claim(members[0].fleet, members[0].bucket)
        try:
            launched = launch_fleet(members, slots, rank, self.executor, self.store_for(members[0].bucket), secrets,
                                    journal=self.journal)
        except SubmitFailed:
            self.failed_launches[members[0].fleet] = (began, time.time())
            raise
        except BaseException:
            self._unclaim(members[0].fleet)
            raise
        self.forget_listing()
        return launched

    def _claim(self, run_id: str, bucket: str) -> None:
        """The id for this run, once in the whole panel (RunIdTaken where another run holds it)."""
        if self.run_ids is not None:
            self.run_ids.claim(run_id, self.executor.name, self.namespace, bucket)

    def _unclaim(self, run_id: str) -> None:
        if self.run_ids is not None:
            self.run_ids.release(run_id, self.executor.name, self.namespace)


    def view(self, run_id: str) -> RunView:
        """The run's one view in this registry, shared by every browser session that watches it."""
        with self._lock:
            if run_id not in self._views:
                self._views[run_id] = self._new_view(run_id)
                self._summaries.pop(run_id, None)
            return self._views[run_id]

    def _new_view(self, run_id: str, bounded: bool = False) -> RunView:
        summary = next((r for r in self.list_runs() if r.run_id == run_id), None)
        if summary is not None and summary.bucket is None and summary.unreadable:
            raise KeyError(f"Run {run_id} cannot be opened: the record of its job(s) "
                           f"{', '.join(summary.jobs[r] for r in sorted(summary.unreadable))} cannot be read, "
                           "so its bucket is unknown.")
        if summary is None or summary.bucket is None:
            recorded = self.recorded_launch(run_id)
            if recorded is None or not recorded.get("bucket"):
                raise KeyError(f"no run {run_id!r}")
            # Launched a moment ago (the job list lags): its record says where it is and what it runs.
            return RunView(run_id, self.store_for(recorded["bucket"]), self.executor, dict(recorded["jobs"]),
                           bounded=bounded)
        return RunView(run_id, self.store_for(summary.bucket), self.executor, summary.jobs, earlier=summary.earlier,
                       bounded=bounded)

    def open_view(self, run_id: str) -> RunView | None:
        """The run's view if a dashboard opened it already (none is made here)."""
        return self._views.get(run_id)

    def summary_view(self, run_id: str) -> RunView:
        """What the background watch reads of a live run: its dashboard view if one is open, else a bounded view
        (`RunView(bounded=True)`: its newest steps, events and samples, no history, logs or charts), kept until
        `keep_summaries` leaves it out. A resumed run's summary is made again for its new jobs."""
        with self._lock:
            if run_id in self._views:
                return self._views[run_id]
            summary = self._summaries.get(run_id)
            listed = next((r for r in self.list_runs() if r.run_id == run_id), None)
            current = listed.jobs if listed is not None else {}
            if summary is None or (current and current != {k: j.job_id for k, j in summary.current_jobs.items()}):
                summary = self._summaries[run_id] = self._new_view(run_id, bounded=True)
            return summary

    def watched_view(self, run_id: str) -> RunView | None:
        """The run's open view or its watch summary, whichever exists and has read the run (none is made or
        refreshed here: a dashboard's ticks and the watch keep them current)."""
        view = self._views.get(run_id) or self._summaries.get(run_id)
        return view if view is not None and view.read_once else None

    def keep_summaries(self, run_ids: set[str]) -> None:
        """Drop the watch's summaries of runs not in `run_ids` (runs that ended)."""
        with self._lock:
            for run_id in set(self._summaries) - run_ids:
                del self._summaries[run_id]

    def resume_plan(self, run_id: str) -> ResumePlan:
        """What Resume would do for this run (see `backend.runs.resume`); raises LaunchError when it cannot."""
        view = self.view(run_id)
        view.refresh()
        view.wait_for_events()      # the plan reads the trainer's start and end events, and every version
        return resume_plan(view)

    def resume(self, run_id: str, secrets: dict[str, str] | None = None, from_step_0: bool = False) -> LaunchedRun:
        """Submit the run's jobs again from its spec.json: the trainer resumes from the bucket's last complete
        checkpoint (see `resume_plan`). A run without one starts again from step 0 only if `from_step_0`. The
        jobs run on the files the run was launched with (code, dataset copy), which stay in the bucket."""
        plan = self.resume_plan(run_id)
        if plan.checkpoint_step is None and not from_step_0:
            raise LaunchError(f"{plan.message} Nothing was resumed: confirm starting from step 0 to resume it.")
        view = self.view(run_id)
        began = time.time()
        try:
            launched = launch_run(plan.spec, self.executor, view.store, secrets, resume=True, journal=self.journal)
        except SubmitFailed:
            self.failed_launches[run_id] = (began, time.time())
            raise
        view.replace_jobs(launched.job_ids)
        self.forget_listing()
        return replace(launched, note=plan.message)

    def cancel(self, run_id: str) -> list[str]:
        """Cancel every job of the run that is not over, at once, the trainer first so it records that it was
        cancelled before its replicas go; return the job ids asked to stop.

        The jobs are found by the run's label through the executor, not through the run's bucket: a run whose
        spec.json cannot be read (a restarted panel, a failing bucket) is still cancelled while it bills. The job
        ids its launch recorded (the home's journal) and those an open view knows are cancelled too: the Hub's list
        can lag a job created seconds ago, also across a panel restart."""
        listed = own_jobs(self.executor.list_jobs(run_id=run_id))
        live = [r for r in listed if r.stage not in TERMINAL_STAGES]
        known = {r.job_id for r in listed}
        view = self._views.get(run_id)
        if view is not None:        # jobs the listing may not show yet (one just submitted)
            live += [_Live(j.job_id, role) for role, j in view.current_jobs.items()
                     if j.job_id not in known and not j.status.done]
            known |= {j.job_id for j in view.current_jobs.values()}
        recorded = self.recorded_launch(run_id) or {}
        live += [_Live(job_id, role) for role, job_id in recorded.get("jobs", {}).items()
                 if job_id not in known and not self._over(job_id)]
        ids = [r.job_id for r in sorted(live, key=lambda r: r.role != "trainer")]
        errors = cancel_jobs(self.executor, ids)
        self.forget_listing()
        if errors:
            raise RuntimeError("could not cancel " + "; ".join(errors))
        return ids

    def final_adapter_zip(self, run_id: str, folder: str, repo_id: str | None = None) -> str | None:
        """A zip of the final adapter in `folder` (one file per run, replaced whole), or None while there is none;
        its card names `repo_id` (`publish.card_repo_id`)."""
        view = self.view(run_id)
        view.refresh()
        if not view.final_files:
            view.final_files = final_adapter_files(view.store, run_id)    # asked for: look, whatever the schedule
        if not view.final_files:
            return None
        return write_adapter_zip(self, view, choose(view, FINAL), folder, repo_id)

    def adapter_zip(self, run_id: str, choice: str | None, folder: str,
                    repo_id: str | None = None) -> tuple[str, ChosenAdapter]:
        """A zip of the adapter version `choice` names ("best", "final" or "trl-policy-v<N>"; None: the default) in
        `folder`, one file per run and version, replaced whole, with the card a push to `repo_id` writes; raises
        ChoiceError when there is no such adapter, PublishError when it is incomplete."""
        view = self.view(run_id)
        view.refresh()
        if not view.final_files:
            view.final_files = final_adapter_files(view.store, run_id)    # asked for: look, whatever the schedule
        chosen = choose(view, choice)
        return write_adapter_zip(self, view, chosen, folder, repo_id), chosen

    def _over(self, job_id: str) -> bool:
        """Whether a job the listing does not show is over (asked by id, which the Hub answers at once); one that
        cannot be asked is cancelled anyway."""
        try:
            return self.executor.status(job_id).done
        except Exception:
            return False


def write_adapter_zip(registry, view, chosen: ChosenAdapter, folder: str, repo_id: str | None) -> str:
    """A zip of what a push of `chosen` ships (`shipped_adapter`: the adapter's own files and the card) in
    `folder`, one file per run and version, replaced whole; its path."""
    name = re.sub(r"[^A-Za-z0-9_.-]", "-", redact_tokens(str(view.spec.get("name") or "run")))
    files = shipped_adapter(registry, view, chosen, card_repo_id(repo_id, name))
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for file_name, data in files.items():
            zf.writestr(file_name, data)
    # Its owner's namespace in the name: two namespaces' runs under one id never write one file of the folder.
    owner = getattr(registry, "namespace", None) or "local"
    path = os.path.join(folder, f"{name}-{owner}-{view.run_id}-{chosen.choice}-adapter.zip")
    atomic_write_bytes(path, buf.getvalue())
    return path



@dataclass(frozen=True)
class _Live:
    job_id: str
    role: str


def cancel_jobs(executor: Executor, job_ids: list[str]) -> list[str]:
    """Ask every job to stop, concurrently (on HF Jobs each is an API call), in the given order; return errors."""
    if not job_ids:
        return []
    with ThreadPoolExecutor(max_workers=len(job_ids)) as pool:
        futures = [(job_id, pool.submit(executor.cancel, job_id)) for job_id in job_ids]
    errors = []
    for job_id, future in futures:
        try:
            future.result()
        except Exception as exc:   # keep cancelling the others: each is billing
            errors.append(f"{job_id}: {exc}")
    return errors
