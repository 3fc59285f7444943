"""The panel in a real browser: launch the tiny demo from the form, watch it live, download the adapter.

Starts `python app.py` as a real process on a free port and drives Debian's chromium with Playwright.
"""

import io
import json
import os
import re
import time
import zipfile
from pathlib import Path

import pytest

from tests.browser_helpers import (
    CHROMIUM,
    inner_text,
    launch_message,
    open_runs_list,
    plot_points,
    running_panel,
    set_number,
    tail,
    wait_for_launch_answer,
)
from tests.mcp_client import initialize_status, mcp_session

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pytestmark = [pytest.mark.browser,
              pytest.mark.skipif(not os.path.exists(CHROMIUM), reason="Debian chromium is not installed")]


@pytest.fixture(scope="module")
def app_home(tmp_path_factory):
    return tmp_path_factory.mktemp("panel-home")


@pytest.fixture(scope="module")
def app_url(app_home):
    # A distributed run's proxy reads each server's load every 2 s (not 10): a 4-step run shows it.
    try:
        with running_panel("app.py", {"GRPO_PROXY_LOAD_INTERVAL_S": "2"}, app_home, unset=("SPACE_ID",)) as url:
            yield url
    finally:
        from backend.executors.local import LocalExecutor

        LocalExecutor(str(app_home)).cancel_all()     # the panel exits; stop whatever local runs the tests left



@pytest.fixture
def page(browser, app_url, app_home, request):
    """A fresh page per test (no state carried from the previous test), loaded until the form is usable.

    When the test fails, a screenshot and the panel's log tail are attached to the failure report."""
    page = browser.new_page(viewport={"width": 1400, "height": 1000}, accept_downloads=True)
    page.goto(app_url)
    page.locator("#launch-btn").wait_for(state="visible", timeout=60000)
    yield page
    report = getattr(request.node, "rep_call", None)
    if report is not None and report.failed:
        shot = app_home / f"{request.node.name}.png"
        try:
            page.screenshot(path=str(shot), full_page=True)
        except Exception as exc:  # diagnostics must not hide the test's own failure
            shot = f"(no screenshot: {exc})"
        print(f"--- screenshot: {shot}\n--- launch message: {launch_message(page)!r}\n"
              f"--- panel log tail:\n{tail(app_home / 'app.log')}")
    page.close()




# What a starting local demo run's header may say it is doing (`backend/view/startup.py`), in the order it goes.
STARTING_STAGES = {"starting the trainer job", "building the model", "loading the data and the model",
                   "importing TRL and building the trainer, then scoring the base model on the held-out set",
                   "training the first step"}


def _reward_points(page) -> int:
    return page.evaluate("""() => {
        const el = document.querySelector('#reward-plot .js-plotly-plot');
        if (!el || !el.data) return 0;
        const t = el.data.find(d => d.name === 'mean reward');
        return t ? t.x.length : 0;
    }""")


def _visible(page, elem_id: str) -> bool:
    return page.evaluate("(id) => { const e = document.getElementById(id); return !!e && e.offsetParent !== null; }",
                         elem_id)


def _marked(page, elem_id: str) -> bool:
    return page.evaluate("(id) => document.getElementById(id).classList.contains('field-error')", elem_id)


def test_bad_input_is_refused_by_its_label_in_its_opened_section_and_nothing_launches(page):
    page.get_by_text("LoRA", exact=True).click()
    set_number(page, "f-lora_r", 0)
    page.get_by_text("GRPO training", exact=True).click()
    set_number(page, "f-adam_beta2", 1)
    page.get_by_text("GRPO training", exact=True).click()       # closed again: the refusal opens it
    page.wait_for_function("() => document.querySelector('#f-adam_beta2') === null || "
                           "document.querySelector('#f-adam_beta2').offsetParent === null", timeout=30000)
    set_number(page, "f-max_steps", 0)                         # on the first screen, beside Launch
    page.locator("#launch-btn").click()
    message = wait_for_launch_answer(page)
    assert "nothing was launched" in message and "Launched run" not in message, message
    assert "Rank r (lora_r): must be between 1 and 512" in message, message
    assert "Adam beta2 (adam_beta2): must be between 0 and 1" in message, message
    assert "Steps (max_steps): must be between 1 and 1,000,000" in message, message
    page.wait_for_function("() => { const e = document.getElementById('f-adam_beta2'); "
                           "return e && e.offsetParent !== null && e.classList.contains('field-error'); }",
                           timeout=30000)
    assert _marked(page, "f-lora_r") and _marked(page, "f-max_steps") and not _marked(page, "f-learning_rate")

    set_number(page, "f-lora_r", 8)
    set_number(page, "f-adam_beta2", 0.999)
    set_number(page, "f-max_steps", 5)
    page.locator("#preview-btn").click()
    page.wait_for_function("() => /job\\(s\\) of run/.test(document.getElementById('launch-msg').innerText)",
                           timeout=30000)
    page.wait_for_function("() => !document.getElementById('f-lora_r').classList.contains('field-error')",
                           timeout=30000)
    assert not _marked(page, "f-max_steps") and not _marked(page, "f-adam_beta2"), "a fixed field is no longer marked"


def test_the_form_shows_the_sections_of_the_chosen_mode(page):
    assert _visible(page, "f-mode")
    sections = ("vLLM (colocated)", "Distributed (async GRPO)")

    def shown():
        return [page.get_by_text(title, exact=True).first.is_visible() for title in sections]

    assert shown() == [True, False], "the tiny demo is colocated"
    page.locator("#f-mode").get_by_text("distributed", exact=True).click()
    page.wait_for_function("() => document.querySelector('#f-mode input[value=distributed]')?.checked", timeout=30000)
    page.get_by_text("Distributed (async GRPO)", exact=True).wait_for(state="visible", timeout=30000)
    assert shown() == [False, True]
    page.locator("#f-mode").get_by_text("colocated", exact=True).click()
    page.get_by_text("vLLM (colocated)", exact=True).wait_for(state="visible", timeout=30000)
    assert shown() == [True, False]




def _screenshot(page, name: str) -> None:
    folder = os.environ.get("DASHBOARD_SCREENSHOTS")
    if folder:
        page.screenshot(path=os.path.join(folder, name), full_page=True)


def _pick(page, elem_id: str, option: str) -> None:
    """Pick `option` of a dropdown, typed to narrow a long list first (a click on an option below the fold misses)."""
    box = page.locator(f"#{elem_id} input").first
    box.click()
    box.fill("")        # a single choice's box holds the current one
    box.press_sequentially(option)
    # An option's label may go on after `option` (a version's held-out score follows its step).
    page.locator("[role=option]", has_text=option).first.click()
    page.keyboard.press("Escape")


def _grid(page, elem_id: str) -> tuple[list[str], list[list[str]]]:
    """A Gradio dataframe's column headers and rows as shown."""
    return page.evaluate("""(id) => [
        Array.from(document.querySelectorAll('#' + id + ' [role=columnheader]')).map(
            c => (c.getAttribute('title') ?? c.textContent).trim()),
        Array.from(document.querySelectorAll('#' + id + ' .virtual-row')).map(
            r => Array.from(r.querySelectorAll('[role=gridcell]')).map(c => c.textContent.trim()))]""", elem_id)


def _run_dir(page, app_home) -> str:
    run_id = re.search(r"Run (\S+)", inner_text(page, "run-status")).group(1).strip("`")
    return os.path.join(str(app_home), "buckets", "local", "grpo-runs", "runs", run_id)


def _a_version_downloads_and_tries_beside_the_base_model(page, app_home) -> None:
    """A version that is not final/ downloads from the version picker; "try it" answers one prompt with the base
    model, final/, an early version and a tampered one, on CPU with PEFT, side by side."""
    run_dir = _run_dir(page, app_home)
    _pick(page, "version-pick", "trl-policy-v5 · step 100")
    # The button was already enabled for the version shown before the pick: wait for the pick's own answer.
    page.wait_for_function("() => (document.getElementById('version-msg') || {}).innerText"
                           "?.includes('picked by hand')", timeout=30000)
    page.wait_for_function("() => { const b = document.querySelector('#version-btn'); "
                           "return b && !b.disabled && !b.querySelector('[disabled]'); }", timeout=30000)
    assert "trl-policy-v5 at step 100, picked by hand" in inner_text(page, "version-msg")
    with page.expect_download(timeout=30000) as info:
        page.locator("#version-btn").click()
    archive = zipfile.ZipFile(io.BytesIO(open(info.value.path(), "rb").read()))
    with open(os.path.join(run_dir, "adapters", "trl-policy-v5", "adapter_model.safetensors"), "rb") as f:
        assert archive.read("adapter_model.safetensors") == f.read()

    # A version whose config was tampered with after the run (a visitor's data is untrusted): refused, alone.
    with open(os.path.join(run_dir, "adapters", "trl-policy-v2", "adapter_config.json"), "w") as f:
        json.dump({"peft_type": "PREFIX_TUNING", "num_virtual_tokens": 10**9}, f)
    page.locator("#try-section").get_by_text("Try it: one prompt", exact=False).first.click()
    page.locator("#try-prompt textarea").fill("Count to ten")
    # The run was opened before it had an adapter: the base model alone is picked; the rest are picked here.
    for option in ("final/ (trl-policy-v10)", "trl-policy-v1 · step 20", "trl-policy-v2 · step 40"):
        _pick(page, "try-picks", option)
    page.locator("#try-btn").click()
    page.wait_for_function("() => document.getElementById('try-msg').innerText.includes('Done')", timeout=300000)
    headers, answers = _grid(page, "try-answers")
    table = {h: [row[i] for row in answers] for i, h in enumerate(headers) if h}
    assert set(table) == {"base model", "final", "trl-policy-v1", "trl-policy-v2"}, (headers, answers)
    assert all(table[h][1].startswith("PEFT on CPU") for h in table), table
    assert "not loaded: peft_type 'PREFIX_TUNING'" in table["trl-policy-v2"][0], table
    assert table["final"][0] and not table["final"][0].startswith("(") and table["final"][0] != table["base model"][0]
    assert sum(ch.isdigit() for ch in table["final"][0]) > sum(ch.isdigit() for ch in table["base model"][0]), table


def _one_training_prompt_is_followed_across_steps(page) -> None:
    box = page.locator("#sample-prompt input").first
    box.click()
    box.fill("")
    box.press_sequentially("training: ")
    page.get_by_role("option", name=re.compile("^training: ")).first.click()
    # The table showed the newest step's samples (all of one step): it now shows that prompt at several steps.
    page.wait_for_function("""() => new Set(Array.from(document.querySelectorAll('#samples-table .virtual-row'))
        .map(r => r.querySelector('[role=gridcell]').textContent.trim())).size >= 2""", timeout=30000)
    _, rows = _grid(page, "samples-table")
    steps = [int(row[0]) for row in rows]
    assert steps == sorted(steps) and len({row[2] for row in rows}) == 1, rows


def test_launch_the_demo_and_watch_it_live(page, app_home):
    """The reward-hacking demo (the digits task a random tiny model games): it runs as fast as a tiny run does, so the
    live views are watched on it; it ends with the alert. The default demo's outcome: the full-tier test below."""
    page.locator("#preset input").first.click()
    page.get_by_role("option", name="Tiny reward-hacking demo (CPU)").click()
    page.locator("#launch-btn").click()
    # A successful launch switches to the Runs tab, with the new run selected.
    message = wait_for_launch_answer(page)
    assert "Launched run" in message, message
    page.wait_for_function("() => document.querySelector('#run-status').textContent.includes('trainer:')",
                           timeout=30000)

    # The dashboard fills in across timer ticks: the reward chart gains points while the run trains. Until its first
    # step the header says what the run is doing to start, with the time it took so far.
    counts, shot, starting = [], False, []
    deadline = time.time() + 300
    while time.time() < deadline and (not counts or counts[-1] < 200):
        counts.append(_reward_points(page))
        said = re.search(r"Starting: (.+?)(?: for \d[^\n]*)?\n", inner_text(page, "run-cost") + "\n")
        if said and not counts[-1] and said.group(1) not in starting:
            starting.append(said.group(1))
        if 40 <= counts[-1] <= 170 and not shot:
            _screenshot(page, "dashboard.png")   # mid-run, for the README
            shot = True
        time.sleep(0.5)
    grown = sorted(set(counts))
    assert len(grown) >= 3 and grown[-1] == 200, counts
    assert starting and set(starting) <= STARTING_STAGES, starting
    assert "Starting" not in inner_text(page, "run-cost"), "a run that logged its steps says its step, not its start"

    page.locator("#run-status").get_by_text("final adapter ready").wait_for(timeout=120000)
    assert "transformers (CPU)" in inner_text(page, "run-status")
    # The runs list (folded away while the run is open) names the run and shows its progress and latest reward.
    open_runs_list(page)
    page.wait_for_function("() => /reward-hacking-demo[\\s\\S]*200\\/200\\s+\\d\\.\\d{3}/.test("
                           "document.getElementById('runs-table').innerText)", timeout=30000)
    adapters = inner_text(page, "adapters-table")
    assert "trl-policy-v1" in adapters and "trl-policy-v10" in adapters
    # Held-out reward by version, beside the training reward: the base model (v0) and each of the 10 versions scored
    # on the held-out split, the best starred, the monitor-only format reward dashed; it rises as the training
    # reward does.
    page.wait_for_function("() => { const el = document.querySelector('#heldout-plot .js-plotly-plot');"
                           " const t = el && el.data && el.data.find(d => d.name.startsWith('held-out score'));"
                           " return t && t.x.length === 11 && t.text[0] === 'v0'; }", timeout=30000)
    held_out = page.evaluate("""() => Object.fromEntries(document.querySelector('#heldout-plot .js-plotly-plot')
        .data.map(d => [d.name, d.y]))""")
    # The line is the score under the run's best-by rule (the one that decides), named by it; the trained score
    # (what the trainer maximised) is drawn beside it, named so.
    rule_line = "held-out score (held-out 1 x digits + 1 x distinct_chars)"
    assert {"training reward", rule_line, "trained score", "digits", "format (monitor-only)"} <= set(held_out), \
        held_out
    assert any(name.startswith("best: v") for name in held_out), held_out
    scores = held_out["trained score"]
    assert scores[-1] > scores[0], f"the held-out trained score rises with training: {scores}"
    assert "reward hacking suspected" in inner_text(page, "run-status"), "the gameable demo raises the alert"
    assert "step 200/200" in page.locator("#log-box textarea").input_value()
    scrolled_to_end = page.evaluate("""() => { const t = document.querySelector('#log-box textarea');
        return t.scrollHeight > t.clientHeight && t.scrollTop + t.clientHeight >= t.scrollHeight - 2; }""")
    assert scrolled_to_end, "the log tail shows its newest lines"

    page.wait_for_function("() => !document.querySelector('#final-btn').disabled", timeout=30000)
    with page.expect_download(timeout=30000) as info:
        page.locator("#final-btn").click()
    data = open(info.value.path(), "rb").read()
    names = set(zipfile.ZipFile(io.BytesIO(data)).namelist())
    assert {"adapter_config.json", "adapter_model.safetensors"} <= names
    _a_version_downloads_and_tries_beside_the_base_model(page, app_home)
    _one_training_prompt_is_followed_across_steps(page)


def test_an_agent_reads_the_demo_run_over_mcp_as_the_local_ui_and_only_through_a_loopback_host(app_url):
    """The run the test above launched, read with the panel's MCP tools by a real MCP client."""
    runs, = mcp_session(app_url, [("list_runs", {"query": "reward-hacking-demo"})])
    [run] = [r for r in runs["runs"] if r["name"] == "reward-hacking-demo"]
    deadline = time.time() + 300
    while True:
        status, = mcp_session(app_url, [("run_status", {"run_id": run["run"]})])
        if status["stage"] == "COMPLETED" or time.time() > deadline:
            break
        time.sleep(2)
    adapters, preview, bad = mcp_session(app_url, [
        ("run_adapters", {"run_id": run["run"], "newest": 3}), ("preview_run", {"settings": {"max_steps": 5}}),
        ("preview_run", {"settings": {"bogus": 1}})])
    assert status["stage"] == "COMPLETED" and status["latest_metrics"]["step"] == 200, status
    assert isinstance(status["latest_metrics"]["reward"], float) and status["engine"].startswith("transformers")
    assert [a["name"] for a in adapters["adapters"]] == ["trl-policy-v10", "trl-policy-v9", "trl-policy-v8"]
    assert preview["ok"] and "runtime.trainer.train" in preview["preview"], "the local UI's preset and preview"
    assert not bad["ok"] and bad["fields_to_fix"] == ["bogus"] and "not a field of the launch form" in bad["preview"]
    # A page of another site whose name resolves to 127.0.0.1 (DNS rebinding) reaches the port, not the tools.
    assert (initialize_status(app_url, host="attacker.example"), initialize_status(app_url)) == (421, 200)


@pytest.mark.full   # a 300-step run after the warmed-up model's build (kept in the build cache after the first)
def test_the_default_demo_learns_to_repeat_letters_with_no_alert_and_its_best_version_late(page):
    """The default preset, as a newcomer runs it: the held-out exact answer rises from the base model's to at least
    0.8, no reward-hacking alert, and the best version (the star) comes from the second half of the run."""
    page.locator("#preset input").first.click()
    page.get_by_role("option", name="Tiny demo (CPU)").click()
    page.locator("#launch-btn").click()
    message = wait_for_launch_answer(page)
    assert "Launched run" in message, message
    page.locator("#run-status").get_by_text("final adapter ready").wait_for(timeout=900000)
    page.wait_for_function("() => { const el = document.querySelector('#heldout-plot .js-plotly-plot');"
                           " const t = el && el.data && el.data.find(d => d.name.startsWith('held-out score'));"
                           " return t && t.x.length === 11; }", timeout=60000)
    traces = page.evaluate("""() => document.querySelector('#heldout-plot .js-plotly-plot').data
        .map(d => ({name: d.name, x: d.x, y: d.y, text: d.text}))""")
    score = next(t for t in traces if t["name"].startswith("held-out score"))
    assert score["text"][0] == "v0" and max(score["y"][1:]) >= 0.8 > score["y"][0], score
    best = next(t for t in traces if t["name"].startswith("best: v"))
    version = int(re.match(r"best: v(\d+)", best["name"]).group(1))
    assert version > 5 and best["y"][0] >= 0.8, (best, score)     # versions every 30 steps: v6 is step 180 of 300
    assert "reward hacking suspected" not in inner_text(page, "run-status")


@pytest.mark.full   # ~210 s; tier 1's vLLM pair runs in test_distributed_run.py
@pytest.mark.xdist_group("vllm-servers")   # one vLLM test at a time (conftest: VLLM_SERVERS)
# and no other test beside it: its two servers and trainer share 2 cores; beside a training test on the other worker
# (and other load) its run missed its 7 minutes
@pytest.mark.runs_alone
def test_a_local_distributed_run_of_one_replica_job_with_two_vllm_servers_from_the_browser(page, app_home):
    """The tiny distributed preset as one replica job running 2 vLLM servers (servers_per_gpu 2, the cost of its two
    replica jobs): each server is a replica to the proxy, and the canary proves each serves the newest version."""
    page.locator("#preset input").first.click()
    page.get_by_role("option", name="Tiny distributed (CPU, 2 vLLM replicas)").click()
    page.wait_for_function("() => document.querySelector('#f-mode input[value=distributed]')?.checked", timeout=30000)
    page.get_by_text("GRPO training", exact=True).click()
    set_number(page, "f-max_steps", 4)
    page.get_by_text("Distributed (async GRPO)", exact=True).click()
    set_number(page, "f-replicas", 1)
    set_number(page, "f-servers_per_gpu", 2)
    # The preset's token budget (4096, ~230 completions packed a step) costs ~30 s a step on 2 cores; 512 (~30
    # completions, as the other distributed tests train) is all this test's checks need, at ~5 s a step.
    set_number(page, "f-max_tokens_per_batch", 512)
    page.locator("#launch-btn").click()
    message = wait_for_launch_answer(page)
    assert "Launched run" in message, message
    page.wait_for_function("""() => {
        const t = document.getElementById('run-status').innerText;
        return t.includes('distributed') && t.includes('final adapter ready');
    }""", timeout=420000)

    status = inner_text(page, "run-status")
    assert "vLLM replicas behind the LoRA-aware proxy (2/2 healthy at start, adapter-only sync" in status, status
    replicas = inner_text(page, "replicas-table")
    assert replicas.count("127.0.0.1") == 2 and "DOWN" not in replicas
    assert "vllm-0/0" in replicas and "vllm-0/1" in replicas, "two servers of the one replica job"
    adapters = inner_text(page, "adapters-table")
    assert "trl-policy-v1" in adapters and "trl-policy-v4" in adapters
    assert "vllm-0/0, vllm-0/1" in adapters, "the newest versions are listed as loaded on both servers"
    # The proxy's canary: every server lists the newest version, answers for it, and differs from its base model.
    assert replicas.count(": yes · differs from base: yes") == 2, replicas
    # Each server's own load, as the proxy read it from its /metrics: tokens generated, its API process's CPU.
    snapshots = [json.loads(line) for path in (Path(_run_dir(page, app_home)) / "metrics").glob("proxy-*.jsonl")
                 for line in path.read_text().splitlines()]
    loaded = {r["url"] for snap in snapshots for r in snap["replicas"] if r.get("gen_tok_s", 0) > 0
              and r.get("api_cpu", 0) > 0}
    assert len(loaded) == 2, snapshots[-1:]
    assert plot_points(page, "staleness-plot", "mean") == 4
    assert plot_points(page, "ratio-plot", "ratio") == 4
    assert plot_points(page, "reward-plot", "mean reward") == 4
    # The preset evaluates the base model first (v0, asked of the replicas' base model), then every 5 steps and the
    # last version: v1 (before the first step) and v5 (after step 4) answered the held-out split on the replicas.
    page.wait_for_function("() => { const el = document.querySelector('#heldout-plot .js-plotly-plot');"
                           " const t = el && el.data && el.data.find(d => d.name.startsWith('held-out score'));"
                           " return t && t.text.join() === 'v0,v1,v5'; }", timeout=60000)
    assert plot_points(page, "util-plot", "vllm-0 CPU") > 0
    _screenshot(page, "distributed.png")
    # The replicas stop by themselves once the trainer has finished: nothing keeps running (or billing).
    page.wait_for_function("""() => {
        const t = document.getElementById('run-status').innerText;
        return t.includes('vllm-0: COMPLETED');
    }""", timeout=90000)
    assert "vllm-1" not in inner_text(page, "run-status"), "one replica job"
