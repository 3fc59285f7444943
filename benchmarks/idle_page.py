"""What an idle page costs the browser: chromium's renderer CPU per window (30 s) with nothing changing.

    python benchmarks/idle_page.py [--rounds 5] [--window 30] [--steps 300] [--floor] [--baseline DIR]

Pages, each in a chromium of its own (Debian's, through Playwright), all open at once and measured over the same
windows, round after round (so a busy moment of the machine falls on every page alike):
  run     the panel (`python app.py`) with a finished run of `--steps` steps open (`?run=`): its charts, samples,
          held-out scores and adapters, as a visitor leaves the Runs tab;
  form    the panel's launch form, as the page opens;
  trackio trackio's dashboard (`trackio.show()`, its own server on a free loopback port) of a run of as many
          steps that logged the same metrics, in a local trackio folder of its own.
With `--floor`, a Gradio page of one Markdown and no events at all (`gradio-floor`): what any page of this Gradio
costs idle; and the same page with the panel's script that stops Gradio's leaked frame loop (`floor-fixed`,
panel/idle_frames.py). With `--baseline DIR` (another checkout of this project, e.g.
`git archive <commit> | tar -x -C DIR`), the same run and form pages of that checkout's panel too (`base-run`,
`base-form`): a before/after on the same windows.

The renderer is the browser's child process with `--type=renderer` (psutil, user + system time; every renderer of
that chromium summed). Printed per page: the CPU-s per window of each round, min and median, and the ratio of each
page to trackio's (min to min, median to median); the panel processes' own CPU per window too. Asserts nothing; on
a loaded machine the figures are the load's as much as the pages'.
"""

import argparse
import contextlib
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

import psutil

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT]

from benchmarks.dashboard_scale import SyntheticRun
from tests.browser_helpers import CHROMIUM, CHROMIUM_ARGS, running_panel, wait_for_text
from tests.helpers import free_port

TRACKIO_PROJECT = "idle-page"
TRACKIO_SCRIPT = """
import sys, trackio
sys.path[:0] = [{root!r}]
from benchmarks.dashboard_scale import record
trackio.init(project={project!r}, name="grpo-lora-{steps}", auto_log_cpu=False, auto_log_gpu=False)
for step in range(1, {steps} + 1):
    trackio.log({{k: v for k, v in record(step, 0.0).items() if k not in ("step", "time")}}, step=step)
trackio.finish()
trackio.show(project={project!r}, open_browser=False, block_thread=True, server_port={port})
"""
NO_TOKENS = ("SPACE_ID", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")
# The floor any Gradio page pays, here: a page of one Markdown and no events at all.
FLOOR_SCRIPT = """
import sys
import gradio as gr
from starlette.middleware import Middleware
sys.path[:0] = [{root!r}]
from panel.idle_frames import StopLeakedFrames
with gr.Blocks() as demo:
    gr.Markdown("An idle Gradio page.", elem_id="floor")
middleware = [Middleware(StopLeakedFrames)] if {fixed!r} else []
demo.launch(server_name="127.0.0.1", server_port={port}, app_kwargs={{"middleware": middleware}})
"""


def finished_run(home: str, steps: int) -> str:
    """A finished run in the panel's home: `steps` logged steps with samples, held-out scores and adapter versions,
    its final adapter written and every job ended. Its run id."""
    from backend.runtime import layout

    run = SyntheticRun(home, steps, samples="flush", evals=True)
    final = os.path.join(run.run_dir, layout.FINAL_DIR)
    os.makedirs(final, exist_ok=True)
    for name in layout.ADAPTER_FILES:
        with open(os.path.join(final, name), "w") as f:
            f.write("{}")
    run._fragment(run.events, "trainer", run.event_fragment, [{"time": run.t0 + steps + 1, "event": "finished"}])
    run.complete()
    return run.spec.run_id


@contextlib.contextmanager
def panel_server(tree: str, steps: int):
    """The panel of the checkout `tree` over a home of its own holding one finished run: (url, run id, process)."""
    home = tempfile.mkdtemp(prefix="grpo-idle-")
    run_id = finished_run(home, steps)
    before = {p.pid for p in psutil.Process().children()}
    with running_panel(os.path.join(tree, "app.py"), {}, home, unset=NO_TOKENS) as url:
        [proc] = [p for p in psutil.Process().children() if p.pid not in before]
        yield url, run_id, proc


@contextlib.contextmanager
def trackio_server(steps: int):
    """trackio's dashboard of a run of `steps` steps logged with the same metrics, on a free loopback port."""
    port = free_port()
    script = TRACKIO_SCRIPT.format(root=ROOT, project=TRACKIO_PROJECT, steps=steps, port=port)
    with script_server(script, port, "trackio-idle-") as url:
        yield f"{url}/?project={TRACKIO_PROJECT}"


@contextlib.contextmanager
def floor_server(fixed: bool = False):
    """A Gradio page of one Markdown and no events, on a free loopback port; `fixed`: with the panel's script that
    stops Gradio's leaked frame loop (panel/idle_frames.py)."""
    port = free_port()
    with script_server(FLOOR_SCRIPT.format(port=port, root=ROOT, fixed=fixed), port, "gradio-floor-") as url:
        yield url


@contextlib.contextmanager
def script_server(script: str, port: int, prefix: str):
    """`python -c script` serving on `port`, in a folder of its own (TRACKIO_DIR, HF_HOME), its own process group."""
    folder = tempfile.mkdtemp(prefix=prefix)
    env = {**{k: v for k, v in os.environ.items() if k not in NO_TOKENS}, "TRACKIO_DIR": folder,
           "HF_HOME": os.path.join(folder, "hf"), "GRADIO_ANALYTICS_ENABLED": "False"}
    log = open(os.path.join(folder, "server.log"), "wb")
    proc = subprocess.Popen([sys.executable, "-c", script], env=env, stdout=log, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 180
        while True:
            try:
                urllib.request.urlopen(url, timeout=2)
                break
            except OSError:
                assert proc.poll() is None and time.time() < deadline, open(log.name).read()[-2000:]
                time.sleep(0.5)
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()


def chromium_processes() -> set[int]:
    """This process's chromium browser processes (the ones without a `--type`)."""
    out = set()
    for proc in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            cmd = proc.cmdline()
            if cmd and os.path.basename(cmd[0]).startswith("chrom") and not any(a.startswith("--type=") for a in cmd):
                out.add(proc.pid)
    return out


def renderer_times(browser_pid: int) -> dict[int, float]:
    """CPU seconds (user + system) so far of each renderer of the chromium `browser_pid`."""
    out = {}
    with contextlib.suppress(psutil.Error):
        for proc in psutil.Process(browser_pid).children(recursive=True):
            with contextlib.suppress(psutil.Error):
                if "--type=renderer" in proc.cmdline():
                    times = proc.cpu_times()
                    out[proc.pid] = times.user + times.system
    return out


def cpu_of(proc: psutil.Process) -> float:
    with contextlib.suppress(psutil.Error):
        times = proc.cpu_times()
        return times.user + times.system
    return 0.0


def open_page(p, url: str, ready) -> tuple[object, int]:
    """`url` in a chromium of its own, once `ready(page)` returns: (the browser, its browser process's pid)."""
    before = chromium_processes()
    browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
    [pid] = chromium_processes() - before
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.goto(url)
    ready(page)
    return browser, pid


def run_ready(run_id: str):
    def ready(page) -> None:
        wait_for_text(page, "run-status", run_id, 120000)
        page.wait_for_function("() => { const el = document.querySelector('#reward-plot .js-plotly-plot');"
                               " return el && el.data && el.data.length > 0; }", timeout=120000)
    return ready


def form_ready(page) -> None:
    page.locator("#launch-btn").wait_for(state="visible", timeout=120000)


def trackio_ready(page) -> None:
    """Its charts drawn (it polls for new metrics all along: the network never idles)."""
    page.wait_for_function("() => document.querySelectorAll('svg line, svg path').length > 100", timeout=120000)


def floor_ready(page) -> None:
    page.locator("#floor").wait_for(state="visible", timeout=120000)


def measure(pages: dict, servers: dict, rounds: int, window: float) -> tuple[dict, dict]:
    """Each page's renderer CPU-s per window, and each panel process's, over `rounds` windows taken together."""
    cpu = {name: [] for name in pages}
    served = {name: [] for name in servers}
    for i in range(rounds):
        start = {name: renderer_times(pid) for name, pid in pages.items()}
        served_start = {name: cpu_of(proc) for name, proc in servers.items()}
        time.sleep(window)
        for name, pid in pages.items():
            end = renderer_times(pid)
            cpu[name].append(sum(t - start[name].get(p, 0.0) for p, t in end.items()))
        for name, proc in servers.items():
            served[name].append(cpu_of(proc) - served_start[name])
        print(f"round {i + 1}: " + ", ".join(f"{name} {cpu[name][-1]:.2f}" for name in pages)
              + " (renderer CPU-s); panel " + ", ".join(f"{name} {served[name][-1]:.2f}" for name in servers),
              flush=True)
    return cpu, served


def report(cpu: dict, served: dict, window: float) -> None:
    med = statistics.median
    print(f"\nchromium renderer CPU-s per {window:.0f} s, idle ({len(next(iter(cpu.values())))} rounds):")
    for name, xs in cpu.items():
        print(f"{name:>9}: min {min(xs):.2f}  median {med(xs):.2f}  max {max(xs):.2f}")
    base = cpu.get("trackio")
    if base and min(base) > 0:
        for name, xs in cpu.items():
            if name != "trackio":
                print(f"{name:>9} / trackio: min {min(xs) / min(base):.2f}, median {med(xs) / med(base):.2f}")
    for name, xs in served.items():
        print(f"panel process ({name}, both its pages' sessions): median {med(xs):.2f} CPU-s per {window:.0f} s")


def main() -> None:
    from playwright.sync_api import sync_playwright

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--window", type=float, default=30.0, help="seconds per measurement window")
    parser.add_argument("--steps", type=int, default=300, help="logged steps of the run each page shows")
    parser.add_argument("--settle", type=float, default=15.0, help="seconds idle before the first window")
    parser.add_argument("--baseline", help="another checkout of this project: its panel's pages too")
    parser.add_argument("--floor", action="store_true", help="a Gradio page of one Markdown and no events too")
    args = parser.parse_args()
    trees = {"": ROOT, **({"base-": os.path.abspath(args.baseline)} if args.baseline else {})}
    with sync_playwright() as p, contextlib.ExitStack() as stack:     # the pages closed before playwright
        pages, servers = {}, {}
        for prefix, tree in trees.items():
            url, run_id, proc = stack.enter_context(panel_server(tree, args.steps))
            servers[prefix.rstrip("-") or "this"] = proc
            for name, address, ready in ((f"{prefix}run", f"{url}/?run={run_id}", run_ready(run_id)),
                                         (f"{prefix}form", url, form_ready)):
                browser, pages[name] = open_page(p, address, ready)
                stack.callback(browser.close)
        browser, pages["trackio"] = open_page(p, stack.enter_context(trackio_server(args.steps)), trackio_ready)
        stack.callback(browser.close)
        if args.floor:
            for name, fixed in (("gradio-floor", False), ("floor-fixed", True)):
                browser, pages[name] = open_page(p, stack.enter_context(floor_server(fixed)), floor_ready)
                stack.callback(browser.close)
        time.sleep(args.settle)
        cpu, served = measure(pages, servers, args.rounds, args.window)
    report(cpu, served, args.window)


if __name__ == "__main__":
    main()
