"""Run the tiny demo through LocalExecutor with the resource sampler and print what it measured.

    python benchmarks/sampled_run.py [--steps N] [--home DIR] [--set FIELD=VALUE ...]

`--set` overrides a RunSpec field, the value read as JSON where it parses (`--set use_vllm=true`
`--set vllm_gpu_memory_utilization=0.2`), else as text; the spec validates it as the form would.

Prints per-step time (from the trainer's metrics) beside the sampled CPU/RAM and, where NVML sees GPUs,
GPU utilisation and memory. Used for the GPU evidence on an H200 and for CPU figures here.
"""

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from backend.executors.local import LocalExecutor
from backend.plan.spec import RunSpec, SpecError
from backend.runs.registry import RunRegistry
from backend.storage.store import FolderStore


def summary(values: list[float]) -> str:
    if not values:
        return "n/a"
    return f"mean {statistics.mean(values):.3g}, median {statistics.median(values):.3g}, max {max(values):.3g}"


def spec_override(item: str) -> tuple[str, object]:
    """A `--set FIELD=VALUE` as (field, value): the value as JSON where it parses, else the text."""
    field, sep, text = item.partition("=")
    if not sep:
        sys.exit(f"--set wants FIELD=VALUE, got {item!r}")
    try:
        return field, json.loads(text)
    except ValueError:
        return field, text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=None, help="default: the demo's own (RunSpec default)")
    parser.add_argument("--home", default=None)
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE", help="override a RunSpec field")
    args = parser.parse_args()
    overrides = dict(spec_override(item) for item in args.set)
    home = args.home or tempfile.mkdtemp(prefix="grpo-bench-")
    executor = LocalExecutor(home)
    registry = RunRegistry(executor, lambda b: FolderStore(executor.bucket_root(b)))
    try:
        spec = RunSpec.from_dict({**({"max_steps": args.steps} if args.steps else {}), **overrides})
    except SpecError as error:
        sys.exit(f"bad --set:\n{error}")
    if errors := spec.validate():
        sys.exit("bad --set:\n" + "\n".join(map(str, errors)))
    started = time.time()
    job_id = registry.launch(spec).job_ids["trainer"]
    status = executor.wait(job_id, timeout=spec.timeout_minutes * 60)
    wall = time.time() - started
    view = registry.view(spec.run_id)
    view.refresh()
    samples = view.jobs["trainer"].resources
    print(f"stage {status.stage} {status.message} | wall {wall:.1f} s | {len(view.metrics)} logged steps | "
          f"{len(view.adapters)} adapter versions | final {'yes' if view.final_files else 'no'} | engine {view.engine}")
    print("step_time (s):", summary([r["step_time"] for r in view.metrics if "step_time" in r]))
    rewards = [r["reward"] for r in view.metrics if "reward" in r]
    if len(rewards) >= 20:
        print(f"reward first-10 mean {statistics.mean(rewards[:10]):.3f}, "
              f"last-10 mean {statistics.mean(rewards[-10:]):.3f}")
    print(f"{len(samples)} resource samples; CPU %:",
          summary([s.cpu_percent for s in samples if s.cpu_percent is not None]))
    print("RSS (GiB):", summary([s.ram_bytes / 2**30 for s in samples if s.ram_bytes]))
    gpus = max((len(s.gpu_util) for s in samples), default=0)
    for g in range(gpus):
        util = [s.gpu_util[g] for s in samples if len(s.gpu_util) > g]
        mem = [s.gpu_mem_bytes[g] / 2**30 for s in samples if len(s.gpu_mem_bytes) > g]
        print(f"GPU{g} utilisation (%): {summary(util)} | memory used (GiB): {summary(mem)} of "
              f"{samples[-1].gpu_mem_total_bytes[g] / 2**30:.1f}")
    if status.stage != "COMPLETED":
        print("\n".join(list(view.jobs["trainer"].logs)[-40:]))
    print(json.dumps({"run_id": spec.run_id, "home": home}))


if __name__ == "__main__":
    main()
