"""Runs on a real Ray cluster (one node, started on this machine for this module): from the browser, the tiny demo
and the tiny distributed preset; a killed replica leaves the run degraded; a restarted panel finds the runs through
Ray's job list; Cancel stops every job. And what Ray shows of a job (metadata, entrypoint, runtime_env, its
dashboard's job list) never holds a secret the job was given.
"""

import contextlib
import hashlib
import json
import os
import re
import signal
import time
import urllib.error
import urllib.request

import psutil
import pytest
from browser_helpers import CHROMIUM, field_box, keep_value, panel_page, pick_run, running_panel, text_of, wait_for_text
from playwright.sync_api import expect
from ray_cluster import ray_cluster

pytest.importorskip("ray.job_submission")
pytestmark = [pytest.mark.browser, pytest.mark.full,
              pytest.mark.skipif(not os.path.exists(CHROMIUM), reason="Debian chromium is not installed")]

HOST_TOKEN = "hf_" + "rayhosttoken" + "A" * 25    # the panel's own token: Ray jobs must never get it
JOB_SECRET = "hf_" + "rayjobsecret" + "B" * 25
DEMO_STEPS = 20            # the preset's adapter_every: one version, the final one (40 only trained a second)


@pytest.fixture(scope="module")
def cluster():
    with ray_cluster(num_cpus=4) as address:
        yield address


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    """The folder every node of the cluster (one here) and the panel see at the same path."""
    return str(tmp_path_factory.mktemp("cluster-shared"))


def _ray_jobs(address: str) -> list:
    from ray.job_submission import JobSubmissionClient

    return JobSubmissionClient(address).list_jobs()


def _stages(address: str, run_id: str) -> dict[str, str]:
    return {j.metadata["grpo-panel-role"]: str(j.status) for j in _ray_jobs(address)
            if (j.metadata or {}).get("grpo-panel-run") == run_id}


def _dashboard_jobs(address: str) -> str:
    with urllib.request.urlopen(f"{address}/api/jobs/", timeout=10) as answer:
        return answer.read().decode()


def _open(page, section: str, field: str) -> None:
    if not field_box(page, field).is_visible():
        page.get_by_text(section, exact=True).click()
        field_box(page, field).wait_for(state="visible", timeout=30000)


def _http_status(method: str, url: str) -> int:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, method=method, data=b"" if method == "POST" else None),
                                    timeout=10) as answer:
            return answer.status
    except urllib.error.HTTPError as err:
        return err.code


def _form(page, preset: str, mount: str, steps: int) -> None:
    page.get_by_role("tab", name="Launch").click()
    page.locator("#preset input").first.click()
    page.get_by_role("option", name=preset).click()
    page.wait_for_function("(p) => document.querySelector('#preset input').value === p", arg=preset, timeout=30000)
    page.locator("#f-executor").get_by_text("ray", exact=True).click()
    _open(page, "Hardware and storage", "mount_path")
    keep_value(page, field_box(page, "mount_path"), mount, "#f-mount_path")
    _open(page, "GRPO training", "max_steps")
    keep_value(page, field_box(page, "max_steps"), steps, "#f-max_steps")


def _launch(page) -> str:
    page.locator("#launch-btn").click()
    message = wait_for_text(page, "launch-msg", "launched", 180000)
    found = re.search(r"Launched run \*?\*?(\S+?)\*?\*? ", message)
    assert found, message
    return found.group(1)


@contextlib.contextmanager
def _shot_on_failure(page, home, name: str):
    """A full-page screenshot in the panel's home when the block fails (the test's report is not written yet)."""
    try:
        yield
    except BaseException:
        with contextlib.suppress(Exception):
            page.screenshot(path=os.path.join(str(home), f"{name}.png"), full_page=True)
        raise


def _processes_of(run_id: str) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        if any(run_id in arg for arg in proc.info["cmdline"] or []) and proc.status() != psutil.STATUS_ZOMBIE:
            found.append(proc)
    return found


def _wait(condition, timeout: float, what: str, interval: float = 0.5):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def _panel(cluster: str, home, request, name: str):
    """The panel as a process with RAY_ADDRESS set (and a host token, which Ray jobs must never get), and a page on
    it that waits long for a click: a CI machine shared with other work can stall the browser for a while."""
    stack = contextlib.ExitStack()
    url = stack.enter_context(running_panel("app.py", {"RAY_ADDRESS": cluster, "HF_TOKEN": HOST_TOKEN}, home,
                                            unset=("SPACE_ID",)))
    page = stack.enter_context(panel_page(url, home, request))
    stack.enter_context(_shot_on_failure(page, home, name))
    page.set_default_timeout(120000)
    return stack, page


def test_the_tiny_demo_runs_on_a_ray_cluster_from_the_browser(cluster, shared, tmp_path, request):
    home = tmp_path / "panel"
    stack, page = _panel(cluster, home, request, "demo")
    with stack:
        # Bad input first: a mount path that is a file, replicas asking for GPUs a CPU cluster lacks. Refused by
        # field, and nothing reaches the cluster.
        _form(page, "Tiny distributed (CPU, 2 vLLM replicas)", os.path.join(shared, "not-a-folder"), 200)
        open(os.path.join(shared, "not-a-folder"), "w").close()
        page.locator("#launch-btn").click()
        refused = wait_for_text(page, "launch-msg", "nothing was launched")
        assert "(mount_path): this panel cannot write" in refused, refused
        assert "(vllm_flavor): 'l4x1' asks for 1 GPU(s) a job, but no node of the cluster has more than 0: pick " \
               "ray-cpu" in refused, refused
        assert [j for j in _ray_jobs(cluster) if (j.metadata or {}).get("grpo-panel")] == []

        # The tiny demo, 20 steps (one version: its final adapter), on the cluster: previewed as the `ray job
        # submit` it is.
        _form(page, "Tiny reward-hacking demo (CPU)", shared, DEMO_STEPS)
        page.locator("#preview-btn").click()
        preview = wait_for_text(page, "launch-msg", "job\\(s\\) of run", 60000)
        assert "ray job submit --address " + cluster in preview and "--entrypoint-num-gpus 0" in preview, preview
        assert "runtime.job.job_wrapper" in preview and HOST_TOKEN not in preview
        demo = _launch(page)
        pick_run(page, demo, 60000)
        wait_for_text(page, "run-status", "final adapter ready", 420000)
        wait_for_text(page, "run-status", "trainer: COMPLETED", 120000)    # it exits a moment after writing final/
        assert f"step {DEMO_STEPS}/{DEMO_STEPS}" in page.locator("#log-box textarea").input_value()
        # Resource samples from the in-job sampler, as on the other executors.
        util = page.evaluate("() => { const el = document.querySelector('#util-plot .js-plotly-plot');"
                             "return el && el.data ? el.data.map(d => d.name + ':' + d.x.length) : []; }")
        assert any(name.startswith("trainer CPU:") and int(name.rsplit(":", 1)[1]) > 0 for name in util), util
    assert HOST_TOKEN not in _dashboard_jobs(cluster) + repr(_ray_jobs(cluster))


def test_a_distributed_run_on_ray_degrades_survives_a_panel_restart_and_is_cancelled(cluster, shared, tmp_path,
                                                                                       request):
    stack, page = _panel(cluster, tmp_path / "panel", request, "distributed")
    with stack:
        # The tiny distributed preset, its replicas on CPU: a run long enough to lose a replica on the way.
        _form(page, "Tiny distributed (CPU, 2 vLLM replicas)", shared, 200)
        _open(page, "Distributed (async GRPO)", "vllm_flavor")
        field_box(page, "vllm_flavor").click()
        # With Ray picked, the hardware lists offer the cluster's flavors only (an HF Jobs one would not run here).
        page.get_by_role("option", name=re.compile(r"^ray-1gpu · ")).wait_for(timeout=30000)
        expect(page.get_by_role("option", name=re.compile(r"^(a10g-small|cpu-basic) · "))).to_have_count(0)
        page.get_by_role("option", name=re.compile(r"^ray-cpu · ")).click()
        page.wait_for_function("() => document.querySelector('#f-vllm_flavor input')?.value.startsWith('ray-cpu')")
        distributed = _launch(page)
        pick_run(page, distributed, 60000)
        # Both replicas joined the proxy (the trainer's engine line says so) before one dies.
        wait_for_text(page, "run-status", r"2/2 healthy at start", 600000)
        # A replica dies (its whole process group): the run goes on, degraded, as on the other executors.
        jobs = {j.metadata["grpo-panel-role"]: j for j in _ray_jobs(cluster)
                if (j.metadata or {}).get("grpo-panel-run") == distributed}
        assert set(jobs) == {"trainer", "vllm-0", "vllm-1"}
        with open(os.path.join(jobs["vllm-1"].metadata["grpo-panel-job-dir"], "process.json")) as f:
            pid = json.load(f)["pid"]
        with contextlib.suppress(ProcessLookupError):   # a machine short of memory may have killed it already
            os.killpg(pid, signal.SIGKILL)
        wait_for_text(page, "run-status", r"degraded \(1/2 replicas\)", 60000)
        # The replicas listen on every interface of their node, so they answer only their trainer: the run's key, a
        # job secret, on every route but /health. The trainer has it: a version it published reached the live replica.
        wait_for_text(page, "adapters-table", r"vllm-0", 120000)
        live = re.findall(r"http://[\d.]+:\d+", text_of(page, "replicas-table"))[0]     # rows in replica order
        for method, path in (("GET", "/v1/models"), ("POST", "/pause"), ("POST", "/v1/load_lora_adapter")):
            assert _http_status(method, f"{live}{path}") == 401, (method, path)
        assert _http_status("GET", f"{live}/health") == 200
        # The proxy's view says degraded first; the job's own status follows once Ray has seen it end.
        wait_for_text(page, "run-status", "vllm-1: ERROR", 60000)

    # The jobs keep running on the cluster while no panel runs. A new panel, with a home of its own (no local record
    # of the run), finds the run through Ray's job list, and its Cancel stops every job.
    stack, page = _panel(cluster, tmp_path / "another-panel", request, "restarted")
    with stack:
        page.get_by_role("tab", name="Runs").click()
        table = wait_for_text(page, "runs-table", re.escape(distributed), 60000)
        assert "tiny-distributed" in table, table
        pick_run(page, distributed, 60000)
        page.locator("#cancel-btn").click()
        wait_for_text(page, "action-msg", "cancel", 30000)
        _wait(lambda: all(str(s) in ("STOPPED", "FAILED", "SUCCEEDED") for s in _stages(cluster, distributed).values()),
              90, "every Ray job of the cancelled run ended")
        assert set(_stages(cluster, distributed)) == {"trainer", "vllm-0", "vllm-1"}
        _wait(lambda: not _processes_of(distributed), 30, "no process of the run is left")
        status = wait_for_text(page, "run-status", "trainer: CANCELED", 30000)
        assert "vllm-0: CANCELED" in status, status


def test_a_secret_reaches_its_job_and_nothing_ray_shows(cluster, shared):
    from backend.executors.ray import RayExecutor
    from backend.plan.jobspec import JobSpec, VolumeSpec
    from backend.runtime import RUNTIME_DIR
    from backend.storage.store import FolderStore

    run_id = "secret-check"
    FolderStore(shared).upload_folder(RUNTIME_DIR, f"runs/{run_id}/code/runtime")
    executor = RayExecutor(cluster)
    show = "import hashlib, os; print('digest', hashlib.sha256(os.environ['HF_TOKEN'].encode()).hexdigest())"
    job = JobSpec(run_id=run_id, role="trainer", image="ray", command=["python", "-c", show], flavor="ray-cpu",
                  timeout_s=120, env={"PYTHONPATH": f"{shared}/runs/{run_id}/code"}, secrets=("HF_TOKEN",),
                  volumes=(VolumeSpec("local/grpo-runs", shared),))
    job_id = executor.submit(job, {"HF_TOKEN": JOB_SECRET})
    assert executor.status(job_id).stage in ("SCHEDULING", "RUNNING")
    _wait(lambda: executor.status(job_id).done, 120, "the job ended")
    status = executor.status(job_id)
    assert status.stage == "COMPLETED", (status, "".join(executor.all_logs(job_id)))
    assert f"digest {hashlib.sha256(JOB_SECRET.encode()).hexdigest()}" in "".join(executor.all_logs(job_id))

    from ray.job_submission import JobSubmissionClient

    client = JobSubmissionClient(cluster)
    shown = [repr(client.get_job_info(job_id)), repr(client.list_jobs()), _dashboard_jobs(cluster),
             client.get_job_logs(job_id), "\n".join(executor.all_logs(job_id))]
    assert all(JOB_SECRET not in text for text in shown)
    for folder, _, files in os.walk(shared):
        for name in files:
            with open(os.path.join(folder, name), "rb") as f:
                assert JOB_SECRET.encode() not in f.read(), os.path.join(folder, name)
    assert os.listdir(os.path.join(shared, ".grpo-secrets")) == [], "the job deleted its secrets file"


def test_a_mount_path_the_head_node_cannot_write_is_refused_by_a_check_job_there(cluster, tmp_path):
    from backend.plan.engines.ray import head_node_problem

    (tmp_path / "runs").write_text("a file where the runs' folder should be")
    problem = head_node_problem(cluster, str(tmp_path))
    assert problem.startswith(f"the cluster's head node cannot write {tmp_path}/runs (") and "Error" in problem, problem


def test_a_wrapper_told_to_stop_its_job_with_it_leaves_no_command_behind_when_it_is_killed(tmp_path):
    """Ray kills a dead job supervisor's entrypoint group, which holds the wrapper but not the command it started."""
    import subprocess
    import sys

    from backend.runtime import BACKEND_DIR

    wrapper = subprocess.Popen([sys.executable, "-m", "runtime.job.job_wrapper", "--job-dir", str(tmp_path),
                                "--timeout", "60", "--stop-with-wrapper", "--", "sleep", "300"], cwd=BACKEND_DIR)
    try:
        pid = _wait(lambda: json.loads((tmp_path / "process.json").read_text())["pid"]
                    if (tmp_path / "process.json").exists() else None, 30, "the command started")
        assert psutil.Process(pid).cmdline() == ["sleep", "300"]
        wrapper.kill()
        wrapper.wait()
        _wait(lambda: not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE, 10,
              "the command died with its wrapper")
    finally:
        wrapper.kill()
        wrapper.wait()
