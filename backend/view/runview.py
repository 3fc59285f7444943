"""RunView: everything the dashboard shows about one run, kept up to date incrementally.

`refresh()` asks each observer for what is new (metric and event fragments, adapter versions, log lines, resource
samples, job stages) and appends it; it returns whether anything changed, so the panel redraws only then. A resumed
run keeps its earlier launches' jobs (and logs) as `<role>#<launch>`; its stage and whether it is done are the
current launch's (a "launch" is the run's jobs submitted once, by Launch or Resume; an "attempt" is one start of one
job, `runtime.job.attempt`). Adapter versions come from the trainers' `adapter_published` events as well as from the
folders, so a version whose serving copy was deleted still counts, in every panel.

The view holds what the page shows and derives the rest (stage, replicas up, retries); what it reads is read by its
`reader` (`bucket_reader.RunReader`: each tick's new records) and its `history` (`run_history.RunHistory`: a long
run's older records, read in background threads and joined in front).
"""

import contextlib
import threading
import time
from collections import deque

from backend.executors.base import Executor
from backend.outcome.held_out import HeldOut
from backend.plan.jobspec import ERROR, TERMINAL_STAGES, run_stage
from backend.runtime import layout
from backend.storage.adapters import AdapterVersion, find_adapter_version
from backend.storage.series import SeriesTable
from backend.storage.store import BucketStore
from backend.view.bucket_reader import (
    EVALS_TAIL_FRAGMENTS,
    MAX_ADAPTER_LOADS,
    MAX_REPLICA_SNAPSHOTS,
    SAMPLE_STEPS_KEPT,
    RunReader,
)
from backend.view.job_view import JobView
from backend.view.run_history import RunHistory
from backend.view.run_records import STARTED_NONE, _is_number
from backend.view.servers import listed_per_job, server_name, server_role

MIN_REFRESH_S = 1.0         # sessions ticking at once share one refresh: a second within this is a no-op
SETTLED_RECHECK_S = 60.0    # a finished run is looked at again this rarely (its files do not change)


class RunView:
    def __init__(self, run_id: str, store: BucketStore, executor: Executor, jobs: dict[str, str],
                 earlier: dict[str, str] | None = None, bounded: bool = False):
        """`jobs`: role -> job id of the current launch; `earlier`: "<role>#<launch>" -> job id of earlier ones.
        A `bounded` view holds what the alerts and the runs list read, whatever the run's length: the newest
        `bucket_reader.SUMMARY_ROWS` steps, its events but adapter versions, each job's newest resource samples; it
        reads no history, log, samples or adapter folders, and draws nothing."""
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
        self.reader = RunReader(self)       # what each tick reads: the bucket's new records, the jobs' news
        self.history = RunHistory(self)     # what a first look set aside, read in the background

    # ---- derived
    @property
    def current_jobs(self) -> dict[str, JobView]:
        return {role: job for role, job in self.jobs.items() if job.current}

    @property
    def stage(self) -> str:
        """The run's stage from its current launch's jobs (`jobspec.run_stage`, the runs list's rule too); ERROR
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
        """(replicas up, replica jobs) of the current launch; None for a run without replicas. A replica is down
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
        `runtime.job.attempt`), replicas the proxy took back after a restart (a new server), and the times a replica
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
        per_job = listed_per_job(len(snapshot), sum(1 for role in self.current_jobs if role.startswith("vllm-")))
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
        self.reader.events.expect(writer)
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
            changed = self.reader.read_spec()
            if not self._settled:      # a settled run's bucket holds nothing new: only its jobs are asked
                changed |= self.reader.read_fragments()
                changed |= self.reader.read_adapters()
            for job in self.jobs.values():
                changed |= self.reader.read_job(job)
            # Settled once every job is over and the bucket was read in full after that (once a first look's
            # background listings are read: the full read lists again).
            if self.done and not self._settled and not self.reader.looking_back:
                changed |= self.reader.read_fragments(True)
                changed |= self.reader.read_adapters(True)
                self._settled = True
            self.history.start()
            self.version += changed
            return changed

    # ---- history (a long run's older rows, read in the background by `history`)
    @property
    def history_pending(self) -> bool:
        """Whether older rows or events a first look left for later are still being found or read."""
        return self.history.pending

    @property
    def events_loading(self) -> bool:
        """Whether older events a first look left for later are still being found or read: until they are,
        `events` holds the newest ones (and whatever the other writers' fragments held that was read)."""
        return self.history.events_loading

    @property
    def history_failure(self) -> str:
        """Why the last background read of the history failed ("" if none did)."""
        return self.history.failure

    def wait_for_history(self, timeout: float | None = None) -> bool:
        """Wait until the history is read (for a one-off drawing such as Compare); True if it is."""
        return self.history.wait_for_history(timeout)

    def wait_for_events(self, timeout: float | None = None) -> bool:
        """Wait until every event is read (for what must see them all: a resume plan, "try it"); True if it is."""
        return self.history.wait_for_events(timeout)

    def reading(self) -> threading.RLock:
        """Hold while drawing or reading the view's tables: what refreshes and history joins hold."""
        return self._lock

    def replace_jobs(self, jobs: dict[str, str]) -> None:
        """Watch a new launch's jobs (the run was resumed); the earlier launches' jobs stay, as `<role>#<n>`."""
        with self._lock:
            for role, job in list(self.current_jobs.items()):
                launch = 1 + sum(key.startswith(f"{role}#") for key in self.jobs)
                job.role, job.current = f"{role}#{launch}", False
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
        counts = {**self.reader.unreadable, **self.held_out.unreadable}
        if self.jobs:    # a view of bucket files alone has no executor to ask
            counts.update(self.executor.unreadable_records(self.run_id))
        return counts

    @property
    def best_by(self) -> dict[str, float]:
        """The rule the best version is chosen by: the user's newest change on the run, else the launch spec's."""
        rule = self.best_by_change.get("best_by") if self.best_by_change else self.spec.get("best_by")
        return {str(k): float(v) for k, v in rule.items() if isinstance(v, (int, float))} if isinstance(
            rule, dict) else {}


def reading(view):
    """What to hold while drawing `view` or reading its tables: a RunView's lock (another kind of view, built for
    one caller, needs none)."""
    lock = getattr(view, "reading", None)
    return lock() if callable(lock) else contextlib.nullcontext()


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
    per_job = listed_per_job(len(snapshot), jobs)
    return {server_role(i, per_job) for i, r in enumerate(snapshot)
            if isinstance(r, dict) and not r.get("healthy") and _is_number(r.get("joined")) and r["joined"] >= 1}


def _clock(moment) -> str:
    return time.strftime("%H:%M:%S", time.gmtime(moment)) + " UTC" if _is_number(moment) else "?"
