"""Faults a production run meets (a crash, an OOM kill, a panel restart, a recycled process id, a bad line), injected
into real local jobs: each test says what must still be true afterwards."""

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
import uuid

import psutil
import pytest

from backend.executors.local import LocalExecutor
from backend.plan.jobspec import JobSpec, VolumeSpec
from tests.fakehub import wait_until
from tests.helpers import free_port

pytestmark = [pytest.mark.integration, pytest.mark.full]

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


def _log(ex: LocalExecutor, job_id: str) -> list[str]:
    return ex.read_logs(job_id, 0)[0]


# ---- a job's processes and its final status do not depend on the panel that launched it

PANEL_SCRIPT = """
import sys
from backend.executors.local import LocalExecutor
from backend.plan.jobspec import JobSpec, VolumeSpec
from tests.fakehub import wait_until
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
    wait_until(lambda: not _processes_with(job_dir), 30, 0.1, "the job ended")
    # The machine restarted: nobody recorded how the job ended, and its process id now belongs to someone else.
    if os.path.exists(os.path.join(job_dir, "exit.json")):
        os.remove(os.path.join(job_dir, "exit.json"))
    with open(os.path.join(job_dir, "status.json"), "w") as f:      # what a panel of the old kind left
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
    status = wait_until(lambda: (s := executor.status(job_id)).done and s, 20, 0.1, "the job ended")
    took = time.monotonic() - started
    assert status.stage == "ERROR" and "timed out after 2 s" in status.message, status
    assert took < 30, f"a 2 s timeout was reported after {took:.1f} s (the job itself would end at 60 s)"
    assert _log(executor, job_id)[-1] == "got SIGTERM" or "got SIGTERM" in _log(executor, job_id)


def test_when_a_jobs_main_process_is_killed_no_process_of_its_group_survives(executor):
    marker = uuid.uuid4().hex
    job_id = executor.submit(_job(["bash", "-c", f"sleep 300 & sleep 300 & echo {marker}; wait"]))
    wait_until(lambda: _log(executor, job_id) == [marker], 15, 0.1, "the job started")
    [main] = [p for p in _processes_with(marker) if p.name() == "bash"]
    group = os.getpgid(main.pid)
    family = [main, *main.children(recursive=True)]
    assert len(family) == 3
    main.kill()      # what the OOM killer does: one process, not its group
    _, alive = psutil.wait_procs(family, timeout=15)
    assert alive == [], f"left running in group {group}: {[p.cmdline() for p in alive]}"
    status = wait_until(lambda: (s := executor.status(job_id)).done and s, 15, 0.1, "the job ended")
    assert status.stage == "ERROR" and "SIGKILL" in status.message, status


# ---- one malformed record is skipped and counted; it breaks no view and not the runs list

def _corrupt_run(ex: LocalExecutor, run_id: str) -> str:
    """A run with one good job and, in every file the panel reads, one malformed record of each kind."""
    from backend.runtime.layout import FragmentWriter
    from backend.runtime.records import write_event

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
    from backend.runs.registry import RunRegistry
    from backend.storage.store import FolderStore
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


# ---- real runs: cancel, resume, restart

def _registry(ex: LocalExecutor):
    from backend.runs.registry import RunRegistry
    from backend.storage.store import FolderStore

    return RunRegistry(ex, lambda bucket: FolderStore(ex.bucket_root(bucket)))


def _run_processes(ex: LocalExecutor, run_id: str) -> list[psutil.Process]:
    """Every live process of the run: in a process group or session one of its jobs recorded, or naming the run."""
    groups = set()
    for job_id in os.listdir(ex.jobs_dir):
        if job_id.startswith(f"{run_id}--"):
            for name in ("job.json", "process.json"):
                try:
                    groups.add(json.load(open(os.path.join(ex.jobs_dir, job_id, name)))["pid"])
                except (OSError, ValueError, KeyError):
                    pass
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        if proc.info["status"] == psutil.STATUS_ZOMBIE or proc.pid == os.getpid():
            continue
        try:
            in_group = os.getpgid(proc.pid) in groups
        except ProcessLookupError:
            continue
        if in_group or run_id in " ".join(proc.info["cmdline"] or []):
            found.append(proc)
    return found


def _logged(ex: LocalExecutor, job_id: str, text: str) -> bool:
    return any(text in line for line in _log(ex, job_id))


def _attempt(ex: LocalExecutor, job_id: str) -> int | None:
    """Which attempt of the job runs now, as its wrapper recorded it."""
    try:
        return json.load(open(os.path.join(ex.jobs_dir, job_id, "process.json"))).get("attempt")
    except (OSError, ValueError):
        return None


def _trainer_events(view) -> list[dict]:
    return [e for e in view.events if e.get("writer") == "trainer"]


def test_a_colocated_run_cancelled_and_resumed_reuses_no_version_name_and_keeps_every_attempt(executor):
    from backend.plan.spec import RunSpec
    from backend.runs.launch import LaunchError
    from backend.runs.resume import resume_plan
    from backend.runtime.trainer.common import latest_checkpoint
    from panel import adapters_table

    registry = _registry(executor)
    spec = RunSpec(max_steps=30, adapter_every=2, checkpoint_every=10)
    run_dir = os.path.join(executor.bucket_root(spec.bucket), "runs", spec.run_id)
    first = registry.launch(spec).job_ids["trainer"]
    view = registry.view(spec.run_id)
    wait_until(lambda: _logged(executor, first, "step 3/30"), 180, 0.1, "training started")
    view.refresh()
    with pytest.raises(LaunchError, match="still has running jobs"):
        resume_plan(view)

    wait_until(lambda: latest_checkpoint(run_dir), 180, 0.1, "a checkpoint was saved")
    registry.cancel(spec.run_id)
    # Within the wrapper's grace (40 s) and without its SIGKILL: the trainer ended on SIGTERM, as asked.
    wait_until(lambda: not _run_processes(executor, spec.run_id), 35, 0.1, "every process of the run ended")
    assert executor.wait(first, 10).stage == "CANCELED"
    assert not _logged(executor, first, "sending SIGKILL"), "the trainer ended on SIGTERM, not killed"
    os.makedirs(os.path.join(run_dir, "adapters", "trl-policy-v99"))     # a half-written copy: counts for nothing
    with open(os.path.join(run_dir, "adapters", "trl-policy-v99", "adapter_config.json"), "w") as f:
        f.write("{}")
    view.refresh()
    assert _trainer_events(view)[-1]["event"] == "canceled", "the trainer records that it was cancelled"
    plan = resume_plan(view)
    assert plan.checkpoint_step == int(latest_checkpoint(run_dir).rsplit("-", 1)[1]) >= 10
    assert plan.next_version == max(view.adapters) + 1 < 99
    assert f"resumes from checkpoint-{plan.checkpoint_step}" in plan.message
    second = registry.resume(spec.run_id).job_ids["trainer"]
    assert executor.wait(second, 300).stage == "COMPLETED", "\n".join(_log(executor, second)[-20:])

    view.refresh()
    published = [e["name"] for e in _trainer_events(view) if e["event"] == "adapter_published"]
    assert len(published) == len(set(published)), f"a version name was published twice: {published}"
    assert published[plan.next_version - 1] == f"trl-policy-v{plan.next_version}"
    supersedes = [e["names"] for e in _trainer_events(view) if e["event"] == "adapters_superseded"]
    assert supersedes == ([list(plan.superseded)] if plan.superseded else [])
    # The note column is there only where a version is superseded (an empty one took a fifth of the table's width).
    rows = {row[0]: row[6] for row in adapters_table.adapter_rows(view)} if plan.superseded else {}
    assert all(rows[name].startswith("superseded") for name in plan.superseded)
    assert set(view.jobs) == {"trainer", "trainer#1"} and view.stage == "COMPLETED"
    assert view.jobs["trainer#1"].status.stage == "CANCELED"
    assert any("step 3/30" in line for line in view.jobs["trainer#1"].logs), "the earlier attempt's log stays"
    with pytest.raises(LaunchError, match="finished"):
        resume_plan(view)

    fresh = _registry(LocalExecutor(executor.home)).view(spec.run_id)     # another panel, or a restarted one
    fresh.refresh()
    assert set(fresh.jobs) == set(view.jobs) and fresh.jobs["trainer#1"].job_id == first
    assert sorted(fresh.adapters) == sorted(view.adapters) and fresh.superseded == view.superseded


@pytest.fixture
def small_bucket(executor):
    """The local bucket on a 16 MiB tmpfs of its own (root ignores file modes, not a full disk)."""
    from tests.helpers import small_tmpfs

    with small_tmpfs(executor.bucket_root("local/grpo-runs"), "16m") as root:
        try:
            yield root
        finally:
            _stop_everything(executor.home)


def _fill(folder: str) -> None:
    # Unbuffered: a write refused for want of space leaves nothing pending for close() to write (and fail) again.
    with open(os.path.join(folder, "filler"), "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 65536)
                f.flush()
        except OSError:
            pass


def test_a_bucket_that_fills_up_is_reported_as_the_cause(executor, small_bucket):
    from backend.plan.spec import RunSpec
    from panel import dashboard

    registry = _registry(executor)
    spec = RunSpec(max_steps=200, adapter_every=2, checkpoint_every=1000)
    job_id = registry.launch(spec).job_ids["trainer"]
    wait_until(lambda: _logged(executor, job_id, "step 3/200"), 180, 0.1, "training started")
    _fill(small_bucket)
    status = executor.wait(job_id, 60)
    log_tail = "\n".join(_log(executor, job_id)[-15:])
    assert status.stage == "ERROR", log_tail
    assert "cannot write to the bucket: No space left on device" in status.message, (status, log_tail)
    view = registry.view(spec.run_id)
    view.refresh()
    assert "✗ Failed: **trainer: exited with code 1: training failed: cannot write to the bucket: No space left on " \
        "device" in dashboard.build_frame(view).status


# ---- the panel's exit

def _start_panel(home: str, sigint_ignored: bool = False) -> tuple[subprocess.Popen, str]:
    """`python app.py` on a free port; `sigint_ignored`: started as a background script starts it (SIGINT ignored)."""
    port = free_port()
    env = {**os.environ, "GRPO_PANEL_HOME": home, "PORT": str(port), "GRADIO_ANALYTICS_ENABLED": "False"}
    env.pop("SPACE_ID", None)
    os.makedirs(home, exist_ok=True)
    log = open(os.path.join(home, "app.log"), "wb")
    command = ["bash", "-c", f"trap '' INT; exec {shlex.quote(sys.executable)} app.py"] if sigint_ignored \
        else [sys.executable, "app.py"]
    proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    return proc, f"http://127.0.0.1:{port}"


def _launch_through(url: str, steps: int) -> str:
    """Press Launch with the default preset through the panel's own API (what the browser does)."""
    from gradio_client import Client

    client = Client(url, verbose=False)
    params = client.view_api(return_format="dict", print_info=False)["named_endpoints"]["/on_launch"]["parameters"]
    by_label = {p["label"]: p["parameter_name"] for p in params}
    message = client.predict(api_name="/on_launch", **{by_label["Steps"]: steps})[0]
    assert message.startswith("Launched run"), message
    return message.split("**")[1]


def test_the_panel_exits_alike_on_sigterm_and_sigint_and_its_local_runs_finish_with_their_true_status(tmp_path):
    # The SIGINT one is started as a script in the background starts it, with SIGINT ignored: Ctrl-C still stops it.
    panels = {sig: (str(tmp_path / sig.name), *_start_panel(str(tmp_path / sig.name), sig == signal.SIGINT))
              for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        for home, proc, url in panels.values():
            wait_until(lambda url=url, proc=proc: proc.poll() is not None or _answers(url), 180, 0.1,
                       "the panel answers")
            assert proc.poll() is None, open(os.path.join(home, "app.log")).read()
        runs = {sig: _launch_through(url, steps=20) for sig, (_, _, url) in panels.items()}
        for sig, (_, proc, _) in panels.items():
            proc.send_signal(sig)        # a container stop or a Space restart (SIGTERM); Ctrl-C (SIGINT)
        for sig, (home, proc, _) in panels.items():
            try:
                code = proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.send_signal(signal.SIGUSR1)         # the panel prints every thread's stack
                time.sleep(3)
                code = "still running"
            assert code == 0, f"{sig.name}: {code}\n" + open(os.path.join(home, "app.log")).read()[-12000:]
        for sig, (home, _, _) in panels.items():
            fresh = LocalExecutor(home)      # the next panel
            [job] = fresh.list_jobs()
            assert job.run_id == runs[sig]
            status = fresh.wait(job.job_id, 240)
            assert (status.stage, status.message) == ("COMPLETED", ""), f"after {sig.name}: {status}"
    finally:
        for home, proc, _ in panels.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            _stop_everything(home)


def _answers(url: str) -> bool:
    import urllib.request

    try:
        urllib.request.urlopen(url, timeout=2)
        return True
    except OSError:
        return False


@pytest.mark.xdist_group("vllm-servers")   # one vLLM test at a time (conftest: VLLM_SERVERS)
def test_a_distributed_run_takes_back_a_restarted_replica_and_trainer_then_survives_a_panel_restart_and_a_resume(
        executor, monkeypatch):
    from backend.plan.spec import RunSpec
    from backend.runs.resume import resume_plan
    from backend.runtime.tiny_model import TINY_MODEL
    from backend.runtime.trainer.common import latest_checkpoint
    from panel import dashboard, replicas_table

    monkeypatch.setenv("GRPO_HEARTBEAT_S", "2")             # the jobs inherit the panel's environment
    # Long enough for the trainer's own retry below to beat again (a local retry starts at once), short enough for
    # the replicas to stop soon after its last attempt.
    monkeypatch.setenv("GRPO_TRAINER_GONE_AFTER_S", "30")
    registry = _registry(executor)
    spec = RunSpec(mode="distributed", model=TINY_MODEL, rewards=["digits", "format"], replicas=2,
                   max_staleness=1, lora_r=8, max_steps=500, adapter_every=1, checkpoint_every=1,
                   per_device_batch_size=8, num_generations=4, max_completion_length=16, max_inflight_tasks=8,
                   queue_maxsize=32, max_tokens_per_batch=512, timeout_minutes=20, attempts=2)
    run_dir = os.path.join(executor.bucket_root(spec.bucket), "runs", spec.run_id)
    jobs = registry.launch(spec).job_ids
    view = registry.view(spec.run_id)

    def steps() -> int:
        view.refresh()
        return max((r["step"] for r in view.metrics), default=0)

    def published() -> list[str]:
        view.refresh()
        return [e["name"] for e in _trainer_events(view) if e["event"] == "adapter_published"]

    wait_until(lambda: steps() >= 1 and latest_checkpoint(run_dir), 480, 1, "a step and a checkpoint")

    # A replica dies (its whole process group): training goes on with the other one, and the run is degraded until
    # the replica's job has started it again (its second attempt) and the proxy has taken it back.
    first_replica = executor.main_pid(jobs["vllm-1"])
    os.killpg(first_replica, signal.SIGKILL)
    wait_until(lambda: steps() and view.degraded == "degraded (1/2 replicas)", 30, 0.1, "the run shows degraded")
    assert view.stage == "RUNNING"
    at_kill = steps()
    wait_until(lambda: steps() > at_kill, 180, 1, "training went on with one replica")
    rows = replicas_table.replica_rows(view)
    assert rows[1][1] == "DOWN" and rows[1][5] == "", rows
    assert "degraded (1/2 replicas)" in dashboard.build_frame(view).status
    wait_until(lambda: steps() and view.degraded is None, 480, 1, "the restarted replica taken back")
    assert executor.main_pid(jobs["vllm-1"]) != first_replica
    assert view.jobs["vllm-1"].status.message == "attempt 2 of 2"
    assert replicas_table.replica_rows(view)[1][1] == "up" and "vllm-1 taken back 1x after a restart" in view.retries
    assert "vllm-1 taken back 1x" in dashboard.build_frame(view).status

    # The trainer is OOM-killed: its job starts it again, and the retried trainer resumes from the bucket's newest
    # checkpoint by itself, numbering its versions on. (On a loaded machine its first attempt may have failed by
    # itself meanwhile, a sync that found no replica answering: then that was its retry.)
    if _attempt(executor, jobs["trainer"]) == 1:
        first_trainer = executor.main_pid(jobs["trainer"])
        os.kill(first_trainer, signal.SIGKILL)
        wait_until(lambda: _attempt(executor, jobs["trainer"]) == 2, 30, 0.1, "the trainer started again")
    wait_until(lambda: _logged(executor, jobs["trainer"], "resuming from"), 480, 1, "the retried trainer resumed")
    wait_until(lambda: steps() >= 0 and any(r.startswith("trainer retried at") and "(attempt 2)" in r
                                            for r in view.retries), 30, 0.1, "the header shows the trainer's retry")
    # Killed again, with no attempt left: no event; its leftovers and the live replica must stop.
    os.kill(executor.main_pid(jobs["trainer"]), signal.SIGKILL)
    wait_until(lambda: not _run_processes(executor, spec.run_id), 60, 1, "no process of the run is left")
    view.refresh()
    assert view.jobs["trainer"].status.stage == "ERROR" and "SIGKILL" in view.jobs["trainer"].status.message
    assert _logged(executor, jobs["vllm-0"], "no trainer heartbeat for")
    before = published()
    assert sorted(view.adapters) == list(range(1, len(before) + 1))

    # Another panel (or this one restarted) counts the same versions, though most serving copies are deleted.
    fresh = _registry(LocalExecutor(executor.home)).view(spec.run_id)
    fresh.refresh()
    assert sorted(fresh.adapters) == sorted(view.adapters)
    assert len(os.listdir(os.path.join(run_dir, ".vllm_lora"))) < len(view.adapters)

    # Its newest checkpoint was cut off mid-save: the resume starts a step earlier, so TRL, which numbers on from the
    # checkpoint's model_version, would publish names already published with other weights.
    newest = latest_checkpoint(run_dir)
    os.remove(os.path.join(newest, "trainer_state.json"))
    resumed_from = latest_checkpoint(run_dir)
    with open(os.path.join(resumed_from, "rollout_state.json")) as f:
        assert json.load(f)["model_version"] < len(before)
    plan = resume_plan(view)
    assert plan.checkpoint_step == int(resumed_from.rsplit("-", 1)[1])
    # A kill between a sync's rename and its event leaves a complete folder with no event: numbering goes past it.
    serving = os.path.join(run_dir, ".vllm_lora")
    on_disk = [int(m.group(1)) for name in os.listdir(serving) if (m := re.fullmatch(r"trl-policy-v(\d+)", name))
               and {"adapter_config.json", "adapter_model.safetensors"} <= set(os.listdir(os.path.join(serving, name)))]
    assert plan.next_version == max([len(before), *on_disk]) + 1 and plan.superseded, (plan, before, on_disk)
    resumed = registry.resume(spec.run_id).job_ids
    wait_until(lambda: len(published()) > len(before) + 1, 480, 1, "the resumed trainer published")
    assert published()[len(before)] == f"trl-policy-v{plan.next_version}"
    assert len(published()) == len(set(published())), f"a version name was published twice: {published()}"
    # (The retried attempt above may have superseded versions of its own: the resume's is the newest.)
    superseded = [e["names"] for e in _trainer_events(view) if e["event"] == "adapters_superseded"][-1]
    assert superseded == list(plan.superseded)

    # Cancel: every job at once, the trainer first (it records why), replicas drain within their grace.
    asked = time.monotonic()
    registry.cancel(spec.run_id)
    wait_until(lambda: not _run_processes(executor, spec.run_id), 45, 0.5, "every process of the run ended")
    took = time.monotonic() - asked
    view.refresh()
    assert {role: view.jobs[role].status.stage for role in resumed} == dict.fromkeys(resumed, "CANCELED")
    assert _trainer_events(view)[-1]["event"] == "canceled"
    assert not any(_logged(executor, job_id, "sending SIGKILL") for job_id in resumed.values())
    assert {"trainer#1", "vllm-0#1", "vllm-1#1"} <= set(view.jobs)
    assert view.jobs["trainer#1"].logs, "the crashed attempt's log stays reachable"
    print(f"cancel took {took:.1f} s")


def test_a_job_cancelled_the_moment_it_was_submitted_ends_canceled(executor):
    job_id = executor.submit(_job(["sleep", "60"]))
    executor.cancel(job_id)
    status = executor.wait(job_id, 20)
    assert (status.stage, status.message) == ("CANCELED", "canceled by the user")
    assert not _processes_with(os.path.join(executor.jobs_dir, job_id))
