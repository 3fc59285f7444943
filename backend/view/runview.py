"""RunView: everything the dashboard shows about one run, kept up to date incrementally.

`refresh()` asks each observer for what is new (metric and event fragments, adapter versions, log lines,
resource samples, job stages) and appends it; it returns whether anything changed, so the panel redraws
only then. A resumed run keeps its earlier attempts' jobs (and logs) as `<role>#<attempt>`; its stage and
whether it is done are the current attempt's. Adapter versions come from the trainers' `adapter_published`
events as well as from the folders, so a version whose serving copy was deleted still counts, in every panel.
"""

import bisect
import contextlib
import json
import logging
import math
import threading
import time
from collections import deque
from dataclasses import dataclass, field

from backend.executors.base import Executor, ResourceSample
from backend.outcome.held_out import HeldOut
from backend.plan.jobspec import ERROR, TERMINAL_STAGES, JobStatus, run_stage
from backend.runtime import layout, records
from backend.runtime.redact import redact_record
from backend.storage.adapters import AdapterVersion, final_adapter_files, find_adapter_version, list_adapter_versions
from backend.storage.observers import FragmentReader
from backend.storage.series import SeriesTable, Sketch
from backend.storage.store import BucketStore
from backend.view.servers import server_name, server_role, servers_per_job

log = logging.getLogger(__name__)

MAX_LOG_LINES = 5000
FIRST_LOOK_LOG_LINES = 1000     # a first look reads each log's newest lines; the rest of its tail in the background
RECENT_SAMPLES = 900        # raw resource samples kept per job (15 minutes at 1 Hz): alerts read them
MAX_REPLICA_SNAPSHOTS = 100
MAX_ADAPTER_LOADS = 500     # the proxy's newest per-replica load timings a view keeps (and a first look reads)
SAMPLE_CHUNK = 5000         # resource samples read at a time
SAMPLE_STEPS_KEPT = 100     # steps (or policy versions) whose sample completions a view keeps
MIN_REFRESH_S = 1.0         # sessions ticking at once share one refresh: a second within this is a no-op
SETTLED_RECHECK_S = 60.0    # a finished run is looked at again this rarely (its files do not change)
# A first look at a long run reads its newest metric fragments (about 1,000 steps) and the last 20 minutes of each
# job's resource samples (the alerts read the last 15) at once, and the history before them in the background: it
# opens about as fast as a short run, whatever its length, and the charts fill in once the history is read.
HISTORY_TAIL_FRAGMENTS = 100
HISTORY_TAIL_SAMPLES = 1200
# Of the trainer's events (one fragment each: an adapter version every few steps), a first look reads the newest
# ones; the older ones are joined in front of them in the background, in time order, and whatever the view derives
# from events (versions, open alerts, the trainer's end, its engine) is derived again from all of them. Readers
# that must see every event wait for them (`wait_for_events`); the alerts wait by themselves (`events_loading`).
EVENTS_TAIL_FRAGMENTS = 100
# Of the held-out evaluation records (one fragment per evaluated version), a first look reads the newest ones and the
# base model's: the best version (best.json names it until its record is read) and the chart appear at once; the
# older records are joined in the background, after which the ranking is over every record.
EVALS_TAIL_FRAGMENTS = 100
CANARY_KEPT = 10            # the proxy's newest serving proofs a first look reads (the view keeps the last)
# A bounded view (the background watch's summary of a live run nobody watches) keeps only what the alerts and the
# runs list read: the newest steps, the events but adapter versions, the newest resource samples.
SUMMARY_FRAGMENTS = 10
SUMMARY_ROWS = 200
STARTED_NONE: tuple[int, float | None] = (0, None)


def note_started(known: tuple[int, float | None], event: dict) -> tuple[int, float | None]:
    """(how many 'started' events, the newest one's time) with `event` counted: each attempt's trainer writes one
    as training begins (the alerts' start-up allowance). Kept as events are read: a tick never walks them all."""
    when = event.get("time")
    if event.get("event") != records.STARTED or not isinstance(when, (int, float)):
        return known
    count, newest = known
    return count + 1, when if newest is None else max(newest, when)


SUMMARY_EVENTS_SKIPPED = (records.ADAPTER_PUBLISHED, records.ADAPTERS_SUPERSEDED)
# A background read of the history that fails (a bucket that did not answer) is tried again, this long after
# the failure, doubling up to the cap: the rows it did not bring are never silently left out.
HISTORY_RETRY_S = 2.0
HISTORY_RETRY_MAX_S = 60.0
HISTORY_WAIT_FAILURES = 3    # a wait with no deadline (a resume's plan) gives up after this many failed reads


def _usage_row(sample: ResourceSample) -> dict:
    row = {"time": sample.time, "cpu_percent": sample.cpu_percent,
           "ram_gib": None if sample.ram_bytes is None else sample.ram_bytes / 2**30}
    for i, util in enumerate(sample.gpu_util):
        row[f"{sample.gpu_name(i)} util"] = util
    for i, used in enumerate(sample.gpu_mem_bytes):
        row[f"{sample.gpu_name(i)} memory_gib"] = used / 2**30
    return row


class ResourceUsage:
    """A job's resource samples as columns against time: CPU %, RAM, and per GPU its utilisation and memory
    (GPUs named by the machine's index where the sampler knows it), drawn as bounded series."""

    def __init__(self):
        self.table = SeriesTable(axes=("time",))

    def add(self, samples: list[ResourceSample]) -> None:
        if len(samples) < 64 or any(s.gpu_util or s.gpu_mem_bytes for s in samples):
            self.table.extend([_usage_row(s) for s in samples])
            return
        # CPU-only samples (a local job), column by column: a first look at a day of them makes no dict each.
        self.table.extend_columns({
            "time": [s.time for s in samples], "cpu_percent": [s.cpu_percent for s in samples],
            "ram_gib": [None if s.ram_bytes is None else s.ram_bytes / 2**30 for s in samples]})

    def sketch(self, key: str) -> Sketch | None:
        return self.table.sketch(key, "time")

    def gpus(self) -> list[str]:
        return [key[: -len(" util")] for key in self.table.columns if key.endswith(" util")]

    @property
    def version(self) -> int:
        return self.table.version


@dataclass
class JobView:
    job_id: str
    role: str
    status: JobStatus = field(default_factory=lambda: JobStatus("SCHEDULING"))
    log_cursor: int = 0
    resource_cursor: int = 0
    history_end: int = -1     # where a first look started reading samples (-1: not looked at yet; >0: history)
    log_from: int = -1        # where the log's tail begins, when a first look read less of it (-1: nothing left)
    logs: deque = field(default_factory=lambda: deque(maxlen=MAX_LOG_LINES))
    log_version: int = 0
    resources: deque = field(default_factory=lambda: deque(maxlen=RECENT_SAMPLES))   # the newest raw samples
    usage: ResourceUsage = field(default_factory=ResourceUsage)                       # all of them, bounded
    current: bool = True      # of the run's latest attempt (False: an earlier attempt, before a resume)


class RunView:
    def __init__(self, run_id: str, store: BucketStore, executor: Executor, jobs: dict[str, str],
                 earlier: dict[str, str] | None = None, bounded: bool = False):
        """`jobs`: role -> job id of the current attempt; `earlier`: "<role>#<attempt>" -> job id of earlier ones.
        A `bounded` view holds what the alerts and the runs list read, whatever the run's length: the newest
        SUMMARY_ROWS steps, its events but adapter versions, each job's newest resource samples; it reads no
        history, log, samples or adapter folders, and draws nothing."""
        self.run_id = run_id
        self.bounded = bounded
        self.store = store
        self.executor = executor
        self.jobs = {key: JobView(job_id, key, current=False) for key, job_id in (earlier or {}).items()}
        self.jobs.update({role: JobView(job_id, role) for role, job_id in jobs.items()})
        self.superseded: dict[str, int] = {}    # adapter name -> the step the run resumed from, discarding it
        self.spec: dict = {}
        # A sweep's shared fleet has no spec.json: its fleet.json (its name, sweep, members, slots) is read instead.
        self.fleet: dict = {}
        self.table = SeriesTable()            # the trainer's metrics, one row per logged step, bounded to draw
        self.first_step: dict[int, int] = {}  # policy version -> the first step trained with it (async runs)
        self.events: list[dict] = []
        self.replica_stats: deque[dict] = deque(maxlen=MAX_REPLICA_SNAPSHOTS)
        self.adapter_loads: deque[dict] = deque(maxlen=MAX_ADAPTER_LOADS)   # {"time", "version", "replicas"}
        self.adapters: dict[int, AdapterVersion] = {}
        self.final_files: list = []
        prefix = layout.run_prefix(run_id)
        # The proxy's replica snapshots each replace the last: a first look reads only the newest ones.
        self._metrics = FragmentReader(store, f"{prefix}/{layout.METRICS_DIR}", check=_is_metric_record,
                                       latest_only={layout.PROXY_WRITER: MAX_REPLICA_SNAPSHOTS,
                                                    layout.LOADS_WRITER: MAX_ADAPTER_LOADS,
                                                    layout.CANARY_WRITER: CANARY_KEPT},
                                       defer={layout.TRAINER_WRITER: SUMMARY_FRAGMENTS if bounded
                                              else HISTORY_TAIL_FRAGMENTS})
        self._events = FragmentReader(store, f"{prefix}/{layout.EVENTS_DIR}",
                                      check=lambda r: isinstance(r.get("event"), str),
                                      defer={layout.TRAINER_WRITER: EVENTS_TAIL_FRAGMENTS})
        # What the policy writes: a few completions per step; a first look reads only the newest steps.
        self._samples = FragmentReader(store, f"{prefix}/{layout.SAMPLES_DIR}",
                                       check=lambda r: isinstance(r.get("completion"), str),
                                       latest_only={layout.TRAINER_WRITER: SAMPLE_STEPS_KEPT})
        self.samples: deque[dict] = deque(maxlen=SAMPLE_STEPS_KEPT * 4)
        # Held-out scores per version, their samples, the best version (a first look reads the newest records).
        self.held_out = HeldOut(store, run_id, tail=EVALS_TAIL_FRAGMENTS)
        self.serving: dict = {}               # the proxy's newest serving proof (distributed runs)
        self.open_alerts: dict[str, dict] = {}   # alert key -> the event that fired it, until one clears it
        self.best_by_change: dict = {}       # the newest best_by_changed event: the user's rule, over the spec's
        self._engine: str | None = None
        self.trainer_end: dict = {}          # the trainer's newest started/finished/failed/canceled event
        # Kept as events are read, so a tick never scans a long run's thousands of events for them:
        self.launch_failed: dict | None = None     # the newest launch_failed event
        self.trainer_attempts: list[dict] = []      # the trainer's attempt events, in order
        self.trainer_started = STARTED_NONE          # (how many 'started' events, the newest one's time)
        self._versions: list[int] = []       # adapter version numbers, ascending
        self._adapters_listed_at = float("-inf")
        self._versions_from_events = False
        self._refreshed_at = float("-inf")
        self.refreshes = 0
        self.min_refresh_s = MIN_REFRESH_S
        self._settled = False     # every job over and the bucket read once since: nothing more will come
        self.version = 0          # bumped on every change, so each viewer can tell whether it is behind
        # Every browser session watching this run shares this view, and Gradio runs their handlers in threads:
        # two refreshes at once would each append the same new lines (reentrant: a due refresh is checked under it).
        # Whatever draws or reads the tables holds it too (`reading`): a draw adds sketches to a table and walks
        # their points, which a refresh appends to and a history join iterates.
        self._lock = threading.RLock()
        self.history_failure = ""     # why the last background read of the history failed ("" if none did)
        self._history_failures = 0
        self._history_retry_at = float("-inf")
        self._history: threading.Thread | None = None    # reads a long run's history in the background
        self._event_history: threading.Thread | None = None     # and its older events
        self._evals_history: threading.Thread | None = None     # and its older held-out records

    # ---- derived
    @property
    def current_jobs(self) -> dict[str, JobView]:
        return {role: job for role, job in self.jobs.items() if job.current}

    @property
    def stage(self) -> str:
        """The run's stage from its current attempt's jobs (`jobspec.run_stage`, the runs list's rule too); ERROR
        for a run whose current launch failed (what it had started was cancelled)."""
        if self.launch_failure is not None:
            return ERROR
        return run_stage({role: job.status.stage for role, job in self.current_jobs.items()})

    @property
    def launch_failure(self) -> dict | None:
        """The newest `launch_failed` event when the current jobs are that failed launch's (each one among the ids
        it cancelled, or none at all), else None."""
        failed = self.launch_failed
        known = failed.get("known") if failed is not None else None
        if not isinstance(known, list):
            return None
        return failed if all(job.job_id in known for job in self.current_jobs.values()) else None

    @property
    def replicas_up(self) -> tuple[int, int] | None:
        """(replicas up, replica jobs) of the current attempt; None for a run without replicas. A replica is down
        when its job ended, or when the proxy's newest snapshot says it stopped answering after it had joined (its
        process died and its job is retrying it): it is up again once the proxy has taken it back. A sweep member on
        its sweep's shared fleet has no replica job of its own: the fleet's (its spec's `replicas`) are counted from
        its proxy's snapshot alone, so a fleet replica lost degrades every member."""
        replicas = {role: job for role, job in self.current_jobs.items() if role.startswith("vllm-")}
        snapshot = self.replica_stats[-1].get("replicas", []) if self.replica_stats else []
        if not replicas:
            fleet = self.spec.get("replicas") if self.spec.get("fleet") and snapshot else None
            if type(fleet) is not int or fleet < 1:
                return None
            return fleet - len(_lost_roles(snapshot, fleet)), fleet
        lost = _lost_roles(snapshot, len(replicas))
        return sum(not job.status.done and role not in lost for role, job in replicas.items()), len(replicas)

    @property
    def retries(self) -> list[str]:
        """Each retry the run has seen, in words: trainer attempts beyond the first of each trainer job (recorded by
        `runtime.attempt`), replicas the proxy took back after a restart (a new server), and the times a replica
        stopped answering for a while and came back (a disconnect, not a restart)."""
        attempts = self.trainer_attempts
        launched = sum(1 for role in self.jobs if role == "trainer" or role.startswith("trainer#"))
        # Where the executor numbers its attempts (local) a retry is one past the first; HF Jobs does not say, so
        # there every trainer job's first attempt is counted off instead.
        numbered = attempts and all(_is_number(e.get("attempt")) for e in attempts)
        retried = [e for e in attempts if e["attempt"] > 1] if numbered else attempts[launched:]
        out = [f"trainer retried at {_clock(e.get('time'))}" + (f" (attempt {e['attempt']})" if numbered else "")
               for e in retried]
        snapshot = self.replica_stats[-1].get("replicas", []) if self.replica_stats else []
        per_job = servers_per_job(len(snapshot), sum(1 for role in self.current_jobs if role.startswith("vllm-")))
        for i, r in enumerate(snapshot):
            restarted, reconnected, _missed = replica_counts(r)
            if restarted:
                out.append(f"{server_name(i, per_job)} taken back {restarted}x after a restart")
            if reconnected:
                out.append(f"{server_name(i, per_job)} stopped answering and came back {reconnected}x")
        return out

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
        return self._engine

    @property
    def member(self) -> str:
        """The run's sweep member tag ("" for a lone run): part of its versions' names."""
        return layout.spec_member(self.spec)

    def find_adapter(self, version: int) -> AdapterVersion | None:
        """Version `version` if the run published it: from its events, or from its folder while the older events
        are still being read (a version picked by hand before its event is read is no less published)."""
        known = self.adapters.get(version)
        if known is not None or not self.events_loading:
            return known
        return find_adapter_version(self.store, self.run_id, version, self.member)

    def newest_adapters(self, count: int) -> list[AdapterVersion]:
        """The `count` highest versions, newest first (without sorting thousands of versions each time)."""
        return [self.adapters[v] for v in self._versions[-count:][::-1]]

    @property
    def metrics(self) -> list[dict]:
        """Every logged step as a dict, oldest first. O(run length): for scripts and tests, not for ticks."""
        return self.table.rows()

    @property
    def read_once(self) -> bool:
        """Whether the view has refreshed at least once (a view made by a launch may not have yet)."""
        return self.refreshes > 0

    @property
    def latest(self) -> dict:
        """The newest logged step's metrics ({} before the first)."""
        return self.table.last_row

    # ---- refresh
    def refresh_if_due(self) -> bool:
        """`refresh()` for a timer tick. Sessions ticking together share the work: a refresh within MIN_REFRESH_S
        of the last one returns at once, and a finished run (every job over, its files read since) is looked at
        only every SETTLED_RECHECK_S."""
        wait = SETTLED_RECHECK_S if self._settled else self.min_refresh_s
        if time.monotonic() - self._refreshed_at < wait:
            return False
        with self._lock:     # sessions due at once: the first one in refreshes, the others find it done
            if time.monotonic() - self._refreshed_at < wait:
                return False
            return self.refresh()

    def expect_event_writer(self, writer: str) -> None:
        """The panel writes events of its own into the run's folder (alerts, a budget stop): read them at once."""
        self._events.expect(writer)
        with self._lock:
            self._settled = False       # a finished run's folder is read again: the panel has just written to it

    def expire(self) -> None:
        """Forget when the view last refreshed: the next `refresh_if_due` reads (a timer period has passed)."""
        self._refreshed_at = float("-inf")

    def refresh(self) -> bool:
        """Read what is new: metric and event fragments, adapter versions, job stages, log lines, resource
        samples. Returns whether anything changed."""
        with self._lock:
            self._refreshed_at = time.monotonic()
            self.refreshes += 1
            changed = self._refresh_spec()
            if not self._settled:      # a settled run's bucket holds nothing new: only its jobs are asked
                changed |= self._refresh_fragments()
                changed |= self._refresh_adapters()
            for job in self.jobs.values():
                changed |= self._refresh_job(job)
            # Settled once every job is over and the bucket was read in full after that (once a first look's
            # background listings are read: the full read lists again).
            if self.done and not self._settled and not (self._metrics.looking_back or self._events.looking_back
                                                        or self.held_out.reader.looking_back):
                changed |= self._refresh_fragments(True)
                changed |= self._refresh_adapters(True)
                self._settled = True
            self._start_history()
            self.version += changed
            return changed

    # ---- history (a long run's older rows, read in the background)
    @property
    def history_pending(self) -> bool:
        """Whether older rows or events a first look left for later are still being found or read."""
        return (_alive(self._history) or self.events_loading or self._metrics.looking_back
                or bool(self._metrics.deferred) or self.held_out.older_pending)

    @property
    def events_loading(self) -> bool:
        """Whether older events a first look left for later are still being found or read: until they are,
        `events` holds the newest ones (and whatever the other writers' fragments held that was read)."""
        return _alive(self._event_history) or self._events.looking_back or bool(self._events.deferred)

    def wait_for_history(self, timeout: float | None = None) -> bool:
        """Wait until the history is read (for a one-off drawing such as Compare); True if it is."""
        return self._wait(lambda: self.history_pending, (self._metrics, self._events, self.held_out.reader),
                          lambda: (self._history, self._event_history, self._evals_history), timeout)

    def wait_for_events(self, timeout: float | None = None) -> bool:
        """Wait until every event is read (for what must see them all: a resume plan, "try it"); True if it is."""
        return self._wait(lambda: self.events_loading, (self._events,), lambda: (self._event_history,), timeout)

    def _wait(self, pending, readers, threads, timeout: float | None) -> bool:
        deadline = None if timeout is None else time.monotonic() + timeout
        failures = self._history_failures
        while pending():
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            for reader in readers:
                reader.wait_for_listing(left)
            if any(reader.looking_back or reader.deferred for reader in readers):
                with self._lock:    # the listing's news read now (what a tick would do), the history started
                    for full in (False, True):      # a listing that failed: list now
                        if any(reader.looking_back and not reader.listing_pending for reader in readers):
                            self.version += self._refresh_fragments(full)
                    self._start_history()
            for thread in threads():
                if thread is not None:
                    thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
            if deadline is not None and time.monotonic() >= deadline:
                break
            if pending() and not any(_alive(t) for t in threads()):   # a failed read waits for its retry
                if deadline is None and self._history_failures - failures >= HISTORY_WAIT_FAILURES:
                    break
                until = self._history_retry_at if deadline is None else min(self._history_retry_at, deadline)
                time.sleep(max(0.0, min(until - time.monotonic(), HISTORY_RETRY_MAX_S)))
        return not pending()

    def _start_history(self) -> None:
        """Read what a first look set aside, in threads of their own (called under the lock); after a failed read,
        not before its retry is due."""
        if time.monotonic() < self._history_retry_at:
            return
        if self._events.deferred and not _alive(self._event_history):
            fragments, self._events.deferred = self._events.deferred, []
            self._event_history = threading.Thread(target=self._read_event_history, args=(fragments,),
                                                   name=f"events-{self.run_id}", daemon=True)
            self._event_history.start()
        if self.held_out.reader.deferred and not self.bounded and not _alive(self._evals_history):
            older = self.held_out.take_older()
            self._evals_history = threading.Thread(target=self._read_evals_history, args=(older,),
                                                   name=f"evals-{self.run_id}", daemon=True)
            self._evals_history.start()
        if _alive(self._history):
            return
        fragments, self._metrics.deferred = self._metrics.deferred, []
        if self.bounded:        # a summary needs no history
            for job in self.jobs.values():
                job.history_end = min(job.history_end, 0)
            return
        samples, logs = {}, {}
        for job in self.jobs.values():
            if job.history_end > 0:
                samples[job.job_id], job.history_end = job.history_end, 0
            if job.log_from >= 0:
                logs[job.job_id], job.log_from = job.log_from, -1
        if fragments or samples or logs:
            self._history = threading.Thread(target=self._read_history, args=(fragments, samples, logs),
                                             name=f"history-{self.run_id}", daemon=True)
            self._history.start()

    def _read_history(self, fragments: list, samples: dict[str, int], logs: dict[str, int] | None = None) -> None:
        """The rows before what a first look read, joined in front of the rows read since (one swap under the
        lock; what is drawn is built here, so the swap costs the rows read since, not the history)."""
        try:
            with self._lock:
                drawn = self.table.drawn()
                # Each job's samples up to the first one a first look read (a chunk can run past it), drawn alike.
                jobs = {job.job_id: (job.usage.table.times[0] if len(job.usage.table) else math.inf,
                                     job.usage.table.drawn()) for job in self.jobs.values()}
            table, first_step = SeriesTable(), {}
            for batch in self._metrics.read_deferred(fragments):
                steps = [_with_band(record) for _writer, record in batch if _is_step_record(record)]
                for record in steps:
                    if _is_number(record.get("policy_version")):
                        first_step.setdefault(int(record["policy_version"]), record["step"])
                table.extend(steps)
            for key in drawn:
                table.sketch(*key)
            usages = {}
            for job_id, end in samples.items():
                usage, cursor = ResourceUsage(), 0
                first, drawn_usage = jobs.get(job_id, (math.inf, []))
                while cursor < end:
                    chunk, cursor = self.executor.read_resources(job_id, cursor, limit=SAMPLE_CHUNK)
                    if not chunk:
                        break
                    usage.add([sample for sample in chunk if sample.time < first])
                for key in drawn_usage:
                    usage.table.sketch(*key)
                usages[job_id] = usage
            tails = {job_id: self.executor.read_logs(job_id, start) for job_id, start in (logs or {}).items()}
            with self._lock:
                for job in self.jobs.values():
                    if job.job_id in tails:     # the log's tail from where it begins to now (a short read here)
                        lines, end = tails[job.job_id]
                        more, job.log_cursor = self.executor.read_logs(job.job_id, end)
                        job.logs = deque([*lines, *more], maxlen=MAX_LOG_LINES)
                        job.log_version += 1
                self.table = self.table.after(table)
                for version, step in first_step.items():
                    if step < self.first_step.get(version, step + 1):
                        self.first_step[version] = step
                for job in self.jobs.values():
                    if job.job_id in usages:
                        job.usage.table = job.usage.table.after(usages[job.job_id].table)
                self._history_read()
        except Exception as e:  # the dashboard goes on with the rows it has, and reads them again
            with self._lock:
                self._metrics.deferred = [*fragments, *self._metrics.deferred]
                for job in self.jobs.values():
                    job.history_end = samples.get(job.job_id, job.history_end)
                    job.log_from = (logs or {}).get(job.job_id, job.log_from)
                self._history_failed(e, "history")

    def _read_event_history(self, fragments: list) -> None:
        """The events before what a first look read, joined in time order; what the view derives from events is
        derived again from all of them (one pass under the lock)."""
        try:
            older = []
            for batch in self._events.read_deferred(fragments):
                older += [self._event_record(writer, record) for writer, record in batch]
            older = [record for record in older if record is not None]
            with self._lock:
                self.events = sorted([*older, *self.events], key=_event_time)
                self._engine, self.trainer_end, self.open_alerts, self.superseded = None, {}, {}, {}
                self.launch_failed, self.trainer_attempts = None, []
                self.trainer_started = STARTED_NONE
                for record in self.events:
                    self._note_event(record)
                self._history_read()
        except Exception as e:  # the dashboard goes on with the events it has, and reads them again
            with self._lock:
                self._events.deferred = [*fragments, *self._events.deferred]
                self._history_failed(e, "older events")

    def _read_evals_history(self, fragments: list) -> None:
        """The held-out records before what a first look read, joined behind those read since (one pass under the
        lock): the ranking is then over every record."""
        try:
            older = self.held_out.read_older(fragments)
            with self._lock:
                self.held_out.join_older(older)
                self._history_read()
        except Exception as e:  # the dashboard goes on with the records it has, and reads them again
            with self._lock:
                self.held_out.give_back(fragments)
                self._history_failed(e, "older held-out records")

    def _history_read(self) -> None:
        """A background read joined what it read (called under the lock): any earlier failure is over."""
        self.history_failure, self._history_failures = "", 0
        self.version += 1

    def _history_failed(self, error: Exception, what: str) -> None:
        """A background read failed (called under the lock, its work handed back): say why, and try again later,
        each retry twice as late as the one before, up to HISTORY_RETRY_MAX_S."""
        self._history_failures += 1
        delay = min(HISTORY_RETRY_S * 2 ** (self._history_failures - 1), HISTORY_RETRY_MAX_S)
        self._history_retry_at = time.monotonic() + delay
        self.history_failure = f"{type(error).__name__}: {error}"[:300]
        self.version += 1
        log.warning("could not read the %s of run %s (%s); trying again in %.0f s", what, self.run_id,
                    self.history_failure, delay)

    def reading(self) -> threading.RLock:
        """Hold while drawing or reading the view's tables: what refreshes and history joins hold."""
        return self._lock

    def replace_jobs(self, jobs: dict[str, str]) -> None:
        """Watch a new attempt's jobs (the run was resumed); the earlier attempts' jobs stay, as `<role>#<n>`."""
        with self._lock:
            for role, job in list(self.current_jobs.items()):
                attempt = 1 + sum(key.startswith(f"{role}#") for key in self.jobs)
                job.role, job.current = f"{role}#{attempt}", False
                self.jobs[job.role] = self.jobs.pop(role)
            self.jobs.update({role: JobView(job_id, role) for role, job_id in jobs.items()})
            self._settled = False
            self._refreshed_at = float("-inf")
            self.version += 1

    @property
    def evals(self) -> dict[int, dict]:
        """The held-out evaluation records by version (what the chart draws)."""
        return self.held_out.records

    @property
    def unreadable(self) -> dict[str, int]:
        """Records skipped as unreadable, per file: metric and event fragments, and the jobs' own files."""
        counts = {**self._metrics.cursor.bad, **self._events.cursor.bad, **self.held_out.unreadable}
        if self.jobs:    # a view of bucket files alone has no executor to ask
            counts.update(self.executor.unreadable_records(self.run_id))
        return counts

    def _refresh_spec(self) -> bool:
        if self.spec or self.fleet:
            return False
        try:
            spec = json.loads(self.store.read_bytes(f"{layout.run_prefix(self.run_id)}/{layout.SPEC_FILE}"))
        except (OSError, ValueError, KeyError):
            return self._refresh_fleet()
        self.spec = redact_record(spec) if isinstance(spec, dict) else {}
        self.held_out.member = self.member
        return bool(self.spec)

    def _refresh_fleet(self) -> bool:
        """A run folder without spec.json may be a sweep's shared fleet: its fleet.json, once readable."""
        try:
            record = json.loads(self.store.read_bytes(f"{layout.run_prefix(self.run_id)}/{layout.FLEET_FILE}"))
        except (OSError, ValueError, KeyError):
            return False
        self.fleet = redact_record(record) if isinstance(record, dict) else {}
        return bool(self.fleet)

    def _refresh_fragments(self, full: bool = False) -> bool:
        changed = False
        for batch in self._metrics.batches(full):
            changed = True
            steps = []
            for _writer, record in batch:
                if "replicas" in record:
                    self.replica_stats.append(record)
                    continue
                if "canary" in record:
                    self.serving = record["canary"]
                    continue
                if "adapter_load" in record:
                    self.adapter_loads.append({**record["adapter_load"], "time": record.get("time")})
                    continue
                steps.append(_with_band(record))
                if _is_number(record.get("policy_version")):
                    self.first_step.setdefault(int(record["policy_version"]), record["step"])
            # In the order they were written: a resumed trainer logs the steps after its checkpoint again, and
            # the table keeps the latest.
            self.table.extend(steps)
        if self.bounded and len(self.table) > 2 * SUMMARY_ROWS:
            newest = SeriesTable()
            newest.extend(self.table.rows(last=SUMMARY_ROWS))
            self.table = newest
        for _writer, record in [] if self.bounded else self._samples.read(full):
            self.samples.append(redact_record(record))
            changed = True
        if not self.bounded:    # a watched summary keeps no held-out scores
            changed |= self.held_out.refresh(full)
        # Several writers' fragments arrive in one batch (the trainer's, each panel's): in the order they happened,
        # so an alert cleared by a restarted panel is not read back before the one that raised it.
        new_events = sorted(self._events.read(full), key=lambda pair: _event_time(pair[1]))
        for writer, record in new_events:
            record = self._event_record(writer, record)
            if record is not None:
                self.events.append(record)
                self._note_event(record)
        if not self.bounded:
            changed |= self.held_out.set_rule(self.best_by)
        return changed or bool(new_events)

    @property
    def best_by(self) -> dict[str, float]:
        """The rule the best version is chosen by: the user's newest change on the run, else the launch spec's."""
        rule = self.best_by_change.get("best_by") if self.best_by_change else self.spec.get("best_by")
        return {str(k): float(v) for k, v in rule.items() if isinstance(v, (int, float))} if isinstance(
            rule, dict) else {}

    def _event_record(self, writer: str, record: dict) -> dict | None:
        """An event as the view keeps it (None: one a bounded view does not keep). Masked on the way in too: a
        job's event may quote a token that its own job did not know to mask."""
        record = {"writer": writer, **redact_record(record)}
        return None if self.bounded and record["event"] in SUMMARY_EVENTS_SKIPPED else record

    def _note_event(self, record: dict) -> None:
        """What the view derives from an event, the events read in the order they happened."""
        self._note_adapter_event(record)
        if record["event"] == records.ENGINE:
            self._engine = record.get("engine")
        if record["writer"] == layout.TRAINER_WRITER and record["event"] in records.TRAINER_STAGES:
            self.trainer_end = record
        if record["event"] == records.LAUNCH_FAILED:
            self.launch_failed = record
        if record["writer"] == layout.TRAINER_WRITER and record["event"] == records.ATTEMPT:
            self.trainer_attempts.append(record)
        self.trainer_started = note_started(self.trainer_started, record)
        if record["event"] == records.BEST_BY_CHANGED and isinstance(record.get("best_by"), dict) and (
                _event_time(record) >= _event_time(self.best_by_change or {"time": float("-inf")})):
            self.best_by_change = record
        if record["event"] == records.ALERT and isinstance(record.get("key"), str):
            self.open_alerts[record["key"]] = record
        elif record["event"] == records.ALERT_CLEARED:
            self.open_alerts.pop(record.get("key"), None)

    def _note_adapter_event(self, event: dict) -> None:
        """A published version (its files may be gone: TRL deletes old serving copies) or superseded versions."""
        if event["event"] == records.ADAPTERS_SUPERSEDED and isinstance(event.get("names"), list):
            for name in event["names"]:
                self.superseded[str(name)] = event.get("resumed_from_step")
        version = layout.adapter_version(event.get("name"))
        if event["event"] != records.ADAPTER_PUBLISHED or version is None or version in self.adapters:
            return
        self._versions_from_events = True
        name = event["name"]
        path = event.get("path") if isinstance(event.get("path"), str) else f"{layout.ADAPTERS_DIR}/{name}"
        step, size, when = event.get("step"), event.get("size_bytes"), event.get("time")
        bisect.insort(self._versions, version)
        self.adapters[version] = AdapterVersion(
            version=version, name=name, path=f"{layout.run_prefix(self.run_id)}/{path}",
            step=step if isinstance(step, int) else None, time=when if isinstance(when, (int, float)) else 0.0,
            size_bytes=size if isinstance(size, int) else 0)

    def _refresh_adapters(self, full: bool = False) -> bool:
        """Versions come from the trainers' events; their folders are listed (for runs whose trainer wrote no
        such events) only as often as the metrics folder is, and final/ once the trainer says it finished."""
        changed = rescan = False
        # A trainer that records its versions as events is the authority: its folders need no listing (thousands
        # of versions); one that never did (an older run) is listed as often as its metrics folder.
        if self.bounded:
            return False
        if (full or self._metrics.listed_at > self._adapters_listed_at) and not self._versions_from_events:
            self._adapters_listed_at = self._metrics.listed_at
            new = list_adapter_versions(self.store, self.run_id, known=set(self.adapters))
            self.adapters.update(new)
            for version in new:
                bisect.insort(self._versions, version)
            changed, rescan = bool(new), True
        elif full or self._metrics.listed_at > self._adapters_listed_at:
            self._adapters_listed_at = self._metrics.listed_at
            rescan = True
        finished = any(e.get("event") == records.FINISHED for e in self.events[-20:])
        if not self.final_files and (full or rescan or finished):
            self.final_files = final_adapter_files(self.store, self.run_id)
            changed |= bool(self.final_files)
        return changed

    def _refresh_job(self, job: JobView) -> bool:
        changed = False
        if job.log_cursor == 0:     # a first look shows the tail: a day-long log is not read from its start
            job.log_cursor = self.executor.tail_cursor(job.job_id, FIRST_LOOK_LOG_LINES)
            if job.log_cursor > 0 and not self.bounded:     # the rest of the tail is read with the history
                job.log_from = self.executor.tail_cursor(job.job_id, MAX_LOG_LINES)
        if job.history_end < 0:     # and the last hour of samples: the ones before are read in the background
            job.resource_cursor = job.history_end = self.executor.resources_tail_cursor(
                job.job_id, RECENT_SAMPLES if self.bounded else HISTORY_TAIL_SAMPLES)
        if job.status.stage not in TERMINAL_STAGES or job.log_cursor == 0:
            try:
                status = self.executor.status(job.job_id)
            except Exception as exc:  # a flaky status call must not break the dashboard
                status = JobStatus(job.status.stage, f"status unavailable: {exc}")
            changed |= status != job.status
            job.status = status
        lines, job.log_cursor = ([], job.log_cursor) if self.bounded else self.executor.read_logs(job.job_id,
                                                                                                   job.log_cursor)
        if lines:
            job.logs.extend(lines)
            job.log_version += 1
        sampled = False
        while True:    # a day of samples on a first look is read in chunks, never all held at once
            samples, job.resource_cursor = self.executor.read_resources(job.job_id, job.resource_cursor,
                                                                        limit=SAMPLE_CHUNK)
            if not samples:
                break
            sampled = True
            job.resources.extend(samples)
            if not self.bounded:
                job.usage.add(samples)
        return changed or bool(lines) or sampled


def reading(view):
    """What to hold while drawing `view` or reading its tables: a RunView's lock (another kind of view, built for
    one caller, needs none)."""
    lock = getattr(view, "reading", None)
    return lock() if callable(lock) else contextlib.nullcontext()


def _alive(thread: threading.Thread | None) -> bool:
    return thread is not None and thread.is_alive()


def _with_band(record: dict) -> dict:
    """The record (just read, ours to change) with `reward` +- `reward_std` as series of their own, so the band
    is drawn bounded too."""
    reward, std = record.get("reward"), record.get("reward_std")
    if _is_number(reward) and _is_number(std):
        record["reward_upper"], record["reward_lower"] = reward + std, reward - std
    return record


def _is_step_record(record: dict) -> bool:
    return not {"replicas", "canary", "adapter_load"} & set(record)


def replica_counts(r) -> tuple[int, int, int]:
    """A proxy snapshot's replica: (restarts, disconnects it came back from, canary misses) over the whole run. A
    proxy from before the run's counts said only how often it joined (and how many of those were restarts), for the
    life of that proxy."""
    if not isinstance(r, dict):
        return 0, 0, 0
    counts = [int(r[k]) if _is_number(r.get(k)) else 0 for k in ("restarted", "reconnected", "canary_missed")]
    if "reconnected" not in r:
        back = int(r["joined"]) - 1 if _is_number(r.get("joined")) else 0
        counts[0] = counts[0] if back > 0 else 0
        counts[1] = max(back - counts[0], 0)
    return counts[0], counts[1], counts[2]


def _lost_roles(snapshot: list, jobs: int) -> set[str]:
    """The replica jobs (`vllm-i`) of which the proxy's `snapshot` has a server that stopped answering after it had
    joined (one still starting is not lost)."""
    per_job = servers_per_job(len(snapshot), jobs)
    return {server_role(i, per_job) for i, r in enumerate(snapshot)
            if isinstance(r, dict) and not r.get("healthy") and _is_number(r.get("joined")) and r["joined"] >= 1}


def _is_number(value) -> bool:
    return type(value) in (int, float)      # exactly: a bool is not a metric


def _is_metric_record(record: dict) -> bool:
    """A trainer's metric record (an integer step and numbers), a proxy's replica snapshot (a list of replicas),
    its serving proof (a canary record) or an adapter load's timings (a list of replicas)."""
    if "replicas" in record:
        return isinstance(record["replicas"], list) and all(isinstance(r, dict) for r in record["replicas"])
    if "canary" in record:
        canary = record["canary"]
        return isinstance(canary, dict) and isinstance(canary.get("replicas"), list)
    if "adapter_load" in record:
        load = record["adapter_load"]
        return (isinstance(load, dict) and isinstance(load.get("version"), str) and _is_number(record.get("time"))
                and isinstance(load.get("replicas"), list) and all(isinstance(r, dict) for r in load["replicas"]))
    step = record.get("step")
    return type(step) is int and step >= 0 and {type(v) for v in record.values()} <= {int, float}


def _event_time(record: dict) -> float:
    when = record.get("time")
    return float(when) if isinstance(when, (int, float)) and not isinstance(when, bool) else 0.0


def _clock(moment) -> str:
    return time.strftime("%H:%M:%S", time.gmtime(moment)) + " UTC" if _is_number(moment) else "?"
