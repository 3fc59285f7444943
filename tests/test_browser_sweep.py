"""A sweep from the launch form in a real browser: the Sweep section, Preview (members, run ids, the fleet they need,
refusals by label), one Launch for every member, the runs list grouping them, and Cancel sweep stopping them all.

Starts `python app.py` as a real process on a free port and drives Debian's chromium with Playwright.
"""

import json
import os
import re
import time

import pytest

from backend.executors.local import LocalExecutor
from backend.plan.jobspec import TERMINAL_STAGES
from backend.runtime import layout
from tests.browser_helpers import (
    CHROMIUM,
    inner_text,
    launch_message,
    open_runs_list,
    running_panel,
    set_number,
    table_rows,
    tail,
    wait_for_launch_answer,
    wait_for_text,
)

pytestmark = [pytest.mark.browser, pytest.mark.full,
              pytest.mark.skipif(not os.path.exists(CHROMIUM), reason="Debian chromium is not installed")]
TINY_DISTRIBUTED = "Tiny distributed (CPU, 2 vLLM replicas)"
BUCKET = "local/grpo-runs"      # the preset's


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    home = tmp_path_factory.mktemp("sweep-home")
    try:
        with running_panel("app.py", {}, home, unset=("SPACE_ID", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")) as url:
            yield url, home
    finally:
        LocalExecutor(str(home)).cancel_all()     # whatever a failed test left running



@pytest.fixture
def page(browser, app, request):
    """A fresh page on the tiny distributed preset with the Sweep section open (a screenshot left on failure)."""
    url, home = app
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.goto(url)
    page.locator("#launch-btn").wait_for(state="visible", timeout=60000)
    page.locator("#preset input").first.click()
    page.get_by_role("option", name=TINY_DISTRIBUTED).click()
    page.wait_for_function("() => document.querySelector('#f-mode input[value=distributed]')?.checked", timeout=30000)
    page.locator("#sweep").get_by_text("Sweep (distributed)", exact=True).click()
    page.locator("#sweep-values-0 textarea, #sweep-values-0 input").first.wait_for(state="visible", timeout=30000)
    yield page
    report = getattr(request.node, "rep_call", None)
    if report is not None and report.failed:
        page.screenshot(path=os.path.join(str(home), f"{request.node.name}.png"), full_page=True)
        print(f"--- launch message: {launch_message(page)!r}\n--- panel log tail:\n{tail(home / 'app.log')}")
    page.close()


def sweep_row(page, i: int, field: str, values: str) -> None:
    """Row `i` of the Sweep section: the field (typed into its picker, as a visitor may type any name) and values."""
    picker = page.locator(f"#sweep-field-{i} input").first
    picker.click()
    picker.fill(field)
    picker.press("Enter")
    box = page.locator(f"#sweep-values-{i} textarea, #sweep-values-{i} input").first
    box.fill(values)
    box.press("Tab")


def preview(page, expect: str) -> str:
    """Press Preview and return the launch message once it reads `expect` (a regular expression): the answer this
    preview must give (a text merely changed may be the previous answer redrawn)."""
    page.locator("#preview-btn").click()
    return wait_for_text(page, "launch-msg", expect, 60000)


def jobs_of(home, run_ids) -> list:
    return [j for j in LocalExecutor(str(home)).list_jobs() if j.run_id in run_ids]


def test_a_sweep_previews_its_members_and_fleet_and_bad_input_is_refused_by_label_launching_nothing(page, app):
    _, home = app
    sweep_row(page, 0, "learning_rate", "1e-4, 0.0001")
    sweep_row(page, 1, "model", "a, b")
    message = preview(page, "nothing was launched")
    assert "nothing was launched" in message, message
    assert "Model (model): cannot be swept: the fleet serves one base model to every member" in message, message
    assert "Learning rate (learning_rate): 0.0001 is given twice" in message, message

    sweep_row(page, 0, "learning_rate", "1e-4, 5e-4")
    sweep_row(page, 1, "lora_r", "8, 16")
    page.locator("#sweep-grid").get_by_text("side by side", exact=True).click()
    message = preview(page, r"Sweep .*: 2 members")
    assert "Sweep" in message and "2 members" in message and "side by side" in message, message
    members = re.findall(r"^(m\d)\s+(\d{8}-\d{6}-[0-9a-f]{6})\s+(\S+)\s+(\d+)$", inner_text(page, "launch-msg"),
                         re.MULTILINE)
    assert [(m, lr, r) for m, _, lr, r in members] == [("m0", "0.0001", "8"), ("m1", "0.0005", "16")], message
    assert "--max-loras 6" in message and "--max-lora-rank 16" in message, message
    assert "pads every adapter to --max-lora-rank 16: member(s) m0" in message, message

    page.locator("#sweep-grid").get_by_text("grid", exact=True).click()
    message = preview(page, r"Sweep .*: 4 members")
    assert "--max-loras 12" in message, message
    assert "One fleet for all members: 2 replica job(s) started once" in message, message
    assert "# fleet vllm-1" in message and "# m0 trainer" in message and "# m0 vllm-0" not in message, message
    grid_ids = re.findall(r"^m\d\s+(\d{8}-\d{6}-[0-9a-f]{6})", inner_text(page, "launch-msg"), re.MULTILINE)
    assert len(grid_ids) == 4, message
    previewed = {run_id for _, run_id, _, _ in members} | set(grid_ids)
    assert jobs_of(home, previewed) == [], "a preview launches nothing"
    root = LocalExecutor(str(home)).bucket_root(BUCKET)
    for run_id in previewed:
        assert not os.path.exists(os.path.join(root, layout.run_prefix(run_id))), "a preview writes nothing"
    sweep_id = re.search(r"Sweep (sweep-\S+): 4 members", message).group(1)
    assert not os.path.exists(os.path.join(root, layout.sweep_record_path(sweep_id)))


@pytest.mark.xdist_group("vllm-servers")   # its members start vLLM servers, however briefly (conftest: VLLM_SERVERS)
@pytest.mark.spine   # tier 1's sweep from the browser: one launch, every member started on one fleet, all cancelled
def test_one_launch_starts_every_member_the_runs_list_groups_them_and_cancel_sweep_stops_them_all(page, app):
    _, home = app
    page.get_by_text("Distributed (async GRPO)", exact=True).click()
    set_number(page, "f-replicas", 1)
    sweep_row(page, 0, "learning_rate", "1e-4, 5e-4")
    message = preview(page, r"Sweep .*: 2 members")
    previewed = re.findall(r"^m\d\s+(\d{8}-\d{6}-[0-9a-f]{6})", inner_text(page, "launch-msg"), re.MULTILINE)
    sweep_id = re.search(r"Sweep (sweep-\S+): 2 members", message).group(1)
    assert len(previewed) == 2, message

    page.locator("#launch-btn").click()
    message = wait_for_launch_answer(page, 120000)
    assert f"Launched sweep {sweep_id}: 2 member runs" in message, message
    assert all(run_id in message for run_id in previewed), "the members launched are the ones previewed"
    root = LocalExecutor(str(home)).bucket_root(BUCKET)
    with open(os.path.join(root, layout.sweep_record_path(sweep_id))) as f:
        assert json.load(f)["members"] == {"m0": previewed[0], "m1": previewed[1]}
    for run_id in previewed:
        with open(os.path.join(root, layout.run_prefix(run_id), layout.SPEC_FILE)) as f:
            spec = json.load(f)
        assert spec["sweep_id"] == sweep_id and spec["replicas"] == 1
    assert {j.run_id for j in jobs_of(home, previewed)} == set(previewed), "every member's jobs were started"
    assert {j.role for j in jobs_of(home, previewed)} == {"trainer"}, "a member starts no replicas of its own"
    assert [j.role for j in jobs_of(home, [sweep_id])] == ["vllm-0"], "the sweep's one fleet, started once"

    # The Runs tab opens on m0 (offering Cancel sweep, and folding the runs list away); the list shows both members
    # together, each named with its sweep's id.
    page.locator("#cancel-sweep-btn").wait_for(state="visible", timeout=60000)
    wait_for_text(page, "run-status", re.escape(previewed[0]), 60000)
    open_runs_list(page)
    deadline, rows = time.time() + 60, []
    while time.time() < deadline:
        listed = table_rows(page, "runs-table")
        rows = [row for row in listed if row and row[0] in previewed]
        if len(rows) == 2 and any(row and row[0] == sweep_id for row in listed):
            break
        time.sleep(1)
    assert sorted(row[0] for row in rows) == sorted(previewed), table_rows(page, "runs-table")
    assert all(f"sweep {sweep_id}" in row[1] for row in rows), rows
    assert any(row and row[0] == sweep_id for row in listed), ("the fleet is listed as a run of its own", listed)
    page.locator("#cancel-sweep-btn").click()
    said = wait_for_text(page, "action-msg", "Cancel requested for sweep|not cancelled", 60000)
    assert f"Cancel requested for sweep {sweep_id}" in said and "its 2 members" in said, said
    assert f"its fleet {sweep_id} (1 job(s))" in said, said
    everything = [*previewed, sweep_id]
    deadline = time.time() + 120
    while any(j.stage not in TERMINAL_STAGES for j in jobs_of(home, everything)) and time.time() < deadline:
        time.sleep(1)
    left = [(j.run_id, j.role, j.stage) for j in jobs_of(home, everything) if j.stage not in TERMINAL_STAGES]
    assert not left, f"jobs still running after Cancel sweep: {left}"
