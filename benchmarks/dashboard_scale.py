"""How the dashboard's cost grows with a run's length and with the number of people watching it.

    python benchmarks/dashboard_scale.py [--sizes 1000 10000 100000] [--ticks 7] [--no-evals] [--runs-list-only]

Synthesises live distributed runs in the project's real format (metric fragments of 10 rows, one event fragment
per event, an adapter version every 20 steps with its held-out evaluation record in evals/ (the base model's, v0,
first; not with --no-evals), proxy stats every 10 steps, 1 Hz resource samples for three local jobs, a trainer
log) at each size, then measures what one timer tick costs after 10 new rows: reading what is new, building the
frame, and Gradio's postprocessing (what goes to the browser). Sizes are measured interleaved, tick by tick, so
the ratios compare like with like on a noisy machine. Also: the first open of each run (its newest rows drawn)
and the time until its whole history is drawn (read in the background), the panel's RSS with the largest run
open (a fresh process each), and a tick served to 10 sessions at once against one. Prints figures; asserts
nothing.
"""

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT]

ROWS_PER_FRAGMENT = 10
ADAPTER_EVERY = 20
PROXY_EVERY = 10
JOBS = ("trainer", "vllm-0", "vllm-1")


def write_whole(path: str, data: dict | str) -> None:
    """Written as the executors and the trainer write: whole, then renamed into place, so a panel reading the same
    home (a browser test's) never reads a half-written file."""
    from backend.runtime.layout import atomic_write_bytes

    atomic_write_bytes(path, (data if isinstance(data, str) else json.dumps(data)).encode())


def record(step: int, t0: float) -> dict:
    x = step / 1000.0
    return {"step": step, "time": t0 + step, "reward": 0.5 + 0.4 * (x % 1), "reward_std": 0.1,
            "rewards/digits": 0.5 + 0.4 * (x % 1), "kl": 0.01 * (step % 7), "entropy": 1.2, "loss": 0.03,
            "grad_norm": 0.8, "learning_rate": 5e-3, "completion_length": 14.0, "tokens_per_s": 900.0 + step % 50,
            "gen_tokens_per_s": 1800.0, "train_tokens_per_s": 900.0, "step_time": 1.0, "staleness_mean": 0.5,
            "staleness_max": 1.0, "dropped_stale_total": 0.0, "ratio": 1.0 + 0.0003 * ((step % 5) - 2),
            "weight_sync_s": 0.2, "time_in_queue_s": 0.3, "policy_version": step // ADAPTER_EVERY}


def sample_records(step: int, t: float) -> list[dict]:
    """The 4 completions a trainer writes of a step (`backend.runtime.trainer.samples.sample_record`'s fields)."""
    return [{"time": t, "step": step, "policy_version": step // ADAPTER_EVERY, "prompt": f"What is {step} + {i}?",
             "completion": f"The answer is {step + i}. " * 6, "rewards": {"digits": 0.5}, "advantage": 0.1 * i,
             "length": 40, "truncated": False} for i in range(4)]


class SyntheticRun:
    """A live distributed run of `rows` logged steps in a local panel home; `grow()` adds what a tick brings."""

    def __init__(self, home: str, rows: int, samples: str | None = None, evals: bool = False,
                 fields: dict | None = None, score=None):
        """`samples`: None (no samples/ folder), "flush" (a fragment of 4 completions a step per metric fragment,
        as trainers write them now) or "step" (a fragment per step, as runs written before did). `evals`: a
        held-out record per adapter version in evals/, the base model's (v0) first. `fields`: RunSpec fields
        beside the defaults (a sweep member's run_id, name, sweep_id, sweep_member). `score(version)`: each
        version's held-out score (the trained reward's mean), where a test needs known ones."""
        from backend.plan.spec import RunSpec
        from backend.runtime import layout

        self.home, self.rows, self.t0 = home, rows, time.time() - rows
        self.samples_mode, self.sample_fragment = samples, 0
        self.samples_dir = None
        self.score = score
        self.spec = RunSpec(**{"name": f"scale-{rows}", "mode": "distributed", "max_steps": rows * 10,
                               "bucket": "local/bench", "run_id": f"scale-{rows}",
                               **(dict(eval_source="split", monitor_rewards=["distinct_chars"]) if evals else {}),
                               **(fields or {})})
        self.run_dir = os.path.join(home, "buckets", "local", "bench", layout.run_prefix(self.spec.run_id))
        self.metrics = os.path.join(self.run_dir, layout.METRICS_DIR)
        self.events = os.path.join(self.run_dir, layout.EVENTS_DIR)
        self.evals = os.path.join(self.run_dir, layout.EVALS_DIR) if evals else None
        for folder in (self.metrics, self.events, *([self.evals] if evals else [])):
            os.makedirs(folder, exist_ok=True)
        if samples:
            self.samples_dir = os.path.join(self.run_dir, layout.SAMPLES_DIR)
            os.makedirs(self.samples_dir, exist_ok=True)
        write_whole(os.path.join(self.run_dir, layout.SPEC_FILE), self.spec.to_json())
        self.fragment = self.proxy_fragment = self.event_fragment = self.eval_fragment = 0
        self.step = 0
        self.job_ids = {}
        for role in JOBS:
            self.job_ids[role] = self._make_job(role)
        if evals:
            self._evaluate(0, 0, self.t0)
        self._write_steps(rows, history=True)

    def _make_job(self, role: str) -> str:
        job_id = f"{self.spec.run_id}--{role}--000000"
        folder = os.path.join(self.home, "jobs", job_id)
        # As the local executor makes one: under a hidden name, renamed once its job.json is in, so a panel listing
        # the jobs meanwhile never meets a job folder without its record.
        staging = os.path.join(self.home, "jobs", f".new-{job_id}")
        os.makedirs(staging)
        spec = {"run_id": self.spec.run_id, "role": role, "flavor": "local",
                "volumes": [{"bucket": "local/bench", "mount_path": "/bucket", "read_only": False}]}
        from backend.runtime.job.job_wrapper import process_start_time

        # A live job as the local executor records one: its wrapper's pid (this process stands in) and start time.
        write_whole(os.path.join(staging, "job.json"), {"job_id": job_id, "spec": spec, "created_at": self.t0,
                                                        "pid": os.getpid(),
                                                        "pid_started_at": process_start_time(os.getpid())})
        os.rename(staging, folder)
        return job_id

    def complete(self) -> "SyntheticRun":
        """Every job of the run ended COMPLETED, as the local executor's wrapper records it (exit.json)."""
        for job_id in self.job_ids.values():
            write_whole(os.path.join(self.home, "jobs", job_id, "exit.json"),
                        {"stage": "COMPLETED", "code": 0, "message": "", "time": time.time()})
        return self

    def _write_steps(self, count: int, history: bool = False) -> None:
        from backend.runtime import layout

        job_dirs = {role: os.path.join(self.home, "jobs", job_id) for role, job_id in self.job_ids.items()}
        logs = {role: open(os.path.join(job_dirs[role], "log.txt"), "a") for role in JOBS}
        samples = {role: open(os.path.join(job_dirs[role], "resources.jsonl"), "a") for role in JOBS}
        try:
            pending, completions = [], []
            for _ in range(count):
                self.step += 1
                step, t = self.step, self.t0 + self.step
                pending.append(record(step, self.t0))
                if self.samples_mode:
                    completions += sample_records(step, t)
                    if self.samples_mode == "step":
                        self._samples(completions)
                        completions = []
                if len(pending) == ROWS_PER_FRAGMENT:
                    self._fragment(self.metrics, "trainer", self.fragment, pending)
                    self.fragment, pending = self.fragment + 1, []
                    if completions:
                        self._samples(completions)
                        completions = []
                if step % PROXY_EVERY == 0:
                    replicas = [{"url": f"http://127.0.0.1:{8000 + i}", "healthy": True, "in_flight": 3,
                                 "served": step * 4, "errors": 0,
                                 "adapters": [layout.adapter_name(step // 20, self.spec.sweep_member)]}
                                for i in range(2)]
                    self._fragment(self.metrics, "proxy", self.proxy_fragment, [{"time": t, "replicas": replicas}])
                    self.proxy_fragment += 1
                if step % ADAPTER_EVERY == 0:
                    self._adapter(step // ADAPTER_EVERY, step, t)
                for role in JOBS:
                    logs[role].write(f"step {step}/{self.spec.max_steps}  reward 0.500  {t - self.t0:.1f}s\n")
                    samples[role].write(json.dumps({"time": t, "cpu_percent": 95.0, "ram_bytes": 2**30}) + "\n")
            if pending:
                self._fragment(self.metrics, "trainer", self.fragment, pending)
                self.fragment += 1
            if completions:
                self._samples(completions)
        finally:
            for f in [*logs.values(), *samples.values()]:
                f.close()

    def _samples(self, records: list[dict]) -> None:
        self._fragment(self.samples_dir, "trainer", self.sample_fragment, records)
        self.sample_fragment += 1

    def _fragment(self, folder: str, writer: str, seq: int, records: list[dict]) -> None:
        from backend.runtime.layout import fragment_name

        name = fragment_name(writer, seq)     # written once, as the runtime's writers do: a reader never sees half
        with open(os.path.join(folder, f"_tmp{name}"), "w") as f:
            f.write("".join(json.dumps(r) + "\n" for r in records))
        os.replace(os.path.join(folder, f"_tmp{name}"), os.path.join(folder, name))

    def _adapter(self, version: int, step: int, t: float) -> None:
        from backend.runtime import layout

        name = layout.adapter_name(version, self.spec.sweep_member)
        folder = os.path.join(self.run_dir, layout.ADAPTERS_DIR, name)
        os.makedirs(folder, exist_ok=True)
        for file, data in (("adapter_config.json", b'{"r": 8}'), ("adapter_model.safetensors", b"x" * 4096),
                           (layout.ADAPTER_META_FILE, json.dumps({"version": version, "step": step,
                                                                   "time": t}).encode())):
            with open(os.path.join(folder, file), "wb") as f:
                f.write(data)
        self._fragment(self.events, "trainer", self.event_fragment,
                       [{"time": t, "event": "adapter_published", "name": name}])
        self.event_fragment += 1
        if self.evals:
            self._evaluate(version, step, t)

    def _evaluate(self, version: int, step: int, t: float) -> None:
        """The version's held-out record as the trainer writes it (`evaluate.eval_record`): 16 prompts, two
        rewards (one monitor-only), two samples; a fragment per version."""
        from backend.runtime.trainer.evaluate import eval_record

        rows = [{"prompt": f"held-out question {i}"} for i in range(16)]
        digits = self.score(version) if self.score else 0.3 + 0.4 * ((version * 7919) % 101) / 101
        record = eval_record(step, version, rows, [[f"The answer is {version + i}."] for i in range(16)],
                             {"digits": [[digits]] * 16, "distinct_chars": [[0.6]] * 16},
                             {"digits": 1.0, "distinct_chars": 0.0}, greedy=True)
        self._fragment(self.evals, "trainer", self.eval_fragment, [{**record, "time": t}])
        self.eval_fragment += 1

    def grow(self, rows: int = 10) -> None:
        self._write_steps(rows)


def payload_bytes(values: list) -> int:
    """The bytes Gradio would send for these outputs: plot JSON and text as they are, tables as Gradio's
    postprocessed Dataframe."""
    import gradio as gr

    total = 0
    for value in values:
        if isinstance(value, str):
            total += len(value)
        elif isinstance(value, list):
            total += len(gr.Dataframe().postprocess(value).model_dump_json()) if value else 2
    return total


def session_tick(panel, run_id: str, state: dict) -> int:
    """What one browser session's timer tick does; returns the payload bytes it sends."""
    from panel import live

    update = live.dashboard_update(panel, run_id, state, visitor=None)
    return payload_bytes(update.outputs())


def open_in_full(panel, run_id: str, state: dict, began: float) -> float:
    """Seconds from `began` until the run's whole history is drawn: a first look at a long run draws its newest
    rows and reads the older ones in the background; the next tick once they are in draws them."""
    view = panel.view(run_id)
    view.wait_for_history()
    session_tick(panel, run_id, state)
    return time.perf_counter() - began


def due(panel, run_id: str) -> None:
    """As when the timer's 2 s have passed: the next tick refreshes the run (sessions within a second share it)."""
    panel.view(run_id).expire()


def measure(args) -> None:
    import psutil

    from panel.actions import Panel, Settings

    home = tempfile.mkdtemp(prefix="grpo-scale-")
    runs = {}
    for rows in args.sizes:
        began = time.perf_counter()
        runs[rows] = SyntheticRun(home, rows, evals=not args.no_evals)
        print(f"synthesised {rows:>7} rows in {time.perf_counter() - began:5.1f} s")
    panel = Panel(Settings(home=home, on_space=False, host="127.0.0.1"))
    warm = SyntheticRun(home, 10)            # imports and first-use costs (gradio, plotly) out of the way
    session_tick(panel, warm.spec.run_id, {})

    first_open, whole = {}, {}
    states = {}
    for rows, run in runs.items():
        gc.collect()
        began = time.perf_counter()
        states[rows] = {}
        session_tick(panel, run.spec.run_id, states[rows])
        first_open[rows] = time.perf_counter() - began
        whole[rows] = open_in_full(panel, run.spec.run_id, states[rows], began)

    ticks = {rows: [] for rows in runs}
    payloads = {rows: [] for rows in runs}
    for _ in range(args.ticks):
        for rows, run in runs.items():      # interleaved: every size sees the same machine moment
            run.grow(10)
            due(panel, run.spec.run_id)
            began = time.perf_counter()
            payloads[rows].append(session_tick(panel, run.spec.run_id, states[rows]))
            ticks[rows].append(time.perf_counter() - began)

    small, large = min(runs), max(runs)
    print("\nrows     first open   whole history drawn   tick min   tick median   payload/tick (median)")
    for rows in runs:
        print(f"{rows:>7}   {first_open[rows]:8.2f} s   {whole[rows]:15.2f} s   {min(ticks[rows]) * 1e3:6.1f} ms   "
              f"{statistics.median(ticks[rows]) * 1e3:8.1f} ms   {statistics.median(payloads[rows]) / 1e3:8.1f} KB")
    print(f"tick({large}) / tick({small}): min {min(ticks[large]) / min(ticks[small]):.2f}, "
          f"median {statistics.median(ticks[large]) / statistics.median(ticks[small]):.2f}")

    run = runs[large]
    one, ten = [], []
    for _ in range(args.ticks):
        for sessions, out in ((1, one), (10, ten)):
            run.grow(10)
            fresh = [json.loads(json.dumps(states[large])) for _ in range(sessions)]   # each has drawn it once
            due(panel, run.spec.run_id)
            cpu = time.process_time()
            threads = [threading.Thread(target=session_tick, args=(panel, run.spec.run_id, s)) for s in fresh]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            out.append(time.process_time() - cpu)
            states[large] = fresh[0]
    ratio_median = statistics.median(ten) / max(statistics.median(one), 1e-9)
    print(f"CPU per tick on the {large}-row run: 1 session median {statistics.median(one) * 1e3:.1f} ms, "
          f"10 sessions median {statistics.median(ten) * 1e3:.1f} ms: ratio {ratio_median:.2f} "
          f"(min {min(ten) / max(min(one), 1e-9):.2f})")
    panel.shutdown()
    print(f"this process's RSS now: {psutil.Process().memory_info().rss / 2**20:.0f} MiB")
    rss(home, run.spec.run_id)


def finished_runs(home: str, count: int) -> None:
    """`count` finished runs of three jobs each, as the local executor leaves them, each with the best.json its
    trainer published (the runs list shows each run's best held-out version)."""
    from backend.runtime import layout

    for r in range(count):
        best = os.path.join(home, "buckets", "local", "bench", layout.run_prefix(f"done-{r:03d}"), layout.BEST_DIR)
        os.makedirs(best, exist_ok=True)
        with open(os.path.join(best, layout.BEST_FILE), "w") as f:
            json.dump({"policy_version": 1 + r % 7, "step": 20 * (1 + r % 7), "score": 0.5, "best_by": {},
                       "baseline": 0.25}, f)
        for role in JOBS:
            job_id = f"done-{r:03d}--{role}--000000"
            folder = os.path.join(home, "jobs", job_id)
            os.makedirs(folder, exist_ok=True)
            spec = {"run_id": f"done-{r:03d}", "role": role, "flavor": "local",
                    "volumes": [{"bucket": "local/bench", "mount_path": "/bucket", "read_only": False}]}
            with open(os.path.join(folder, "job.json"), "w") as f:
                json.dump({"job_id": job_id, "spec": spec, "created_at": 1.0e9 + r, "pid": 1,
                           "pid_started_at": 0.0}, f)
            with open(os.path.join(folder, "exit.json"), "w") as f:
                json.dump({"stage": "COMPLETED", "message": "", "time": 1.0e9 + r}, f)


def runs_list(args) -> None:
    """The runs list's cost per tick (the table and the pickers' choices, as a session's tick asks them) with 10 and
    with 1,000 finished runs in the panel's home, interleaved: min and median (a tick between listings), mean (the
    listings every second or so included); then a listing alone (a tick that comes after the registry's listing
    expired), interleaved the same way."""
    from panel.actions import Panel, Settings, as_visitor

    panels = {}
    for count in (10, 1000):
        home = tempfile.mkdtemp(prefix=f"grpo-runs-{count}-")
        finished_runs(home, count)
        panels[count] = Panel(Settings(home=home, on_space=False, host="127.0.0.1"))
        panels[count].runs_table()          # a first listing reads every job file once
    times = {count: [] for count in panels}
    deadline = time.monotonic() + max(args.ticks, 10)      # seconds: several listings (every few seconds) fall in
    while time.monotonic() < deadline:
        for count, panel in panels.items():
            began = time.perf_counter()
            rows = panel.runs_table()
            panel.runs_table(with_cost=False)
            times[count].append(time.perf_counter() - began)
    print(f"runs list per tick ({len(rows)} rows shown, {len(times[1000])} ticks each): "
          + _ratios(times[10], times[1000], mean=True))
    listings = {count: [] for count in panels}
    for _ in range(max(args.ticks, 10)):
        for count, panel in panels.items():
            registries = panel.runs.registries(as_visitor(None))
            for registry in registries:
                registry.forget_listing()
            began = time.perf_counter()
            panel.runs_table()
            panel.runs_table(with_cost=False)
            listings[count].append(time.perf_counter() - began)
    print(f"runs list tick that lists again ({len(listings[1000])} each): " + _ratios(listings[10], listings[1000]))
    for panel in panels.values():
        panel.shutdown()


def _ratios(small: list[float], large: list[float], mean: bool = False) -> str:
    """10 runs and 1,000 runs: min, median (and mean) in ms, and the 1,000-run figure over the 10-run one."""
    figures = [("min", min), ("median", statistics.median)] + ([("mean", statistics.mean)] if mean else [])
    return "; ".join(f"{name} {f(small) * 1e3:.3f} ms vs {f(large) * 1e3:.3f} ms: ratio {f(large) / f(small):.2f}"
                     for name, f in figures)


def rss(home: str, run_id: str) -> None:
    """Panel RSS idle and with the run open, in a fresh process (nothing else held)."""
    code = f"""
import gc, os, sys, psutil
sys.path[:0] = [{ROOT!r}]
from panel.actions import Panel, Settings
import panel.ui, panel.live
panel_ = Panel(Settings(home={home!r}, on_space=False, host="127.0.0.1"))
gc.collect(); idle = psutil.Process().memory_info().rss
sys.path[:0] = [{os.path.join(ROOT, 'benchmarks')!r}]
from dashboard_scale import session_tick
session_tick(panel_, {run_id!r}, {{}})
panel_.view({run_id!r}).wait_for_history()
session_tick(panel_, {run_id!r}, {{}})
gc.collect(); opened = psutil.Process().memory_info().rss
print(f"panel RSS idle {{idle / 2**20:.0f}} MiB, with the {run_id} run open {{opened / 2**20:.0f}} MiB: "
      f"ratio {{opened / idle:.2f}}")
panel_.shutdown()
"""
    print(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 10000, 100000])
    parser.add_argument("--ticks", type=int, default=7)
    parser.add_argument("--no-evals", action="store_true", help="runs without held-out records (evals/)")
    parser.add_argument("--runs-list-only", action="store_true", help="only the runs list: 10 runs against 1,000")
    args = parser.parse_args()
    if not args.runs_list_only:
        measure(args)
    runs_list(args)


if __name__ == "__main__":
    main()
