"""Launches a panel never finished, cancel by the record, failures said with nobody watching: real panel processes
(killed with SIGKILL part way), the real huggingface_hub against the loopback fake Hub, real local jobs."""

import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from backend.runtime import records
from backend.storage.journal import LAUNCH_FILE, LAUNCHING, ROLLED_BACK, STOPPED_DURING_LAUNCH, LaunchJournal
from panel import dashboard
from tests.fakehub import FakeHub, FakeUser, wait_until

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ALICE = "hf_oauth_aliceToken000000000000"
FORM = {"executor": "hf_jobs", "model": "Qwen/Qwen2.5-0.5B-Instruct", "dataset": "trl-lib/DeepMath-103K",
        "bucket": "alice/grpo-runs", "flavor": "a10g-small", "use_vllm": True, "rewards": ["format"],
        "mode": "distributed", "replicas": 1, "vllm_flavor": "l4x1"}

pytestmark = [pytest.mark.integration,
              pytest.mark.fake_hub(users={ALICE: FakeUser("alice")}), pytest.mark.panel_settings(budget_check_s=0)]


# A panel process of its own on the fake Hub (the real client; bucket bytes through the fake's test routes): it
# previews and launches FORM, printing the run id first.
PANEL_PROCESS = textwrap.dedent("""
    import json, os, sys
    sys.path.insert(0, os.getcwd())
    from tests.fakehub import install_remote_bucket_transfers
    install_remote_bucket_transfers(os.environ["HF_ENDPOINT"])
    from panel.actions import Panel, Settings
    panel = Panel(Settings(home=sys.argv[1], on_space=False, host="127.0.0.1", budget_check_s=0))
    form = json.loads(sys.argv[2])
    shown = panel.preview(form)
    print("RUN", shown.run_id, flush=True)
    print(panel.launch(form, confirmed=shown.fingerprint, run_id=shown.run_id).message, flush=True)
""")


def _start_panel_process(hub: FakeHub, home: str, form: dict) -> subprocess.Popen:
    env = {**os.environ, "HF_ENDPOINT": hub.url, "HF_TOKEN": ALICE, "GRPO_PANEL_HOME": home,
           "GRPO_PANEL_DATASETS_SERVER": hub.url}
    env.pop("SPACE_ID", None)
    return subprocess.Popen([sys.executable, "-c", PANEL_PROCESS, home, json.dumps(form)], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)


def _run_jobs(hub: FakeHub, run_id: str) -> dict[str, str]:
    """role -> stage of every job the fake Hub holds for the run."""
    return {job.spec["labels"]["grpo-panel-role"]: job.stage for job in hub.jobs.values()
            if job.spec["labels"].get("grpo-panel-run") == run_id}


def test_a_panel_killed_between_submissions_leaves_nothing_billing_after_a_restart(hub, make_panel, tmp_path):
    home = str(tmp_path / "home")
    arrived, release = hub.hold_nth_job_submission(2)      # the trainer's: the replica exists by then
    proc = _start_panel_process(hub, home, FORM)
    try:
        wait_until(lambda: arrived.is_set() or proc.poll() is not None, 240, what="the trainer's submission")
        assert arrived.is_set(), proc.communicate(timeout=5)[0]
        os.killpg(proc.pid, signal.SIGKILL)          # the panel dies with the trainer's submission in flight
        proc.wait(30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
    run_id = next(line.split()[1] for line in proc.stdout.read().splitlines() if line.startswith("RUN "))
    [record] = LaunchJournal(home).records()
    assert record["state"] == LAUNCHING and record["planned"] == ["vllm-0", "trainer"]
    assert list(record["jobs"]) == ["vllm-0"], "the replica's id was recorded as it was created"
    bucket_copy = json.loads(hub.buckets["alice/grpo-runs"].files[f"runs/{run_id}/{LAUNCH_FILE}"].data)
    assert bucket_copy["jobs"] == record["jobs"] and bucket_copy["state"] == LAUNCHING
    release.set()               # the Hub finishes the request anyway: a trainer nobody recorded
    wait_until(lambda: len(_run_jobs(hub, run_id)) == 2, 30, what="the held submission created its job")
    assert set(_run_jobs(hub, run_id).values()) == {"SCHEDULING"}, "both bill until someone cancels them"

    panel = make_panel()        # the next panel on the home: rolls the launch back as it starts
    wait_until(lambda: set(_run_jobs(hub, run_id).values()) == {"CANCELED"}, 60,
               what=f"every job of the half-launched run cancelled: {_run_jobs(hub, run_id)}")
    wait_until(lambda: LaunchJournal(home).get(run_id)["state"] == ROLLED_BACK, 30, what="the record closed")
    view = panel.view(run_id)
    wait_until(lambda: view.refresh() or any(e.get("event") == records.LAUNCH_FAILED for e in view.events), 30,
               what="the launch_failed event")
    [failed] = [e for e in view.events if e.get("event") == records.LAUNCH_FAILED]
    assert STOPPED_DURING_LAUNCH in failed["message"] and record["jobs"]["vllm-0"] in failed["known"]
    frame = dashboard.build_frame(view)
    assert view.stage == "ERROR" and STOPPED_DURING_LAUNCH in frame.status, frame.status
    [row] = [row for row in panel.runs_table() if row[0] == run_id]
    assert "error" in row[2], row
    assert panel.watch.recover_launches() == [], "rolled back once"


def test_cancel_at_once_after_a_restart_with_a_lagging_listing_cancels_every_job_on_the_first_press(hub, make_panel):
    first = make_panel()
    shown = first.preview(FORM)
    launched = first.launch(FORM, confirmed=shown.fingerprint, run_id=shown.run_id)
    assert launched.run_id, launched.message
    first.shutdown()
    hub.list_lag_s = 3600.0        # the Hub's job list has not caught up with the run's jobs (an hour, to be sure)
    for job in hub.jobs.values():
        job.listed_from = float("inf")
    restarted = make_panel()
    message = restarted.cancel(launched.run_id)
    assert "no run" not in message, message
    assert set(_run_jobs(hub, launched.run_id).values()) == {"CANCELED"}, (message, _run_jobs(hub, launched.run_id))


def _alert_events(store, run_id: str) -> list[dict]:
    from backend.runtime import layout

    found = []
    for f in store.list_files(f"runs/{run_id}/events"):
        events, _ = layout.fragment_records(store.read_bytes(f.path))
        found += [e for e in events if e and e.get("event") == records.ALERT]
    return found


@pytest.mark.full   # tier 2 only (~45 s loaded)
def test_a_colocated_run_whose_trainer_is_killed_alerts_once_with_no_dashboard_open(tmp_path):
    from panel.actions import Panel, Settings
    from tests.test_alerts import Webhook

    home, hook = str(tmp_path / "home"), Webhook()

    def start_panel() -> Panel:
        panels.append(Panel(Settings(home=home, on_space=False, host="127.0.0.1", budget_check_s=1)))
        return panels[-1]

    panels: list[Panel] = []
    try:
        result = start_panel().launch({"max_steps": 5000, "adapter_every": 1000, "checkpoint_every": 1000},
                                      webhook=hook.url)
        assert result.run_id, result.message
        panels[0].shutdown()          # the panel that launched it (and holds its view) goes: nobody watches the run
        watching = start_panel()
        run_id, local = result.run_id, watching.local
        [job] = local.list_jobs(run_id=run_id)
        wait_until(lambda: any("step 3/" in line for line in local.read_logs(job.job_id, 0)[0]), 180,
                   what="the trainer training")
        os.killpg(os.getpgid(local.main_pid(job.job_id)), signal.SIGKILL)
        assert local.wait(job.job_id, 60).stage == "ERROR"
        wait_until(lambda: hook.bodies, 60, what="the failed run's webhook post")
        assert watching.runs.local.open_view(run_id) is None, "no dashboard had the run open"
        watching.shutdown()
        restarted = start_panel()
        store = restarted.runs.local.store_for("local/grpo-runs")
        before = restarted.watch._last_look
        wait_until(lambda: restarted.watch._last_look > before + 2, 60, what="two looks of the restarted panel")
        [body] = hook.bodies
        assert body["alert"]["key"] == "job-error-trainer" and run_id in body["text"], body
        [event] = _alert_events(store, run_id)
        assert event["key"] == "job-error-trainer", event
    finally:
        for panel in panels:
            panel.shutdown()
        hook.stop()


# A task check on a panel that serves others, whose reward code takes its time: the check job runs until stopped.
CHECK_PROCESS = textwrap.dedent("""
    import json, os, sys
    sys.path.insert(0, os.getcwd())
    from tests.fakehub import install_remote_bucket_transfers
    install_remote_bucket_transfers(os.environ["HF_ENDPOINT"])
    from panel.actions import Panel, Settings
    panel = Panel(Settings(home=sys.argv[1], on_space=False, host="0.0.0.0", allow_host_token=True,
                           budget_check_s=0))
    print(panel.check_task(json.loads(sys.argv[2])).errors, flush=True)
""")
SLOW_CHECK = {"executor": "hf_jobs", "model": "builtin:tiny-qwen2", "dataset": "builtin:count-to-ten",
              "rewards": [], "bucket": "alice/grpo-runs", "flavor": "cpu-basic",
              "reward_code": "def slow(completions, **kwargs):\n    import time\n    time.sleep(900)\n"
                             "    return [0.0] * len(completions)\n"}


def _check_jobs(hub: FakeHub) -> dict[str, str]:
    return {job.id: job.stage for job in hub.jobs.values()
            if job.spec["labels"].get("grpo-panel-role") == "task-check"}


def _staged(hub: FakeHub) -> list[str]:
    return [p for p in hub.buckets.get("alice/grpo-runs").files if p.startswith("checks/")] \
        if "alice/grpo-runs" in hub.buckets else []


def test_a_killed_panels_check_job_is_cancelled_and_its_folder_removed_at_the_next_start(hub, tmp_path):
    from panel.actions import Panel, Settings

    home = str(tmp_path / "home")
    env = {**os.environ, "HF_ENDPOINT": hub.url, "HF_TOKEN": ALICE, "GRPO_PANEL_DATASETS_SERVER": hub.url}
    env.pop("SPACE_ID", None)
    proc = subprocess.Popen([sys.executable, "-c", CHECK_PROCESS, home, json.dumps(SLOW_CHECK)], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        wait_until(lambda: "RUNNING" in _check_jobs(hub).values() or proc.poll() is not None, 240,
                   what="the check job running")
        assert proc.poll() is None, proc.communicate(timeout=5)[0]
        os.killpg(proc.pid, signal.SIGKILL)          # the panel dies mid-check
        proc.wait(30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
    [job_id] = _check_jobs(hub)
    assert _check_jobs(hub)[job_id] == "RUNNING" and _staged(hub), "the check bills on, its folder stays"
    panel = Panel(Settings(home=home, on_space=False, host="0.0.0.0", allow_host_token=True, budget_check_s=0))
    try:
        wait_until(lambda: _check_jobs(hub)[job_id] == "CANCELED" and not _staged(hub), 60,
                   what=f"the check job cancelled and its folder removed: {_check_jobs(hub)}, {_staged(hub)[:3]}")
    finally:
        panel.shutdown()


# ---- a full disk in the panel's home

@pytest.fixture
def small_home(tmp_path):
    """The panel's home on a 32 MiB tmpfs of its own (root ignores file modes, not a full disk)."""
    from tests.helpers import small_tmpfs

    with small_tmpfs(str(tmp_path / "home"), "32m") as home:
        try:
            yield home
        finally:
            from backend.executors.local import LocalExecutor

            executor = LocalExecutor(home)
            for job in executor.list_jobs():
                executor.cancel(job.job_id)


def _fill(folder: str, leave: int = 0) -> str:
    """Fill the disk holding `folder`, leaving about `leave` bytes free; the filler's path."""
    path = os.path.join(folder, "filler")
    with open(path, "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 65536)
        except OSError:
            pass
    if leave:
        os.truncate(path, max(0, os.path.getsize(path) - leave))
    return path


def test_a_launch_without_room_says_so_in_one_sentence_and_leaves_nothing_behind(small_home):
    from panel.actions import Panel, Settings

    panel = Panel(Settings(home=small_home, on_space=False, host="127.0.0.1", budget_check_s=0))
    try:
        panel.local_runs.store_for("local/grpo-runs").ensure_bucket()
        _fill(small_home, leave=200_000)      # room for a few files of the runtime, not for all of them
        result = panel.launch({"max_steps": 20})
        assert result.run_id is None, result.message
        assert "the disk is full (No space left on device" in result.message, result.message
        assert "No job was submitted, and nothing was left in the bucket." in result.message, result.message
        assert "Errno" not in result.message and "[(" not in result.message, "one sentence, not the copy's list"
        bucket = panel.local.bucket_root("local/grpo-runs")
        assert os.listdir(os.path.join(bucket, "runs")) == [], "no half-copied run folder"
        assert panel.local.list_jobs() == []
    finally:
        panel.shutdown()


def test_a_job_that_fills_the_disk_says_so_as_the_cause(small_home):
    from backend.executors.local import LocalExecutor
    from backend.plan.jobspec import JobSpec, VolumeSpec
    from backend.runtime.job.job_wrapper import DISK_FULL

    executor = LocalExecutor(small_home)
    fill = ("import os, sys\nf = open(os.path.join(sys.argv[1], 'filler'), 'wb', buffering=0)\n"
            "try:\n    [f.write(bytes(65536)) for _ in iter(int, 1)]\n"
            "except OSError as e:\n    print('disk full:', e, flush=True)\nsys.exit(1)\n")
    job = JobSpec(run_id="full", role="trainer", image="local", command=[sys.executable, "-c", fill, small_home],
                  flavor="local", timeout_s=120, volumes=(VolumeSpec("local/b", "/bucket"),))
    job_id = executor.submit(job)
    status = executor.wait(job_id, 60)
    assert status.stage == "ERROR" and status.message.startswith(DISK_FULL), status
    assert "was the machine restarted" not in status.message


def test_the_orphan_finder_lists_half_launched_runs_replicas_without_a_trainer_and_check_jobs_left_over(
        hub, make_panel):
    import time

    from backend.plan.jobspec import CHECK_APP_LABEL, LABEL_APP, JobSpec, VolumeSpec
    from backend.runs.orphans import find_orphans

    registry = make_panel().runs.hub_registry(ALICE, "alice")
    hub.check_runner.stop()           # the check job below stays as the test makes it (it runs nothing)
    registry.store_for("alice/grpo-runs").ensure_bucket()

    def submit(run_id: str, role: str, **labels) -> str:
        job = JobSpec(run_id=run_id, role=role, image="img", command=["sleep", "1"], flavor="cpu-basic",
                      timeout_s=3600, volumes=(VolumeSpec("alice/grpo-runs", "/bucket"),), labels=labels)
        return registry.executor.submit(job)

    hub.clock = lambda: time.time() - 600           # created ten minutes ago
    lonely = submit("r-lonely", "vllm-0")
    served = submit("r-served", "vllm-0")
    check = submit("check-0123456789ab", "task-check", **{LABEL_APP: CHECK_APP_LABEL})
    fleet = submit("sweep-served", "vllm-0")        # a sweep's shared fleet: its trainers are its members'
    unserved = submit("sweep-unserved", "vllm-0")
    hub.clock = time.time
    trainer = submit("r-served", "trainer")
    member = submit("r-m1", "trainer")
    stalled = submit("r-stalled", "vllm-0")
    for run_id in ("r-lonely", "r-served", "r-stalled", "r-m1"):
        hub.put_file("alice/grpo-runs", f"runs/{run_id}/spec.json", b"{}")
    for run_id, members in (("sweep-served", ["r-m0", "r-m1"]), ("sweep-unserved", ["r-u0", "r-u1"])):
        hub.put_file("alice/grpo-runs", f"runs/{run_id}/fleet.json", json.dumps(
            {"sweep_id": run_id, "members": dict(zip(("m0", "m1"), members))}).encode())
    hub.put_file("alice/grpo-runs", f"runs/r-stalled/{LAUNCH_FILE}", json.dumps(
        {"id": "r-stalled", "state": LAUNCHING, "planned": ["vllm-0", "trainer"], "jobs": {"vllm-0": stalled},
         "updated": time.time() - 600}).encode())
    found = {o.record.job_id: o.why for o in find_orphans(registry)}
    assert set(found) == {lonely, stalled, check, unserved}, found
    assert "no trainer was submitted for it" in found[lonely]
    assert "no member's trainer was submitted for it" in found[unserved]
    assert fleet not in found and member not in found, "a fleet serving a live member's trainer is no orphan"
    assert "launch never completed" in found[stalled] and f"vllm-0 {stalled}" in found[stalled]
    assert "checks/check-0123456789ab is gone" in found[check]
    assert served not in found and trainer not in found


def test_a_replica_that_never_hears_a_trainer_gives_up_within_minutes(monkeypatch):
    from backend.runtime.job.heartbeat import HeartbeatWatch

    monkeypatch.delenv("GRPO_TRAINER_FIRST_BEAT_S", raising=False)
    now = [0.0]
    watch = HeartbeatWatch("/nonexistent", clock=lambda: now[0])
    now[0] = 9 * 60.0
    assert watch.gone() is None, "a trainer still installing has its minutes"
    now[0] = 10 * 60.0 + 1
    assert watch.gone() == "no trainer heartbeat within 600 s", "not half an hour"
