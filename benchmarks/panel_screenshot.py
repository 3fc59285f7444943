"""Open a run exported by gpu_recipes.py (--export) in the real panel and screenshot its dashboard.

    python benchmarks/panel_screenshot.py RUN.tar.gz OUT.png

Unpacks the run (its job records, resource samples, metrics and events) into a fresh panel home, starts
`app.py` on it, selects the run on the Runs tab in Debian's chromium and saves the dashboard (status, charts)
as OUT.png. docs/gpu-recipes.md's GPU screenshot was made this way from a run on two H200s.
"""

import os
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_panel(home: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    env = {**os.environ, "GRPO_PANEL_HOME": home, "PORT": str(port), "GRADIO_ANALYTICS_ENABLED": "False"}
    log = open(os.path.join(home, "app.log"), "wb")
    proc = subprocess.Popen([sys.executable, "app.py"], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    for _ in range(240):
        try:
            urllib.request.urlopen(url, timeout=2)
            return proc, url
        except OSError:
            time.sleep(0.5)
    os.killpg(proc.pid, signal.SIGTERM)
    sys.exit(f"the panel did not start; see {home}/app.log")


def screenshot(url: str, run_id: str, out: str) -> None:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox", "--disable-gpu"])
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.goto(url)
        page.get_by_role("tab", name="Runs").click()
        page.locator("#run-pick input").click()
        page.get_by_role("option", name=run_id).first.click()
        page.wait_for_function("() => document.querySelectorAll('#util-plot .trace').length > 0", timeout=60000)
        page.wait_for_timeout(2000)   # the other charts of the same frame
        top = page.locator("#run-status").bounding_box()["y"]
        bottom = page.locator("#length-plot").bounding_box()
        height = bottom["y"] + bottom["height"] - top + 20
        page.screenshot(path=out, full_page=True, clip={"x": 0, "y": top - 10, "width": 1400, "height": height})
        browser.close()


def main() -> None:
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    archive, out = sys.argv[1], os.path.abspath(sys.argv[2])
    home = tempfile.mkdtemp(prefix="grpo-panel-shot-")
    with tarfile.open(archive) as tar:
        tar.extractall(home, filter="data")
    run_id = next(Path(home, "buckets").glob("*/*/runs/*")).name
    proc, url = start_panel(home)
    try:
        screenshot(url, run_id, out)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
    print(f"{out} ({run_id}, panel home {home})")


if __name__ == "__main__":
    main()
