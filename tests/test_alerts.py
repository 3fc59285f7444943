"""Alerts that mean something: recorded in the run's bucket folder once, cleared when the trouble ends, never
sent twice (also after a panel restart), posted to a webhook whose URL is kept encrypted."""

import json
import os
import signal
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace

import pytest

from backend.alerts import AlertBook, WebhookStore, current_alerts
from backend.diagnose import Alert
from backend.jobspec import JobStatus
from backend.runtime import layout
from backend.series import SeriesTable
from backend.store import FolderStore


def _view(rows, *, stages=None, serving=None, events=None):
    table = SeriesTable()
    table.extend(rows)
    jobs = {role: SimpleNamespace(status=JobStatus(stage), resources=[]) for role, stage in (stages or {}).items()}
    done = all(j.status.done for j in jobs.values()) if jobs else False
    return SimpleNamespace(run_id="r1", table=table, spec={"mode": "distributed", "name": "demo"}, current_jobs=jobs,
                           done=done, serving=serving or {}, events=events or [])


def _events(store) -> list[dict]:
    folder = store.local_path(f"runs/r1/{layout.EVENTS_DIR}")
    out = []
    for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
        out += [json.loads(line) for line in open(os.path.join(folder, name))]
    return sorted(out, key=lambda e: e["time"])     # two books write fragments of their own: order by time


class Webhook:
    """A loopback HTTP server standing for Slack or Discord: records every JSON body posted to it."""

    def __init__(self):
        self.bodies = []
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                hook.bodies.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hooks/secret-path"

    def stop(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def webhook():
    hook = Webhook()
    yield hook
    hook.stop()


def test_an_alert_is_recorded_and_sent_once_and_cleared_when_the_trouble_ends(tmp_path, webhook):
    store = FolderStore(str(tmp_path))
    drifting = [{"step": i, "time": 100.0 + i, "ratio": 1.05} for i in range(1, 11)]
    view = _view(drifting, stages={"trainer": "RUNNING"})
    book = AlertBook(store, "r1", webhook.url)
    [fired] = book.update(view, now=111.0)
    assert fired.kind == "ratio"
    assert book.update(view, now=111.5) == [], "still firing: not recorded or sent again"
    deadline = time.monotonic() + 10
    while not webhook.bodies and time.monotonic() < deadline:
        time.sleep(0.05)
    [body] = webhook.bodies
    assert "ratio" in body["text"] and body["text"] == body["content"] and body["alert"]["key"] == "ratio"

    # A panel restarted over the same bucket reads the open alert back and sends nothing again.
    again = AlertBook(store, "r1", webhook.url)
    view.events = _events(store)
    assert again.update(view, now=112.0) == []
    healthy = _view([*drifting, *({"step": 10 + i, "time": 110.0 + i, "ratio": 1.0} for i in range(1, 6))],
                    stages={"trainer": "RUNNING"}, events=_events(store))
    again.update(healthy, now=116.0)
    assert [e["event"] for e in _events(store)] == ["alert", "alert_cleared"]
    assert len(webhook.bodies) == 1


def test_the_rules_cover_failed_replicas_and_replicas_that_do_not_serve_the_newest_version():
    proof = {"version": "trl-policy-v3", "replicas": [
        {"url": "http://a", "listed": True, "served": "trl-policy-v3", "delta_base": 0.4},
        {"url": "http://b", "listed": True, "served": "trl-policy-v3", "delta_base": 0.0}]}
    view = _view([{"step": 1, "time": 1.0}], stages={"trainer": "RUNNING", "vllm-1": "ERROR"}, serving=proof)
    kinds = sorted((a.kind, a.key) for a in current_alerts(view, now=2.0))
    assert kinds == [("replica-down", "replica-down-vllm-1"), ("serving", "serving-http://b")]


def test_a_webhook_url_is_kept_encrypted_in_the_panels_home(tmp_path, monkeypatch):
    monkeypatch.delenv("GRPO_PANEL_SECRET_KEY", raising=False)
    store = WebhookStore(str(tmp_path))
    url = "https://hooks.slack.com/services/T000/B000/verysecretpart"
    store.put("r1", url)
    assert store.get("r1") == url and store.get("other") is None
    raw = b"".join(open(os.path.join(store.folder, n), "rb").read() for n in os.listdir(store.folder))
    assert b"verysecretpart" not in raw and b"hooks.slack.com" not in raw
    assert oct(os.stat(os.path.join(store.folder, "r1.webhook")).st_mode & 0o777) == "0o600"


def test_a_run_made_to_stall_raises_the_stall_alert_on_its_dashboard_and_webhook(tmp_path, webhook):
    """A real local run whose trainer is stopped (SIGSTOP) stops logging steps: the stall alert fires."""
    from panel.actions import Panel, Settings

    panel = Panel(Settings(home=str(tmp_path / "home"), on_space=False, host="127.0.0.1"))
    result = panel.launch({"max_steps": 400, "adapter_every": 1000, "checkpoint_every": 1000})
    run_id = result.run_id
    assert run_id, result.message
    panel.watch.webhooks.put(run_id, webhook.url)
    view = panel.view(run_id)
    job = view.jobs["trainer"]
    try:
        deadline = time.monotonic() + 180
        while len(view.table) < 15:
            assert time.monotonic() < deadline, "the run did not log 15 steps"
            time.sleep(0.5)
            view.refresh()
        group = os.getpgid(panel.local.main_pid(job.job_id))
        os.killpg(group, signal.SIGSTOP)
        try:
            deadline = time.monotonic() + 60
            fired = []
            while not any(a.kind == "stall" for a in fired):
                assert time.monotonic() < deadline, "no stall alert"
                time.sleep(1.0)
                view.refresh()
                fired += panel.watch.alerts(view)
        finally:
            os.killpg(group, signal.SIGCONT)
        view.refresh()
        assert any(a.get("kind") == "stall" for a in view.open_alerts.values())
        deadline = time.monotonic() + 10
        while not webhook.bodies and time.monotonic() < deadline:
            time.sleep(0.1)
        assert any(b["alert"]["kind"] == "stall" for b in webhook.bodies)
    finally:
        panel.cancel(run_id)
        panel.local.wait(job.job_id, 60)
        panel.shutdown()


def test_an_alert_is_an_alert_whatever_sends_it():
    assert Alert("stall", "no step", "stall") == Alert("stall", "no step", "stall")
