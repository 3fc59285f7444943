"""Alerts that mean something: recorded in the run's bucket folder once, cleared when the trouble ends, never
sent twice (also after a panel restart), posted to a webhook whose URL is kept encrypted."""

import functools
import json
import os
import signal
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace

import pytest

from backend.plan.jobspec import JobStatus
from backend.runtime import layout
from backend.storage.series import SeriesTable
from backend.storage.store import FolderStore
from backend.view import diagnose
from backend.view.alerts import AlertBook, WebhookStore, current_alerts
from backend.view.diagnose import Alert
from backend.view.run_records import STARTED_NONE, note_started

pytestmark = pytest.mark.integration


def _view(rows, *, stages=None, serving=None, events=None, spec=None, earlier=()):
    table = SeriesTable()
    table.extend(rows)
    jobs = {role: SimpleNamespace(status=JobStatus(stage), resources=[], logs=[])
            for role, stage in (stages or {}).items()}
    done = all(j.status.done for j in jobs.values()) if jobs else False
    spec = {"mode": "distributed", "name": "demo", **(spec or {})}
    started = functools.reduce(note_started, events or [], STARTED_NONE)    # as a RunView counts them
    return SimpleNamespace(run_id="r1", table=table, spec=spec, current_jobs=jobs, done=done, serving=serving or {},
                           events=events or [], jobs={**jobs, **{key: None for key in earlier}},
                           trainer_started=started, launch_failure=None)


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
    book = AlertBook(store, "r1", webhook.url, public_only=False)    # a local panel: its loopback webhook is allowed
    [fired] = book.update(view, now=111.0)
    assert fired.kind == "ratio"
    assert book.update(view, now=111.5) == [], "still firing: not recorded or sent again"
    deadline = time.monotonic() + 10
    while not webhook.bodies and time.monotonic() < deadline:
        time.sleep(0.05)
    [body] = webhook.bodies
    assert "ratio" in body["text"] and body["text"] == body["content"] and body["alert"]["key"] == "ratio"

    # A panel restarted over the same bucket reads the open alert back and sends nothing again.
    again = AlertBook(store, "r1", webhook.url, public_only=False)
    view.events = _events(store)
    assert again.update(view, now=112.0) == []
    healthy = _view([*drifting, *({"step": 10 + i, "time": 110.0 + i, "ratio": 1.0} for i in range(1, 6))],
                    stages={"trainer": "RUNNING"}, events=_events(store))
    again.update(healthy, now=116.0)
    assert [e["event"] for e in _events(store)] == ["alert", "alert_cleared"]
    assert len(webhook.bodies) == 1


def test_a_book_reads_older_events_joined_in_front_and_waits_while_a_view_still_reads_them(tmp_path):
    store = FolderStore(str(tmp_path))
    drifting = [{"step": i, "time": 100.0 + i, "ratio": 1.05} for i in range(1, 11)]
    started = [{"event": "started", "time": 90.0 + i} for i in range(3)]
    fired = {"event": "alert", "key": "ratio", "kind": "ratio", "time": 40.0, "message": "drifting"}
    view = _view(drifting, stages={"trainer": "RUNNING"}, events=started[-1:])
    view.events_loading = True
    book = AlertBook(store, "r1")
    assert book.update(view, now=111.0) == [] and not _events(store), "nothing fired while older events load"
    # The summary's events, then the open view's (another list, the older events in front): read from its start.
    book.update(_view([], stages={"trainer": "RUNNING"}, events=started), now=111.0)
    opened = _view(drifting, stages={"trainer": "RUNNING"}, events=[fired, *started])
    assert book.update(opened, now=111.0) == [] and not _events(store), "recorded long ago, still firing: not again"
    cleared = {"event": "alert_cleared", "key": "ratio", "time": 50.0}
    healthy = _view([{"step": 11, "time": 111.0, "ratio": 1.0}] * 5, stages={"trainer": "RUNNING"},
                    events=[cleared])
    assert book.update(healthy, now=112.0) == [] and not book.open and not _events(store), "cleared elsewhere"
    healthy.events[:0] = [fired]                    # joined in front, in the same list: older than its clearing
    healthy.events = list(healthy.events)
    book.update(healthy, now=112.5)
    assert not book.open and not _events(store)


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


@pytest.mark.full   # tier 2 only (~60 s loaded)
def test_a_run_made_to_stall_raises_the_stall_alert_on_its_dashboard_and_webhook(tmp_path, webhook, monkeypatch):
    """A real local run whose trainer is stopped (SIGSTOP) stops logging steps: the stall alert fires."""
    from panel.actions import Panel, Settings

    monkeypatch.setattr(diagnose, "STALL_FLOOR_S", 5.0)   # the floor's own test is above; here, not a minute's wait

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


def _steps(n: int, step_s: float, start: float = 1000.0, **metrics) -> list[dict]:
    return [{"step": i, "time": start + i * step_s, **metrics} for i in range(1, n + 1)]


def _kinds(view, now: float) -> list[str]:
    return [a.kind for a in current_alerts(view, now)]


def _start(kind: str, at: float) -> dict:
    return {"event": kind, "writer": "trainer", "time": at}


def test_a_run_that_does_not_reach_its_first_step_stalls_at_the_start_up_stage_it_is_in():
    """Progress, not the job's liveness, decides: a trainer alive but not moving is stalled from step 0 on, each
    start-up mark with its own allowance (diagnose.START_UP_ALLOWANCE_S), named in the header's words."""
    for kind, words in (("attempt", "loading the data and the model"),
                        ("engine", "importing TRL and building the trainer"), ("started", "training the first step")):
        allowance = diagnose.START_UP_ALLOWANCE_S[kind]
        view = _view([], stages={"trainer": "RUNNING"}, events=[_start(kind, 1000.0)], spec={"mode": "colocated"})
        assert _kinds(view, 1000.0 + allowance - 1) == [], kind
        [stall] = [a for a in current_alerts(view, 1000.0 + allowance + 1) if a.kind == "stall"]
        assert f"still {words}" in stall.message and f"allowance of {allowance:.0f} s" in stall.message, stall
    # A machine not given yet, and a job that wrote nothing yet, are no stall of the run's.
    for stage, events in (("SCHEDULING", []), ("RUNNING", [])):
        assert _kinds(_view([], stages={"trainer": stage}, events=events), 1e9) == []


def test_a_run_with_one_or_two_steps_stalls_past_the_few_steps_limit():
    """Before a third step there is no step time of the run's own: the first steps get FEW_STEPS_LIMIT_S."""
    for rows in (_steps(1, 5.0), _steps(2, 5.0)):
        view = _view(rows, stages={"trainer": "RUNNING"}, spec={"adapter_every": 1000, "checkpoint_every": 1000})
        last = rows[-1]["time"]
        assert _kinds(view, last + diagnose.FEW_STEPS_LIMIT_S - 1) == []
        [stall] = [a for a in current_alerts(view, last + diagnose.FEW_STEPS_LIMIT_S + 1) if a.kind == "stall"]
        assert f"{len(rows)} logged step(s)" in stall.message, stall


def test_a_stall_needs_a_floor_in_seconds_not_only_a_multiple_of_a_fast_step():
    """A 0.1 s-step run paused 1 s once fired "11x the median step time"; a pause is a stall only past a floor."""
    rows = _steps(30, 0.1)
    view = _view(rows, stages={"trainer": "RUNNING"}, spec={"adapter_every": 1000, "checkpoint_every": 1000})
    last = rows[-1]["time"]
    assert _kinds(view, last + 1.1) == [] and _kinds(view, last + diagnose.STALL_FLOOR_S - 1) == []
    [stall] = [a for a in current_alerts(view, last + diagnose.STALL_FLOOR_S + 1) if a.kind == "stall"]
    assert f"at least {diagnose.STALL_FLOOR_S:.0f} s" in stall.message and "last step 30" in stall.message


def test_a_pause_the_run_makes_on_purpose_is_no_stall():
    """A checkpoint save or an adapter publish due right after the newest step, or a resumed trainer starting,
    gets its own allowance on top of the stall limit."""
    spec = {"adapter_every": 1000, "checkpoint_every": 50}
    rows = _steps(50, 20.0)                              # 20 s steps; step 50 saves a checkpoint
    last = rows[-1]["time"]
    view = _view(rows, stages={"trainer": "RUNNING"}, spec=spec)
    limit = 10 * 20.0
    assert _kinds(view, last + limit + 60) == [], "the checkpoint save is still within its allowance"
    [stall] = [a for a in current_alerts(view, last + limit + diagnose.PAUSE_ALLOWANCE_S["checkpoint save"] + 1)
               if a.kind == "stall"]
    assert "checkpoint save" in stall.message
    mid = _view(rows[:45], stages={"trainer": "RUNNING"}, spec=spec)
    assert _kinds(mid, rows[44]["time"] + limit + 60) == ["stall"], "no save is due after step 45"

    # Resumed: the new attempt's trainer is loading its model (no 'started' event of its own yet): no stall.
    started = [{"event": "started", "time": rows[0]["time"] - 5}]
    resumed = _view(rows[:45], stages={"trainer": "RUNNING"}, spec=spec, events=started, earlier=["trainer#1"])
    assert _kinds(resumed, rows[44]["time"] + 3600) == []
    # Once it started, the time until its first step is start-up, counted from its start.
    started.append({"event": "started", "time": rows[44]["time"] + 3000})
    resumed = _view(rows[:45], stages={"trainer": "RUNNING"}, spec=spec, events=started, earlier=["trainer#1"])
    assert _kinds(resumed, rows[44]["time"] + 3000 + limit + 60) == []
    late = rows[44]["time"] + 3000 + limit + diagnose.PAUSE_ALLOWANCE_S["start-up"] + 1
    assert [a.message for a in current_alerts(resumed, late) if "start-up" in a.message]


def test_an_ended_run_shows_no_live_alert_in_its_header(tmp_path):
    """A stall recorded while the run ran stays in its events; the header of the completed or failed run does
    not show it, and the alert book clears it once it sees the run ended."""
    from panel import run_header

    store = FolderStore(str(tmp_path))
    rows = _steps(30, 1.0)
    running = _view(rows, stages={"trainer": "RUNNING"}, spec={"adapter_every": 1000, "checkpoint_every": 1000})
    book = AlertBook(store, "r1")
    assert [a.kind for a in book.update(running, now=rows[-1]["time"] + 600)] == ["stall"]
    for stage in ("COMPLETED", "ERROR"):
        ended = _header_view(rows, stage, open_alerts={"stall": _events(store)[0]})
        header = run_header.status_markdown(ended)
        assert "stall" not in header and "Alert:" not in header, header
    done = _view(rows, stages={"trainer": "COMPLETED"}, events=_events(store))
    book.update(done, now=rows[-1]["time"] + 700)
    assert [e["event"] for e in _events(store)] == ["alert", "alert_cleared"]


# Metric records as the trainers write them: TRL's log dict through the runtime's canonical_metrics, as
# RunFolderCallback.on_log (GRPOTrainer: frac_reward_zero_std, batch reward_std) and AsyncRunFolderCallback.on_log
# (the async trainer: reward_std is each group's own std, averaged over the step's samples) record them.
def _colocated_records(n: int, reward: float = 0.0, frac: float = 1.0, start: float = 1000.0) -> list[dict]:
    from backend.runtime.trainer.metrics_callback import canonical_metrics

    logs = {"loss": 0.0, "grad_norm": 0.0, "learning_rate": 4e-05, "num_tokens": 1234.0,
            "completions/mean_length": 64.0, "rewards/accuracy_reward/mean": reward,
            "rewards/accuracy_reward/std": 0.0, "reward": reward, "reward_std": 0.0,
            "frac_reward_zero_std": frac, "kl": 0.0, "entropy": 2.1, "clip_ratio/region_mean": 0.0, "epoch": 0.1}
    return [{"step": i, "time": start + i, **canonical_metrics({**logs, "step": i})} for i in range(1, n + 1)]


def _async_records(n: int, reward_std: float, start: float = 1000.0) -> list[dict]:
    from backend.runtime.trainer.metrics_callback import canonical_metrics

    logs = {"reward": 0.0, "reward_std": reward_std, "rewards/accuracy_reward": 0.0, "ratio": 1.0, "kl": 0.0,
            "sample/staleness_mean": 1.0, "perf/step_s": 1.0, "perf/rollout_wait_s": 0.1}
    return [{**canonical_metrics(logs), "step": i, "time": start + i, "policy_version": i} for i in range(1, n + 1)]


def test_no_learning_signal_raises_an_alert_that_says_what_to_change(tmp_path, webhook):
    """Every group's completions scored alike (all 0) for a while: every advantage is 0, nothing is learned."""
    spec = {"mode": "colocated", "num_generations": 8, "temperature": 1.0}
    store = FolderStore(str(tmp_path))
    book = AlertBook(store, "r1", webhook.url, public_only=False)
    flat = _colocated_records(diagnose.NO_SIGNAL_STEPS)
    assert book.update(_view(flat[:-1], stages={"trainer": "RUNNING"}, spec=spec), now=1000.0 + len(flat)) == []
    [alert] = book.update(_view(flat, stages={"trainer": "RUNNING"}, spec=spec), now=1000.0 + len(flat))
    assert alert.kind == "no-signal"
    for words in ("nothing is learned", "num_generations", "temperature", "partial credit", "easier"):
        assert words in alert.message, alert.message
    # One step where some group's completions differ is a learning signal: the alert clears.
    mixed = [*flat, *_colocated_records(1, reward=0.125, frac=0.5, start=1000.0 + len(flat))]
    mixed[-1]["step"] = len(flat) + 1
    book.update(_view(mixed, stages={"trainer": "RUNNING"}, spec=spec), now=1000.0 + len(mixed))
    assert [e["event"] for e in _events(store)] == ["alert", "alert_cleared"]

    # The async trainer logs no frac_reward_zero_std: a zero mean within-group reward_std says the same.
    assert "no-signal" in _kinds(_view(_async_records(diagnose.NO_SIGNAL_STEPS, 0.0), stages={"trainer": "RUNNING"},
                                       spec={"num_generations": 8}), now=1020.0)
    assert "no-signal" not in _kinds(_view(_async_records(diagnose.NO_SIGNAL_STEPS, 0.2),
                                           stages={"trainer": "RUNNING"}), now=1020.0)
    # A run that ended with no signal says so in its header (not as a live alert).
    from panel import run_header

    header = run_header.status_markdown(_header_view(flat, "COMPLETED", spec=spec))
    assert "nothing is learned" in header and "Alert:" not in header, header


def _header_view(rows, stage, open_alerts=None, spec=None):
    table = SeriesTable()
    table.extend(rows)
    jobs = {"trainer": SimpleNamespace(status=JobStatus(stage), logs=[], resources=[])}
    return SimpleNamespace(run_id="r1", spec={"mode": "colocated", "max_steps": 100, **(spec or {})}, latest=rows[-1],
                           degraded="", stage=stage, jobs=jobs, current_jobs=jobs, engine="", history_pending=False,
                           open_alerts=open_alerts or {}, table=table, unreadable={}, done=True, trainer_end={},
                           adapters={}, final_files=[], replica_stats=[])


def test_a_pause_made_at_every_step_gets_no_allowance_on_top_of_the_step_time():
    """A distributed run syncing each step (adapter_every 1) has the sync in its median step time already: a frozen
    one is stalled at the plain limit, not 120 s later."""
    rows = _steps(30, 2.0)
    view = _view(rows, stages={"trainer": "RUNNING"}, spec={"adapter_every": 1, "checkpoint_every": 1000})
    last = rows[-1]["time"]
    assert _kinds(view, last + diagnose.STALL_FLOOR_S - 1) == []
    [stall] = [a for a in current_alerts(view, last + diagnose.STALL_FLOOR_S + 1) if a.kind == "stall"]
    assert "adapter publish" not in stall.message, stall
