"""The dashboard at scale, measured the way a browser drives it: each session's timer tick through Gradio's request
path (`Blocks.process_api`: preprocessing, the handler, postprocessing), every 2 s of wall clock, on live runs that
hold the files a trainer writes (metrics, samples, events, adapters, logs, resource samples).

    python benchmarks/dashboard_requests.py [--sizes 1000 100000] [--ticks 40] [--sessions 10]
    python benchmarks/dashboard_requests.py --samples step     # runs written with one samples file per step
    python benchmarks/dashboard_requests.py --idle [--sessions 10]   # a finished run: the idle check, N vs 1

Sizes are measured interleaved, tick by tick, so the ratios compare like with like on a noisy machine. Each tick
period every run grows by 10 logged steps (a metric fragment, its samples fragment, a proxy snapshot, an adapter
version every 20 steps). Printed: the tick's wall time per size (mean, median, p90, max) and the ratios of the
largest run to the smallest; the first open of each run through the run picker (newest rows drawn) and its whole
history drawn, in the same interleaved way; the panel's CPU per tick period with N sessions against one (periods
alternate); the payload a tick sends; and, in a fresh process each, the panel's RSS after start-up and idle with
the largest run live (the background watch checking it), against its start-up RSS. Asserts nothing.

With `--idle`, only this: a finished run of the largest size open in every session, nothing changing, and the panel's
CPU per period (TICK_S of wall clock; periods alternate) with N sessions against one, for what each session's page
sends while idle: the idle check's stamp (`tick.on_stamp`, panel/tick.py) and, for comparison, the full update with
nothing to send (what an idle page sent on each tick before the two-stage tick).
"""

import argparse
import asyncio
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "benchmarks")]
os.environ.pop("HF_TOKEN", None)

from dashboard_scale import SyntheticRun

TICK_S = 2.0
ROWS_PER_TICK = 10


class Browser:
    """One browser session of the page: its Gradio session state, its run pick, and what a tick sends it."""

    def __init__(self, demo, run_id: str):
        from gradio.state_holder import SessionState

        self.demo, self.run_id = demo, run_id
        self.state = SessionState(demo)
        self.session = os.urandom(8).hex()
        self.fns = {f.name: f for f in demo.fns.values()}

    async def call(self, name: str, inputs: list) -> int:
        out = await self.demo.process_api(self.fns[name], inputs, state=self.state, session_hash=self.session)
        return len(json.dumps(out["data"], default=str))

    async def open(self) -> int:
        return await self.call("on_select", [self.run_id, "trainer", "", "step", 0, "latest", ""])

    async def stamp(self) -> int:
        return await self.call("on_stamp", [self.run_id])

    async def idle_tick(self) -> int:
        from panel.tick import IDLE_TICK_S
        return await self.call("on_tick", [self.run_id, "trainer", "", "step", 0, "latest", "", None, None, "",
                                           "all", None, IDLE_TICK_S, None])

    async def tick(self) -> int:
        return await self.call("on_tick", [self.run_id, "trainer", "", "step", 0, "latest", "", None, None, "", "all",
                                           None, TICK_S, None])   # the timer's period (a live run: TICK_S); tick_seen


def forget(panel, run_id: str) -> None:
    """As in a panel that never opened the run: its view is dropped, so the next open is a first look."""
    from backend.runs.access import Visitor

    registry = panel.runs.find(run_id, Visitor())
    registry._views.pop(run_id, None)


def stats(xs: list[float]) -> str:
    xs = sorted(xs)
    p90 = xs[min(len(xs) - 1, int(0.9 * len(xs)))]
    return (f"mean {statistics.mean(xs) * 1e3:7.1f} ms  median {statistics.median(xs) * 1e3:7.1f}  "
            f"p90 {p90 * 1e3:7.1f}  max {xs[-1] * 1e3:7.1f}")


async def ticks(runs: dict, browsers: dict, count: int) -> tuple[dict, dict]:
    """`count` tick periods of 2 s wall clock; each period every run grows, then its session ticks."""
    times = {rows: [] for rows in runs}
    sent = {rows: [] for rows in runs}
    start = time.perf_counter()
    for i in range(count):
        for rows, run in runs.items():
            run.grow(ROWS_PER_TICK)
            began = time.perf_counter()
            sent[rows].append(await browsers[rows].tick())
            times[rows].append(time.perf_counter() - began)
        await asyncio.sleep(max(0.0, start + (i + 1) * TICK_S - time.perf_counter()))
    return times, sent


async def first_opens(demo, panel, runs: dict, repeats: int) -> tuple[dict, dict]:
    """Seconds from picking the run to its newest rows drawn, and to its whole history drawn."""
    newest = {rows: [] for rows in runs}
    whole = {rows: [] for rows in runs}
    for _ in range(repeats):
        for rows, run in runs.items():
            forget(panel, run.spec.run_id)
            gc.collect()
            browser = Browser(demo, run.spec.run_id)
            began = time.perf_counter()
            await browser.open()
            newest[rows].append(time.perf_counter() - began)
            panel.view(run.spec.run_id).wait_for_history()
            await browser.tick()
            whole[rows].append(time.perf_counter() - began)
    return newest, whole


async def sessions_cpu(runs: dict, demo, rows: int, count: int, periods: int) -> tuple[list, list]:
    """The process's CPU seconds per tick period on the `rows` run: one session, then `count` sessions, alternating."""
    run = runs[rows]
    one = [Browser(demo, run.spec.run_id)]
    many = [Browser(demo, run.spec.run_id) for _ in range(count)]
    for browser in [*one, *many]:
        await browser.open()
    cpu = {1: [], count: []}
    start = time.perf_counter()
    await asyncio.sleep(TICK_S)      # a period apart from the opens (a first one would share their refresh)
    start = time.perf_counter()
    for i in range(periods * 2):
        group = one if i % 2 == 0 else many
        run.grow(ROWS_PER_TICK)
        began = time.process_time()
        await asyncio.gather(*(b.tick() for b in group))
        await asyncio.sleep(max(0.0, start + (i + 1) * TICK_S - time.perf_counter()))
        cpu[len(group)].append(time.process_time() - began)    # background threads (listings) count too
    return cpu[1], cpu[count]


RSS_CODE = """
import gc, os, sys, psutil
sys.path[:0] = [{root!r}]
os.environ.pop("HF_TOKEN", None)
from panel.actions import Panel, Settings
from panel.ui import build_ui
panel = Panel(Settings(home={home!r}, on_space=False, host="127.0.0.1", budget_check_s=0))
build_ui(panel)
gc.collect(); started = psutil.Process().memory_info().rss
for _ in range(3):
    panel.watch.check()          # what the background thread does every period, with nobody watching
gc.collect(); idle = psutil.Process().memory_info().rss
print(f"panel RSS after start-up {{started / 2**20:.0f}} MiB, idle with the live runs watched {{idle / 2**20:.0f}} MiB:"
      f" ratio {{idle / started:.2f}}")
panel.shutdown()
"""


def rss(home: str) -> str:
    code = RSS_CODE.format(root=ROOT, home=home)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    return done.stdout.strip() or done.stderr.strip()[-500:]


async def measure(args) -> None:
    from panel.actions import Panel, Settings
    from panel.ui import build_ui

    home = tempfile.mkdtemp(prefix="grpo-requests-")
    runs = {}
    for rows in args.sizes:
        began = time.perf_counter()
        runs[rows] = SyntheticRun(home, rows, samples=args.samples)
        print(f"synthesised {rows:>7} rows in {time.perf_counter() - began:5.1f} s", flush=True)
    print(rss(home), flush=True)      # before this process's own views exist (they keep the runs' files warm)
    panel = Panel(Settings(home=home, on_space=False, host="127.0.0.1", budget_check_s=0))
    demo = build_ui(panel)
    warm = SyntheticRun(home, 10, samples=args.samples)      # first-use costs (gradio, plotly) out of the way
    browser = Browser(demo, warm.spec.run_id)
    await browser.open()
    await browser.tick()

    newest, whole = await first_opens(demo, panel, runs, args.opens)
    small, large = min(runs), max(runs)
    print("\nfirst open through the run picker (interleaved):")
    for rows in runs:
        print(f"{rows:>7} rows: newest rows drawn median {statistics.median(newest[rows]):.2f} s "
              f"(min {min(newest[rows]):.2f}), whole history drawn median {statistics.median(whole[rows]):.2f} s")
    med = statistics.median
    print(f"newest rows drawn {large} / {small}: median {med(newest[large]) / med(newest[small]):.2f}, "
          f"min {min(newest[large]) / min(newest[small]):.2f}")

    browsers = {rows: Browser(demo, run.spec.run_id) for rows, run in runs.items()}
    for b in browsers.values():
        await b.open()
    times, sent = await ticks(runs, browsers, args.ticks)
    print(f"\none session's tick through process_api, {args.ticks} ticks of {TICK_S:.0f} s (interleaved):")
    for rows in runs:
        print(f"{rows:>7} rows: {stats(times[rows])}; sent {statistics.median(sent[rows]) / 1e3:.1f} KB/tick (median)")
    ratio = {k: f(times[large]) / f(times[small]) for k, f in
             (("mean", statistics.mean), ("median", statistics.median), ("min", min), ("max", max))}
    print(f"tick {large} / {small}: " + ", ".join(f"{k} {v:.2f}" for k, v in ratio.items()))

    one, many = await sessions_cpu(runs, demo, large, args.sessions, args.periods)
    print(f"\nCPU per tick period on the {large}-row run: 1 session median {statistics.median(one) * 1e3:.1f} ms, "
          f"{args.sessions} sessions median {statistics.median(many) * 1e3:.1f} ms: ratio "
          f"{med(many) / med(one):.2f} (min {min(many) / min(one):.2f}, means "
          f"{statistics.mean(many) / statistics.mean(one):.2f})")
    panel.shutdown()


async def idle_sessions(args) -> None:
    """N sessions against one on a finished run, nothing changing: the idle check's stamp, and the full update."""
    from panel.actions import Panel, Settings
    from panel.ui import build_ui

    home = tempfile.mkdtemp(prefix="grpo-requests-idle-")
    run = SyntheticRun(home, max(args.sizes), samples=args.samples).complete()
    panel = Panel(Settings(home=home, on_space=False, host="127.0.0.1", budget_check_s=0))
    demo = build_ui(panel)
    one = [Browser(demo, run.spec.run_id)]
    many = [Browser(demo, run.spec.run_id) for _ in range(args.sessions)]
    for browser in [*one, *many]:
        await browser.open()
        await browser.idle_tick()
    panel.view(run.spec.run_id).wait_for_history()
    for kind in ("stamp", "idle_tick"):
        cpu = {1: [], args.sessions: []}
        start = time.perf_counter()
        for i in range(args.periods * 2):
            group = one if i % 2 == 0 else many
            began = time.process_time()
            await asyncio.gather(*(getattr(b, kind)() for b in group))
            await asyncio.sleep(max(0.0, start + (i + 1) * TICK_S - time.perf_counter()))
            cpu[len(group)].append(time.process_time() - began)
        a, b = cpu[1], cpu[args.sessions]
        name = "idle check (stamp)" if kind == "stamp" else "full update, nothing to send"
        print(f"{name}, {max(args.sizes)}-row finished run, CPU per {TICK_S:.0f} s period: 1 session median "
              f"{statistics.median(a) * 1e3:.2f} ms, {args.sessions} sessions median {statistics.median(b) * 1e3:.2f}"
              f" ms: ratio {statistics.median(b) / statistics.median(a):.2f} (min {min(b) / min(a):.2f}, means "
              f"{statistics.mean(b) / statistics.mean(a):.2f})", flush=True)
    panel.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 100000])
    parser.add_argument("--ticks", type=int, default=40)
    parser.add_argument("--opens", type=int, default=3)
    parser.add_argument("--sessions", type=int, default=10)
    parser.add_argument("--periods", type=int, default=10)
    parser.add_argument("--samples", choices=("flush", "step"), default="flush",
                        help="samples written one fragment per flush (trainers now) or per step (runs before)")
    parser.add_argument("--idle", action="store_true", help="a finished run: the idle check, N sessions vs one")
    args = parser.parse_args()
    asyncio.run(idle_sessions(args) if args.idle else measure(args))


if __name__ == "__main__":
    main()
