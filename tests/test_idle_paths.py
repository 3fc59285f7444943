"""The idle check (panel/tick.py) on the paths real visitors take, in Debian's chromium: a panel behind its login
(`GRPO_PANEL_AUTH`), a panel served under a root path behind a reverse proxy that mounts it at a prefix (as nginx or a
Space's edge would), and a Space whose visitors sign in with Hugging Face. On each, an idle page (nothing live shown)
checks the stamp with its own sign-in and still lists a run started elsewhere; on a Space the stamp is the visitor's
own: another visitor's new run changes nothing on their idle page. Request-level checks of the same endpoint (refused
without the login, malformed calls) are tests/test_tick_stamp_requests.py."""

import json
import os
import re
import sys
import threading
import time

import httpx
import pytest
import uvicorn
from playwright.sync_api import TimeoutError as PlaywrightTimeout
from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.responses import StreamingResponse
from starlette.routing import Route

from panel.tick import IDLE_TICK_S, STAMP_API, TICK_S
from tests import space_panel, test_space_browser
from tests.browser_helpers import ROOT, running_panel, text_of, wait_for_text
from tests.helpers import free_port
from tests.space_panel import ALICE, CAROL
from tests.test_idle_page import LISTING_S
from tests.test_space_tenants import launched_by_mcp

sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
from dashboard_scale import SyntheticRun
from idle_page import NO_TOKENS, finished_run, run_ready

# Tier 2: a panel (or a Space and its fake Hub) per scenario, each page waited on until it is idle (minutes here).
pytestmark = [pytest.mark.browser, pytest.mark.full]
hub, space = space_panel.hub, space_panel.space   # the Space scenario's fixtures (started only for it)
visit = test_space_browser.visit      # the Space opened signed in, a browser context each

LOGIN = ("ann", "s3cret-panel-pw")
PREFIX = "/grpo"
FIRST_CHECK_S = TICK_S + 2 * IDLE_TICK_S + 30     # the fast timer's first tick stops it; an idle check comes after
HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "upgrade", "proxy-connection", "te", "trailer", "host"}


class StampChecks:
    """The page's idle checks as the browser sent them: each answer's URL and status."""

    def __init__(self, page):
        self.answers: list[tuple[str, int]] = []
        page.on("response", self._seen)

    def _seen(self, response) -> None:
        if response.request.method == "POST" and f"/run/{STAMP_API}" in response.url:
            self.answers.append((response.url, response.status))

    def wait_first(self, page) -> None:
        deadline = time.monotonic() + FIRST_CHECK_S
        while not self.answers:
            assert time.monotonic() < deadline, f"no idle check in {FIRST_CHECK_S:.0f} s"
            page.wait_for_timeout(500)


def listed_after_idle(page, checks: StampChecks, start_elsewhere, listing_s: float) -> tuple[str, float]:
    """Once the page is idle (its first check answered), a run started elsewhere (`start_elsewhere()`: its id) is
    listed on it within the idle period, the listing's age and a tick's time: (run id, seconds it took)."""
    checks.wait_first(page)
    started = time.monotonic()
    other = start_elsewhere()
    folded = page.locator("#runs-list").get_by_text("All runs").first    # folded away once a run is open
    if not page.locator("#runs-table").is_visible():
        folded.click()
    within_s = IDLE_TICK_S + listing_s + 20
    try:
        wait_for_text(page, "runs-table", re.escape(other), int(within_s * 1000))
    except PlaywrightTimeout:
        raise AssertionError(f"{other} not listed within {within_s:.0f} s; the idle checks' answers: "
                             f"{checks.answers}") from None
    return other, time.monotonic() - started


@pytest.fixture
def finished_home(tmp_path):
    """A panel home holding one finished run: (home, run id)."""
    home = tmp_path / "home"
    return home, finished_run(str(home), 10)


def test_behind_the_panels_login_the_idle_check_carries_the_login_and_a_run_started_elsewhere_appears(
        finished_home, browser, no_hub_login):
    home, run_id = finished_home
    with running_panel(os.path.join(ROOT, "app.py"), {"GRPO_PANEL_AUTH": ":".join(LOGIN)}, home,
                       unset=NO_TOKENS) as url:
        context = browser.new_context(viewport={"width": 1400, "height": 1000})
        try:
            page = context.new_page()
            page.goto(f"{url}/?run={run_id}")        # Gradio's login page first
            page.get_by_label("username").fill(LOGIN[0])
            page.get_by_label("password").fill(LOGIN[1])
            page.get_by_role("button", name="Login").click()
            page.locator("#launch-btn").wait_for(state="attached", timeout=60000)
            checks = StampChecks(page)
            if f"run={run_id}" not in page.url:     # the login landed on the panel's root
                page.goto(f"{url}/?run={run_id}")
            run_ready(run_id)(page)
            other, seen_s = listed_after_idle(page, checks, lambda: SyntheticRun(str(home), 5).spec.run_id,
                                              LISTING_S)
            refused = [a for a in checks.answers if a[1] != 200]
            assert not refused, f"idle checks the panel refused (no login cookie?): {refused}"
            print(f"behind the login: {len(checks.answers)} checks, all 200; {other} listed after {seen_s:.1f} s")
        finally:
            context.close()


class PrefixProxy:
    """A reverse proxy on a free loopback port that serves `upstream` at `PREFIX`/, as nginx's `location /grpo/ {
    proxy_pass http://upstream/; proxy_set_header X-Forwarded-Host $host; ... }` does (Gradio's guide to running
    behind nginx): the prefix stripped, the Host and X-Forwarded-* headers set, answers streamed (Gradio's queue
    answers with server-sent events)."""

    def __init__(self, upstream: str, refused: str | None = None):
        self.upstream, self.refused = upstream, refused
        self.paths: list[str] = []
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}{PREFIX}"
        self.client = httpx.AsyncClient(base_url=upstream, timeout=None)
        app = Starlette(routes=[Route("/{path:path}", self.forward,
                                      methods=["GET", "POST", "PUT", "DELETE", "HEAD", "OPTIONS", "PATCH"])])
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning",
                                                    lifespan="off"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    async def forward(self, request):
        path = request.url.path
        if not (path == PREFIX or path.startswith(PREFIX + "/")):
            return StreamingResponse(iter([b"not under the prefix"]), status_code=404)
        self.paths.append(path)
        if self.refused and path.endswith(self.refused):     # as a proxy locking down Gradio's API would
            return StreamingResponse(iter([b"forbidden here"]), status_code=403)
        headers = [(k, v) for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP]
        headers += [("host", request.headers["host"]), ("x-forwarded-host", request.headers["host"]),
                    ("x-forwarded-proto", "http"), ("x-forwarded-for", request.client.host)]
        upstream = self.client.build_request(request.method, path[len(PREFIX):] or "/",
                                             params=request.url.query, headers=headers, content=await request.body())
        answer = await self.client.send(upstream, stream=True)
        kept = {k: v for k, v in answer.headers.multi_items() if k.lower() not in HOP_BY_HOP}
        return StreamingResponse(answer.aiter_raw(), status_code=answer.status_code, headers=kept,
                                 background=BackgroundTask(answer.aclose))

    def __enter__(self):
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            assert self.thread.is_alive() and time.monotonic() < deadline, "the proxy did not start in 30 s"
            time.sleep(0.1)
        return self

    def __exit__(self, *exc):
        self.server.should_exit = True
        self.thread.join(timeout=30)
        assert not self.thread.is_alive(), "the proxy did not stop in 30 s"


def test_under_a_root_path_behind_a_prefix_proxy_the_idle_check_goes_through_the_proxy_and_a_new_run_appears(
        finished_home, browser, no_hub_login):
    home, run_id = finished_home
    with running_panel(os.path.join(ROOT, "app.py"), {"GRADIO_ROOT_PATH": PREFIX}, home, unset=NO_TOKENS) as url, \
            PrefixProxy(url) as proxy:
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        try:
            checks = StampChecks(page)
            page.goto(f"{proxy.url}/?run={run_id}")
            run_ready(run_id)(page)
            assert page.evaluate("window.gradio_config.root").rstrip("/") == proxy.url
            other, seen_s = listed_after_idle(page, checks, lambda: SyntheticRun(str(home), 5).spec.run_id,
                                              LISTING_S)
            wrong = [a for a in checks.answers if a != (f"{proxy.url}/gradio_api/run/{STAMP_API}", 200)]
            assert not wrong, f"idle checks that did not go through the proxy's prefix, or failed: {wrong}"
            assert any(p.endswith(f"/run/{STAMP_API}") for p in proxy.paths), "no idle check reached the proxy"
            print(f"under {PREFIX}: {len(checks.answers)} checks through the proxy; {other} listed after "
                  f"{seen_s:.1f} s")
        finally:
            page.close()


def test_behind_a_proxy_that_refuses_the_stamp_route_the_idle_page_falls_back_to_the_full_update(
        finished_home, browser, no_hub_login):
    """The idle check refused (here by the proxy; a lost login or a stamp that raised alike): the page still lists a
    run started elsewhere, through the full update it clicks instead, and never stops updating in silence."""
    home, run_id = finished_home
    with running_panel(os.path.join(ROOT, "app.py"), {"GRADIO_ROOT_PATH": PREFIX}, home, unset=NO_TOKENS) as url, \
            PrefixProxy(url, refused=f"/run/{STAMP_API}") as proxy:
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        try:
            checks = StampChecks(page)
            page.goto(f"{proxy.url}/?run={run_id}")
            run_ready(run_id)(page)
            other, seen_s = listed_after_idle(page, checks, lambda: SyntheticRun(str(home), 5).spec.run_id,
                                              LISTING_S)
            assert {status for _, status in checks.answers} == {403}, checks.answers
            print(f"stamp refused ({len(checks.answers)} checks, 403): {other} listed after {seen_s:.1f} s")
        finally:
            page.close()


def stamp_from(page, run_id: str) -> str:
    """The stamp the panel answers this page's browser (its own cookies and session) for `run_id`."""
    return page.evaluate("""async (run) => {
        const root = (window.gradio_config.root || '').replace(/\\/+$/, '');
        const answer = await fetch(root + '/gradio_api/run/STAMP_API', {method: 'POST',
            headers: {'Content-Type': 'application/json'},
            body: JSON.stringify({data: [run], session_hash: window.__gradio_session_hash__})});
        return answer.ok ? (await answer.json()).data[0] : 'status ' + answer.status;
    }""".replace("STAMP_API", STAMP_API), run_id)


def test_on_a_space_a_signed_in_visitors_idle_page_lists_their_new_run_and_another_visitors_stamp_is_unmoved(
        visit, space, hub):
    url, _ = space
    carol = visit(CAROL, "carol")
    alice = visit(ALICE, "alice")
    alice_checks, carol_checks = StampChecks(alice), StampChecks(carol)
    carol_events: list[float] = []
    carol.on("request", lambda r: carol_events.append(time.monotonic())
             if r.method == "POST" and "/queue/join" in r.url else None)
    for page in (carol, alice):
        page.get_by_role("tab", name="Runs").click()
    carol_checks.wait_first(carol)
    carol_before = stamp_from(carol, "")
    launched: list[str] = []

    def launch_elsewhere() -> str:      # an agent of Alice's, through the Space's MCP tools with her token
        launched.append(launched_by_mcp(url, ALICE, {"max_steps": 7, "name": "alices-idle-pickup"}))
        return launched[0]

    # The Space lists a namespace's Hub jobs at most GRPO_PANEL_HUB_LIST_S (15 s) old.
    other, seen_s = listed_after_idle(alice, alice_checks, launch_elsewhere, 15.0)
    launched_at = time.monotonic() - seen_s
    carol.wait_for_timeout(IDLE_TICK_S * 1000 + 2000)   # a check of Carol's after Alice's run was listed
    assert stamp_from(carol, "") == carol_before, "Carol's stamp moved with Alice's new run"
    assert stamp_from(carol, other) == carol_before, "Alice's run id in Carol's call stamps as something"
    # Alice's run progresses (its trainer logs a step): her stamp for it moves, Carol's for its id does not.
    alice_before = stamp_from(alice, other)
    hub.put_file("alice/grpo-runs", f"runs/{other}/metrics/trainer-000000.jsonl",
                 json.dumps({"step": 1, "time": time.time(), "reward": 0.5}).encode() + b"\n")
    deadline = time.monotonic() + 60
    while stamp_from(alice, other) == alice_before:
        assert time.monotonic() < deadline, "Alice's stamp for her run did not move in 60 s after it logged a step"
        alice.wait_for_timeout(1000)
    assert stamp_from(carol, other) == carol_before, "Alice's run's progress moved Carol's stamp for its id"
    assert not [t for t in carol_events if t >= launched_at], "Carol's idle page sent events for Alice's run"
    assert other not in text_of(carol, "runs-table")
    refused = [a for a in alice_checks.answers + carol_checks.answers if a[1] != 200]
    assert not refused, f"idle checks the Space refused: {refused}"
    print(f"Space: {other} listed on Alice's idle page after {seen_s:.1f} s; Carol's stamp unmoved, "
          f"{len(carol_checks.answers)} checks of hers")
