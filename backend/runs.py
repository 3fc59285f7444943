"""The run registry: launch, list, watch and cancel runs over one executor and the runs' buckets.

The run list is rebuilt from the executor's jobs (found by labels) every time it is asked for, so a
restarted panel shows every run it launched.
"""

import io
import os
import time
import zipfile
from collections.abc import Callable
from dataclasses import dataclass

from backend.executors.base import Executor
from backend.launch import LaunchedRun, LaunchError, launch_run
from backend.runtime.layout import atomic_write_bytes
from backend.runview import RunView
from backend.spec import RunSpec
from backend.store import BucketStore


@dataclass(frozen=True)
class RunSummary:
    run_id: str
    bucket: str | None
    created_at: float
    jobs: dict[str, str]       # role -> job id
    stages: dict[str, str]     # role -> stage


class RunRegistry:
    def __init__(self, executor: Executor, store_for: Callable[[str], BucketStore], list_every_s: float = 0.0):
        self.executor = executor
        self.store_for = store_for
        self.list_every_s = list_every_s    # a remote job list is an API call: ask at most this often
        self._views: dict[str, RunView] = {}
        self._listed: tuple[float, list[RunSummary]] = (0.0, [])

    def launch(self, spec: RunSpec, secrets: dict[str, str] | None = None) -> LaunchedRun:
        launched = launch_run(spec, self.executor, self.store_for(spec.bucket), secrets)
        self._listed = (0.0, [])
        self._views[spec.run_id] = RunView(spec.run_id, self.store_for(spec.bucket), self.executor, launched.job_ids)
        return launched

    def list_runs(self) -> list[RunSummary]:
        listed_at, cached = self._listed
        if self.list_every_s and time.time() - listed_at < self.list_every_s:
            return cached
        runs: dict[str, dict] = {}
        for rec in self.executor.list_jobs():
            run = runs.setdefault(rec.run_id, {"bucket": rec.bucket, "created_at": rec.created_at,
                                               "jobs": {}, "stages": {}})
            run["jobs"].setdefault(rec.role, rec.job_id)
            run["stages"].setdefault(rec.role, rec.stage)
            run["created_at"] = min(run["created_at"], rec.created_at)
            run["bucket"] = run["bucket"] or rec.bucket
        summaries = sorted((RunSummary(run_id, **data) for run_id, data in runs.items()),
                           key=lambda r: r.created_at, reverse=True)
        self._listed = (time.time(), summaries)
        return summaries

    def view(self, run_id: str) -> RunView:
        if run_id not in self._views:
            summary = next((r for r in self.list_runs() if r.run_id == run_id), None)
            if summary is None or summary.bucket is None:
                raise KeyError(f"no run {run_id!r}")
            self._views[run_id] = RunView(run_id, self.store_for(summary.bucket), self.executor, summary.jobs)
        return self._views[run_id]

    def resume(self, run_id: str, secrets: dict[str, str] | None = None) -> LaunchedRun:
        """Submit the run's jobs again from its spec.json: the trainer resumes from the bucket's checkpoints."""
        view = self.view(run_id)
        view.refresh()
        if not view.spec:
            raise LaunchError(f"run {run_id} has no spec.json in its bucket; it cannot be resumed")
        if not view.done:
            raise LaunchError(f"run {run_id} still has running jobs; cancel it before resuming")
        spec = RunSpec.from_dict(view.spec)
        launched = launch_run(spec, self.executor, view.store, secrets)
        view.replace_jobs(launched.job_ids)
        self._listed = (0.0, [])
        return launched

    def cancel(self, run_id: str) -> list[str]:
        """Cancel every job of the run; return the job ids asked to stop."""
        view = self.view(run_id)
        for job in view.jobs.values():
            self.executor.cancel(job.job_id)
        return [j.job_id for j in view.jobs.values()]

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
        name = view.spec.get("name", "run")
        path = os.path.join(folder, f"{name}-{run_id}-final-adapter.zip")
        atomic_write_bytes(path, buf.getvalue())
        return path
