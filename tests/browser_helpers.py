"""What the browser tests share: start the panel as a real process, drive Debian's chromium, read the page."""

import base64
import contextlib
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request

from tests.helpers import free_port

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run"]


def tail(path, lines: int = 60) -> str:
    try:
        with open(path, errors="replace") as f:
            return "\n".join(f.read().splitlines()[-lines:])
    except OSError as exc:
        return f"(no log: {exc})"


@contextlib.contextmanager
def running_panel(script: str, env: dict, home, startup_s: float = 120.0, unset: tuple[str, ...] = (),
                  python: str = sys.executable):
    """`python <script>` as its own process group on a free port; yields its URL; stops the group at the end.
    `env` is added to this process's environment, without the variables named in `unset`; `python` is the
    interpreter (by the path given: a venv's, reached through a link, starts as such)."""
    port = free_port()
    env = {**{k: v for k, v in os.environ.items() if k not in unset}, "GRPO_PANEL_HOME": str(home),
           "PORT": str(port), "GRADIO_ANALYTICS_ENABLED": "False", **env}
    log_path = os.path.join(str(home), "app.log")
    os.makedirs(str(home), exist_ok=True)
    log = open(log_path, "wb")
    proc = subprocess.Popen([python, script], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + startup_s
        while True:
            try:
                urllib.request.urlopen(url, timeout=2)
                break
            except OSError:
                assert proc.poll() is None, tail(log_path)
                assert time.time() < deadline, f"the panel did not answer within {startup_s:.0f} s:\n{tail(log_path)}"
                time.sleep(0.5)
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)   # the panel stops its local jobs on exit
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()


@contextlib.contextmanager
def panel_page(url: str, home, request):
    """A fresh chromium page on the panel at `url`, once its form is up; when the test failed, a full-page
    screenshot and the panel's log tail are left in `home`."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1000}, accept_downloads=True)
        page.goto(url)
        page.locator("#launch-btn").wait_for(state="visible", timeout=60000)
        try:
            yield page
        finally:
            report = getattr(request.node, "rep_call", None)
            if report is not None and report.failed:
                page.screenshot(path=os.path.join(str(home), f"{request.node.name}.png"), full_page=True)
                print(f"--- panel log tail:\n{tail(os.path.join(str(home), 'app.log'))}")
            browser.close()


def space_session_cookie(client_secret: str, token: str, username: str, expires_at: float) -> str:
    """The `session` cookie Gradio's OAuth callback would set for a signed-in visitor: Starlette's
    SessionMiddleware format (base64 JSON, itsdangerous TimestampSigner) under Gradio's key,
    sha256(OAUTH_CLIENT_SECRET + "-v4")."""
    import itsdangerous

    oauth_info = {"access_token": token, "token_type": "bearer", "scope": "openid profile jobs",
                  "expires_at": int(expires_at), "expires_in": int(expires_at - time.time()),
                  "userinfo": {"sub": hashlib.sha1(username.encode()).hexdigest()[:24], "name": username.title(),
                               "preferred_username": username, "profile": f"https://huggingface.co/{username}",
                               "picture": "", "website": ""}}
    key = hashlib.sha256((client_secret + "-v4").encode()).hexdigest()
    data = base64.b64encode(json.dumps({"oauth_info": oauth_info}).encode())
    return itsdangerous.TimestampSigner(key).sign(data).decode()


def text_of(page, elem_id: str) -> str:
    return page.evaluate("(id) => { const e = document.getElementById(id); return e ? e.innerText : ''; }", elem_id)


def wait_for_text(page, elem_id: str, pattern: str, timeout_ms: int = 30000) -> str:
    """The element's text once it matches the regular expression `pattern` (case-insensitive)."""
    page.wait_for_function("""([id, pattern]) => {
        const e = document.getElementById(id);
        return e && new RegExp(pattern, 'i').test(e.innerText);
    }""", arg=[elem_id, pattern], timeout=timeout_ms)
    return text_of(page, elem_id)


def field_box(page, name: str):
    """The text box of the form's field `name` (`#f-<name>`: a textarea or an input)."""
    return page.locator(f"#f-{name} textarea, #f-{name} input").first


def keep_value(page, box, value, what: str) -> None:
    """Type `value` into `box` until it holds.

    A field inside an accordion that has just been opened can be reset to its stored value right after it mounts
    (seen in CI: the value typed within ~0.1 s of opening was replaced by the preset's), so the value is typed
    again until it survives a short settle."""
    want = str(value)
    for _ in range(10):
        box.fill(want)
        box.press("Tab")
        page.wait_for_timeout(400)
        if box.input_value() == want:
            return
    raise AssertionError(f"{what} does not keep {want!r}; it shows {box.input_value()!r}")


def set_number(page, elem_id: str, value) -> None:
    """Type a number into the number field `#elem_id` until it holds (`keep_value`)."""
    keep_value(page, page.locator(f"#{elem_id} input").first, value, f"#{elem_id}")


def pick_run(page, run_id: str, list_timeout_ms: int = 30000) -> None:
    """Open the run `run_id` on the Runs tab, as a visitor picks it from the list."""
    page.get_by_role("tab", name="Runs").click()
    wait_for_text(page, "runs-table", re.escape(run_id), list_timeout_ms)
    page.locator("#run-pick input").first.click()
    page.get_by_role("option", name=run_id).click()
    wait_for_text(page, "run-status", re.escape(run_id))


def open_runs_list(page) -> None:
    """Open the runs list (*All runs*) where it folded away when a run was opened."""
    table = page.locator("#runs-table")
    if not table.is_visible():
        page.locator("#runs-list").get_by_text("All runs", exact=True).click()
        table.wait_for(state="visible", timeout=30000)


def launch_message(page) -> str:
    try:
        return page.evaluate("() => document.querySelector('#launch-msg').innerText")
    except Exception as exc:
        return f"(unreadable: {exc})"


def wait_for_launch_answer(page, timeout_ms: int = 30000) -> str:
    """The launch message once the server has answered the click: a refusal or 'Launched run'."""
    page.wait_for_function("""() => {
        const t = document.querySelector('#launch-msg').innerText;
        return /launched/i.test(t);   // 'Launched run ...', 'Not launched ...', '... nothing was launched'
    }""", timeout=timeout_ms)
    return launch_message(page)


def table_rows(page, table_id: str) -> list[list[str]]:
    """The rows a Gradio table `#table_id` draws, each a list of its cells' texts."""
    return page.evaluate("""(id) => Array.from(document.querySelectorAll('#' + id + ' .virtual-row'))
        .map(r => Array.from(r.querySelectorAll('[role=gridcell]')).map(c => c.textContent.trim()))""", table_id)


def plot_points(page, plot_id: str, trace: str) -> int:
    return page.evaluate("""([plotId, trace]) => {
        const el = document.querySelector('#' + plotId + ' .js-plotly-plot');
        const t = el && el.data ? el.data.find(d => d.name === trace) : null;
        return t ? t.x.length : 0;
    }""", [plot_id, trace])


def inner_text(page, elem_id: str) -> str:
    """The element's text; fails where there is no such element (so a check that some text is absent cannot pass
    on a missing element, as `text_of` would)."""
    return page.evaluate("(id) => document.getElementById(id).innerText", elem_id)
