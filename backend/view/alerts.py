"""Alerts that survive the panel: each one that fires is written as an event into the run's bucket folder (so
every panel, and the next one, agrees on what fired), and optionally posted to a webhook.

`AlertBook.update(view)` evaluates the rules of `backend.view.diagnose` over a run's view and returns the alerts that
started firing. An alert is keyed (a replica, a job, or one kind of trouble): it is written and sent when its key
appears, and an `alert_cleared` event is written when it goes away. A restarted panel reads the open alerts
back from the events and sends nothing twice.

The webhook URL is a secret (a Slack or Discord incoming webhook lets anyone post): it is kept, encrypted, in the
panel's own home, never in spec.json or the bucket, and never shown back.
"""

import base64
import hashlib
import json
import logging
import os
import secrets
import threading
import time

from cryptography.fernet import Fernet

from backend.runtime import layout, records
from backend.runtime.redact import redact_tokens
from backend.storage.store import BucketStore
from backend.view import diagnose
from backend.view.hacking import HACKING_KIND, hacking_alert
from backend.view.runview import reading
from backend.view.startup import start_up
from backend.view.webhook import post_webhook

log = logging.getLogger(__name__)

WRITER = f"{layout.PANEL_WRITER}-alerts"


def current_alerts(view, now: float | None = None) -> list[diagnose.Alert]:
    """Every rule of `backend.view.diagnose` over the run as `view` shows it now. An ended run has no live trouble left:
    only a failed job's alert (its failure, sent once) and reward hacking (its records stay), so the others clear."""
    now = now or time.time()
    found = diagnose.job_alerts({role: job.status.stage for role, job in view.current_jobs.items()},
                                {role: job.status.message for role, job in view.current_jobs.items()})
    found.append(hacking_alert(view))     # from the held-out records: it holds once the run has ended too
    if view.done:
        return [a for a in found if a is not None]
    with reading(view):
        rows = view.table.rows(last=diagnose.WINDOW + 1)
    starting, started_at = _trainer_start(view)
    stage = start_up(view) if not rows else None
    found += [diagnose.ratio_alert(rows), diagnose.no_signal_alert(rows, view.spec),
              None if starting else diagnose.stall_alert(rows, now, True, view.spec, started_at),
              diagnose.start_up_stall_alert(stage, now),
              diagnose.stale_drop_alert(rows, view.spec)]
    found += [diagnose.gpu_idle_alert(role, list(job.resources), now, True)
              for role, job in view.current_jobs.items()]
    if view.serving:
        found += diagnose.serving_alerts(view.serving)
    return [a for a in found if a is not None]


def _trainer_start(view) -> tuple[bool, float | None]:
    """(whether a resumed trainer is still starting: its attempt has not recorded 'started' yet, when its current
    attempt started training), from the 'started' events the view counts as it reads them (`note_started`)."""
    attempts = 1 + sum(1 for key in getattr(view, "jobs", {}) if key.startswith("trainer#"))
    starts, newest = view.trainer_started
    if attempts > 1 and starts < attempts:
        return True, None
    return False, newest


class AlertBook:
    """The open alerts of one run, kept in step with its events folder."""

    def __init__(self, store: BucketStore, run_id: str, webhook: str | None = None, send=None,
                 public_only: bool = True):
        """`send(url, text, alert)` posts an alert (default: `post_webhook`, to public addresses only unless
        `public_only` is False: a panel only its own user reaches)."""
        self.store, self.run_id, self.webhook = store, run_id, webhook
        self.send = send or (lambda url, text, alert: post_webhook(url, text, alert, public_only))
        self.open: dict[str, dict] = {}
        self._newest: dict[str, dict] = {}     # alert key -> its newest alert or alert_cleared event, read or written
        # A writer name of this book's own: two panels (or a restarted one) never write the same fragment name.
        self.writer = f"{WRITER}.{secrets.token_hex(4)}"
        self._seq = 0
        self._learnt: tuple[list | None, int] = (None, 0)    # the events list learnt from, and how far
        self._lock = threading.Lock()

    def update(self, view, now: float | None = None) -> list[diagnose.Alert]:
        """Write (and send) the alerts that started firing, clear the ones that stopped; return the new ones.
        Nothing while the view is still reading the run's older events: an alert they hold as open is not sent
        again."""
        if getattr(view, "events_loading", False):
            return []
        with self._lock:
            self._learn(view.events)
            alerts = {a.key: a for a in current_alerts(view, now)}
            fired = [a for key, a in alerts.items() if key not in self.open]
            # A summary view reads no held-out records: it can neither raise nor clear what only they show; nor can
            # a view still reading a long run's older ones.
            held = getattr(view, "held_out", None)
            unsure = getattr(view, "bounded", False) or getattr(held, "older_pending", False)
            unknown = {HACKING_KIND} if unsure else set()
            cleared = [key for key in self.open if key not in alerts and key not in unknown]
            written = [records.event_record(records.ALERT, kind=a.kind, key=a.key, message=a.message) for a in fired]
            written += [records.event_record(records.ALERT_CLEARED, key=key) for key in cleared]
            if written:
                self._write(written)
                if hasattr(view, "expect_event_writer"):
                    view.expect_event_writer(self.writer)
            for record in written:
                self._note(record)
            for alert in fired:
                self._notify(alert, view)
            return fired

    def _learn(self, events: list[dict]) -> None:
        """Open alerts as the bucket records them (this panel's or an earlier one's). A list read before is read
        on from where it was left; another one (another view of the run, or older events joined in front) from
        its start: an event older than what is known of its key changes nothing, so reading one twice is harmless."""
        seen, known = self._learnt
        for event in events[known if seen is events else 0:]:
            if event.get("event") in (records.ALERT, records.ALERT_CLEARED) and isinstance(event.get("key"), str):
                self._note(event)
        self._learnt = (events, len(events))

    def _note(self, event: dict) -> None:
        """An alert or alert_cleared event, unless one newer for its key is known already."""
        key, newest = event["key"], self._newest.get(event["key"])
        if newest is not None and _time(event) < _time(newest):
            return
        self._newest[key] = event
        if event["event"] == records.ALERT:
            self.open[key] = event
        else:
            self.open.pop(key, None)

    def _write(self, events: list[dict]) -> None:
        folder = f"{layout.run_prefix(self.run_id)}/{layout.EVENTS_DIR}"
        name = layout.fragment_name(self.writer, self._seq)
        self._seq += 1
        body = "".join(json.dumps(event) + "\n" for event in events).encode()
        try:
            self.store.write_bytes(f"{folder}/{name}", body)
        except Exception as error:   # an alert that cannot be recorded is still shown and sent
            log.warning("could not record alerts of run %s: %s", self.run_id, redact_tokens(str(error)))

    def _notify(self, alert: diagnose.Alert, view) -> None:
        if not self.webhook:
            return
        text = redact_tokens(f"[{view.spec.get('name', 'run')} {self.run_id}] {alert.kind}: {alert.message}")
        threading.Thread(target=self._send_quietly, args=(text, alert), daemon=True).start()

    def _send_quietly(self, text: str, alert: diagnose.Alert) -> None:
        try:
            self.send(self.webhook, text, alert)
        except Exception as error:
            log.warning("alert webhook failed for run %s: %s", self.run_id, type(error).__name__)


def _time(event: dict) -> float:
    when = event.get("time")
    return float(when) if isinstance(when, (int, float)) and not isinstance(when, bool) else 0.0


class WebhookStore:
    """Per-run webhook URLs, encrypted in the panel's home (`<home>/secrets/`), readable by this panel only.

    The key is GRPO_PANEL_SECRET_KEY (set it as a Space secret so a restarted Space keeps reading them), else a
    random key created in the home on first use."""

    def __init__(self, home: str):
        self.folder = os.path.join(home, "secrets")

    def _fernet(self):
        secret = os.environ.get("GRPO_PANEL_SECRET_KEY")
        if not secret:
            os.makedirs(self.folder, mode=0o700, exist_ok=True)
            path = os.path.join(self.folder, "key")
            if not os.path.exists(path):
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                with os.fdopen(fd, "wb") as f:
                    f.write(os.urandom(32))
            with open(path, "rb") as f:
                secret = f.read().hex()
        return Fernet(base64.urlsafe_b64encode(hashlib.sha256(secret.encode()).digest()))

    def put(self, run_id: str, url: str) -> None:
        os.makedirs(self.folder, mode=0o700, exist_ok=True)
        path = os.path.join(self.folder, f"{run_id}.webhook")
        fd = os.open(path + ".tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(self._fernet().encrypt(url.encode()))
        os.replace(path + ".tmp", path)

    def get(self, run_id: str) -> str | None:
        try:
            with open(os.path.join(self.folder, f"{run_id}.webhook"), "rb") as f:
                return self._fernet().decrypt(f.read()).decode()
        except (OSError, ValueError):
            return None
        except Exception:      # a key that changed (another Space secret): the URL is gone, not the panel
            return None
