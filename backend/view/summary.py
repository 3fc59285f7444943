"""One run summary (step, reward, stage, time, cost) per run and tick, for the runs list, the budget and the alerts.

`RunSummaries.glance` reads what a run's list row and its budget cap need, once: its spec.json (read once, it never
changes), its job records (one listing serves every run), and its newest logged steps. The steps come from the view
a dashboard keeps of the run when there is one; otherwise from the trainer's metric fragments through the same
`FragmentReader` the dashboard uses, read from a cursor at most every `read_every_s` while a job is active, and once
for a finished run (its newest fragments only). Its best held-out version comes from the view's held-out scores
where a dashboard has read them, else from the run's published best.json (`published_best.published_best`: one small
file, not its evaluation records), read as often as its metrics while a job is active, again once its jobs ended, then
every `BEST_REREAD_S` (the user may change the rule of a finished run).
"""

import json
import logging
import math
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from backend.outcome.published_best import PublishedBest, held_out_best, published_best
from backend.plan.cost import RATE_POINTS, RunCost, hourly_prices, run_cost, view_points
from backend.plan.hardware import FlavorCache
from backend.plan.jobspec import TERMINAL_STAGES, JobRecord, run_stage
from backend.runtime import layout
from backend.runtime.redact import redact_record
from backend.storage.observers import FragmentReader
from backend.view.fleet_cost import FleetCosts
from backend.view.runview import reading

log = logging.getLogger(__name__)

READ_EVERY_S = 10.0      # a live run's new metric fragments, read at most this often when no dashboard has them
BEST_REREAD_S = 60.0    # an ended run's best.json, read again this rarely (a change of its rule republishes it)


def _NO_VIEW() -> None:      # a glance made without a view: stands in for a view's weak reference
    return None


@dataclass(frozen=True)
class RunGlance:
    """A run as the runs list and the budget see it now."""

    run_id: str
    spec: dict               # its spec.json, redacted ({} until it can be read)
    stage: str               # `jobspec.run_stage` of its newest jobs
    cost: RunCost
    step: int | float | None = None      # the newest logged step, and its reward and time (None before the first)
    reward: int | float | None = None
    time: float | None = None
    best: PublishedBest = field(default_factory=PublishedBest)    # its best held-out version, or none beats v0

    @property
    def latest(self) -> dict:
        """{"step", "reward"} of the newest logged step, those it has ({} before the first)."""
        return {k: v for k, v in (("step", self.step), ("reward", self.reward)) if v is not None}


@dataclass
class _Followed:
    """What is kept of one run: its spec, a cursor into its metrics, and its newest (step, time) points."""

    spec: dict | None = None
    reader: FragmentReader | None = None
    points: deque = field(default_factory=lambda: deque(maxlen=RATE_POINTS + 1))
    read_at: float = float("-inf")
    newest: dict = field(default_factory=dict)     # the newest logged step's record
    best: PublishedBest = field(default_factory=PublishedBest)     # as published (best.json), when read
    best_read_at: float = float("-inf")
    best_read_live: bool = False        # whether it was read while a job was active (read again once all ended)
    lock: threading.Lock = field(default_factory=threading.Lock)


class RunSummaries:
    """Run summaries of any registry's runs. Shared by every browser session and the budget thread."""

    def __init__(self, clock: Callable[[], float] = time.time, read_every_s: float = READ_EVERY_S):
        self.clock = clock
        self.read_every_s = read_every_s
        self.flavor_cache = FlavorCache()
        # Each sweep's shared fleet split between its members by tokens (a member's cost line), on this clock.
        self.fleets = FleetCosts(self.prices, lambda: self.clock())
        self._runs: dict[tuple[str, str], _Followed] = {}
        # The newest glance of each run, given again within the same second of `clock` for the same job records and
        # view version: every session's tick asks each run's summary (its list row, its cost line) alike.
        self._glances: dict[tuple[int, str], tuple[tuple, object, RunGlance]] = {}
        self._lock = threading.Lock()

    def prices(self, registry) -> dict[str, float]:
        """Flavor -> USD per hour as the registry's token sees the Hub's list (none for local runs)."""
        executor = registry.executor
        if not hasattr(executor, "flavors"):
            return {}
        return hourly_prices(self.flavor_cache.get(("namespace", registry.namespace or ""),
                                                   executor.flavors))

    def glance(self, registry, run_id: str, view=None) -> RunGlance:
        """The run's summary now (as of this second). A dashboard's `view` of it, if given, supplies its steps."""
        records = registry.job_records(run_id)
        key = (tuple(records), getattr(view, "version", None), math.floor(self.clock()))
        kept = self._glances.get((id(registry), run_id))
        if kept is not None and kept[0] == key and kept[1]() is view:
            return kept[2]
        glance = self._glance(registry, run_id, records, view)
        try:
            self._glances[(id(registry), run_id)] = (key, _NO_VIEW if view is None else weakref.ref(view), glance)
        except TypeError:        # a view that cannot be weakly referenced (a stand-in): not kept
            pass
        return glance

    def _glance(self, registry, run_id: str, records: list[JobRecord], view) -> RunGlance:
        followed = self._followed(registry, run_id, records)
        if view is not None:
            points, newest = view_points(view), view.latest
        else:
            points, newest = self._read(registry, run_id, records, followed)
        spec = (view.spec if view is not None and view.spec else None) or followed.spec or {}
        billed = registry.engine.billed
        cost = run_cost(records, self.prices(registry) if billed else {}, points, spec.get("max_steps"),
                        self.clock(), billed)
        stages: dict[str, str] = {}
        for record in records:       # newest first: each role's newest job
            stages.setdefault(record.role, record.stage)
        step, reward, t = (newest.get(k) for k in ("step", "reward", "time"))
        held = getattr(view, "held_out", None) if not getattr(view, "bounded", True) else None
        best = None
        if held is not None:
            with reading(view):     # a refresh or a history join may be changing its scores
                best = held_out_best(held)
        best = best or self._best(registry, run_id, records, followed)
        return RunGlance(run_id, spec, run_stage(stages), cost, _number(step), _number(reward), _number(t), best)

    def _best(self, registry, run_id: str, records: list[JobRecord], followed: _Followed) -> PublishedBest:
        """The run's published best version, read again when due: as often as its metrics while a job is active,
        at once when every job has ended (the last version's evaluation may have moved it), then every
        BEST_REREAD_S."""
        bucket = next((r.bucket for r in records if r.bucket), None)
        live = any(r.stage not in TERMINAL_STAGES for r in records)
        with followed.lock:
            since = time.monotonic() - followed.best_read_at
            due = since >= (self.read_every_s if live else BEST_REREAD_S) or (followed.best_read_live and not live)
            if bucket and due:
                followed.best_read_at, followed.best_read_live = time.monotonic(), live
                try:
                    followed.best = published_best(registry.store_for(bucket), run_id)
                except Exception as exc:   # a failing bucket: the last one read stands
                    log.debug("run %s: best.json unreadable for its summary: %s", run_id, exc)
            return followed.best

    def cost(self, registry, run_id: str, view=None) -> tuple[RunCost, dict]:
        """The run's cost now and its spec (`glance`'s)."""
        glance = self.glance(registry, run_id, view)
        return glance.cost, glance.spec

    def latest(self, registry, run_id: str, view=None) -> dict:
        """The run's newest logged step and reward ({} before its first step), for the runs list (`glance`'s)."""
        return self.glance(registry, run_id, view).latest

    def _followed(self, registry, run_id: str, records: list[JobRecord]) -> _Followed:
        bucket = next((r.bucket for r in records if r.bucket), None)
        with self._lock:
            followed = self._runs.setdefault((bucket or "", run_id), _Followed())
        if followed.spec is None and bucket:
            with followed.lock:
                try:
                    data = run_record(registry.store_for(bucket), run_id)
                    followed.spec = redact_record(data) if isinstance(data, dict) else {}
                except (OSError, ValueError, KeyError):
                    pass     # not written yet, or the bucket failing: asked again next time
        return followed

    def _read(self, registry, run_id: str, records: list[JobRecord], followed: _Followed) -> tuple[list, dict]:
        """The run's newest (step, time) points and step record, after reading what is new if it is due."""
        bucket = next((r.bucket for r in records if r.bucket), None)
        live = any(r.stage not in TERMINAL_STAGES for r in records)
        with followed.lock:
            looked = followed.reader is not None
            if bucket and (live or not looked) and time.monotonic() - followed.read_at >= self.read_every_s:
                followed.read_at = time.monotonic()
                try:
                    self._read_new(registry.store_for(bucket), run_id, followed)
                except Exception as exc:   # a failing bucket: the spend is still known from the job records
                    log.debug("run %s: metrics unreadable for its summary: %s", run_id, exc)
            return list(followed.points), dict(followed.newest)

    def _read_new(self, store, run_id: str, followed: _Followed) -> None:
        if followed.reader is None:
            # A first look reads the trainer's newest fragments only: enough steps for the recent rate.
            followed.reader = FragmentReader(
                store, f"{layout.run_prefix(run_id)}/{layout.METRICS_DIR}",
                latest_only={layout.PROXY_WRITER: 1, layout.LOADS_WRITER: 1},
                defer={layout.TRAINER_WRITER: RATE_POINTS + 1})
        for writer, record in followed.reader.read():
            step, t = record.get("step"), record.get("time")
            if writer != layout.TRAINER_WRITER or _number(step) is None or _number(t) is None:
                continue
            if followed.points and step <= followed.points[-1][0]:
                followed.points.clear()     # a resumed trainer logs from its checkpoint again
            followed.points.append((step, t))
            followed.newest = record
        followed.reader.deferred.clear()    # older history: no summary needs it


def run_record(store, run_id: str):
    """What a run's summary reads as its spec: its spec.json, or for a sweep's shared fleet (which has none) its
    fleet.json, which names it (`<sweep name>-fleet`), its sweep and mode, so its row in the runs list reads like
    its members'. Raises as `read_bytes` does (or ValueError) where neither can be read."""
    prefix = layout.run_prefix(run_id)
    try:
        return json.loads(store.read_bytes(f"{prefix}/{layout.SPEC_FILE}"))
    except (OSError, KeyError):
        return json.loads(store.read_bytes(f"{prefix}/{layout.FLEET_FILE}"))


def _number(value) -> int | float | None:
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None
