"""The GPU recipes at a realistic size: colocated (1 GPU with and without sleep mode, 2 GPUs data- or
tensor-parallel) and distributed (trainer on one GPU, a vLLM replica on the other), each launched through the
real recipe and LocalExecutor on a random-weight model shaped like Qwen2.5, with the resource sampler on.

    python benchmarks/gpu_recipes.py [--model builtin:bench-qwen2.5-1.5b] [--steps 12] [--only NAME ...]
                                     [--side-by-side] [--set FIELD=VALUE ...] [--export DIR]

Prints one row per configuration: median step time, generated and trained tokens/s, colocated vLLM's own
generation rate, weight-sync time, GPU utilisation and memory per GPU from the sampler, staleness and `ratio`
for the distributed run, start-up time; then the colocated / distributed ratios. Every configuration trains the
same global batch (64 completions of up to 256 tokens a step), so step times compare. The first WARMUP steps of
each run are left out of the medians. `--side-by-side` runs the two 1-GPU colocated rows at once, one per GPU.
`--export DIR` writes each run's metrics, events, job logs and resource samples (no weights) as
DIR/<config>.tar.gz, which a local panel opens with GRPO_PANEL_HOME. `--budget-s` stops in time for a command
limit, keeping what was measured. Asserts nothing: it measures.
"""

import argparse
import json
import os
import statistics
import sys
import tarfile
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from backend.executors.local import LocalExecutor
from backend.plan.engines.local import local_gpu_ids
from backend.plan.spec import RunSpec, SpecError
from backend.runs.registry import RunRegistry
from backend.runtime import layout
from backend.storage.store import FolderStore
from benchmarks.sampled_run import spec_override

WARMUP = 2
GLOBAL_BATCH = 64   # completions per step in every configuration
WORKLOAD = dict(
    dataset="builtin:count-to-ten", rewards=["digits"], num_generations=8, max_completion_length=256,
    learning_rate=1e-5, lora_r=16, lora_alpha=32, beta=0.0, logging_steps=1, checkpoint_every=1_000_000,
    timeout_minutes=9,
)
COLOCATED = dict(mode="colocated", use_vllm=True, vllm_gpu_memory_utilization=0.3)
DISTRIBUTED = dict(mode="distributed", replicas=1, max_staleness=1, adapter_every=1,
                   # One generation per in-flight task: a step's worth in flight, a fixed 64 samples a step.
                   max_inflight_tasks=GLOBAL_BATCH, queue_maxsize=2 * GLOBAL_BATCH, max_tokens_per_batch=0,
                   per_device_batch_size=GLOBAL_BATCH)
# A generation-bound one-GPU run (the trainer and one replica job share the GPU): 1024-token completions, packed
# into 16k-token micro-batches (one batch of 64 such sequences ran the trainer out of memory), 4 of them a step (~60
# completions: with a token budget a step trains what fits, not per_device_batch_size), at one vLLM server and at the
# H200 preset's rule: 4 servers, requests in flight 4x (64 a server each time). What is in flight and queued stays
# within max_staleness steps (a first try queued ~50 steps' worth at max_staleness 4 and dropped 428 samples as
# stale: docs/replica-scaling.md). Each local server keeps a fixed 1 GiB KV cache: 64 sequences of a 0.5B model.
GENERATION_BOUND = dict(DISTRIBUTED, max_completion_length=1024, max_tokens_per_batch=16384,
                        gradient_accumulation_steps=4, max_staleness=8, queue_maxsize=GLOBAL_BATCH,
                        replica_max_model_len=2048)
# name: (RunSpec fields, GPUs it needs)
CONFIGS = {
    "colocated-1gpu-sleep": (dict(COLOCATED, vllm_enable_sleep_mode=True, per_device_batch_size=GLOBAL_BATCH), 1),
    "colocated-1gpu-awake": (dict(COLOCATED, vllm_enable_sleep_mode=False, per_device_batch_size=GLOBAL_BATCH), 1),
    "colocated-2gpu-dp": (dict(COLOCATED, num_processes=2, per_device_batch_size=GLOBAL_BATCH // 2), 2),
    "colocated-2gpu-tp": (dict(COLOCATED, num_processes=2, vllm_tensor_parallel_size=2,
                               per_device_batch_size=GLOBAL_BATCH // 2), 2),
    "distributed-2gpu": (DISTRIBUTED, 2),
    "distributed-1gpu": (DISTRIBUTED, 1),   # trainer and replica share one GPU: the one-H200 fallback
    # Two replicas and the trainer time-sharing one GPU: where two GPUs are not lent, a partial datum on scaling.
    "distributed-1gpu-2replicas": (dict(DISTRIBUTED, replicas=2), 1),
    "distributed-1gpu-k1": (GENERATION_BOUND, 1),
    "distributed-1gpu-k4": (dict(GENERATION_BOUND, servers_per_gpu=4, max_inflight_tasks=4 * GLOBAL_BATCH), 1),
}
DEFAULT = [name for name in CONFIGS if not name.startswith("distributed-1gpu")]


def median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None



def build_spec(name: str, model: str, steps: int, overrides: dict) -> RunSpec:
    fields, _ = CONFIGS[name]
    data = {**WORKLOAD, "adapter_every": steps, **fields, "name": name, "model": model, "max_steps": steps,
            **overrides}
    try:
        spec = RunSpec.from_dict(data)
    except SpecError as error:
        sys.exit(f"{name}: bad settings:\n{error}")
    if errors := spec.validate():
        sys.exit(f"{name}: bad settings:\n" + "\n".join(map(str, errors)))
    return spec


@contextmanager
def visible_gpus(gpus: list[str]):
    """Local jobs inherit the environment: this pins the run's jobs to `gpus` (the launcher splits them further
    between a distributed run's trainer and replicas). Each set of GPUs gets its own vLLM compile cache, so two
    runs side by side never write one cache folder at once."""
    wanted = {"CUDA_VISIBLE_DEVICES": ",".join(gpus),
              "VLLM_CACHE_ROOT": os.path.expanduser(f"~/.cache/vllm-gpus-{'-'.join(gpus)}")}
    before = {k: os.environ.get(k) for k in wanted}
    os.environ.update(wanted)
    try:
        yield
    finally:
        for key, value in before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def launch(registry: RunRegistry, spec: RunSpec, gpus: list[str]) -> dict:
    with visible_gpus(gpus):
        launched = registry.launch(spec)
    return {"spec": spec, "launched": launched, "started": time.time(), "gpus": gpus}


def wait(executor: LocalExecutor, run: dict, deadline: float) -> None:
    """Until the trainer ends (a distributed run's replicas then stop themselves: serve_replica), or the deadline:
    then every job of the run is cancelled and what it logged so far is measured."""
    ids = run["launched"].job_ids
    run["status"] = executor.wait(ids["trainer"], timeout=max(deadline - time.time(), 1))
    run["wall_s"] = time.time() - run["started"]
    for role, job_id in ids.items():
        status = executor.wait(job_id, timeout=0 if role == "trainer" else min(90, max(deadline - time.time(), 1)))
        if not status.done:
            executor.cancel(job_id)
    if not run["status"].done:
        run["status"] = executor.status(ids["trainer"])


def measure(registry: RunRegistry, run: dict) -> dict:
    spec = run["spec"]
    view = registry.view(spec.run_id)
    view.refresh()
    records = [r for r in view.metrics if "step" in r]
    steady = [r for r in records if r["step"] > WARMUP] or records

    def med(key: str) -> float | None:
        return median([r[key] for r in steady if isinstance(r.get(key), (int, float))])

    completions = spec.per_device_batch_size * (spec.num_processes if spec.mode == "colocated" else 1)
    engine_rates = [r["completion_length"] * completions / r["generation_s"] for r in steady
                    if r.get("generation_s") and r.get("completion_length")]
    row = {
        "config": spec.name, "run_id": spec.run_id, "stage": run["status"].stage, "wall_s": run["wall_s"],
        "steps": len(records), "step_s": med("step_time"), "gen_tok_s": med("gen_tokens_per_s"),
        "train_tok_s": med("train_tokens_per_s"), "engine_tok_s": median(engine_rates),
        "weight_sync_s": med("weight_sync_s"), "completion_len": med("completion_length"),
        # Where a step goes: colocated generation inside it; the async trainer's compute and its wait for rollouts.
        "generation_s": med("generation_s"), "fwd_bwd_s": med("fwd_bwd_s"), "rollout_wait_s": med("rollout_wait_s"),
        "staleness_mean": med("staleness_mean") if spec.mode == "distributed" else None,
        "ratio_range": _range([r["ratio"] for r in steady if "ratio" in r]),
        "startup_s": (records[0]["time"] - run["started"]) if records else None,
        "gpus": run["gpus"], "engine": view.engine,
    }
    row.update(_gpu_figures(view, records, run["gpus"]))
    if run["status"].stage != "COMPLETED":
        row["log_tail"] = {role: list(job.logs)[-30:] for role, job in view.jobs.items()}
    return row


def _range(values: list[float]) -> list[float] | None:
    return [min(values), max(values)] if values else None


def _gpu_figures(view, records: list[dict], gpus: list[str]) -> dict:
    """Utilisation (mean, max) and memory (max GiB) of the run's GPUs over its training window, per GPU of the
    machine, each from the first job (trainer first) whose sampler saw it: jobs sharing a GPU see the same GPU."""
    util: dict[int, list[float]] = {}
    mem: dict[int, list[float]] = {}
    owner: dict[int, str] = {}
    for role in sorted(view.jobs, key=lambda r: r != "trainer"):
        for s in view.jobs[role].resources:
            if records and not records[0]["time"] - 1 <= s.time <= records[-1]["time"] + 1:
                continue
            for pos, (u, m) in enumerate(zip(s.gpu_util, s.gpu_mem_bytes)):
                index = s.gpu_index[pos] if pos < len(s.gpu_index) else pos
                if owner.setdefault(index, role) == role:
                    util.setdefault(index, []).append(u)
                    mem.setdefault(index, []).append(m / 2**30)
    return {f"gpu{g}": {"util_mean": statistics.mean(util[g]), "util_max": max(util[g]), "mem_max_gib": max(mem[g])}
            for g in map(int, gpus) if util.get(g)}


def export(executor: LocalExecutor, run: dict, row: dict, folder: str) -> str:
    """The run's light files (no weights, adapters or checkpoints) as DIR/<config>.tar.gz, which a local panel
    opens (GRPO_PANEL_HOME), and its row appended to DIR/results.jsonl: written as each run ends, so a command
    stopped at its time limit still leaves the runs before it."""
    home, spec = Path(executor.home), run["spec"]
    heavy = {layout.BASE_MODEL_DIR, layout.ADAPTERS_DIR, layout.CHECKPOINTS_DIR, layout.VLLM_LORA_DIR, layout.FINAL_DIR,
             layout.CODE_DIR}
    path = os.path.join(folder, f"{spec.name}.tar.gz")
    with tarfile.open(path, "w:gz") as tar:
        for job_id in run["launched"].job_ids.values():
            tar.add(home / "jobs" / job_id, arcname=f"jobs/{job_id}")
        run_dir = Path(executor.bucket_root(spec.bucket)) / "runs" / spec.run_id
        tar.add(run_dir, arcname=str(run_dir.relative_to(home)),
                filter=lambda info: None if set(Path(info.name).parts) & heavy else info)
    with open(os.path.join(folder, "results.jsonl"), "a") as f:
        f.write(json.dumps(row, default=str) + "\n")
    return path


def _fmt(value, spec: str = ".3g") -> str:
    return "-" if value is None else format(value, spec)


def print_table(rows: list[dict]) -> None:
    print("\n| configuration | steps | median step (s) | in a step (s) | generated tok/s | trained tok/s | "
          "vLLM engine tok/s | weight sync (s) | GPU util mean/max (%) | GPU memory max (GiB) | staleness | ratio | "
          "start-up (s) |")
    print("| --- " * 13 + "|")
    for r in rows:
        gpus = [k for k in r if k.startswith("gpu") and isinstance(r[k], dict)]
        util = ", ".join(f"{g}: {r[g]['util_mean']:.0f}/{r[g]['util_max']:.0f}" for g in gpus) or "-"
        mem = ", ".join(f"{g}: {r[g]['mem_max_gib']:.1f}" for g in gpus) or "-"
        ratio = "-" if not r["ratio_range"] else f"{r['ratio_range'][0]:.4f}-{r['ratio_range'][1]:.4f}"
        name = r["config"] + ("" if r["stage"] == "COMPLETED" else f" ({r['stage']})")
        split = (f"generate {_fmt(r['generation_s'])}" if r["generation_s"] is not None else
                 f"fwd+bwd {_fmt(r['fwd_bwd_s'])}, wait {_fmt(r['rollout_wait_s'])}")
        print(f"| {name} | {r['steps']} | {_fmt(r['step_s'])} | {split} | {_fmt(r['gen_tok_s'], '.0f')} | "
              f"{_fmt(r['train_tok_s'], '.0f')} | {_fmt(r['engine_tok_s'], '.0f')} | {_fmt(r['weight_sync_s'])} | "
              f"{util} | {mem} | {_fmt(r['staleness_mean'])} | {ratio} | {_fmt(r['startup_s'], '.0f')} |")


def print_ratios(rows: list[dict]) -> None:
    by_name = {r["config"]: r for r in rows if r["stage"] == "COMPLETED"}
    one, four = by_name.get("distributed-1gpu-k1"), by_name.get("distributed-1gpu-k4")
    if one and four and one["gen_tok_s"] and four["gen_tok_s"] and one["step_s"] and four["step_s"]:
        print(f"distributed-1gpu-k4 / -k1: generated tok/s x{four['gen_tok_s'] / one['gen_tok_s']:.2f}, "
              f"median step {one['step_s']:.2f} s -> {four['step_s']:.2f} s (x{one['step_s'] / four['step_s']:.2f})")
    dist = by_name.get("distributed-2gpu")
    for name in ("colocated-2gpu-dp", "colocated-2gpu-tp"):
        colo = by_name.get(name)
        if not (colo and dist and colo["gen_tok_s"] and dist["gen_tok_s"] and colo["step_s"] and dist["step_s"]):
            continue
        print(f"{name} / distributed-2gpu: generated tok/s x{colo['gen_tok_s'] / dist['gen_tok_s']:.2f}, "
              f"step time x{dist['step_s'] / colo['step_s']:.2f} faster (published colocated vs server: ~1.43x)")


def batches(names: list[str], gpus: list[str], side_by_side: bool) -> list[list[tuple[str, list[str]]]]:
    """Which configurations run together, each with its GPUs: one at a time, or the 1-GPU colocated pair at once."""
    out, pair = [], []
    for name in names:
        need = CONFIGS[name][1]
        if need > len(gpus):
            print(f"skipping {name}: it needs {need} GPUs, {len(gpus)} visible", flush=True)
            continue
        if side_by_side and need == 1 and name.startswith("colocated") and len(gpus) >= 2:
            pair.append((name, [gpus[len(pair)]]))
            if len(pair) == 2:
                out.append(pair)
                pair = []
            continue
        out.append([(name, gpus[:need])])
    return out + ([pair] if pair else [])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="builtin:bench-qwen2.5-1.5b")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--only", nargs="+", choices=list(CONFIGS), default=DEFAULT)
    parser.add_argument("--side-by-side", action="store_true", help="the two 1-GPU colocated rows at once")
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE", help="override a RunSpec field")
    parser.add_argument("--home", default=None)
    parser.add_argument("--export", default=None, metavar="DIR",
                        help="write DIR/<config>.tar.gz and DIR/results.jsonl as each run ends")
    parser.add_argument("--budget-s", type=float, default=None,
                        help="stop (cancel what runs, report what was logged) after this many seconds")
    args = parser.parse_args()
    deadline = time.time() + (args.budget_s or 10**9)
    overrides = dict(spec_override(item) for item in args.set)
    home = args.home or tempfile.mkdtemp(prefix="grpo-gpu-bench-")
    executor = LocalExecutor(home)
    registry = RunRegistry(executor, lambda b: FolderStore(executor.bucket_root(b)))
    gpus = local_gpu_ids() or ["0"]   # without GPUs the runs fall back to the CPU (a smoke test of this script)
    if args.export:
        os.makedirs(args.export, exist_ok=True)
    rows = []
    for batch in batches(args.only, gpus, args.side_by_side):
        if time.time() >= deadline:
            print(f"out of time: not run {', '.join(name for name, _ in batch)}", flush=True)
            continue
        together = [launch(registry, build_spec(name, args.model, args.steps, overrides), g) for name, g in batch]
        print("running " + ", ".join(f"{name} on GPU {','.join(g)}" for name, g in batch), flush=True)
        for run in together:
            wait(executor, run, deadline)
            rows.append(measure(registry, run))
            print(json.dumps(rows[-1], default=str), flush=True)
            if args.export:
                export(executor, run, rows[-1], args.export)
    executor.cancel_all()
    print(f"\nmodel {args.model}, {args.steps} steps, medians over steps > {WARMUP}, settings {WORKLOAD} + "
          f"each configuration's + {overrides}; home {home}")
    print_table(rows)
    print_ratios(rows)


if __name__ == "__main__":
    main()
