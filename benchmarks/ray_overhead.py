"""The same tiny run through LocalExecutor and through RayExecutor (a one-node Ray cluster started here), interleaved:
wall time ratio, and what Ray adds to starting a job.

    python benchmarks/ray_overhead.py [--rounds 3] [--steps 40]

Each round runs the tiny demo once per executor, the order alternating between rounds. Prints per executor the wall
time from launch to the trainer's end, the ratio Ray / local (min and median over rounds), and the job start: from
the submit call to the moment the job's wrapper started its command (process.json), so Ray's own overhead per job
start is the Ray figure minus the local one.
"""

import argparse
import os
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "tests")]

from ray_cluster import ray_cluster

from backend.executors.local import LocalExecutor
from backend.plan.spec import RunSpec
from backend.runs.registry import RunRegistry
from backend.storage.store import FolderStore


def one_run(registry: RunRegistry, spec: RunSpec) -> tuple[float, float]:
    """(wall seconds from launch to the trainer's end, seconds from launch to its command's start)."""
    started = time.time()
    job_id = registry.launch(spec).job_ids["trainer"]
    executor = registry.executor
    while not executor.status(job_id).done:
        time.sleep(0.2)
    wall = time.time() - started
    status = executor.status(job_id)
    assert status.stage == "COMPLETED", status
    [record] = [r for r in executor.list_jobs(spec.run_id) if r.job_id == job_id]
    return wall, record.started_at - started


def ratio_line(name: str, ray: list[float], local: list[float]) -> str:
    ratios = [r / max(lo, 1e-9) for r, lo in zip(ray, local)]
    return (f"{name}: ray / local min {min(ratios):.2f}, median {statistics.median(ratios):.2f} "
            f"(ray median {statistics.median(ray):.1f} s, local median {statistics.median(local):.1f} s)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=40)
    args = parser.parse_args()
    home = tempfile.mkdtemp(prefix="ray-bench-")
    shared = os.path.join(home, "shared")
    with ray_cluster(num_cpus=4) as address:
        os.environ["RAY_ADDRESS"] = address
        from backend.executors.ray import ENGINE, RayExecutor

        ray_executor = RayExecutor(address)
        local = LocalExecutor(os.path.join(home, "local"))
        registries = {
            "local": RunRegistry(local, lambda bucket: FolderStore(local.bucket_root(bucket))),
            "ray": RunRegistry(ray_executor, lambda bucket: FolderStore(ray_executor.bucket_root(bucket))),
        }
        results = {name: {"wall": [], "start": []} for name in registries}
        for i in range(args.rounds):
            order = ["local", "ray"] if i % 2 == 0 else ["ray", "local"]
            for name in order:
                spec = RunSpec(max_steps=args.steps, use_vllm=False, executor=name,
                               **({"mount_path": shared} if name == "ray" else {})).check()
                if name == "ray":
                    problems = ENGINE.spec_problems(spec)
                    assert not problems, problems
                wall, start = one_run(registries[name], spec)
                results[name]["wall"].append(wall)
                results[name]["start"].append(start)
                print(f"round {i + 1} {name}: wall {wall:.1f} s, job start {start:.2f} s", flush=True)
    ray, lo = results["ray"], results["local"]
    print(ratio_line("wall time", ray["wall"], lo["wall"]))
    overhead = [r - s for r, s in zip(ray["start"], lo["start"])]
    print(f"Ray's own overhead per job start: min {min(overhead):.2f} s, median {statistics.median(overhead):.2f} s "
          f"(ray start median {statistics.median(ray['start']):.2f} s, local {statistics.median(lo['start']):.2f} s)")


if __name__ == "__main__":
    main()
