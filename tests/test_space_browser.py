"""The panel as a Hugging Face Space, through Gradio's own request handling, in a real browser (its MCP tools, the
same Space for an agent, are in test_space_mcp.py).

`app.py` runs as a Space runs it (SPACE_ID, SYSTEM=spaces, OAuth client variables) against the loopback fake
Hub. Visitors are signed in the way Gradio's OAuth callback signs them in: a signed `session` cookie holding
their OAuth access token, so every click reaches the handlers through Gradio's OAuth injection, sessions and
queue, exactly as on a Space.
"""

import json
import re
import time

import pytest

from panel import notes_view
from tests import space_panel
from tests.browser_helpers import (
    CHROMIUM,
    field_box,
    keep_value,
    pick_run,
    space_session_cookie,
    tail,
    text_of,
    wait_for_text,
)
from tests.fakehub import wait_until
from tests.space_panel import ALICE, BOB, CAROL, CLIENT_SECRET, DAVE, OAUTH_MINUTES, PLANTED, UPLOAD_MB

pytestmark = [pytest.mark.browser, pytest.mark.full,
              pytest.mark.skipif(not __import__("os").path.exists(CHROMIUM), reason="Debian chromium is not installed")]
hub, space = space_panel.hub, space_panel.space   # this file's fixtures: one Space and its fake Hub for every test



@pytest.fixture
def visit(browser, space, request):
    """`visit(token, username)` opens the Space in a browser context of its own, signed in (or anonymous)."""
    url, home = space
    contexts = []

    def open_page(token: str | None = None, username: str | None = None):
        context = browser.new_context(viewport={"width": 1400, "height": 1000})
        contexts.append(context)
        if token:
            # As long as the README's front matter makes a Space's sign-in last (hf_oauth_expiration_minutes).
            cookie = space_session_cookie(CLIENT_SECRET, token, username, time.time() + OAUTH_MINUTES * 60)
            context.add_cookies([{"name": "session", "value": cookie, "url": url}])
        page = context.new_page()
        page.goto(url)
        page.locator("#launch-btn").wait_for(state="visible", timeout=60000)
        if token:
            # The page's load event fills in the visitor's own bucket, and any change to the form unticks a review:
            # a visitor who clicks before it has answered loses the tick (on a busy machine, seconds after the page
            # shows), so the clicks start once it has.
            _open_hardware(page)
            page.wait_for_function("() => { const b = document.querySelector('#f-bucket textarea, #f-bucket input');"
                                   " return b && b.value.endsWith('/grpo-runs'); }", timeout=60000)
        return page

    yield open_page
    report = getattr(request.node, "rep_call", None)
    if report is not None and report.failed:
        for i, context in enumerate(contexts):
            for page in context.pages:
                page.screenshot(path=str(home / f"{request.node.name}-{i}.png"), full_page=True)
        print(f"--- panel log tail:\n{tail(home / 'app.log')}")
    for context in contexts:
        context.close()


def _open_hardware(page) -> None:
    """Open the form's "Hardware and storage" section unless it is open (a click on an open one closes it)."""
    if not page.locator("#f-bucket textarea, #f-bucket input").first.is_visible():
        page.get_by_text("Hardware and storage", exact=True).click()
        page.locator("#f-bucket textarea, #f-bucket input").first.wait_for(state="visible", timeout=30000)


def _launch_reviewed(page) -> tuple[str, str]:
    """Preview, tick the review box, launch: the clicks a visitor makes. Returns (preview, launch message)."""
    page.locator("#preview-btn").click()
    preview = wait_for_text(page, "launch-msg", "review code|fix these fields|sign in")
    page.locator("#confirm input").check()
    page.locator("#launch-btn").click()
    page.wait_for_function("(before) => document.getElementById('launch-msg').innerText !== before",
                           arg=preview, timeout=30000)
    return preview, wait_for_text(page, "launch-msg", "launched|sign in")


def _run_id(message: str) -> str:
    match = re.search(r"Launched run (\S+)", message)
    assert match, message
    return match.group(1)


@pytest.mark.spine   # tier 1's signed-in browser flow (the rest of this file: --full)
def test_a_signed_in_newcomer_launches_on_hf_jobs_in_three_clicks(visit, hub):
    started = time.monotonic()
    page = visit(ALICE, "alice")
    options = page.locator("#f-executor input").evaluate_all("(els) => els.map(e => e.value)")
    assert options == ["hf_jobs"], "a Space offers no local runs unless its owner turns them on"
    preview, message = _launch_reviewed(page)
    assert "hf://buckets/alice/grpo-runs" in preview and "--namespace alice" in preview, preview
    run_id = _run_id(message)
    print(f"page load to launched run: {time.monotonic() - started:.1f} s, 3 clicks after signing in")

    [post] = [p for p in hub.job_posts() if p.json["labels"]["grpo-panel-run"] == run_id]
    assert post.user == "alice" and post.path == "/api/jobs/alice"
    assert post.json["secrets"] == {"HF_TOKEN": ALICE}, "the visitor's token travels as a secret only"
    body_without_secrets = {k: v for k, v in post.json.items() if k != "secrets"}
    assert ALICE not in str(body_without_secrets)
    spec = hub.buckets["alice/grpo-runs"].files[f"runs/{run_id}/spec.json"].data.decode()
    assert ALICE not in spec and '"bucket": "alice/grpo-runs"' in spec
    assert hub.buckets["alice/grpo-runs"].private, "the bucket made on first launch is private"


def test_org_members_share_runs_while_outsiders_and_anonymous_visitors_see_nothing(visit, hub):
    alice = visit(ALICE, "alice")
    _open_hardware(alice)
    field_box(alice, "bucket").fill("acme/grpo-runs")
    field_box(alice, "bucket").press("Tab")
    run_id = _run_id(_launch_reviewed(alice)[1])
    [job] = [j for j in hub.jobs.values() if j.spec["labels"]["grpo-panel-run"] == run_id]
    hub.set_stage(job.id, "RUNNING")
    hub.append_logs(job.id, f"step 1/500 reward 0.1 with HF_TOKEN={ALICE} and {PLANTED}_x printed by user code")

    bob = visit(BOB, "bob")
    bob.get_by_role("tab", name="Runs").click()
    wait_for_text(bob, "runs-table", re.escape(run_id))
    bob.locator("#run-pick input").first.click()
    bob.get_by_role("option", name=run_id).click()
    wait_for_text(bob, "run-status", re.escape(run_id))
    bob.wait_for_function("() => document.querySelector('#log-box textarea')?.value.includes('step 1/500')",
                          timeout=30000)
    log = bob.locator("#log-box textarea").input_value()
    assert ALICE not in log and PLANTED not in log and "hf_***" in log, log

    carol = visit(CAROL, "carol")
    carol.get_by_role("tab", name="Runs").click()
    carol.wait_for_timeout(5000)                       # two timer ticks
    assert run_id not in text_of(carol, "runs-table")
    anonymous = visit()
    anonymous.get_by_role("tab", name="Runs").click()
    wait_for_text(anonymous, "runs-hint", "sign in")
    assert run_id not in text_of(anonymous, "runs-table")
    anonymous.get_by_role("tab", name="Launch").click()
    posts = len(hub.job_posts())
    assert "sign in" in _launch_reviewed(anonymous)[1].lower()
    assert len(hub.job_posts()) == posts, "an anonymous click submits nothing"

    bob.locator("#cancel-btn").click()
    wait_for_text(bob, "action-msg", "cancel requested")
    wait_until(lambda: job.stage == "CANCELED", timeout=10)
    assert [r.user for r in hub.requests if r.path.endswith(f"{job.id}/cancel")] == ["bob"]


def _rename(page, run_id: str, name: str) -> str:
    """Open the run, type `name` into its *Name* field and click *Rename*: the message the page answers."""
    pick_run(page, run_id, 60000)      # a Space lists the org's jobs from the Hub: slower under load
    page.locator("#jump-bar a", has_text="Notes").click()
    page.locator("#notes-section").get_by_text(notes_view.SECTION, exact=True).click()
    keep_value(page, page.locator("#run-name textarea, #run-name input").first, name, "the run's name")
    page.locator("#rename-btn").click()
    return wait_for_text(page, "notes-msg", "renamed|is now called", 60000)


def test_a_visitor_who_may_not_change_a_run_cannot_rename_it_through_the_page(visit, hub):
    alice = visit(ALICE, "alice")
    _open_hardware(alice)
    field_box(alice, "bucket").fill("acme/grpo-runs")
    field_box(alice, "bucket").press("Tab")
    run_id = _run_id(_launch_reviewed(alice)[1])
    notes = f"runs/{run_id}/notes.json"
    dave = visit(DAVE, "dave")      # sees the acme org's runs, changes none (the Space's rule: who may cancel)
    message = _rename(dave, run_id, "defaced")
    assert message.startswith("Not renamed") and "read-only" in message, message
    assert notes not in hub.buckets["acme/grpo-runs"].files, "a refused rename writes nothing"
    renamed = _rename(alice, run_id, "alice's baseline")
    assert renamed.startswith(f"Run {run_id} (acme on Hugging Face Jobs) is now called"), renamed
    assert json.loads(hub.buckets["acme/grpo-runs"].files[notes].data)["name"] == "alice's baseline"
    wait_for_text(alice, "run-status", re.escape(f"alice's baseline · Run {run_id}"))
    # A name Markdown or Gradio's LaTeX would render (a math block) reads as itself in the header.
    keep_value(alice, alice.locator("#run-name textarea, #run-name input").first, "$$x$$ - *y*", "the run's name")
    alice.locator("#rename-btn").click()        # the notes section is open already
    wait_for_text(alice, "run-status", re.escape(f"$$x$$ - *y* · Run {run_id}"))
    assert alice.locator("#run-status .katex, #run-status em, #notes-msg .katex").count() == 0, "rendered as markup"


def _finish(hub, run_id: str, bucket: str = "alice/grpo-runs") -> None:
    """The run's trainer logged two steps, wrote final/ and completed."""
    [job] = [j for j in hub.jobs.values() if j.spec["labels"]["grpo-panel-run"] == run_id]
    records = [{"step": 1, "time": 1.0, "reward": 0.2}, {"step": 2, "time": 2.0, "reward": 0.6}]
    hub.put_file(bucket, f"runs/{run_id}/metrics/trainer-000000.jsonl",
                 "".join(json.dumps(r) + "\n" for r in records).encode())
    hub.put_file(bucket, f"runs/{run_id}/final/adapter_config.json", b'{"r": 16, "peft_type": "LORA"}')
    hub.put_file(bucket, f"runs/{run_id}/final/adapter_model.safetensors", b"\x00safetensors bytes")
    hub.set_stage(job.id, "RUNNING")
    hub.set_stage(job.id, "COMPLETED")


def _push(page, repo_id: str | None = None) -> str:
    if not page.locator("#push-repo textarea, #push-repo input").first.is_visible():
        page.get_by_text("Push the picked adapter version to the Hub", exact=True).click()
    box = page.locator("#push-repo textarea, #push-repo input").first
    if repo_id is not None:
        box.fill(repo_id)
        box.press("Tab")
    before = text_of(page, "push-msg")
    page.locator("#push-btn").click()
    # While the click is pending Gradio shows its status tracker ("queue: 1/1", a timer) over the old message:
    # wait until the tracker is hidden again and the message is a new one.
    page.wait_for_function("(b) => { const e = document.getElementById('push-msg'); "
                           "const busy = e.querySelector('[data-testid=\"status-tracker\"]:not(.hide)'); "
                           "const t = e.innerText.trim(); return !busy && /pushed/i.test(t) && t !== b; }",
                           arg=before, timeout=30000)
    return text_of(page, "push-msg")


def test_a_signed_in_visitor_pushes_a_finished_runs_adapter_and_others_are_refused(visit, hub):
    alice = visit(ALICE, "alice")
    run_id = _run_id(_launch_reviewed(alice)[1])
    _finish(hub, run_id)
    wait_for_text(alice, "run-status", "final adapter ready")
    alice.get_by_text("Push the picked adapter version to the Hub", exact=True).click()
    box = alice.locator("#push-repo textarea, #push-repo input").first
    alice.wait_for_function("() => { const b = document.querySelector('#push-repo textarea, #push-repo input');"
                            " return b && /^alice\\/.+-lora$/.test(b.value); }", timeout=30000)
    repo_id = box.input_value()
    message = _push(alice)
    assert message.startswith("Pushed the final adapter of run") and "(private)" in message, message
    repo = hub.repos[repo_id]
    assert repo.private and set(repo.files) == {"adapter_config.json", "adapter_model.safetensors", "README.md",
                                                "version.json"}, "the adapter, its card and which version it is"
    card = repo.files["README.md"].decode()
    assert repo.lfs == {"adapter_model.safetensors"} and "hf://buckets/alice/grpo-runs" in card
    assert "https://huggingface.co/spaces/alice/grpo-panel" in card

    refused = _push(alice, "carol/stolen-lora")
    assert "Not pushed" in refused and "You cannot write to carol" in refused, refused
    anonymous = visit()
    anonymous.get_by_role("tab", name="Runs").click()
    assert "Sign in with Hugging Face to push" in _push(anonymous)
    assert set(hub.repos) == {repo_id}


def test_the_budget_cap_stops_a_run_in_the_background_and_the_visitor_is_told(visit, hub):
    alice = visit(ALICE, "alice")
    _open_hardware(alice)
    field_box(alice, "budget_usd").fill("0.5")
    field_box(alice, "budget_usd").press("Tab")
    preview, message = _launch_reviewed(alice)
    assert "Budget cap $0.50" in preview, preview
    run_id = _run_id(message)
    [job] = [j for j in hub.jobs.values() if j.spec["labels"]["grpo-panel-run"] == run_id]
    hub.clock = lambda: time.time() - 3600          # it started an hour ago: $1.50 on a10g-large
    try:
        hub.set_stage(job.id, "RUNNING")
    finally:
        hub.clock = time.time
    wait_until(lambda: job.stage == "CANCELED", timeout=90)
    header = wait_for_text(alice, "run-cost", "budget cap reached", timeout_ms=30000)
    assert "cancelled 1 job(s)" in header and "reached the budget cap of $0.50" in header, header
    wait_for_text(alice, "runs-table", "⛔ cap \\$0\\.50")
    files = hub.buckets["alice/grpo-runs"].files
    assert [p for p in files if p.startswith(f"runs/{run_id}/events/panel-budget-")]


def test_orphan_jobs_are_listed_and_cancelled_with_one_click(visit, hub):
    alice = visit(ALICE, "alice")
    run_id = _run_id(_launch_reviewed(alice)[1])
    [job] = [j for j in hub.jobs.values() if j.spec["labels"]["grpo-panel-run"] == run_id]
    hub.set_stage(job.id, "RUNNING")
    bucket = hub.buckets["alice/grpo-runs"]
    for path in [p for p in bucket.files if p.startswith(f"runs/{run_id}/")]:
        del bucket.files[path]                      # the run's folder was deleted; its job still bills
    alice.get_by_role("tab", name="Runs").click()
    alice.get_by_text("Jobs still running after their run ended", exact=True).click()
    alice.locator("#orphans-find").click()
    wait_for_text(alice, "orphans-table", re.escape(job.id))
    assert f"runs/{run_id} is gone" in text_of(alice, "orphans-table")
    alice.locator("#orphans-cancel").click()
    wait_for_text(alice, "orphans-msg", "cancel requested for [1-9]")
    wait_until(lambda: job.stage == "CANCELED", timeout=10)
    assert [r.user for r in hub.requests if r.path.endswith(f"{job.id}/cancel")] == ["alice"]


def test_nothing_a_visitor_types_stays_in_their_browser_storage(visit, hub):
    """Gradio 6 keeps each call's inputs in local storage by default ("run history"): a webhook URL and reward code
    typed into the form, a refused launch and a task check later, the browser holds none of them."""
    page = visit(ALICE, "alice")
    hook = "https://hooks.slack.com/services/T000/B000/" + "typedWebhookSecret" * 2
    marker = "typed_reward_marker_" + "q" * 8
    page.get_by_text("Alerts", exact=True).click()
    page.locator("#f-webhook input, #f-webhook textarea").first.fill(hook)
    editor = page.locator("#f-reward_code .cm-content")
    editor.wait_for(state="visible", timeout=30000)
    editor.click()
    page.keyboard.press("Control+A")
    page.keyboard.press("Delete")
    editor.fill(f"def {marker}(completions, **kwargs):\n    return [0.0] * len(completions)\n")
    page.locator("#check-task-btn").click()
    wait_for_text(page, "task-msg", "task checked|fix these", timeout_ms=120000)
    page.locator("#launch-btn").click()
    # Refused either way: not reviewed, or (no DNS here) the webhook's host cannot be resolved and checked.
    wait_for_text(page, "launch-msg", "not launched|review|fix these", timeout_ms=60000)
    stored = page.evaluate("""async () => {
        const dump = (s) => Object.keys(s).map(k => k + '=' + s.getItem(k)).join('\\n');
        const dbs = indexedDB.databases ? (await indexedDB.databases()).map(d => d.name).join(',') : '';
        return dump(localStorage) + '\\n' + dump(sessionStorage) + '\\n' + dbs + '\\n' + document.cookie;
    }""")
    assert hook not in stored and "typedWebhookSecret" not in stored, stored[:2000]
    assert marker not in stored, stored[:2000]


# ---- what a visitor can make the Space do beyond its own runs: outbound requests, uploads, markup

def test_a_visitors_webhook_at_this_machine_or_a_private_network_is_refused_at_preview_and_never_requested(visit,
                                                                                                          space):
    """Webhook URLs at loopback (the Space's own port among them), written as v4, v6, a decimal number or a name,
    and at private ranges: each refused when the visitor previews, with the field named and marked, and nothing
    ever reaches the loopback servers."""
    from tests.test_webhook import loopback_name, recording

    url, _ = space
    own_port = int(url.rsplit(":", 1)[1].split("/")[0])
    page = visit(ALICE, "alice")
    page.get_by_text("Alerts", exact=True).click()
    hook = page.locator("#f-webhook input, #f-webhook textarea").first
    with recording() as server, recording("::1") as server6:
        for aimed in (f"http://127.0.0.1:{own_port}/gradio_api/upload", f"https://127.0.0.1:{server.port}/hook",
                      f"https://[::1]:{server6.port}/hook", f"https://2130706433:{server.port}/hook",
                      f"https://localhost:{server.port}/hook", f"https://{loopback_name()}:{server.port}/hook",
                      "https://10.0.0.7/hook", "https://192.168.0.1/hook", "https://169.254.169.254/latest"):
            hook.fill(aimed)
            before = text_of(page, "launch-msg")
            page.locator("#preview-btn").click()
            page.wait_for_function("(before) => document.getElementById('launch-msg').innerText !== before",
                                   arg=before, timeout=60000)
            shown = wait_for_text(page, "launch-msg", "fix these fields")
            assert "Alert webhook URL" in shown, (aimed, shown)
            assert "public addresses" in shown or "https URL" in shown, (aimed, shown)
            assert "field-error" in (page.locator("#f-webhook").get_attribute("class") or ""), aimed
            assert "review code" not in shown.lower(), shown
        page.locator("#launch-btn").click()
        assert "Alert webhook URL" in wait_for_text(page, "launch-msg", "fix these fields|not launched")
        assert server.seen == [] and server6.seen == [], "a refused webhook was requested"


def _upload(url: str, size: int, cookie: str | None = None, name: str = "data.jsonl"):
    import httpx

    cookies = {"session": cookie} if cookie else None
    return httpx.post(f"{url}/gradio_api/upload", files={"files": (name, b"x" * size, "application/json")},
                      cookies=cookies, timeout=60)


def test_uploads_are_for_signed_in_visitors_and_bounded_in_size(space):
    """A real multipart POST to Gradio's upload route: anonymous (or with an expired sign-in) 401 and nothing
    stored; signed in, a file under GRPO_PANEL_MAX_UPLOAD_MB is taken and one over it refused with 413."""
    url, home = space
    cache = home / "gradio-cache"
    signed_in = space_session_cookie(CLIENT_SECRET, ALICE, "alice", time.time() + 600)
    expired = space_session_cookie(CLIENT_SECRET, ALICE, "alice", time.time() - 60)
    for cookie in (None, expired):
        refused = _upload(url, 1000, cookie, name="anonymous-upload.jsonl")
        assert refused.status_code == 401 and "Sign in" in refused.text, refused.text
    assert not [p for p in cache.rglob("anonymous-upload*")], "an anonymous upload was stored"
    taken = _upload(url, 1000, signed_in, name="small-upload.jsonl")
    assert taken.status_code == 200 and taken.json()[0].endswith("small-upload.jsonl"), taken.text
    too_big = _upload(url, UPLOAD_MB * 2**20 + 1, signed_in, name="big-upload.jsonl")
    assert too_big.status_code == 413, (too_big.status_code, too_big.text)
    assert not [p for p in cache.rglob("big-upload*") if p.stat().st_size > UPLOAD_MB * 2**20]


def test_the_space_sends_no_analytics_or_telemetry(space, hub):
    """Gradio's analytics and huggingface_hub's telemetry would post to HF_ENDPOINT (the fake Hub here)."""
    url, _ = space
    import httpx

    assert httpx.get(url, timeout=30).status_code == 200
    time.sleep(1)
    assert not [r.path for r in hub.requests if "telemetry" in r.path], "telemetry reached the Hub"

