"""RunView: everything the dashboard shows about one run, kept up to date incrementally.

`refresh()` asks each observer for what is new (metric and event fragments, adapter versions, log lines,
resource samples, job stages) and appends it; it returns whether anything changed, so the panel redraws
only then. A resumed run keeps its earlier attempts' jobs (and logs) as `<role>#<attempt>`; its stage and
whether it is done are the current attempt's. Adapter versions come from the trainers' `adapter_published`
events as well as from the folders, so a version whose serving copy was deleted still counts, in every panel.
"""

import json
import threading
from collections import deque
from dataclasses import dataclass, field

from backend.executors.base import Executor, ResourceSample
from backend.jobspec import TERMINAL_STAGES, JobStatus
from backend.observers import (
    AdapterVersion,
    FragmentCursor,
    final_adapter_files,
    list_adapter_versions,
    read_new_records,
)
from backend.runtime import layout
from backend.runtime.redact import redact_record
from backend.store import BucketStore

MAX_LOG_LINES = 5000


@dataclass
class JobView:
    job_id: str
    role: str
    status: JobStatus = field(default_factory=lambda: JobStatus("SCHEDULING"))
    log_cursor: int = 0
    resource_cursor: int = 0
    logs: deque = field(default_factory=lambda: deque(maxlen=MAX_LOG_LINES))
    resources: list[ResourceSample] = field(default_factory=list)
    current: bool = True      # of the run's latest attempt (False: an earlier attempt, before a resume)


class RunView:
    def __init__(self, run_id: str, store: BucketStore, executor: Executor, jobs: dict[str, str],
                 earlier: dict[str, str] | None = None):
        """`jobs`: role -> job id of the current attempt; `earlier`: "<role>#<attempt>" -> job id of earlier ones."""
        self.run_id = run_id
        self.store = store
        self.executor = executor
        self.jobs = {key: JobView(job_id, key, current=False) for key, job_id in (earlier or {}).items()}
        self.jobs.update({role: JobView(job_id, role) for role, job_id in jobs.items()})
        self.superseded: dict[str, int] = {}    # adapter name -> the step the run resumed from, discarding it
        self.spec: dict = {}
        self.metrics: list[dict] = []
        self._by_step: dict[int, dict] = {}
        self.events: list[dict] = []
        self.replica_stats: list[dict] = []
        self.adapters: dict[int, AdapterVersion] = {}
        self.final_files: list = []
        self._metric_cursor = FragmentCursor()
        self._event_cursor = FragmentCursor()
        self.version = 0          # bumped on every change, so each viewer can tell whether it is behind
        # Every browser session watching this run shares this view, and Gradio runs their handlers in threads:
        # two refreshes at once would each append the same new lines.
        self._lock = threading.Lock()

    # ---- derived
    @property
    def current_jobs(self) -> dict[str, JobView]:
        return {role: job for role, job in self.jobs.items() if job.current}

    @property
    def stage(self) -> str:
        """The run's stage: the trainer's while it has one (a failed replica makes it degraded, not failed), or
        the worst of its jobs'."""
        jobs = self.current_jobs
        trainer = jobs.get("trainer")
        if trainer:
            return trainer.status.stage
        stages = [j.status.stage for j in jobs.values()]
        for stage in ("ERROR", "RUNNING", "SCHEDULING", "CANCELED", "COMPLETED"):
            if stage in stages:
                return stage
        return "UNKNOWN"

    @property
    def replicas_up(self) -> tuple[int, int] | None:
        """(replica jobs still running, replica jobs) of the current attempt; None for a run without replicas."""
        replicas = [job for role, job in self.current_jobs.items() if role.startswith("vllm-")]
        if not replicas:
            return None
        return sum(not job.status.done for job in replicas), len(replicas)

    @property
    def degraded(self) -> str | None:
        """'degraded (1/2 replicas)' while the trainer runs on fewer replicas than it started with."""
        up = self.replicas_up
        if up is None or self.stage != "RUNNING" or up[0] == up[1]:
            return None
        return f"degraded ({up[0]}/{up[1]} replicas)"

    @property
    def done(self) -> bool:
        jobs = self.current_jobs
        return bool(jobs) and all(j.status.stage in TERMINAL_STAGES for j in jobs.values())

    @property
    def engine(self) -> str | None:
        for event in reversed(self.events):
            if event.get("event") == "engine":
                return event.get("engine")
        return None

    # ---- refresh
    def refresh(self) -> bool:
        with self._lock:
            changed = self._refresh_spec()
            changed |= self._refresh_fragments()
            changed |= self._refresh_adapters()
            for job in self.jobs.values():
                changed |= self._refresh_job(job)
            self.version += changed
            return changed

    def replace_jobs(self, jobs: dict[str, str]) -> None:
        """Watch a new attempt's jobs (the run was resumed); the earlier attempts' jobs stay, as `<role>#<n>`."""
        with self._lock:
            for role, job in list(self.current_jobs.items()):
                attempt = 1 + sum(key.startswith(f"{role}#") for key in self.jobs)
                job.role, job.current = f"{role}#{attempt}", False
                self.jobs[job.role] = self.jobs.pop(role)
            self.jobs.update({role: JobView(job_id, role) for role, job_id in jobs.items()})
            self.version += 1

    @property
    def unreadable(self) -> dict[str, int]:
        """Records skipped as unreadable, per file: metric and event fragments, and the jobs' own files."""
        counts = {**self._metric_cursor.bad, **self._event_cursor.bad}
        if self.jobs:    # a view of bucket files alone has no executor to ask
            counts.update(self.executor.unreadable_records(self.run_id))
        return counts

    def _refresh_spec(self) -> bool:
        if self.spec:
            return False
        try:
            spec = json.loads(self.store.read_bytes(f"{layout.run_prefix(self.run_id)}/{layout.SPEC_FILE}"))
        except (OSError, ValueError, KeyError):
            return False
        self.spec = redact_record(spec) if isinstance(spec, dict) else {}
        return bool(self.spec)

    def _refresh_fragments(self) -> bool:
        prefix = layout.run_prefix(self.run_id)
        new_metrics = read_new_records(self.store, f"{prefix}/{layout.METRICS_DIR}", self._metric_cursor,
                                       check=_is_metric_record)
        for writer, record in new_metrics:
            if "replicas" in record:
                self.replica_stats.append(record)
            else:
                # A resumed trainer logs the steps after its checkpoint again: the latest record wins.
                self._by_step[record["step"]] = record
        new_events = read_new_records(self.store, f"{prefix}/{layout.EVENTS_DIR}", self._event_cursor,
                                      check=lambda r: isinstance(r.get("event"), str))
        for writer, record in new_events:
            # Masked on the way in too: a job's event may quote a token that its own job did not know to mask.
            record = redact_record(record)
            self.events.append({"writer": writer, **record})
            self._note_adapter_event(record)
        if new_metrics:
            self.metrics = [self._by_step[step] for step in sorted(self._by_step)]
        return bool(new_metrics or new_events)

    def _note_adapter_event(self, event: dict) -> None:
        """A published version (its files may be gone: TRL deletes old serving copies) or superseded versions."""
        if event["event"] == "adapters_superseded" and isinstance(event.get("names"), list):
            for name in event["names"]:
                self.superseded[str(name)] = event.get("resumed_from_step")
        match = layout.ADAPTER_NAME_RE.match(str(event.get("name", "")))
        if event["event"] != "adapter_published" or not match or int(match.group(1)) in self.adapters:
            return
        version, name = int(match.group(1)), event["name"]
        path = event.get("path") if isinstance(event.get("path"), str) else f"{layout.ADAPTERS_DIR}/{name}"
        step, size, when = event.get("step"), event.get("size_bytes"), event.get("time")
        self.adapters[version] = AdapterVersion(
            version=version, name=name, path=f"{layout.run_prefix(self.run_id)}/{path}",
            step=step if isinstance(step, int) else None, time=when if isinstance(when, (int, float)) else 0.0,
            size_bytes=size if isinstance(size, int) else 0)

    def _refresh_adapters(self) -> bool:
        new = list_adapter_versions(self.store, self.run_id, known=set(self.adapters))
        self.adapters.update(new)
        changed = bool(new)
        if not self.final_files:
            self.final_files = final_adapter_files(self.store, self.run_id)
            changed |= bool(self.final_files)
        return changed

    def _refresh_job(self, job: JobView) -> bool:
        changed = False
        if job.status.stage not in TERMINAL_STAGES or job.log_cursor == 0:
            try:
                status = self.executor.status(job.job_id)
            except Exception as exc:  # a flaky status call must not break the dashboard
                status = JobStatus(job.status.stage, f"status unavailable: {exc}")
            changed |= status != job.status
            job.status = status
        lines, job.log_cursor = self.executor.read_logs(job.job_id, job.log_cursor)
        job.logs.extend(lines)
        samples, job.resource_cursor = self.executor.read_resources(job.job_id, job.resource_cursor)
        job.resources.extend(samples)
        return changed or bool(lines or samples)


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_metric_record(record: dict) -> bool:
    """A trainer's metric record (an integer step and numbers), or a proxy's replica snapshot (a list of replicas)."""
    if "replicas" in record:
        return isinstance(record["replicas"], list) and all(isinstance(r, dict) for r in record["replicas"])
    step = record.get("step")
    return (isinstance(step, int) and not isinstance(step, bool) and step >= 0
            and all(_is_number(v) for v in record.values()))
