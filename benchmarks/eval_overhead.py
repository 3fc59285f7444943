"""What held-out evaluation costs a distributed run: the same run with evaluation and without, interleaved.

    python benchmarks/eval_overhead.py [--rounds 3] [--steps 20] [--home DIR] [--set FIELD=VALUE ...]

Each round launches the local distributed preset ("Tiny distributed (CPU, 2 vLLM replicas)": the trainer, the
proxy and two real vLLM replicas, through LocalExecutor as the panel launches it) twice: once with no held-out set,
once evaluating every synced version on the builtin set's held-out split through the replicas (the preset's own
held-out settings). Which goes first alternates between rounds. The figure is wall time per step: the span between
the first and the last logged step's time, over the steps between them, so the replicas' start-up (minutes on
CPU) is not counted. Prints both per round, then the ratio (with / without) per round, its min and median; the
goal is a median of at most 1.05. Asserts nothing: it measures.

On a GPU machine the same command places the replicas and the trainer on GPUs (LocalExecutor's placement);
`--set` overrides any RunSpec field (JSON where it parses), e.g. a bigger builtin model and more steps:

    python benchmarks/eval_overhead.py --set model='"builtin:bench-qwen2.5-0.5b"' --set max_completion_length=256
"""

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from backend.executors.local import LocalExecutor
from backend.plan.spec import RunSpec
from backend.runs.registry import RunRegistry
from backend.storage.store import FolderStore
from benchmarks.sampled_run import spec_override
from panel.presets import preset_values

PRESET = "Tiny distributed (CPU, 2 vLLM replicas)"



def one_run(registry: RunRegistry, executor: LocalExecutor, values: dict, evaluate: bool) -> dict:
    """Launch one run, wait for it, and return its wall time per step and what it evaluated."""
    values = {**values, "name": f"eval-overhead-{'with' if evaluate else 'without'}"}
    if not evaluate:
        values.update(eval_source="none", monitor_rewards=[])
    spec = RunSpec.from_dict(values).check()
    launched = registry.launch(spec)
    started = time.time()
    status = executor.wait(launched.job_ids["trainer"], timeout=spec.timeout_minutes * 60)
    for job_id in launched.job_ids.values():       # the replicas stop on their own once the trainer has ended
        executor.wait(job_id, timeout=300)
    view = registry.view(spec.run_id)
    view.refresh()
    times = sorted((r["step"], r["time"]) for r in view.metrics if "time" in r)
    if status.stage != "COMPLETED" or len(times) < 2:
        print("\n".join(list(view.jobs["trainer"].logs)[-40:]))
        sys.exit(f"run {spec.run_id} ended {status.stage} {status.message} with {len(times)} logged steps")
    (first_step, first), (last_step, last) = times[0], times[-1]
    return {"run_id": spec.run_id, "per_step_s": (last - first) / (last_step - first_step),
            "wall_s": time.time() - started, "evaluated": len(view.evals)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--home", default=None, help="where the runs go (default: a new temporary folder)")
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE", help="override a RunSpec field")
    args = parser.parse_args()
    home = args.home or tempfile.mkdtemp(prefix="grpo-eval-overhead-")
    executor = LocalExecutor(home)
    registry = RunRegistry(executor, lambda b: FolderStore(executor.bucket_root(b)))
    values = {**preset_values(PRESET), "max_steps": args.steps, **dict(spec_override(s) for s in args.set)}
    if values.get("eval_source", "none") == "none":
        values.update(eval_source="split", eval_split="test")
    print(f"preset {PRESET!r}, {args.steps} steps, {args.rounds} rounds; held-out: {values['eval_source']} "
          f"{values['eval_split']}, at most {values['eval_max_inflight']} requests in flight; home {home}")
    ratios, per_step = [], {True: [], False: []}
    for round_ in range(args.rounds):
        order = (False, True) if round_ % 2 == 0 else (True, False)
        results = {evaluate: one_run(registry, executor, values, evaluate) for evaluate in order}
        for evaluate, result in results.items():
            per_step[evaluate].append(result["per_step_s"])
        ratio = results[True]["per_step_s"] / results[False]["per_step_s"]
        ratios.append(ratio)
        print(f"round {round_ + 1}: without {results[False]['per_step_s']:.3f} s/step, with "
              f"{results[True]['per_step_s']:.3f} s/step ({results[True]['evaluated']} versions evaluated), "
              f"ratio {ratio:.3f}  [wall {results[False]['wall_s']:.0f} s / {results[True]['wall_s']:.0f} s]",
              flush=True)
    for evaluate, label in ((False, "without"), (True, "with")):
        print(f"{label} evaluation: s/step min {min(per_step[evaluate]):.3f}, "
              f"median {statistics.median(per_step[evaluate]):.3f}")
    print(f"ratio with/without (wall time per step): min {min(ratios):.3f}, median {statistics.median(ratios):.3f} "
          f"(goal <= 1.05)")


if __name__ == "__main__":
    main()
