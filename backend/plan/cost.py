"""What a run costs: spend so far, cost per step, and a projection to `max_steps`.

Pure functions of job records (`JobRecord`), the Hub's hourly prices and a clock the caller passes in (`now`),
so a test with a fake clock gets exact figures. HF Jobs bill a job while it starts or runs, never while it is
scheduled, so a job's spend is its running time (from `started_at`, or the Hub's `durations.running_secs`) times
its flavor's price. The Hub bills by the minute; these figures are per second, so a bill can be up to a minute
per job higher. Local runs cost nothing: they show time, not money.
"""

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from backend.plan.jobspec import TERMINAL_STAGES, JobRecord

RATE_POINTS = 10      # the recent step rate is measured over the last this-many logged steps
MIN_RATE_POINTS = 3   # fewer logged steps than this: no rate, so no projection


@dataclass(frozen=True)
class JobSpend:
    job_id: str
    role: str
    flavor: str | None
    price_per_hour: float | None     # None: a flavor the price list does not know
    running_s: float
    usd: float | None
    active: bool                     # not in a terminal stage: still billing, or about to


@dataclass(frozen=True)
class RunCost:
    jobs: tuple[JobSpend, ...]
    billed: bool                     # HF Jobs (money); False for local runs (time only)
    elapsed_s: float                 # wall time since the run's first job was created
    spent_usd: float | None          # None for local runs
    burn_usd_per_h: float            # what the jobs still active cost per hour together
    step: int | None
    max_steps: int | None
    steps_per_s: float | None        # the recent step rate
    eta_s: float | None              # time to max_steps at that rate (0 once the run is over)
    projected_usd: float | None      # spent + eta x burn: the total at max_steps (spent once the run is over)
    unknown_flavors: tuple[str, ...] = ()

    @property
    def usd_per_step(self) -> float | None:
        if self.spent_usd is None or not self.step:
            return None
        return self.spent_usd / self.step


def hourly_prices(flavors: Iterable) -> dict[str, float]:
    """Flavor name -> USD per hour, from `backend.plan.hardware.Flavor`s (the Hub's list or the built-in one)."""
    return {f.name: f.price_per_hour_usd for f in flavors}


def running_interval(record: JobRecord, now: float) -> tuple[float, float] | None:
    """When the job ran (start, end), in epoch seconds: end is `now` while it still runs. None if it never ran."""
    active = record.stage not in TERMINAL_STAGES
    if record.started_at is not None:
        start = record.started_at
        if record.finished_at is not None:
            end = record.finished_at
        elif active:
            end = now
        else:   # ended, but the Hub gave no finish time: what it counted, else nothing
            end = start + (record.running_s or 0.0)
    elif record.running_s is not None:
        seen = record.listed_at if record.listed_at is not None else now
        start = seen - record.running_s
        end = now if active else seen
    else:
        return None
    return start, max(start, end)


def job_spend(record: JobRecord, prices: dict[str, float], now: float) -> JobSpend:
    interval = running_interval(record, now)
    # A retried job's start may be its newest attempt's while the Hub's running seconds count every attempt: the
    # larger figure is what was billed.
    running = max(interval[1] - interval[0] if interval else 0.0, record.running_s or 0.0)
    price = prices.get(record.flavor) if record.flavor else None
    return JobSpend(record.job_id, record.role, record.flavor, price, running,
                    None if price is None else price * running / 3600.0, record.stage not in TERMINAL_STAGES)


def _billed_intervals(records: list[JobRecord], prices: dict[str, float], now: float):
    return [(interval, prices[r.flavor] / 3600.0) for r in records
            if r.flavor in prices and (interval := running_interval(r, now)) is not None]


def spend_curve(records: list[JobRecord], prices: dict[str, float], now: float) -> Callable[[float], float]:
    """`cost_at(t)`: the dollars the run had spent by moment `t` (epoch seconds), for a dollars x-axis."""
    intervals = _billed_intervals(records, prices, now)

    def cost_at(t: float) -> float:
        return sum(per_s * max(0.0, min(end, t) - start) for (start, end), per_s in intervals)

    return cost_at


def spend_knots(records: list[JobRecord], prices: dict[str, float], now: float) -> tuple[tuple[float, float], ...]:
    """The same curve as `spend_curve`, as its corners: ((t, dollars), ...) sorted by t. Spend is linear between
    corners (jobs start and stop only at corners), 0 before the first and flat after the last."""
    intervals = _billed_intervals(records, prices, now)
    cost_at = spend_curve(records, prices, now)
    corners = sorted({t for (start, end), _ in intervals for t in (start, end)})
    return tuple((t, cost_at(t)) for t in corners)


def step_rate(points: list[tuple[float, float]], window: int = RATE_POINTS) -> float | None:
    """Steps per second over the last `window` (step, time) points; None with too few points or no progress."""
    recent = [(s, t) for s, t in points if _finite(s) and _finite(t)][-window:]
    if len(recent) < MIN_RATE_POINTS:
        return None
    (s0, t0), (s1, t1) = recent[0], recent[-1]
    if t1 <= t0 or s1 <= s0:
        return None
    return (s1 - s0) / (t1 - t0)


def run_cost(records: list[JobRecord], prices: dict[str, float], points: list[tuple[float, float]],
             max_steps: int | None, now: float, billed: bool = True) -> RunCost:
    """The run's cost from its jobs' records (every launch and resume) and its recent (step, time) points."""
    jobs = tuple(job_spend(r, prices, now) for r in records)
    done = bool(jobs) and not any(j.active for j in jobs)
    step = int(points[-1][0]) if points else None
    created = [r.created_at for r in records if r.created_at]
    started = min(created, default=now)
    # A run that is over stopped at its last finish time or logged step (local jobs record no finish time).
    ended = max([r.finished_at for r in records if r.finished_at] + [t for _, t in points[-1:]],
                default=max(created, default=now)) if done else now
    elapsed = max(0.0, ended - started)
    rate = step_rate(points)
    eta = 0.0 if done else (max((max_steps or 0) - step, 0) / rate if rate and step is not None and max_steps
                            else None)
    if not billed:
        return RunCost(jobs, False, elapsed, None, 0.0, step, max_steps, rate, eta, None)
    spent = sum(j.usd or 0.0 for j in jobs)
    burn = sum(j.price_per_hour or 0.0 for j in jobs if j.active)
    projected = spent if done else (spent + eta * burn / 3600.0 if eta is not None else None)
    unknown = tuple(sorted({j.flavor or "?" for j in jobs if j.price_per_hour is None and j.running_s > 0}))
    return RunCost(jobs, True, elapsed, spent, burn, step, max_steps, rate, eta, projected, unknown)


def view_points(view, last: int = RATE_POINTS + 1) -> list[tuple[float, float]]:
    """The newest (step, time) points of a RunView: from its bounded table once it has one, else its records."""
    table = getattr(view, "table", None)
    rows = table.rows(last=last) if table is not None else view.metrics[-last:]
    return [(r["step"], r["time"]) for r in rows if _finite(r.get("step")) and _finite(r.get("time"))]


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def format_usd(value: float) -> str:
    """Dollars as a person reads them: cents above $1, a tenth of a cent below, four places for tiny sums."""
    if value >= 1 or value == 0:
        return f"${value:,.2f}"
    return f"${value:.3f}" if value >= 0.01 else f"${value:.4f}"


def format_duration(seconds: float) -> str:
    seconds = max(0, round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60:02d} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60:02d} min"
