"""A sweep's shared replica fleet, its cost split between the members by the tokens the replicas generated for each.

    log = TokenLog("m0")
    log.add(proxy_records)                    # a member's proxy stats records, as its proxy writes them
    shares = split_by_tokens(cost_at, {"m0": log, "m1": ...}, start, end)    # {"m0": 12.5, "m1": 4.1}

Each member's proxy (`runtime/serving/proxy_members.py`, `--member <tag>`) records, beside its replica snapshots, the
tokens the replicas generated for its member so far (`members[<tag>]["generated_tokens"]` in its `proxy-*` fragments
of the member's `metrics/` folder; a restarted proxy counts from 0 again: the log banks what the one before it
counted). The fleet's spend (dollars on a billed engine; replica-seconds on one that bills nothing) is split window by
window (WINDOW_S): what the fleet spent in a window goes to the members in proportion to the tokens each was generated
in it, so a member that ended early keeps the share it had up to its end and pays nothing of what the fleet spends
afterwards. The start-up (the replicas' spend before the first token, which every member's rollouts stand on) goes by
each member's tokens over the whole split; spend in a later window where no member got a token (every trainer between
rollouts) goes with the next window that has tokens, and what is left after the last token as that last window went.
Before any member got a token nothing is split (`None`): no division by zero, and the line says so.

`split_by_tokens` and `TokenLog` are pure; `FleetCosts` reads the members' records (incrementally, as a dashboard
tick does) and the fleet's and the members' job records through a run registry.
"""

import json
import logging
import math
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from backend.plan.cost import job_spend, spend_curve
from backend.runtime import layout
from backend.storage.observers import FragmentReader

log = logging.getLogger(__name__)

WINDOW_S = 60.0        # the fleet's spend is split by the tokens generated within each window of this many seconds
SPLIT_TTL_S = 10.0     # a sweep's split is computed again at most this often (every member's cost line asks for it)


class TokenLog:
    """One member's generated tokens over time, from its proxy's stats records: the newest count in each window."""

    def __init__(self, tag: str, window_s: float = WINDOW_S):
        self.tag, self.window_s = tag, window_s
        self.windows: dict[int, int] = {}     # window index -> the member's tokens so far as of its last record
        self._banked = 0                      # what earlier proxies (before a restart) counted
        self._last = 0                        # the current proxy's newest count

    @property
    def tokens(self) -> int:
        """The member's generated tokens so far, every proxy of it together."""
        return self._banked + self._last

    def add(self, records: Iterable[dict]) -> None:
        """Take a member's proxy stats records, oldest first (records of other writers or members are ignored)."""
        for record in records:
            traffic = record.get("members") if isinstance(record, dict) else None
            mine = traffic.get(self.tag) if isinstance(traffic, dict) else None
            count = mine.get("generated_tokens") if isinstance(mine, dict) else None
            t = record.get("time")
            if type(count) is not int or count < 0 or not _finite(t):
                continue
            if count < self._last:        # a new proxy (a retried or resumed trainer) counts from 0
                self._banked += self._last
            self._last = count
            self.windows[math.floor(t / self.window_s)] = self.tokens

    def increments(self, first: int, last: int) -> list[int]:
        """Tokens generated in each window from `first` to `last` (window indexes, both included)."""
        known = sorted(self.windows)
        out, before, i = [], 0, 0
        while i < len(known) and known[i] < first:     # what was counted before the first window
            before = self.windows[known[i]]
            i += 1
        for k in range(first, last + 1):
            now = self.windows.get(k, before)
            out.append(max(0, now - before))
            before = now
        return out


def split_by_tokens(cost_at: Callable[[float], float], logs: dict[str, TokenLog], start: float,
                    end: float) -> dict[str, float] | None:
    """The fleet's spend from `start` to `end` (`cost_at(t)`: spent by moment t) split between the members by the
    tokens generated for each, window by window (module docstring); None while no member has a token."""
    if not logs or end <= start:
        return None
    window_s = next(iter(logs.values())).window_s
    first, last = math.floor(start / window_s), math.floor(end / window_s)
    rows = {tag: log.increments(first, last) for tag, log in logs.items()}
    grand = sum(sum(row) for row in rows.values())
    if not grand:
        return None
    shares = dict.fromkeys(logs, 0.0)
    pending, weights, start_up = 0.0, None, 0.0
    for i, k in enumerate(range(first, last + 1)):
        lo, hi = max(start, k * window_s), min(end, (k + 1) * window_s)
        total = sum(row[i] for row in rows.values())
        if total > 0 and weights is None:    # before the first token: the start-up every member's rollouts stand on
            start_up, pending = pending, 0.0
        pending += cost_at(hi) - cost_at(lo)
        if total > 0:
            weights = {tag: row[i] / total for tag, row in rows.items()}
            for tag, w in weights.items():
                shares[tag] += pending * w
            pending = 0.0
    for tag, row in rows.items():
        shares[tag] += start_up * sum(row) / grand + pending * weights[tag]   # the tail: as the last window went
    return shares


@dataclass(frozen=True)
class MemberCost:
    """One member's part of its sweep's cost: its share of the fleet, and its own jobs (its trainer)."""

    tag: str
    run_id: str
    tokens: int                      # generated for it so far
    token_share: float | None        # of every member's tokens (0-1); None while no member has a token
    fleet_s: float | None            # the fleet's replica-seconds split to it by tokens; None before any token
    fleet_usd: float | None          # the same in dollars (None on an engine that bills nothing, or before a token)
    own_s: float                     # its own jobs' running seconds (its trainer)
    own_usd: float | None


@dataclass(frozen=True)
class FleetSplit:
    """A sweep's fleet cost and how it splits: the members by tag, the fleet's own totals, the sweep's total."""

    fleet_id: str
    billed: bool
    members: dict[str, MemberCost]
    fleet_s: float                   # the fleet's replica-seconds so far
    fleet_usd: float | None
    live: bool                       # a fleet job still runs
    budget_usd: float = 0.0          # the sweep's budget cap over the members and the fleet (0: none)

    @property
    def total_usd(self) -> float | None:
        """The sweep's total: the fleet plus every member's own jobs (None on an engine that bills nothing)."""
        if not self.billed:
            return None
        return (self.fleet_usd or 0.0) + sum(m.own_usd or 0.0 for m in self.members.values())

    @property
    def total_s(self) -> float:
        """The sweep's job-seconds: the fleet's replicas and every member's own jobs."""
        return self.fleet_s + sum(m.own_s for m in self.members.values())


def fleet_split(fleet_records: list, member_records: dict[str, tuple[str, list]], logs: dict[str, TokenLog],
                prices: dict[str, float], billed: bool, now: float, budget_usd: float = 0.0) -> FleetSplit:
    """The split from job records (the fleet's; each member's as (run id, records) by tag), the members' token logs,
    the prices (flavor -> USD/h), the clock and the sweep's budget cap. Pure."""
    seconds = {r.flavor: 3600.0 for r in fleet_records if r.flavor}    # one "dollar" an hour: the curve counts seconds
    spans = [j for r in fleet_records if (j := job_spend(r, seconds, now)).running_s > 0 or j.active]
    starts = [r.started_at or r.created_at for r in fleet_records if (r.started_at or r.created_at)]
    start, end = min(starts, default=now), now
    if fleet_records and not any(j.active for j in spans):
        end = max([r.finished_at for r in fleet_records if r.finished_at] or [now])
    by_s = split_by_tokens(spend_curve(fleet_records, seconds, now), logs, start, end)
    by_usd = split_by_tokens(spend_curve(fleet_records, prices, now), logs, start, end) if billed else None
    total = sum(log.tokens for log in logs.values())
    members = {}
    for tag, log_ in logs.items():
        run_id, records = member_records.get(tag, ("", []))
        own = [job_spend(r, prices, now) for r in records]
        members[tag] = MemberCost(tag, run_id, log_.tokens, log_.tokens / total if total else None,
                                  by_s[tag] if by_s else None, by_usd[tag] if by_usd else None,
                                  sum(j.running_s for j in own),
                                  sum(j.usd or 0.0 for j in own) if billed else None)
    fleet_usd = sum(job_spend(r, prices, now).usd or 0.0 for r in fleet_records) if billed else None
    return FleetSplit(fleet_records[0].run_id if fleet_records else "", billed, members,
                      sum(j.running_s for j in spans), fleet_usd, any(j.active for j in spans), budget_usd)


@dataclass
class _Sweep:
    members: dict[str, str] = field(default_factory=dict)       # tag -> run id
    budget_usd: float = 0.0                                      # the sweep's cap, from its record
    readers: dict[str, FragmentReader] = field(default_factory=dict)
    logs: dict[str, TokenLog] = field(default_factory=dict)
    split: FleetSplit | None = None
    at: float = float("-inf")
    lock: threading.Lock = field(default_factory=threading.Lock)


class FleetCosts:
    """Every shared fleet's split as the panel shows it: each sweep's members' proxy records read from cursors (what
    is new since the last look), the split computed again at most every SPLIT_TTL_S. Shared by every session."""

    def __init__(self, prices: Callable[[object], dict[str, float]], clock: Callable[[], float] = time.time):
        self.prices, self.clock = prices, clock
        self._sweeps: dict[tuple[str, str], _Sweep] = {}
        self._lock = threading.Lock()

    def split(self, registry, spec: dict) -> FleetSplit | None:
        """The split of the fleet the member whose spec.json is `spec` trains on; None for a run on no shared fleet
        or whose sweep's record cannot be read yet."""
        fleet, sweep_id = spec.get("fleet"), spec.get("sweep_id")
        if not fleet or not sweep_id:
            return None
        bucket = next((r.bucket for r in registry.job_records(str(spec.get("run_id") or "")) if r.bucket), None)
        if not bucket:
            return None
        with self._lock:
            sweep = self._sweeps.setdefault((bucket, str(sweep_id)), _Sweep())
        with sweep.lock:
            if sweep.split is not None and self.clock() - sweep.at < SPLIT_TTL_S:
                return sweep.split
            store = registry.store_for(bucket)
            if not sweep.members:
                try:
                    record = json.loads(store.read_bytes(layout.sweep_record_path(str(sweep_id))))
                    sweep.members = {str(t): str(r) for t, r in record["members"].items()}
                    budget = record.get("budget_usd")
                    sweep.budget_usd = float(budget) if type(budget) in (int, float) else 0.0
                except Exception as exc:    # not written yet, or unreadable: asked again next time
                    log.debug("sweep %s: record unreadable for its fleet's split: %s", sweep_id, exc)
                    return None
            for tag, run_id in sweep.members.items():
                reader = sweep.readers.get(tag)
                if reader is None:
                    reader = sweep.readers[tag] = FragmentReader(
                        store, f"{layout.run_prefix(run_id)}/{layout.METRICS_DIR}", background=False)
                try:
                    sweep.logs.setdefault(tag, TokenLog(tag)).add(
                        r for w, r in reader.read() if w == layout.PROXY_WRITER)
                except Exception as exc:    # a failing bucket: what was read stands
                    log.debug("sweep %s member %s: proxy records unreadable: %s", sweep_id, tag, exc)
            billed = registry.engine.billed
            prices = self.prices(registry) if billed else {}
            sweep.split = fleet_split(registry.job_records(str(fleet)),
                                      {t: (r, registry.job_records(r)) for t, r in sweep.members.items()},
                                      sweep.logs, prices, billed, self.clock(), sweep.budget_usd)
            sweep.at = self.clock()
            return sweep.split


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
