"""Live spend of runs, and the budget cap, enforced by whichever panel process is running.

A run's cap is `budget_usd` in its spec.json, so a restarted panel, or a second one, enforces it too. Enforcing
is idempotent: the run's jobs are found by label and only those not over are cancelled, and the event that says
why (`events/panel-budget-<seq>.jsonl` in the run's folder) is written once, and again only when a later pass
cancelled more jobs (a resumed run that reached its cap again).
"""

import json
import logging
import posixpath
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from backend.cost import RATE_POINTS, RunCost, format_duration, format_usd, hourly_prices, run_cost, view_points
from backend.executors import engine
from backend.jobspec import TERMINAL_STAGES, JobRecord
from backend.observers import FragmentCursor, read_new_records
from backend.runtime import layout
from backend.runtime.redact import redact_record, redact_tokens

log = logging.getLogger(__name__)

BUDGET_WRITER = f"{layout.PANEL_WRITER}-budget"
BUDGET_EVENT = "budget_cap"
PRICES_TTL_S = 600.0     # the Hub's price list, asked at most this often per namespace
READ_EVERY_S = 10.0      # a live run's new metric fragments, read at most this often when no dashboard has them


def budget_reason(cost: RunCost, budget_usd: float) -> str | None:
    """Why the run must stop (its spend, or its projected total, reached the cap), or None."""
    if not budget_usd or not cost.billed or cost.spent_usd is None:
        return None
    if cost.spent_usd >= budget_usd:
        return f"its spend, {format_usd(cost.spent_usd)}, reached the budget cap of {format_usd(budget_usd)}"
    if cost.projected_usd is not None and cost.projected_usd >= budget_usd:
        return (f"its projected total at step {cost.max_steps}, {format_usd(cost.projected_usd)} (ETA "
                f"{format_duration(cost.eta_s or 0)} at the recent step rate; {format_usd(cost.spent_usd)} spent so "
                f"far), reaches the budget cap of {format_usd(budget_usd)}")
    return None


@dataclass(frozen=True)
class BudgetStop:
    run_id: str
    reason: str
    cancelled: list[str]


@dataclass
class _Watched:
    """What the watch keeps of one run: its spec (read once) and its newest (step, time) points."""

    spec: dict | None = None
    cursor: FragmentCursor = field(default_factory=FragmentCursor)
    points: deque = field(default_factory=lambda: deque(maxlen=RATE_POINTS + 1))
    read_at: float = float("-inf")
    latest: dict = field(default_factory=dict)     # the newest logged step's {"step", "reward"}, for the runs list
    glanced: bool = False                          # a finished run's last fragment was read once for `latest`
    lock: threading.Lock = field(default_factory=threading.Lock)


class SpendWatch:
    """Spend of the runs of any registry, and the cap. Shared by every browser session and the enforcer thread."""

    def __init__(self, clock: Callable[[], float] = time.time, read_every_s: float = READ_EVERY_S):
        self.clock = clock
        self.read_every_s = read_every_s
        self._runs: dict[tuple[str, str], _Watched] = {}
        self._prices: dict[str, tuple[float, dict[str, float]]] = {}
        self._lock = threading.Lock()

    def prices(self, registry) -> dict[str, float]:
        """Flavor -> USD per hour as the registry's token sees the Hub's list (none for local runs)."""
        executor = registry.executor
        if not hasattr(executor, "flavors"):
            return {}
        key = getattr(executor, "namespace", "")
        hit = self._prices.get(key)
        if hit and time.monotonic() - hit[0] < PRICES_TTL_S:
            return hit[1]
        prices = hourly_prices(executor.flavors())
        self._prices[key] = (time.monotonic(), prices)
        return prices

    def cost(self, registry, run_id: str, view=None) -> tuple[RunCost, dict]:
        """The run's cost now and its spec. A view being watched supplies the step points; otherwise the run's
        new metric fragments are read here, at most every `read_every_s` and only while a job is active."""
        records = registry.job_records(run_id)
        watched = self._watched(registry, run_id, records)
        spec = (view.spec if view is not None and view.spec else None) or watched.spec or {}
        if view is not None:
            points = view_points(view)
        else:
            points = self._points(registry, run_id, records, watched)
        billed = engine(registry.executor.name).billed
        cost = run_cost(records, self.prices(registry) if billed else {}, points, spec.get("max_steps"),
                        self.clock(), billed)
        return cost, spec

    def enforce(self, registry) -> list[BudgetStop]:
        """Cancel every job of each live run of the registry whose spend or projection reached its cap."""
        if not engine(registry.executor.name).billed:
            return []     # local runs cost nothing (a budget on one is refused when it is launched)
        stops = []
        for run in registry.list_runs():
            if run.bucket is None or all(stage in TERMINAL_STAGES for stage in run.stages.values()):
                continue
            cost, spec = self.cost(registry, run.run_id)
            budget = float(spec.get("budget_usd") or 0.0)
            reason = budget_reason(cost, budget)
            if not reason:
                continue
            try:
                stops.append(self.stop(registry, run.run_id, run.bucket, reason, cost, budget))
            except Exception as exc:   # e.g. a read-only token: the other runs' caps are still checked
                log.warning("run %s reached its budget cap (%s) but could not be stopped with this token: %s",
                            run.run_id, reason, redact_tokens(str(exc)))
        return stops

    def resume_problem(self, registry, run_id: str, budget_usd: float) -> str | None:
        """Why resuming would be pointless: the run already spent its cap, so its new jobs would be cancelled."""
        if not budget_usd:
            return None
        cost, _ = self.cost(registry, run_id)
        if cost.billed and (cost.spent_usd or 0.0) >= budget_usd:
            return (f"run {run_id} has already spent {format_usd(cost.spent_usd)} of its budget cap "
                    f"{format_usd(budget_usd)}: the panel would cancel the resumed jobs at once")
        return None

    def stop(self, registry, run_id: str, bucket: str, reason: str, cost: RunCost, budget: float) -> BudgetStop:
        cancelled = registry.cancel(run_id)
        store = registry.store_for(bucket)
        folder = f"{layout.run_prefix(run_id)}/{layout.EVENTS_DIR}"
        written = [f for f in store.list_files(folder) if f.path.rsplit("/", 1)[-1].startswith(BUDGET_WRITER + "-")]
        if cancelled or not written:
            record = redact_record({"time": self.clock(), "event": BUDGET_EVENT, "reason": reason,
                                    "budget_usd": budget, "spent_usd": cost.spent_usd,
                                    "projected_usd": cost.projected_usd, "cancelled": cancelled})
            name = layout.fragment_name(BUDGET_WRITER, len(written))
            store.write_bytes(f"{folder}/{name}", (json.dumps(record) + "\n").encode())
        log.info("run %s: budget cap reached (%s); cancelled %d job(s)", run_id, reason, len(cancelled))
        return BudgetStop(run_id, reason, cancelled)

    def _watched(self, registry, run_id: str, records: list[JobRecord]) -> _Watched:
        bucket = next((r.bucket for r in records if r.bucket), None)
        with self._lock:
            watched = self._runs.setdefault((bucket or "", run_id), _Watched())
        # Read once per run (the runs list shows its name, mode and steps); a run's spec.json never changes.
        if watched.spec is None and bucket:
            with watched.lock:
                try:
                    data = json.loads(registry.store_for(bucket).read_bytes(
                        f"{layout.run_prefix(run_id)}/{layout.SPEC_FILE}"))
                    watched.spec = redact_record(data) if isinstance(data, dict) else {}
                except (OSError, ValueError, KeyError):
                    pass     # not written yet, or the bucket failing: asked again next time
        return watched

    def _points(self, registry, run_id: str, records: list[JobRecord], watched: _Watched) -> list[tuple]:
        bucket = next((r.bucket for r in records if r.bucket), None)
        live = any(r.stage not in TERMINAL_STAGES for r in records)
        with watched.lock:
            if bucket and live and time.monotonic() - watched.read_at >= self.read_every_s:
                watched.read_at = time.monotonic()
                folder = f"{layout.run_prefix(run_id)}/{layout.METRICS_DIR}"
                try:
                    new = read_new_records(registry.store_for(bucket), folder, watched.cursor)
                except Exception as exc:   # a failing bucket: the spend is still known from the job records
                    log.debug("run %s: metrics unreadable for the projection: %s", run_id, exc)
                    new = []
                for _, record in new:
                    step, t = record.get("step"), record.get("time")
                    if "replicas" in record or step is None or t is None:
                        continue
                    if watched.points and step <= watched.points[-1][0]:
                        watched.points.clear()     # a resumed trainer logs from its checkpoint again
                    watched.points.append((step, t))
                    watched.latest = _glance(record)
            return list(watched.points)

    def latest(self, registry, run_id: str, view=None) -> dict:
        """The run's newest logged step and reward ({} before its first step), for the runs list: from the view a
        dashboard keeps, else from what the spend watch read of a live run, else (a finished run nobody watched)
        from its newest metrics fragment, read once."""
        if view is not None and view.latest:
            return _glance(view.latest)
        records = registry.job_records(run_id)
        watched = self._watched(registry, run_id, records)
        bucket = next((r.bucket for r in records if r.bucket), None)
        live = any(r.stage not in TERMINAL_STAGES for r in records)
        with watched.lock:
            if live or watched.latest or watched.glanced or not bucket:
                return dict(watched.latest)
            watched.glanced = True
            try:
                watched.latest = _glance(last_record(registry.store_for(bucket), run_id))
            except Exception as exc:   # a failing bucket: the list shows no reward, the run is still listed
                log.debug("run %s: no latest step: %s", run_id, exc)
            return dict(watched.latest)


def _glance(record: dict) -> dict:
    return {k: record[k] for k in ("step", "reward") if isinstance(record.get(k), (int, float))}


def last_record(store, run_id: str) -> dict:
    """The last step record of the trainer's newest metrics fragment ({} when there is none)."""
    fragments = []
    for f in store.list_files(f"{layout.run_prefix(run_id)}/{layout.METRICS_DIR}"):
        match = layout.FRAGMENT_RE.match(posixpath.basename(f.path))
        if match and match.group("writer") == "trainer":
            fragments.append((int(match.group("seq")), f.path))
    for _, path in sorted(fragments, reverse=True)[:2]:     # the newest may be torn: one back is enough
        for line in reversed(store.read_bytes(path).decode(errors="replace").splitlines()):
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict) and isinstance(record.get("step"), int):
                return record
    return {}


class BudgetEnforcer:
    """Runs `check()` every `interval_s` seconds in a daemon thread, from `start()` to `stop()` (0: never)."""

    def __init__(self, check: Callable[[], object], interval_s: float):
        self.check = check
        self.interval_s = interval_s
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> "BudgetEnforcer":
        if self.interval_s > 0:
            self._thread = threading.Thread(target=self._loop, name="budget-enforcer", daemon=True)
            self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def _loop(self) -> None:
        while not self._stopping.wait(self.interval_s):
            try:
                self.check()
            except Exception:   # the next pass tries again; a crashed thread would enforce nothing
                log.exception("budget check failed")
