"""From a metric written by the trainer to the point drawn in the browser, on a live run.

    python benchmarks/draw_latency.py [--sizes 1000 100000] [--writes 25] [--samples flush|step]

Starts the panel (`python app.py`, a process of its own, on a free port) over synthetic live runs in the
project's real format (see dashboard_scale.py: metrics, samples, events, adapters, logs, resource samples),
opens each run's dashboard in Debian's chromium, then writes 10
new steps at a time, as a trainer does, at random moments, and measures how long until the reward chart in the
page shows the newest step. The dashboard's timer ticks every `panel.tick.TICK_S` seconds, so a write waits for
the next tick (up to one interval) plus what the tick costs and the browser's drawing. Runs are measured
interleaved, write by write. Prints the figures against the target (one interval + 1 s); asserts nothing.
"""

import argparse
import os
import random
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT]

from benchmarks.dashboard_scale import SyntheticRun
from panel.tick import TICK_S
from tests.browser_helpers import CHROMIUM, CHROMIUM_ARGS, running_panel, wait_for_text

LAST_STEP_DRAWN = """() => {
    const el = document.querySelector('#reward-plot .js-plotly-plot');
    const t = el && el.data ? el.data.find(d => d.name === 'mean reward') : null;
    return t && t.x.length ? Number(t.x[t.x.length - 1]) : -1;
}"""


def main() -> None:
    from playwright.sync_api import sync_playwright

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 100000])
    parser.add_argument("--writes", type=int, default=25)
    parser.add_argument("--samples", choices=("flush", "step"), default="flush",
                        help="samples written one fragment per flush (trainers now) or per step (runs before)")
    args = parser.parse_args()
    home = tempfile.mkdtemp(prefix="grpo-latency-")
    runs = {rows: SyntheticRun(home, rows, samples=args.samples) for rows in args.sizes}   # live while this runs
    latencies: dict[int, list[float]] = {rows: [] for rows in runs}
    rng = random.Random(0)
    with running_panel("app.py", {}, home, unset=("SPACE_ID", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")) as url, \
            sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        pages = {}
        for rows, run in runs.items():
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.goto(f"{url}/?run={run.spec.run_id}")
            wait_for_text(page, "run-status", run.spec.run_id, 120000)
            # The whole history is drawn (a long run's is read in the background first).
            page.wait_for_function(f"() => ({LAST_STEP_DRAWN})() >= {run.step}", polling=100, timeout=120000)
            pages[rows] = page
        for _ in range(args.writes):
            for rows, run in runs.items():
                time.sleep(rng.uniform(0, TICK_S))       # a trainer writes at any moment of the timer's period
                run.grow(10)
                written = time.perf_counter()
                pages[rows].wait_for_function(f"() => ({LAST_STEP_DRAWN})() >= {run.step}", polling=20,
                                              timeout=60000)
                latencies[rows].append(time.perf_counter() - written)
        browser.close()
    print(f"timer interval {TICK_S:.1f} s; target: written -> drawn within {TICK_S + 1:.1f} s")
    for rows, xs in latencies.items():
        print(f"{rows:>7} rows: written -> drawn median {statistics.median(xs):.2f} s, min {min(xs):.2f} s, "
              f"max {max(xs):.2f} s over {len(xs)} writes; max / (interval + 1 s) = {max(xs) / (TICK_S + 1):.2f}")


if __name__ == "__main__":
    main()
