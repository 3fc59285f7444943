"""What the panel process checks whether anyone watches or not: every live run's budget cap and alerts, from a
background thread, for the host's runs and those of visitors seen lately. A live run nobody has open is read
through a bounded summary of it (`RunRegistry.summary_view`), never its whole view: an idle panel's memory does not
grow with its runs' length."""

import contextlib
import fcntl
import json
import logging
import os
import threading
import time

from backend.plan.jobspec import ERROR, TERMINAL_STAGES
from backend.runs.access import ANONYMOUS
from backend.runs.budget import BudgetEnforcer, BudgetStop, SpendWatch
from backend.runs.directory import RunDirectory
from backend.runs.orphans import roll_back, sweep_failed_launch
from backend.runtime.layout import atomic_write_bytes
from backend.runtime.redact import redact_tokens
from backend.view.alerts import AlertBook, WebhookStore
from backend.view.runview import RunView

log = logging.getLogger(__name__)
SWEEP_FAILED_FOR_S = 600.0     # how long after a failed launch its run's label is swept for jobs listed late
LOOK_SLACK_S = 30.0            # a run that ended this long before the last look is looked at again (clocks differ)


def _key(registry, run_id: str) -> tuple:
    return registry.executor.name, registry.namespace, run_id


@contextlib.contextmanager
def _home_lock(folder: str, name: str):
    """An exclusive lock of the panel home's, held by one process at a time (panels beside each other wait)."""
    os.makedirs(folder, exist_ok=True)
    fd = os.open(os.path.join(folder, f"{name}.lock"), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


class RunWatch:
    """Budget caps and alerts (and what the panel adds to `also`). `check()` runs every `interval_s` seconds (0:
    never; tests call it themselves)."""

    def __init__(self, runs: RunDirectory, spend: SpendWatch, home: str, interval_s: float):
        self.runs, self.spend = runs, spend
        self.webhooks = WebhookStore(home)     # each run's alert webhook, kept encrypted in the panel's home
        self._alert_books: dict[tuple, AlertBook] = {}     # (executor, namespace, run id) -> the run's alerts
        self._live: set[tuple] = set()          # runs seen live at a look of this process
        self._ended_seen: set[tuple] = set()    # ended runs whose alerts this process evaluated
        self._alert_locks = os.path.join(home, "alerts")
        self._look_file = os.path.join(home, "alerts", "last-look.json")
        self._last_look = self._read_last_look()
        self._recovering = threading.Lock()
        # Checks the panel adds (each called after the alerts, its failures its own: a local panel's sweep rules).
        self.also: list = []
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
        for extra in list(self.also):
            extra()
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
            for run_id, (began, failed_at) in list(registry.failed_launches.items()):
                if now - failed_at > SWEEP_FAILED_FOR_S:
                    registry.failed_launches.pop(run_id, None)
                    continue
                try:
                    found = sweep_failed_launch(registry, run_id, failed_at, began=began)
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
        # A run by its owner and id: a run made elsewhere under a reused id has alerts (and a folder) of its own.
        owner = (view.executor.name, getattr(view.executor, "namespace", None))
        book = self._alert_books.get((*owner, view.run_id))
        if book is None:
            # The webhook was given at the launch of the run this panel launched under the id: only that run posts.
            launched = self.runs.run_ids.owner(view.run_id)
            ours = launched is None or (launched.get("executor"), launched.get("namespace")) == owner
            # A panel that serves others posts to public addresses only (backend/view/webhook.py says why).
            book = self._alert_books[(*owner, view.run_id)] = AlertBook(
                view.store, view.run_id, self.webhooks.get(view.run_id) if ours else None,
                public_only=self.runs.deployment.serves_others)
        if getattr(book, "seen_version", None) == view.version:
            return []
        book.seen_version = view.version
        return book.update(view)

    def watch_live_alerts(self) -> None:
        """Evaluate the alerts of every live run this process can reach, and once those of each run that ended
        failing since the last look, so a stall, a lost adapter or a failed job reaches the bucket and the webhook
        with no browser open (a colocated run can start and fail between two looks)."""
        since, now = self._last_look, time.time()
        for registry in self._registries():
            try:
                runs = registry.list_runs()
            except Exception as exc:   # one namespace failing must not stop the others' alerts
                log.warning("alert check could not list %s runs: %s", registry.executor.name, redact_tokens(str(exc)))
                continue
            live = [run.run_id for run in runs
                    if run.stages and not all(stage in TERMINAL_STAGES for stage in run.stages.values())]
            ended = [run.run_id for run in runs if run.run_id not in live and self._ended_unseen(registry, run, since)]
            registry.keep_summaries(set(live))
            for run_id in live:
                self._live.add(_key(registry, run_id))
                try:
                    view = registry.summary_view(run_id)     # bounded, unless a dashboard has the run open
                    view.refresh_if_due()
                    self.alerts(view)
                except Exception as exc:
                    log.warning("alert check failed for run %s: %s", run_id, redact_tokens(str(exc)))
            for run_id in ended:
                try:
                    self._alert_ended(registry, run_id)
                except Exception as exc:     # tried again next pass
                    log.warning("alert check failed for ended run %s: %s", run_id, redact_tokens(str(exc)))
        self._remember_look(now)

    def _ended_unseen(self, registry, run, since: float) -> bool:
        """Whether an ended run still needs its one look: a job of it failed (only a failed job alerts once a run is
        over), this process has not looked at it since it ended, and it was live at an earlier look or ended after
        the last look of any panel on this home (a restarted panel does not re-read every old run)."""
        key = _key(registry, run.run_id)
        if key in self._ended_seen or ERROR not in run.stages.values():
            return False
        if key in self._live:
            return True
        ended_at = max((r.finished_at or r.created_at for r in registry.job_records(run.run_id)), default=0.0)
        return ended_at >= since - LOOK_SLACK_S

    def _alert_ended(self, registry, run_id: str) -> None:
        """The ended run's alerts, evaluated once, under a lock of the home: a panel beside this one reads what
        the other recorded first, and the AlertBook sends nothing its events already hold (also after a restart)."""
        with _home_lock(self._alert_locks, run_id):
            view = registry.summary_view(run_id)
            view.refresh()
            view.wait_for_events(60)
            self.alerts(view)
        self._ended_seen.add(_key(registry, run_id))
        self._live.discard(_key(registry, run_id))

    def _remember_look(self, now: float) -> None:
        """When this home's panels last looked at every run: a restarted panel looks at runs that ended since."""
        self._last_look = now
        try:
            atomic_write_bytes(self._look_file, json.dumps({"last_look": now}).encode())
        except OSError as exc:
            log.warning("could not record the alert check's last look: %s", exc)

    def _read_last_look(self) -> float:
        try:
            with open(self._look_file, "rb") as f:
                return float(json.loads(f.read())["last_look"])
        except (OSError, ValueError, KeyError, TypeError):
            return time.time()     # a new home: runs that end from now on

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
