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
from dataclasses import dataclass

from backend.executors.base import Executor
from backend.jobspec import TERMINAL_STAGES, JobRecord
from backend.launch import LaunchedRun, LaunchError, launch_run
from backend.runtime import layout
from backend.runtime.layout import atomic_write_bytes
from backend.runtime.redact import redact_tokens
from backend.runview import RunView
from backend.spec import RunSpec
from backend.store import BucketStore

FRESH_LIST_AGE_S = 3.0   # a "fresh" run list may be this old: a view of an unknown run id must not relist every tick


@dataclass(frozen=True)
class RunSummary:
    run_id: str
    bucket: str | None
    created_at: float
    jobs: dict[str, str]       # role -> job id
    stages: dict[str, str]     # role -> stage


@dataclass(frozen=True)
class ResumePlan:
    spec: RunSpec
    checkpoint_step: int | None     # None: no complete checkpoint, the trainer starts from step 0
    message: str

    def fingerprint(self) -> str:
        return f"{self.spec.fingerprint()}-{self.checkpoint_step}"


def latest_checkpoint_step(store: BucketStore, run_id: str) -> int | None:
    """The step of the newest complete checkpoint in the bucket (transformers writes trainer_state.json last)."""
    prefix = f"{layout.run_prefix(run_id)}/{layout.CHECKPOINTS_DIR}/"
    steps = []
    for f in store.list_files(prefix.rstrip("/")):
        match = re.fullmatch(re.escape(prefix) + r"checkpoint-(\d+)/trainer_state.json", f.path)
        if match and f.size > 0:
            steps.append(int(match.group(1)))
    return max(steps, default=None)


class RunRegistry:
    def __init__(self, executor: Executor, store_for: Callable[[str], BucketStore], list_every_s: float = 0.0):
        self.executor = executor
        self.store_for = store_for
        self.list_every_s = list_every_s    # a remote job list is an API call: ask at most this often
        self._views: dict[str, RunView] = {}
        self._listed: tuple[float, list[RunSummary]] = (0.0, [])
        self._records: dict[str, list[JobRecord]] = {}    # run id -> its jobs, as of the last listing
        self._lock = threading.Lock()       # handlers of several browser sessions run at once

    def launch(self, spec: RunSpec, secrets: dict[str, str] | None = None) -> LaunchedRun:
        launched = launch_run(spec, self.executor, self.store_for(spec.bucket), secrets)
        self.forget_listing()
        self._views[spec.run_id] = RunView(spec.run_id, self.store_for(spec.bucket), self.executor, launched.job_ids)
        return launched

    def list_runs(self, fresh: bool = False) -> list[RunSummary]:
        """Every run of this executor, newest first. `fresh` asks again unless the list is a few seconds old."""
        listed_at, cached = self._listed
        max_age = min(FRESH_LIST_AGE_S, self.list_every_s) if fresh else self.list_every_s
        if max_age and time.time() - listed_at < max_age:
            return cached
        runs: dict[str, dict] = {}
        records: dict[str, list[JobRecord]] = {}
        for rec in self.executor.list_jobs():
            records.setdefault(rec.run_id, []).append(rec)
            run = runs.setdefault(rec.run_id, {"bucket": rec.bucket, "created_at": rec.created_at,
                                               "jobs": {}, "stages": {}})
            run["jobs"].setdefault(rec.role, rec.job_id)
            run["stages"].setdefault(rec.role, rec.stage)
            run["created_at"] = min(run["created_at"], rec.created_at)
        summaries = sorted((RunSummary(run_id, **data) for run_id, data in runs.items()),
                           key=lambda r: r.created_at, reverse=True)
        self._listed, self._records = (time.time(), summaries), records
        return summaries

    def job_records(self, run_id: str) -> list[JobRecord]:
        """Every job of the run (each launch and resume) as a listing at most a few seconds old saw it (the runs
        list asks this for every run it shows: one listing serves them all), newest first."""
        if time.time() - self._listed[0] > FRESH_LIST_AGE_S:
            self.list_runs()
        return list(self._records.get(run_id, []))

    def forget_listing(self) -> None:
        self._listed = (0.0, [])

    def has_run(self, run_id: str, fresh: bool = False) -> bool:
        return run_id in self._views or any(r.run_id == run_id for r in self.list_runs(fresh=fresh))

    def view(self, run_id: str) -> RunView:
        """The run's one view in this registry, shared by every browser session that watches it."""
        with self._lock:
            if run_id not in self._views:
                summary = next((r for r in self.list_runs() if r.run_id == run_id), None)
                if summary is None or summary.bucket is None:
                    raise KeyError(f"no run {run_id!r}")
                self._views[run_id] = RunView(run_id, self.store_for(summary.bucket), self.executor, summary.jobs)
            return self._views[run_id]

    def resume_plan(self, run_id: str) -> ResumePlan:
        """What Resume would do for this run; raises LaunchError when there is nothing to resume."""
        view = self.view(run_id)
        view.refresh()
        if not view.spec:
            raise LaunchError(f"run {run_id} has no spec.json in its bucket; it cannot be resumed")
        if not view.done:
            raise LaunchError(f"run {run_id} still has running jobs; cancel it before resuming")
        if any(e.get("event") == "finished" for e in view.events):
            raise LaunchError(f"run {run_id} finished training; there is nothing to resume")
        spec = RunSpec.from_dict(view.spec)
        step = latest_checkpoint_step(view.store, run_id)
        where = (f"from its checkpoint at step {step} of {spec.max_steps}" if step is not None
                 else f"from step 0 of {spec.max_steps}: it wrote no checkpoint (one every {spec.checkpoint_every} "
                      "steps)")
        return ResumePlan(spec, step, f"The trainer resumes {where}.")

    def resume(self, run_id: str, secrets: dict[str, str] | None = None) -> LaunchedRun:
        """Submit the run's jobs again from its spec.json: the trainer resumes from the bucket's checkpoints."""
        plan = self.resume_plan(run_id)
        view = self.view(run_id)
        launched = launch_run(plan.spec, self.executor, view.store, secrets, resume=True)
        view.replace_jobs(launched.job_ids)
        self._listed = (0.0, [])
        return launched

    def cancel(self, run_id: str) -> list[str]:
        """Cancel every job of the run that is not over; return the job ids asked to stop.

        The jobs are found by the run's label through the executor, not through the run's bucket: a run whose
        spec.json cannot be read (a restarted panel, a failing bucket) is still cancelled while it bills."""
        job_ids = [r.job_id for r in self.executor.list_jobs(run_id=run_id) if r.stage not in TERMINAL_STAGES]
        view = self._views.get(run_id)
        if view is not None:
            job_ids += [j.job_id for j in view.jobs.values() if j.job_id not in job_ids and not j.status.done]
        for job_id in job_ids:
            self.executor.cancel(job_id)
        self._listed = (0.0, [])
        return job_ids

    def final_adapter_zip(self, run_id: str, folder: str) -> str | None:
        """A zip of the final adapter in `folder` (one file per run, replaced whole), or None while there is none."""
        view = self.view(run_id)
        view.refresh()
        if not view.final_files:
            return None
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
            for f in view.final_files:
                zf.writestr(os.path.basename(f.path), view.store.read_bytes(f.path))
        name = re.sub(r"[^A-Za-z0-9_.-]", "-", redact_tokens(str(view.spec.get("name") or "run")))
        path = os.path.join(folder, f"{name}-{run_id}-final-adapter.zip")
        atomic_write_bytes(path, buf.getvalue())
        return path
