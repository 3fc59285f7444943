"""What the panel process checks whether anyone watches or not: every live run's budget cap and alerts, from a
background thread, for the host's runs and those of visitors seen lately. A live run nobody has open is read
through a bounded summary of it (`RunRegistry.summary_view`), never its whole view: an idle panel's memory does not
grow with its runs' length."""

import logging
import threading
import time

from backend.plan.jobspec import TERMINAL_STAGES
from backend.runs.access import ANONYMOUS
from backend.runs.budget import BudgetEnforcer, BudgetStop, SpendWatch
from backend.runs.directory import RunDirectory
from backend.runs.orphans import roll_back, sweep_failed_launch
from backend.runtime.redact import redact_tokens
from backend.view.alerts import AlertBook, WebhookStore
from backend.view.runview import RunView

log = logging.getLogger(__name__)
SWEEP_FAILED_FOR_S = 600.0     # how long after a failed launch its run's label is swept for jobs listed late


class RunWatch:
    """Budget caps and alerts. `check()` runs every `interval_s` seconds (0: never; tests call it themselves)."""

    def __init__(self, runs: RunDirectory, spend: SpendWatch, home: str, interval_s: float):
        self.runs, self.spend = runs, spend
        self.webhooks = WebhookStore(home)     # each run's alert webhook, kept encrypted in the panel's home
        self._alert_books: dict[str, AlertBook] = {}
        self._recovering = threading.Lock()
        # A launch an earlier panel on this home left half done is rolled back now, whatever the check interval.
        self._startup = threading.Thread(target=self.recover_launches, name="launch-recovery", daemon=True)
        self._startup.start()
        self._enforcer = BudgetEnforcer(self.check, interval_s).start()

    def check(self) -> list[BudgetStop]:
        """Launches left half done first (they bill and nothing else stops them), then budget caps, the alerts of
        live runs, and jobs of failed launches the Hub listed late."""
        self.recover_launches()
        stops = self.enforce_budgets()
        self.watch_live_alerts()
        self.sweep_failed_launches()
        return stops

    def recover_launches(self) -> list[str]:
        """Roll back every launch of this home whose panel stopped part way (`LaunchJournal.abandoned`), through
        the registry of its executor and namespace; one whose registry is not held now (a visitor's namespace on
        a Space) waits for a later pass. The ids cancelled."""
        cancelled = []
        with self._recovering:       # the start-up pass and the timer's never roll back the same launch twice
            for launch in self.runs.journal.abandoned():
                registry = self._registry_of(launch.record)
                if registry is None:
                    launch.close()
                    continue
                try:
                    found = roll_back(registry, launch)
                except Exception as exc:   # the next pass tries again
                    launch.close()
                    log.warning("could not roll back the launch of %s: %s", launch.id, redact_tokens(str(exc)))
                    continue
                log.warning("%s %s: the panel that launched it stopped part way; rolled back, cancelled %s",
                            launch.record.get("kind"), launch.id, ", ".join(found) or "no job")
                cancelled += found
        return cancelled

    def _registry_of(self, record: dict):
        return next((r for r in self._registries() if r.executor.name == record.get("executor")
                     and r.namespace == record.get("namespace")), None)

    def sweep_failed_launches(self, now: float | None = None) -> list[str]:
        """Cancel the jobs that launches which failed here in the last SWEEP_FAILED_FOR_S created anyway (the Hub
        lists a job created behind an error answer only later); the ids cancelled."""
        now = time.time() if now is None else now
        cancelled = []
        for registry in self._registries():
            for run_id, failed_at in list(registry.failed_launches.items()):
                if now - failed_at > SWEEP_FAILED_FOR_S:
                    registry.failed_launches.pop(run_id, None)
                    continue
                try:
                    found = sweep_failed_launch(registry, run_id, failed_at)
                except Exception as exc:   # the Hub failing: the next pass tries again
                    log.warning("could not sweep the failed launch of run %s: %s", run_id, redact_tokens(str(exc)))
                    continue
                if found:
                    log.warning("run %s: cancelled %d job(s) its failed launch had created: %s", run_id, len(found),
                                ", ".join(found))
                cancelled += found
        return cancelled

    def alerts(self, view: RunView) -> list:
        """Evaluate the run's alerts once per new version of its view: fired ones are recorded in its bucket
        folder and sent to its webhook, if it has one."""
        book = self._alert_books.get(view.run_id)
        if book is None:
            # A panel that serves others posts to public addresses only (backend/view/webhook.py says why).
            book = self._alert_books[view.run_id] = AlertBook(view.store, view.run_id, self.webhooks.get(view.run_id),
                                                              public_only=self.runs.deployment.serves_others)
        if getattr(book, "seen_version", None) == view.version:
            return []
        book.seen_version = view.version
        return book.update(view)

    def watch_live_alerts(self) -> None:
        """Evaluate the alerts of every live run this process can reach, so a stall or a lost adapter reaches the
        bucket and the webhook with no browser open."""
        for registry in self._registries():
            try:
                live = [run.run_id for run in registry.list_runs()
                        if run.stages and not all(stage in TERMINAL_STAGES for stage in run.stages.values())]
            except Exception as exc:   # one namespace failing must not stop the others' alerts
                log.warning("alert check could not list %s runs: %s", registry.executor.name, redact_tokens(str(exc)))
                continue
            registry.keep_summaries(set(live))
            for run_id in live:
                try:
                    view = registry.summary_view(run_id)     # bounded, unless a dashboard has the run open
                    view.refresh_if_due()
                    self.alerts(view)
                except Exception as exc:
                    log.warning("alert check failed for run %s: %s", run_id, redact_tokens(str(exc)))

    def enforce_budgets(self) -> list[BudgetStop]:
        """Check the budget cap of every live run this process can reach and stop those that reached it. Safe to
        run from several processes at once."""
        stops = []
        for registry in self._registries():
            try:
                stops += self.spend.enforce(registry)
            except Exception as exc:   # one namespace failing must not stop the others' caps
                log.warning("budget check failed for %s runs: %s", registry.executor.name, redact_tokens(str(exc)))
        return stops

    def _registries(self) -> list:
        """The host's registries and the Hub registries held for visitors seen lately (not counted as a use)."""
        return list({id(r): r for r in [*self.runs.registries(ANONYMOUS), *self.runs.held()]}.values())

    def stop(self) -> None:
        self._enforcer.stop()
        self._startup.join(5.0)
