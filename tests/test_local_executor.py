"""LocalExecutor with real processes: a real tiny GRPO run, cancel, failure, timeout."""

import os
import sys
import time

import psutil
import pytest

from backend.executors.local import LocalExecutor
from backend.plan.jobspec import COMPLETED, ERROR, RUNNING, SCHEDULING, TERMINAL_STAGES, JobSpec, VolumeSpec
from backend.plan.spec import RunSpec
from backend.runs.registry import RunRegistry
from backend.runtime.trainer.common import latest_checkpoint
from backend.storage.store import FolderStore
from tests.fakehub import wait_until

pytestmark = pytest.mark.integration


def _job(command, timeout_s=60, role="trainer", run_id="t1"):
    return JobSpec(run_id=run_id, role=role, image="local", command=command, flavor="local", timeout_s=timeout_s,
                   volumes=(VolumeSpec("local/b", "/bucket"),), env={"OUT": f"/bucket/runs/{run_id}/out.txt"})


@pytest.fixture
def executor(tmp_path):
    ex = LocalExecutor(str(tmp_path / "home"), grace_s=3)
    yield ex
    ex.cancel_all()


def test_tiny_demo_runs_for_real_and_writes_metrics_adapters_and_final(executor):
    registry = RunRegistry(executor, lambda b: FolderStore(executor.bucket_root(b)))
    spec = RunSpec(max_steps=5, adapter_every=2, checkpoint_every=100)
    launched = registry.launch(spec)
    view = registry.view(spec.run_id)
    status = executor.wait(launched.job_ids["trainer"], timeout=300)
    view.refresh()
    assert status.stage == "COMPLETED", "\n".join(view.jobs["trainer"].logs)
    assert [r["step"] for r in view.metrics] == [1, 2, 3, 4, 5]
    assert all("reward" in r and "reward_std" in r and r["staleness_mean"] == 0 for r in view.metrics)
    versions = sorted(view.adapters.values(), key=lambda v: v.version)
    assert [v.version for v in versions][:2] == [1, 2] and len(versions) >= 2
    assert [v.step for v in versions][:2] == [2, 4]
    assert view.final_files and view.engine == "transformers (CPU)"
    assert any("step 5/5" in line for line in view.jobs["trainer"].logs)
    assert view.jobs["trainer"].resources, "the resource sampler recorded nothing"
    run_dir = os.path.join(executor.bucket_root(spec.bucket), "runs", spec.run_id)
    archived = os.path.join(run_dir, "code", "runtime", "trainer", "train.py")
    assert os.path.isfile(archived), "the code that ran is archived"
    assert [r.run_id for r in RunRegistry(executor, None).list_runs()] == [spec.run_id]


def test_volume_mount_path_is_mapped_to_the_local_bucket_folder(executor):
    os.makedirs(os.path.join(executor.bucket_root("local/b"), "runs", "t1"), exist_ok=True)
    job_id = executor.submit(_job(["bash", "-c", 'echo hello > "$OUT"; echo /bucket/runs/t1/x']))
    assert executor.wait(job_id, 30).stage == "COMPLETED"
    run = os.path.join(executor.bucket_root("local/b"), "runs", "t1")
    assert open(os.path.join(run, "out.txt")).read() == "hello\n"
    assert executor.read_logs(job_id, 0)[0] == [f"{run}/x"]


def test_cancel_stops_every_process_of_the_job(executor):
    # A parent with two children that ignore nothing: all three must be gone after cancel.
    script = "sleep 300 & sleep 300 & echo started; wait"
    job_id = executor.submit(_job(["bash", "-c", script]))
    deadline = time.time() + 10
    while time.time() < deadline and executor.read_logs(job_id, 0)[0] != ["started"]:
        time.sleep(0.1)
    parent = psutil.Process(executor.main_pid(job_id))
    family = [parent, *parent.children(recursive=True)]
    assert len(family) == 3
    executor.cancel(job_id)
    assert executor.wait(job_id, 15).stage == "CANCELED"
    _, alive = psutil.wait_procs(family, timeout=10)
    assert alive == []


def test_cancel_reaches_a_child_that_ignores_sigterm(executor):
    code = ("import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            "print('ready', flush=True); time.sleep(300)")
    job_id = executor.submit(_job([sys.executable, "-c", code]))
    deadline = time.time() + 10
    while time.time() < deadline and not executor.read_logs(job_id, 0)[0]:
        time.sleep(0.1)
    pid = executor.main_pid(job_id)
    executor.cancel(job_id)
    assert executor.wait(job_id, 20).stage == "CANCELED"
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def test_a_failing_job_ends_in_error_and_keeps_its_log(executor):
    job_id = executor.submit(_job([sys.executable, "-c", "print('about to fail'); raise SystemExit(3)"]))
    status = executor.wait(job_id, 30)
    assert status.stage == "ERROR" and "code 3" in status.message
    assert executor.read_logs(job_id, 0)[0] == ["about to fail"]
    assert os.path.getsize(executor.log_path(job_id)) > 0


def test_the_timeout_is_enforced(executor):
    job_id = executor.submit(_job(["sleep", "60"], timeout_s=1))
    status = executor.wait(job_id, 20)
    assert status.stage == "ERROR" and "timed out" in status.message


@pytest.fixture
def restarted_panel(executor):
    """`restarted_panel()`: a panel started over the executor's home after its jobs ran (shut down at the end)."""
    from tests.helpers import panel_factory

    with panel_factory(executor.home) as make:
        yield make


def _row(panel, run_id: str) -> dict:
    from panel.runs_list import RUNS_HEADERS

    return next(dict(zip(RUNS_HEADERS, row)) for row in panel.runs_table() if row[0] == run_id)


def test_a_timed_out_run_reads_timed_out_in_the_runs_list(executor, restarted_panel):
    timed_out = executor.submit(_job(["sleep", "60"], timeout_s=1, run_id="slow"))
    failed = executor.submit(_job(["false"], run_id="broken"))
    executor.wait(timed_out, 20)
    executor.wait(failed, 20)
    panel = restarted_panel()
    assert _row(panel, "slow")["status"] == "✗ timed out"
    assert _row(panel, "broken")["status"] == "✗ error", "a job that failed by itself did not time out"
    assert "slow" in [row[0] for row in panel.runs_table(status="failed")], "a timed-out run is one that failed"


def test_a_restarted_panel_knows_how_long_a_finished_local_run_took(executor, restarted_panel):
    from backend.runs.access import Visitor
    from panel import spend_view

    job_id = executor.submit(_job(["sleep", "3"], run_id="three-seconds"))
    assert executor.wait(job_id, 30).stage == "COMPLETED"
    panel = restarted_panel()
    assert _row(panel, "three-seconds")["status"] == "✓ completed"
    cost, _spec = panel.spend.cost(panel.local_runs, "three-seconds")     # what the runs list's time cell shows
    assert 3.0 <= cost.elapsed_s < 15.0, cost.elapsed_s
    # The run's header, as the dashboard draws it after a restart (its view has no logged step to date it by).
    cost, _, _ = spend_view.run_cost(panel, "three-seconds", Visitor(), panel.view("three-seconds"))
    header = spend_view.cost_markdown(cost, 0.0, [])
    assert header.startswith("**Time:** ") and not header.startswith(("**Time:** 0 s", "**Time:** 1 s")), header


def test_a_run_whose_only_job_record_is_broken_is_listed_as_unreadable(executor, restarted_panel):
    broken = executor.submit(_job(["true"], run_id="torn"))
    healthy = executor.submit(_job(["true"], run_id="fine"))
    executor.wait(broken, 20)
    executor.wait(healthy, 20)
    with open(os.path.join(executor.jobs_dir, broken, "job.json"), "w") as f:
        f.write('{"job_id": "torn--trainer--')            # torn mid-write
    panel = restarted_panel()
    row = _row(panel, "torn")
    assert "unreadable" in row["status"] and row["executor"] == "local", row
    assert _row(panel, "fine")["status"] == "✓ completed", "one bad record never breaks another run's row"
    with pytest.raises(KeyError, match="cannot be read"):
        panel.view("torn")
    assert panel.view("fine").run_id == "fine"


def test_a_listing_made_while_a_job_is_being_submitted_never_ends_that_job(executor, monkeypatch):
    """The panel lists jobs while others launch (seen in a sweep: a member's trainer ended as "no readable job.json"
    17 s after launch, and stayed so while it trained to its end). Listings are made at each step of the submit
    that touches the disk; none may show the job ended, and the job runs to its real end."""
    from backend.executors import local

    seen = []

    def listing():
        seen.extend((r.job_id, r.stage, executor.status(r.job_id).message) for r in executor.list_jobs())

    def listed_after(fn):
        def call(*args, **kwargs):
            listing()
            result = fn(*args, **kwargs)
            listing()
            return result
        return call

    monkeypatch.setattr(local.tempfile, "mkdtemp", listed_after(local.tempfile.mkdtemp))
    monkeypatch.setattr(local, "write_json", listed_after(local.write_json))
    job_id = executor.submit(_job(["true"], run_id="busy"))
    monkeypatch.undo()
    assert seen, "the submit was listed while it ran"
    assert not [s for s in seen if s[1] in TERMINAL_STAGES], seen
    assert executor.wait(job_id, 20).stage == COMPLETED
    assert [r.job_id for r in executor.list_jobs()] == [job_id], "nothing half-made is left beside it"
    assert os.listdir(executor.jobs_dir) == [job_id]


def test_a_job_folder_whose_record_comes_later_is_starting_then_read_and_an_unreadable_end_is_not_kept(executor):
    """A folder another writer makes before its job.json (the record is not yet there) is starting, not failed: a
    panel would otherwise raise "job failed" for a job about to run (seen: a synthetic run's folder, read between its
    two writes, showed ERROR for good). Older, it is failed as unreadable, and still read again once mended."""
    import json

    def live_record() -> dict:
        with open(os.path.join(executor.jobs_dir, live, "job.json")) as f:
            return json.load(f)

    live = executor.submit(_job(["sleep", "30"], run_id="live"))
    record = wait_until(lambda: (r := live_record()).get("pid") and r, 20)
    for job_id, age in (("later--trainer--aaaaaa", 0), ("mended--trainer--bbbbbb", 120)):
        folder = os.path.join(executor.jobs_dir, job_id)
        os.makedirs(folder)
        os.utime(folder, (time.time() - age, time.time() - age))
        before = executor.status(job_id)
        if age:
            assert before.stage == ERROR and "no readable job.json" in before.message, before
        else:
            assert before.stage == SCHEDULING, before
        with open(os.path.join(folder, "job.json"), "w") as f:
            json.dump({**record, "job_id": job_id}, f)        # the wrapper of `live` stands for this job's
        assert executor.status(job_id).stage == RUNNING, job_id


# What a vLLM server leaves in its temp dir: a `vllm_dist_<uuid>` file, and (serve_replica's) socket folder.
LEAVES_TEMP_FILES = ("import os, sys, tempfile, time; "
                     "tempfile.mkstemp(prefix='vllm_dist_'); tempfile.mkdtemp(prefix='vllm-rpc-'); "
                     "print(tempfile.gettempdir(), flush=True); time.sleep(float(sys.argv[1]))")


@pytest.mark.parametrize("ending", ["completed", "command killed", "cancelled", "timed out", "wrapper killed"])
def test_each_job_has_a_temp_dir_of_its_own_that_goes_when_it_ends(executor, tmp_path, monkeypatch, ending):
    system_tmp = tmp_path / "system-tmp"
    system_tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(system_tmp))       # the panel's own temp dir
    monkeypatch.setattr("tempfile.tempdir", None)        # read again from TMPDIR
    sleep = "0.5" if ending == "completed" else "60"
    job_id = executor.submit(_job([sys.executable, "-c", LEAVES_TEMP_FILES, sleep], timeout_s=3 if ending == "timed out"
                                  else 60))
    lines = wait_until(lambda: executor.read_logs(job_id, 0)[0], timeout=30, what="the job's first line")
    job_tmp = lines[0]
    assert os.path.dirname(job_tmp) == str(system_tmp) and len(os.listdir(job_tmp)) == 2, (job_tmp, lines)
    assert len(os.path.basename(job_tmp)) < 32, "room left for vLLM's socket paths (107 bytes at most)"
    if ending == "command killed":
        os.kill(executor.main_pid(job_id), 9)              # a replica killed from outside
    elif ending == "cancelled":
        executor.cancel(job_id)
    elif ending == "wrapper killed":
        wrapper = executor._job_record(job_id)["pid"]
        os.kill(wrapper, 9)
        wait_until(lambda: _gone(wrapper), timeout=10, what="the wrapper gone")
        executor.cancel(job_id)                            # stops what the dead wrapper left
    status = executor.wait(job_id, 60)
    assert status.done, status
    wait_until(lambda: not os.listdir(system_tmp), timeout=20, what=f"an empty temp dir after '{ending}'")


def test_a_missing_secret_is_refused_before_anything_starts(executor):
    from backend.executors.base import SubmitError

    job = JobSpec(run_id="t1", role="trainer", image="local", command=["true"], flavor="local", timeout_s=5,
                  secrets=("HF_TOKEN",))
    with pytest.raises(SubmitError, match="HF_TOKEN"):
        executor.submit(job)
    assert executor.list_jobs() == []


def test_a_fresh_executor_rebuilds_the_job_list_from_disk(executor):
    job_id = executor.submit(_job(["true"]))
    executor.wait(job_id, 10)
    again = LocalExecutor(executor.home)
    [record] = again.list_jobs()
    assert (record.job_id, record.run_id, record.role, record.stage, record.bucket) == (
        job_id, "t1", "trainer", "COMPLETED", "local/b")


def test_logs_are_read_from_a_cursor_and_tokens_are_masked(executor):
    token = "hf_" + "a" * 34
    job_id = executor.submit(_job(["bash", "-c", f"echo one; echo token={token}; printf 'partial'"]))
    executor.wait(job_id, 10)
    lines, cursor = executor.read_logs(job_id, 0)
    assert lines == ["one", "token=hf_***"], "the unfinished last line waits for its newline"
    assert executor.read_logs(job_id, cursor) == ([], cursor)


@pytest.mark.full   # tier 2 only (~120 s loaded)
def test_a_cancelled_run_resumes_from_its_last_checkpoint(executor):
    registry = RunRegistry(executor, lambda b: FolderStore(executor.bucket_root(b)))
    spec = RunSpec(max_steps=40, adapter_every=3, checkpoint_every=3)
    job_id = registry.launch(spec).job_ids["trainer"]
    view = registry.view(spec.run_id)
    run_dir = os.path.join(executor.bucket_root(spec.bucket), "runs", spec.run_id)
    _cancel_at_checkpoint(executor, job_id, run_dir, 6)
    view.refresh()
    steps_before = [r["step"] for r in view.metrics]
    assert steps_before and max(steps_before) < 40

    resumed_at = time.time()
    resumed = registry.resume(spec.run_id)
    assert resumed.job_ids["trainer"] != job_id
    assert executor.wait(resumed.job_ids["trainer"], 300).stage == "COMPLETED"
    view.refresh()
    log = "\n".join(view.jobs["trainer"].logs)
    resumed_from = int(log.split("resuming from", 1)[1].split("checkpoint-", 1)[1].split()[0].rstrip("/"))
    assert 6 <= resumed_from <= max(steps_before)
    new_steps = [r["step"] for r in view.metrics if r["time"] > resumed_at]
    assert min(new_steps) == resumed_from + 1 and max(new_steps) == 40, "the resumed trainer restarted at 0"
    assert view.final_files
    assert [r["step"] for r in view.metrics] == list(range(1, 41)), "a step logged twice is shown once"


def _cancel_at_checkpoint(executor, job_id: str, run_dir: str, step: int) -> None:
    """Cancel the run's trainer once checkpoint-`step` is complete, not merely created (at most 240 s): a run
    cancelled mid-save resumes from the checkpoint before (test_runtime_train covers that), which is right but not
    what these tests check."""
    deadline = time.time() + 240
    while time.time() < deadline and _checkpoint_step(latest_checkpoint(run_dir)) < step:
        time.sleep(0.5)
    executor.cancel(job_id)
    assert executor.wait(job_id, 30).stage == "CANCELED"


def _flat_runtime(code_dir: str) -> None:
    """Lay out `code_dir/runtime` as a panel from before runtime/'s sub-packages did: every module flat, its
    imports and `-m` strings naming flat modules (what such a panel uploaded with each run)."""
    import re
    import shutil

    from backend.runtime import RUNTIME_DIR

    packages = r"(?:trainer|serving|check|job)"
    target = os.path.join(code_dir, "runtime")
    shutil.rmtree(target)
    os.makedirs(target)
    for folder, dirs, names in os.walk(RUNTIME_DIR):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        for name in names:
            if name.endswith(".pyc") or (name == "__init__.py" and folder != RUNTIME_DIR):
                continue
            with open(os.path.join(folder, name), encoding="utf-8") as f:
                text = f.read()
            if name.endswith(".py"):
                text = re.sub(rf"from \.\.?{packages} import", "from . import", text)
                text = re.sub(rf"from \.\.?(?:{packages}\.)?", "from .", text)
                text = re.sub(rf"\bruntime\.{packages}\.", "runtime.", text)
            with open(os.path.join(target, name), "w", encoding="utf-8") as f:
                f.write(text)


@pytest.mark.full   # tier 2: a second trained run (~1-2 min)
def test_a_run_launched_before_the_sub_packages_resumes_on_its_own_flat_code(executor):
    """A run whose bucket holds the flat runtime/ of an older panel, cancelled and resumed by this one: its jobs
    name the modules that code has (`recipe.flat_code_job`), and it trains on to the end."""
    registry = RunRegistry(executor, lambda b: FolderStore(executor.bucket_root(b)))
    spec = RunSpec(max_steps=20, adapter_every=3, checkpoint_every=3)
    job_id = registry.launch(spec).job_ids["trainer"]
    run_dir = os.path.join(executor.bucket_root(spec.bucket), "runs", spec.run_id)
    _cancel_at_checkpoint(executor, job_id, run_dir, 3)
    _flat_runtime(os.path.join(run_dir, "code"))
    assert not os.path.exists(os.path.join(run_dir, "code", "runtime", "trainer"))

    submitted, submit = [], executor.submit
    executor.submit = lambda job, secrets=None: submitted.append(job) or submit(job, secrets)
    resumed = registry.resume(spec.run_id)
    assert [" ".join(job.command) for job in submitted if "runtime.train " in " ".join(job.command)], submitted
    assert executor.wait(resumed.job_ids["trainer"], 300).stage == "COMPLETED"
    view = registry.view(spec.run_id)
    view.refresh()
    log = "\n".join(view.jobs["trainer"].logs)
    assert "resuming from" in log, log[-2000:]
    assert max(r["step"] for r in view.metrics) == 20 and view.final_files


def _checkpoint_step(path):
    return int(path.rsplit("checkpoint-", 1)[1]) if path else 0


def test_the_mount_path_maps_only_the_runs_own_folder_not_paths_that_start_the_same_way(tmp_path):
    """With the bucket mounted at /srv, an interpreter living under /srv/... keeps its path; the run's folder
    /srv/runs/<id> becomes the local folder standing for the bucket."""
    import json as _json

    from backend.plan.jobspec import VolumeSpec

    executor = LocalExecutor(str(tmp_path))
    script = "import sys; print(sys.argv[1])"
    job = JobSpec(run_id="r9", role="trainer", image="local", flavor="local", timeout_s=60,
                  command=[sys.executable, "-c", script, "/srv/runs/r9/spec.json", "/srv/tools/python"],
                  env={"PYTHONPATH": "/srv/runs/r9/code"}, volumes=(VolumeSpec("local/b", "/srv"),))
    job_id = executor.submit(job)
    executor.wait(job_id, 60)
    record = _json.load(open(os.path.join(executor.jobs_dir, job_id, "job.json")))
    local_run = os.path.join(executor.bucket_root("local/b"), "runs", "r9")
    assert record["command"][3] == f"{local_run}/spec.json"
    assert record["command"][4] == "/srv/tools/python", "a path that merely starts with the mount path stays"
    assert executor.read_logs(job_id, 0)[0] == [f"{local_run}/spec.json"]


# What a vLLM server on CPU does at its start: load a CPU kernel through torch's compile cache (a trivial one here).
LOADS_A_CPU_KERNEL = ("import os, tempfile\n"
                      "from torch._inductor.codecache import CppPythonBindingsCodeCache as cache\n"
                      "kernel = cache.load_pybinding(['long'], 'extern \"C\" long kernel(long x) { return x + 1; }')\n"
                      "kernel(41)\n"
                      "print(sorted(os.listdir(tempfile.gettempdir())), flush=True)\n")


def test_a_job_loading_a_cpu_kernel_builds_no_precompiled_header_in_its_temp_dir(executor):
    """torch would build a ~150 MB header in the job's own temp dir at each start (and lose it with the job), though
    the kernels it serves are in the shared compile cache: local.py's NO_PRIVATE_HEADER_BUILD."""
    job_id = executor.submit(_job([sys.executable, "-c", LOADS_A_CPU_KERNEL], timeout_s=120))
    status = executor.wait(job_id, 150)
    lines = executor.read_logs(job_id, 0)[0]
    assert status.stage == "COMPLETED", lines[-20:]
    assert lines[-1] == "[]", f"left in the job's temp dir: {lines[-1]}"


def _gone(pid: int) -> bool:
    """The process has exited (reaped, or a zombie): it may vanish between any two looks, so vanishing is gone too."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True
