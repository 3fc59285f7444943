"""The runs list and a run's diagnosis in a real browser: name, status, progress and reward in the list, a filter,
a row click and `?run=<id>` to open a run, a failed run's cause at the top of its header, the full log in one
click; for a live distributed run the bottleneck verdict with its one-click change, the samples a step wrote,
each replica's serving proof, and a serving alert raised by the panel's background check.

The runs are synthetic run folders in the project's own format (what the trainer, proxy and canary write, and the
local executor's job files), the live one kept running by a stand-in process as its jobs' pid, so the panel's own
readers and background checks do the work. Set DIAGNOSE_SCREENSHOTS=docs to write the README's screenshots.
"""

import json
import os
import re
import subprocess
import time

import pytest

from backend.runtime import layout
from backend.runtime.job.job_wrapper import process_start_time
from backend.runtime.trainer.samples import sample_record
from backend.view import diagnose
from benchmarks.dashboard_scale import JOBS, SyntheticRun, record
from panel.presets import preset_values
from tests.browser_helpers import CHROMIUM, panel_page, pick_run, running_panel, text_of, wait_for_text

pytestmark = [pytest.mark.browser, pytest.mark.full,
              pytest.mark.skipif(not os.path.exists(CHROMIUM), reason="Debian chromium is not installed")]

HISTORY = 30                     # steps already logged by the live run
FAILED_AT = 12                   # the failed run's last logged step
CAUSE = "bash: /opt/venv/bin/python: No such file or directory"
SYNC_BOUND = {"perf/step_s": 2.0, "step_time": 2.0, "perf/rollout_wait_s": 0.1, "rollout_wait_s": 0.1,
              "perf/weight_sync_s": 1.5, "weight_sync_s": 1.5}


def _live(run: SyntheticRun, pid: int) -> None:
    """Point every job of the run at `pid`: the local executor reads a job as RUNNING while its pid lives."""
    for role in JOBS:
        path = os.path.join(run.home, "jobs", run.job_ids[role], "job.json")
        with open(path) as f:
            job = json.load(f)
        job.update(pid=pid, pid_started_at=process_start_time(pid))
        with open(path, "w") as f:
            json.dump(job, f)


def _set_spec(run: SyntheticRun, **fields) -> dict:
    path = os.path.join(run.run_dir, layout.SPEC_FILE)
    with open(path) as f:
        spec = json.load(f)
    spec.update(fields)
    with open(path, "w") as f:
        json.dump(spec, f)
    return spec


def _sync_bound_run(home: str) -> tuple[SyntheticRun, diagnose.Verdict]:
    """A live sync-bound run (weight sync every step, 1.5 s of each 2 s step) with samples at two steps and a
    canary that finds replica 1 answering exactly like the base model."""
    run = SyntheticRun(home, HISTORY)
    spec = _set_spec(run, name="sync-heavy", adapter_every=1, max_staleness=1)
    rows = [{**record(step, run.t0), **SYNC_BOUND} for step in range(HISTORY + 1, HISTORY + diagnose.WINDOW + 1)]
    layout.FragmentWriter(run.metrics, "trainer").write(rows)
    last = rows[-1]["step"]
    samples = layout.FragmentWriter(os.path.join(run.run_dir, layout.SAMPLES_DIR), "trainer")
    for step, words in ((last - 10, "an early answer"), (last, "the newest answer")):
        samples.write([sample_record(step, step // 20, "What is 2+2?", f"{words} at step {step}",
                                     {"digits": 0.5}, 0.25, 12, False)])
    version = layout.adapter_name(HISTORY // 20)
    replicas = [{"url": "http://127.0.0.1:8000", "listed": True, "served": version, "delta_base": 0.4},
                {"url": "http://127.0.0.1:8001", "listed": True, "served": version, "delta_base": 0.0}]
    layout.FragmentWriter(run.metrics, "canary").write([{"time": time.time(), "canary": {"version": version,
                                                                                         "replicas": replicas}}])
    # The proxy's newest snapshot: the run's counts (replica 0 came back once, replica 1 missed the canary twice).
    counts = ({"restarted": 0, "reconnected": 1, "canary_missed": 0}, {"restarted": 0, "reconnected": 0,
                                                                      "canary_missed": 2})
    snapshot = [{"url": r["url"], "healthy": True, "adapters": [version], "joined": 1, **c}
                for r, c in zip(replicas, counts)]
    layout.FragmentWriter(run.metrics, layout.PROXY_WRITER).write([{"time": time.time(), "replicas": snapshot}])
    return run, diagnose.verdict(rows, spec)


def _failed_run(home: str) -> SyntheticRun:
    """A run whose trainer exited with code 127 at step 12, its replicas stopped after it."""
    run = SyntheticRun(home, FAILED_AT)
    _set_spec(run, name="broken-interpreter")
    for role in JOBS:
        folder = os.path.join(home, "jobs", run.job_ids[role])
        if role == "trainer":
            with open(os.path.join(folder, "log.txt"), "a") as f:
                f.write(f"{CAUSE}\n")
        ended = ({"stage": "ERROR", "code": 127, "message": "exited with code 127; see the log"} if role == "trainer"
                 else {"stage": "CANCELED", "code": -15, "message": "stopped with its trainer"})
        with open(os.path.join(folder, "exit.json"), "w") as f:
            json.dump({**ended, "time": time.time()}, f)
    return run


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    """A panel whose home holds the live sync-bound run and the failed run."""
    home = tmp_path_factory.mktemp("diagnose-home")
    live, verdict = _sync_bound_run(str(home))
    failed = _failed_run(str(home))
    stand_in = subprocess.Popen(["sleep", "900"], start_new_session=True)
    try:
        _live(live, stand_in.pid)
        with running_panel("app.py", {"GRPO_PANEL_BUDGET_CHECK_S": "1"}, home,
                           unset=("SPACE_ID", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")) as url:
            yield url, home, live, verdict, failed
    finally:
        stand_in.kill()
        stand_in.wait()


@pytest.fixture
def page(app, request):
    url, home, *_ = app
    with panel_page(url, home, request) as page:
        yield page


def test_a_sync_bound_run_shows_its_verdict_samples_and_serving_proof_and_one_click_fills_the_change(app, page):
    _, _, run, verdict, _ = app
    assert verdict.kind == "sync-bound" and "adapter_every" in verdict.change
    pick_run(page, run.spec.run_id)

    status = wait_for_text(page, "run-status", "Sync-bound")
    assert "1.50 s every 1 step(s) of 2.00 s" in status, status
    # The panel's background check (no click) records the serving alert, and the header shows it.
    status = wait_for_text(page, "run-status", "serving.*8001 answers .* exactly like its base model", 60000)
    assert "8000" not in status.split("serving", 1)[1].split("\n")[0], status

    replicas = wait_for_text(page, "replicas-table", "differs from base: NO")
    assert "differs from base: yes" in replicas and "vllm-0" in replicas and "vllm-1" in replicas, replicas
    assert "came back 1x" in replicas and "missed the canary 2x" in replicas and "restarted" not in replicas, replicas

    samples = wait_for_text(page, "samples-table", "the newest answer")
    assert "an early answer" not in samples and "What is 2+2?" in samples, samples
    earlier = str(HISTORY + diagnose.WINDOW - 10)
    page.locator("#sample-step input").first.click()
    page.get_by_role("option", name=earlier, exact=True).click()
    samples = wait_for_text(page, "samples-table", "an early answer")
    assert "the newest answer" not in samples
    # A version published after the run was opened: no tick sends the picker's choices, opening it does.
    newer = layout.adapter_name(HISTORY // 20 + 1)
    run._adapter(HISTORY // 20 + 1, HISTORY + 20, time.time())
    wait_for_text(page, "adapters-table", newer)
    page.locator("#version-pick input").first.click()
    page.get_by_role("option", name=newer, exact=True).wait_for(timeout=30000)
    page.keyboard.press("Escape")
    _screenshot(page, "diagnose-header.png", "run-status")
    _screenshot(page, "diagnose-samples.png", "samples-section")

    change = page.locator("#new-run-change")
    change.wait_for(state="visible", timeout=30000)
    change.click()
    every = page.locator("#f-adapter_every input").first
    page.wait_for_function("(want) => { const b = document.querySelector('#f-adapter_every input');"
                           " return b && b.value === want; }",
                           arg=str(verdict.change["adapter_every"]), timeout=30000)
    assert every.input_value() == str(verdict.change["adapter_every"])
    staleness = page.locator("#f-max_staleness input").first.input_value()
    assert staleness == str(verdict.change["max_staleness"]), staleness
    assert f"adapter_every 1 → {verdict.change['adapter_every']}" in text_of(page, "launch-msg")


def _screenshot(page, name: str, elem_id: str) -> None:
    """With DIAGNOSE_SCREENSHOTS=docs, the README's screenshots: the viewport from `elem_id` down."""
    folder = os.environ.get("DIAGNOSE_SCREENSHOTS")
    if folder:
        page.evaluate("(id) => document.getElementById(id).scrollIntoView()", elem_id)
        page.wait_for_timeout(500)
        page.screenshot(path=os.path.join(folder, name))


def _rows(page) -> list[list[str]]:
    return page.evaluate("""() => Array.from(document.querySelectorAll('#runs-table [role=row].virtual-row')).map(
        row => Array.from(row.querySelectorAll('[role=gridcell]')).map(cell => cell.innerText.trim()))""")


def _row_of(page, run_id: str) -> list[str]:
    page.wait_for_function("(id) => document.getElementById('runs-table').innerText.includes(id)", arg=run_id,
                           timeout=30000)
    [row] = [r for r in _rows(page) if r and r[0] == run_id]
    return row


def test_the_runs_list_shows_name_status_progress_and_reward_and_filters(app, page):
    _, _, live, _, failed = app
    page.get_by_role("tab", name="Runs").click()
    live_row = _row_of(page, live.spec.run_id)
    assert live_row[1:5] == ["sync-heavy", "● running", f"█░░░░░░░░░ {HISTORY + diagnose.WINDOW}/300",
                             f"{record(HISTORY + diagnose.WINDOW, 0)['reward']:.3f}"], live_row
    failed_row = _row_of(page, failed.spec.run_id)
    assert failed_row[1:4] == ["broken-interpreter", "✗ error", f"█░░░░░░░░░ {FAILED_AT}/120"], failed_row
    assert [r[0] for r in _rows(page)] == [failed.spec.run_id, live.spec.run_id], "newest first"

    page.locator("#runs-query input, #runs-query textarea").first.fill("broken")
    page.locator("#runs-query input, #runs-query textarea").first.press("Enter")
    page.wait_for_function("(id) => !document.getElementById('runs-table').innerText.includes(id)",
                           arg=live.spec.run_id, timeout=30000)
    assert [r[0] for r in _rows(page)] == [failed.spec.run_id]
    page.locator("#runs-query input, #runs-query textarea").first.fill("")
    page.locator("#runs-query input, #runs-query textarea").first.press("Enter")
    page.locator("#runs-status").get_by_text("running", exact=True).click()
    page.wait_for_function("(id) => !document.getElementById('runs-table').innerText.includes(id)",
                           arg=failed.spec.run_id, timeout=30000)
    assert [r[0] for r in _rows(page)] == [live.spec.run_id]


def test_a_row_click_opens_a_failed_run_with_its_cause_on_top_and_its_address_reopens_it(app, page):
    url, _, _, _, failed = app
    run_id = failed.spec.run_id
    page.get_by_role("tab", name="Runs").click()
    _row_of(page, run_id)
    page.locator("#runs-table [role=row].virtual-row", has_text=run_id).locator("[role=gridcell]").nth(1).click()
    status = wait_for_text(page, "run-status", re.escape(run_id))
    _screenshot(page, "runs.png", "runs-query")
    lines = [line for line in status.splitlines() if line.strip()]
    title = next(i for i, line in enumerate(lines) if line.startswith(f"broken-interpreter · Run {run_id}"))
    assert lines[title + 1] == f"✗ Failed: trainer: exited with code 127; see the log — {CAUSE}", lines[:4]
    page.wait_for_function("(id) => new URL(window.location.href).searchParams.get('run') === id", arg=run_id,
                           timeout=30000)

    page.goto(f"{url}/?run={run_id}")
    status = wait_for_text(page, "run-status", re.escape(run_id), 60000)
    assert CAUSE in status
    with page.expect_download(timeout=30000) as download:
        page.locator("#log-btn").click()
    path = download.value.path()
    with open(path) as f:
        log = f.read()
    assert log.rstrip().endswith(CAUSE) and "step 1/" in log, log[-300:]


def _number(page, elem_id: str) -> str:
    return page.evaluate("(id) => { const b = document.querySelector('#' + id + ' input'); "
                         "return b ? b.value : null; }", elem_id)


def test_smoothing_draws_the_smoothed_series_over_the_faint_raw_one(app, page):
    _, _, run, _, _ = app
    pick_run(page, run.spec.run_id)
    page.wait_for_function("() => { const el = document.querySelector('#reward-plot .js-plotly-plot');"
                           " return el && el.data && el.data.some(t => t.name === 'mean reward'); }", timeout=30000)
    names = page.evaluate("() => document.querySelector('#reward-plot .js-plotly-plot').data.map(t => t.name)")
    assert "mean reward (raw)" not in names
    box = page.locator("#smoothing input[type=number]").first
    box.fill("0.9")
    box.press("Enter")
    page.wait_for_function("() => document.querySelector('#reward-plot .js-plotly-plot').data"
                           ".some(t => t.name === 'mean reward (raw)')", timeout=30000)
    traces = page.evaluate("""() => document.querySelector('#reward-plot .js-plotly-plot').data
        .filter(t => t.name.startsWith('mean reward')).map(t => ({name: t.name, y: Array.from(t.y),
                                                                   opacity: t.opacity}))""")
    raw = next(t for t in traces if t["name"] == "mean reward (raw)")
    smooth = next(t for t in traces if t["name"] == "mean reward")
    assert raw["opacity"] < 1 and len(raw["y"]) == len(smooth["y"]) and raw["y"] != smooth["y"]


def test_new_run_from_this_fills_the_form_and_presets_set_every_field(app, page):
    _, _, run, _, _ = app
    pick_run(page, run.spec.run_id)
    page.locator("#new-run-from").click()
    page.wait_for_function("() => /Filled from run/.test(document.getElementById('launch-msg').innerText)",
                           timeout=30000)
    assert "with" not in text_of(page, "launch-msg").split("Filled from run", 1)[1].split(".")[0]
    assert page.locator("#f-name input, #f-name textarea").first.input_value() == "sync-heavy"
    assert page.locator("#f-mode input[value=distributed]").is_checked()

    # Back and forth between presets: every field takes the chosen preset's value, named or not.
    big, tiny = "Qwen2.5-1.5B math, distributed (HF Jobs, 2 vLLM replicas)", "Tiny demo (CPU)"
    fields = ("max_steps", "learning_rate", "lora_r", "adapter_every", "max_completion_length")
    wanted = {f: preset_values(tiny)[f] for f in fields}
    assert all(preset_values(big)[f] != wanted[f] for f in fields), "the big preset sets each of them otherwise"
    for preset in (big, tiny):
        page.locator("#preset input").first.click()
        page.get_by_role("option", name=preset).click()
        if preset == big:   # under the picker: what the preset takes from its published source, and why not the rest
            page.wait_for_function("() => /Follows the async GRPO/.test(document.getElementById('preset-note')"
                                   ".innerText)", timeout=30000)
            note = text_of(page, "preset-note")
            assert "flavor = h200 (study: h200x2): h200, not h200x2" in note, note
    page.wait_for_function("() => document.querySelector('#f-mode input[value=colocated]')?.checked", timeout=30000)
    page.get_by_text("GRPO training", exact=True).click()
    page.get_by_text("LoRA", exact=True).click()
    page.wait_for_function("(ids) => ids.every(id => document.querySelector('#' + id + ' input') !== null)",
                           arg=[f"f-{f}" for f in fields], timeout=30000)
    assert {f: float(_number(page, f"f-{f}")) for f in fields} == wanted


def test_a_mount_path_over_a_system_folder_is_refused_by_its_label(app, page):
    page.get_by_text("Hardware and storage", exact=True).click()
    box = page.locator("#f-mount_path input, #f-mount_path textarea").first
    box.fill("/tmp")
    box.press("Tab")
    page.locator("#launch-btn").click()
    page.wait_for_function("() => /launched/i.test(document.getElementById('launch-msg').innerText)", timeout=30000)
    message = text_of(page, "launch-msg")
    assert "Mount path in every job (mount_path): '/tmp' would hide a system folder" in message, message
    assert "Launched run" not in message


def test_a_cleared_dataset_stays_empty_on_enter_and_is_refused(app, page):
    box = page.locator("#f-dataset input").first
    box.click()
    box.fill("")
    box.press("Enter")
    page.wait_for_timeout(500)
    assert box.input_value() == "", "Enter in an emptied box does not pick the first dataset"
    page.locator("#launch-btn").click()
    page.wait_for_function("() => /launched/i.test(document.getElementById('launch-msg').innerText)", timeout=30000)
    message = text_of(page, "launch-msg")
    assert "Dataset (dataset): use one of builtin:count-to-ten" in message and "Launched run" not in message, message
    assert box.input_value() == ""
