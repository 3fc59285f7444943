"""Faults a production run meets (a crash, an OOM kill, a panel restart, a recycled process id, a bad line), injected
into real local jobs: each test says what must still be true afterwards."""

import json
import os
import signal
import subprocess
import sys
import time
import uuid

import psutil
import pytest

from backend.executors.local import LocalExecutor
from backend.jobspec import JobSpec, VolumeSpec

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _job(command, timeout_s=120, role="trainer", run_id="f1"):
    return JobSpec(run_id=run_id, role=role, image="local", command=command, flavor="local", timeout_s=timeout_s,
                   volumes=(VolumeSpec("local/b", "/bucket"),))


@pytest.fixture
def executor(tmp_path):
    ex = LocalExecutor(str(tmp_path / "home"))
    yield ex
    _stop_everything(ex.home)


def _stop_everything(home: str) -> None:
    """Cleanup: cancel every job under `home` and SIGKILL whatever a test left behind (by process group)."""
    ex = LocalExecutor(home)
    for record in ex.list_jobs():
        try:
            ex.cancel(record.job_id)
        except Exception:
            pass
    for proc in _processes_with(home):
        try:
            os.killpg(os.getpgid(proc.pid), signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def _processes_with(text: str) -> list[psutil.Process]:
    """Live processes whose command line or working directory mentions `text` (a job folder, a run id)."""
    found = []
    for proc in psutil.process_iter(["cmdline", "cwd", "status"]):
        info = proc.info
        if info["status"] == psutil.STATUS_ZOMBIE or proc.pid == os.getpid():
            continue
        if text in " ".join(info["cmdline"] or []) or text in (info["cwd"] or ""):
            found.append(proc)
    return found


def _wait_for(predicate, timeout: float, what: str, interval: float = 0.1):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"not within {timeout:.0f} s: {what}")


def _log(ex: LocalExecutor, job_id: str) -> list[str]:
    return ex.read_logs(job_id, 0)[0]


# ---- a job's processes and its final status do not depend on the panel that launched it

PANEL_SCRIPT = """
import sys
from backend.executors.local import LocalExecutor
from backend.jobspec import JobSpec, VolumeSpec
job = JobSpec(run_id="f1", role="trainer", image="local", command=sys.argv[2:], flavor="local", timeout_s=120,
              volumes=(VolumeSpec("local/b", "/bucket"),))
print(LocalExecutor(sys.argv[1]).submit(job), flush=True)
"""


def _submit_from_a_panel_that_exits(home: str, command: list[str]) -> str:
    """Submit a job from a separate panel process that exits at once (as a restarted panel's predecessor did)."""
    result = subprocess.run([sys.executable, "-c", PANEL_SCRIPT, home, *command], cwd=ROOT, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip().splitlines()[-1]


def test_a_job_that_ends_after_the_panel_restarted_keeps_its_true_status_and_its_resource_samples(tmp_path):
    home = str(tmp_path / "home")
    code = "import time; time.sleep(4); print('done', flush=True)"
    job_id = _submit_from_a_panel_that_exits(home, [sys.executable, "-c", code])
    restarted_at = time.time()
    fresh = LocalExecutor(home)     # the next panel: knows the job only from disk
    assert fresh.status(job_id).stage == "RUNNING"
    status = fresh.wait(job_id, 60)
    assert (status.stage, status.message) == ("COMPLETED", ""), status
    assert _log(fresh, job_id) == ["done"]
    samples, _ = fresh.read_resources(job_id, 0)
    assert [s for s in samples if s.time > restarted_at], "resource samples stopped with the panel that launched it"


def test_a_recycled_process_id_neither_looks_alive_nor_gets_signalled(tmp_path):
    home = str(tmp_path / "home")
    job_id = _submit_from_a_panel_that_exits(home, ["sleep", "1"])
    job_dir = os.path.join(home, "jobs", job_id)
    _wait_for(lambda: not _processes_with(job_dir), 30, "the job ended")
    # The machine restarted: no wrapper wrote how the job ended, and its process id now belongs to someone else.
    for name in ("exit.json", "status.json"):
        if name == "exit.json" and os.path.exists(os.path.join(job_dir, name)):
            os.remove(os.path.join(job_dir, name))
    with open(os.path.join(job_dir, "status.json"), "w") as f:
        json.dump({"stage": "RUNNING", "message": "", "time": time.time()}, f)
    stranger = subprocess.Popen(["sleep", "300"], start_new_session=True)
    try:
        record = json.load(open(os.path.join(job_dir, "job.json")))
        record["pid"] = stranger.pid
        with open(os.path.join(job_dir, "job.json"), "w") as f:
            json.dump(record, f)
        fresh = LocalExecutor(home)
        status = fresh.status(job_id)
        assert status.stage == "ERROR", status
        fresh.cancel(job_id)
        time.sleep(1)
        assert stranger.poll() is None, "Cancel signalled an unrelated process group"
    finally:
        stranger.kill()
        stranger.wait()


def test_a_timeout_is_reported_on_time_and_asks_with_sigterm_first(executor):
    code = ("import signal, sys, time\n"
            "def bye(*_):\n    print('got SIGTERM', flush=True); sys.exit(0)\n"
            "signal.signal(signal.SIGTERM, bye); print('ready', flush=True); time.sleep(60)")
    started = time.monotonic()
    job_id = executor.submit(_job([sys.executable, "-c", code], timeout_s=2))
    status = _wait_for(lambda: (s := executor.status(job_id)).done and s, 20, "the job ended")
    took = time.monotonic() - started
    assert status.stage == "ERROR" and "timed out after 2 s" in status.message, status
    assert took < 5, f"a 2 s timeout was reported after {took:.1f} s"
    assert _log(executor, job_id)[-1] == "got SIGTERM" or "got SIGTERM" in _log(executor, job_id)


def test_when_a_jobs_main_process_is_killed_no_process_of_its_group_survives(executor):
    marker = uuid.uuid4().hex
    job_id = executor.submit(_job(["bash", "-c", f"sleep 300 & sleep 300 & echo {marker}; wait"]))
    _wait_for(lambda: _log(executor, job_id) == [marker], 15, "the job started")
    [main] = [p for p in _processes_with(marker) if p.name() == "bash"]
    group = os.getpgid(main.pid)
    family = [main, *main.children(recursive=True)]
    assert len(family) == 3
    main.kill()      # what the OOM killer does: one process, not its group
    _, alive = psutil.wait_procs(family, timeout=15)
    assert alive == [], f"left running in group {group}: {[p.cmdline() for p in alive]}"
    status = _wait_for(lambda: (s := executor.status(job_id)).done and s, 15, "the job ended")
    assert status.stage == "ERROR" and "SIGKILL" in status.message, status


# ---- one malformed record is skipped and counted; it breaks no view and not the runs list

def _corrupt_run(ex: LocalExecutor, run_id: str) -> str:
    """A run with one good job and, in every file the panel reads, one malformed record of each kind."""
    from backend.runtime.layout import FragmentWriter, write_event

    job_id = ex.submit(_job(["true"], run_id=run_id))
    ex.wait(job_id, 30)
    run_dir = os.path.join(ex.bucket_root("local/b"), "runs", run_id)
    os.makedirs(run_dir, exist_ok=True)
    with open(os.path.join(run_dir, "spec.json"), "w") as f:
        json.dump({"mode": "colocated", "model": "m", "max_steps": 3}, f)
    FragmentWriter(os.path.join(run_dir, "metrics"), "trainer").write([{"step": 1, "reward": 0.5}])
    with open(os.path.join(run_dir, "metrics", "trainer-000001.jsonl"), "w") as f:
        f.write('{"step": "abc", "reward": 0.7}\n[1, 2]\n{"step": 2, "reward": 0.6}\n')
    write_event(run_dir, "trainer", "started", step=0)
    with open(os.path.join(run_dir, "events", "trainer-000001.jsonl"), "w") as f:
        f.write('"not an object"\n')
    with open(os.path.join(ex.home, "jobs", job_id, "resources.jsonl"), "a") as f:
        f.write('not json\n{"time": "later"}\n')
    bad_job = os.path.join(ex.home, "jobs", f"{run_id}--vllm-0--abcdef")
    os.makedirs(bad_job)
    with open(os.path.join(bad_job, "job.json"), "w") as f:
        f.write("{}")
    empty_job = os.path.join(ex.home, "jobs", f"{run_id}--vllm-1--abcdef")
    os.makedirs(empty_job)
    open(os.path.join(empty_job, "job.json"), "w").close()
    for folder in (bad_job, empty_job):
        with open(os.path.join(folder, "status.json"), "w") as f:
            f.write('{"stage": "COMPLETED"}')
    return job_id


def test_a_malformed_record_is_skipped_counted_and_breaks_neither_its_run_nor_another_nor_the_list(executor):
    from backend.runs import RunRegistry
    from backend.store import FolderStore
    from panel import dashboard

    good = executor.submit(_job(["true"], run_id="good"))
    executor.wait(good, 30)
    _corrupt_run(executor, "bad")
    registry = RunRegistry(executor, lambda b: FolderStore(executor.bucket_root(b)))
    assert {r.run_id for r in registry.list_runs()} == {"good", "bad"}
    view = registry.view("bad")
    view.refresh()
    assert [r["step"] for r in view.metrics] == [1, 2]
    assert [e["event"] for e in view.events] == ["started"]
    frame = dashboard.build_frame(view)
    assert "7 unreadable records" in frame.status, frame.status
    other = registry.view("good")
    other.refresh()
    assert "unreadable" not in dashboard.build_frame(other).status
