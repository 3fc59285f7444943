"""Start `python app.py`, launch the tiny demo from a real browser, and print the panel's own RSS over the run.

    python benchmarks/panel_rss.py

Needs Debian's chromium and Playwright (scripts/install.sh --test). The RSS is the panel process alone,
not the training job it starts.
"""

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

import psutil
from playwright.sync_api import sync_playwright

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "GRPO_PANEL_HOME": tempfile.mkdtemp(prefix="grpo-rss-"), "PORT": str(port)}
    app = subprocess.Popen([sys.executable, "app.py"], cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(180):
            try:
                urllib.request.urlopen(url, timeout=2)
                break
            except OSError:
                time.sleep(0.5)
        proc = psutil.Process(app.pid)
        print(f"panel RSS after start-up: {proc.memory_info().rss / 2**20:.0f} MiB")
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox", "--disable-gpu"])
            page = browser.new_page()
            page.goto(url)
            page.locator("#launch-btn").wait_for()
            started = time.time()
            page.locator("#launch-btn").click()
            peak = 0
            while time.time() - started < 300:
                peak = max(peak, proc.memory_info().rss)
                if "final adapter ready" in page.evaluate(
                        "() => (document.getElementById('run-status') || {innerText: ''}).innerText"):
                    break
                time.sleep(0.5)
            print(f"demo run watched in the browser for {time.time() - started:.1f} s until the final adapter")
            print(f"panel RSS peak during the run: {peak / 2**20:.0f} MiB; at the end: "
                  f"{proc.memory_info().rss / 2**20:.0f} MiB")
            browser.close()
    finally:
        os.killpg(app.pid, signal.SIGTERM)
        app.wait(timeout=30)


if __name__ == "__main__":
    main()
