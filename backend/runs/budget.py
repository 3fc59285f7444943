"""Live spend of runs, and the budget cap, enforced by whichever panel process is running.

A run's cap is `budget_usd` in its spec.json, so a restarted panel, or a second one, enforces it too. Enforcing
is idempotent: the run's jobs are found by label and only those not over are cancelled, and the event that says
why (`events/panel-budget-<seq>.jsonl` in the run's folder) is written once, and again only when a later pass
cancelled more jobs (a resumed run that reached its cap again).

A sweep's cap is `budget_usd` in its record (`sweeps/<sweep id>.json`): one cap over every member's jobs and its
shared fleet's, checked by the same pass (`SpendWatch.enforce_sweeps`) against their spend together; once reached,
every member still running is cancelled, then the fleet, each with the same event. It acts on spend only, not on a
projection: the early-stop rule ends members early, so every member's rate to its max_steps overstates what a sweep
spends.
"""

import json
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

from backend.plan.cost import RunCost, format_duration, format_usd
from backend.plan.jobspec import TERMINAL_STAGES
from backend.runtime import layout, records
from backend.runtime.redact import redact_tokens
from backend.storage.journal import LAUNCHING
from backend.view.summary import RunSummaries

log = logging.getLogger(__name__)

BUDGET_WRITER = f"{layout.PANEL_WRITER}-budget"


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


class SpendWatch(RunSummaries):
    """The budget cap over the run summaries: whichever panel process runs enforces every live run's cap, and every
    sweep's."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._sweep_caps: dict[tuple[str, str], tuple[float, list[str]]] = {}

    def enforce(self, registry) -> list[BudgetStop]:
        """Cancel every job of each live run of the registry whose spend or projection reached its cap."""
        if not registry.engine.billed:
            return []     # local runs cost nothing (a budget on one is refused when it is launched)
        stops = []
        runs = registry.list_runs()
        for run in runs:
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
        return stops + self.enforce_sweeps(registry, runs)

    def enforce_sweeps(self, registry, runs) -> list[BudgetStop]:
        """Cancel every member and the fleet of each sweep with a live run among `runs` whose members' and fleet's
        spend together reached the sweep's cap (its record's `budget_usd`)."""
        sweeps: dict[tuple[str, str], None] = {}
        for run in runs:
            if run.bucket is None or all(stage in TERMINAL_STAGES for stage in run.stages.values()):
                continue
            sweep_id = self.cost(registry, run.run_id)[1].get("sweep_id")    # a member's spec, or the fleet's record
            if isinstance(sweep_id, str) and sweep_id:
                sweeps[(run.bucket, sweep_id)] = None
        stops = []
        for bucket, sweep_id in sweeps:
            try:
                stops += self._enforce_sweep(registry, bucket, sweep_id)
            except Exception as exc:   # a failing bucket or a read-only token: the other sweeps are still checked
                log.warning("sweep %s: its budget cap could not be checked or enforced: %s", sweep_id,
                            redact_tokens(str(exc)))
        return stops

    def _enforce_sweep(self, registry, bucket: str, sweep_id: str) -> list[BudgetStop]:
        budget, run_ids = self.sweep_cap(registry, bucket, sweep_id)
        if not budget:
            return []
        costs = {run_id: self.cost(registry, run_id)[0] for run_id in run_ids}
        spent = sum(cost.spent_usd or 0.0 for cost in costs.values())
        if spent < budget:
            return []
        reason = (f"sweep {sweep_id}'s spend, every member's jobs and its fleet's together, {format_usd(spent)}, "
                  f"reached the sweep's budget cap of {format_usd(budget)}")
        # The members first, then the fleet (after its trainers, which record their end first), as Cancel sweep does.
        return [self.stop(registry, run_id, bucket, reason, cost, budget) for run_id, cost in costs.items()
                if any(job.active for job in cost.jobs)]

    def sweep_cap(self, registry, bucket: str, sweep_id: str) -> tuple[float, list[str]]:
        """The sweep's cap (0: none) and the run ids it covers, its members by tag and then its fleet's, from its
        record in the bucket (kept once read: a launched sweep's members and cap never change)."""
        key = (bucket, sweep_id)
        kept = self._sweep_caps.get(key)
        if kept is not None:
            return kept
        record = json.loads(registry.store_for(bucket).read_bytes(layout.sweep_record_path(sweep_id)))
        members = record.get("members") if isinstance(record.get("members"), dict) else {}
        fleet = record.get("fleet") if isinstance(record.get("fleet"), str) else ""
        budget = record.get("budget_usd")
        budget = float(budget) if isinstance(budget, (int, float)) and not isinstance(budget, bool) else 0.0
        found = (budget, [str(r) for _, r in sorted(members.items())] + ([fleet] if fleet else []))
        if record.get("state") != LAUNCHING:     # a launch still under way may not have written its end yet
            self._sweep_caps[key] = found
        return found

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
            record = records.event_record(records.BUDGET_CAP, time=self.clock(), reason=reason, budget_usd=budget,
                                          spent_usd=cost.spent_usd, projected_usd=cost.projected_usd,
                                          cancelled=cancelled)
            name = layout.fragment_name(BUDGET_WRITER, len(written))
            store.write_bytes(f"{folder}/{name}", (json.dumps(record) + "\n").encode())
        log.info("run %s: budget cap reached (%s); cancelled %d job(s)", run_id, reason, len(cancelled))
        return BudgetStop(run_id, reason, cancelled)


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
