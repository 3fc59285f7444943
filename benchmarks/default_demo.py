"""The default preset (*Tiny demo (CPU)*) end to end through LocalExecutor: launch -> first metric point and
-> COMPLETED, and its held-out curve (issue 45's goal: completed within 2 minutes on an idle 2-core machine).

    python benchmarks/default_demo.py [--home DIR] [--cold] [--set FIELD=VALUE ...]

The run builds its model first: the tiny model after its supervised warm-up (runtime/tiny_model.py), kept in the
build cache after the first build on a machine. `--cold` uses an empty build cache, so the figures include that
build; by default the machine's cache is used as a local run uses it. Prints the held-out exact answer of every
evaluated version (v0: the base model), the best version and whether the reward-hacking alert fired. Say how
loaded the machine was beside any figure: on a shared machine the times say little (`uptime` is printed).
"""

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from backend.executors.local import LocalExecutor
from backend.outcome.hacking_sign import hacking_sign
from backend.plan.spec import RunSpec
from backend.runs.registry import RunRegistry
from backend.runtime import tiny_model
from backend.storage.store import FolderStore
from benchmarks.sampled_run import spec_override
from panel.presets import TINY_DEMO, preset_values

POLL_S = 0.5


def load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg()) + f" on {os.cpu_count()} CPUs"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--home", default=None)
    parser.add_argument("--cold", action="store_true", help="an empty build cache: the model's build is timed too")
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE", help="override a RunSpec field")
    args = parser.parse_args()
    home = args.home or tempfile.mkdtemp(prefix="grpo-bench-")
    if args.cold:
        os.environ[tiny_model.CACHE_ENV] = tempfile.mkdtemp(prefix="grpo-bench-cache-")
    executor = LocalExecutor(home)
    registry = RunRegistry(executor, lambda b: FolderStore(executor.bucket_root(b)))
    spec = RunSpec.from_dict({**preset_values(TINY_DEMO), **dict(spec_override(item) for item in args.set)})
    if errors := spec.validate():
        sys.exit("bad --set:\n" + "\n".join(map(str, errors)))
    print(f"load average before: {load()}", flush=True)
    started = time.time()
    registry.launch(spec)
    view = registry.view(spec.run_id)
    first_point = None
    deadline = started + spec.timeout_minutes * 60
    while time.time() < deadline:
        view.refresh()
        if first_point is None and view.metrics:
            first_point = time.time() - started
        if view.done:
            break
        time.sleep(POLL_S)
    done = time.time() - started
    view.refresh()
    held = view.held_out
    built = next((line for line in view.jobs["trainer"].logs
                  if tiny_model.TINY_REPEATER in line and " ready at " in line), "no build line")
    print(f"stage {view.stage} | launch -> first point {first_point or float('nan'):.1f} s | "
          f"launch -> {view.stage} {done:.1f} s | {len(view.metrics)} logged steps | model: {built.strip()}")
    print(f"load average after: {load()}")
    print("held-out exact answer (version, step, score):")
    for version, score in sorted(held.scores.items()):
        print(f"  v{version:<3} step {score.step:>4}  {score.score:.3f}")
    best = held.best_json or {}
    print(f"best: v{best.get('policy_version')} at step {best.get('step')} of {spec.max_steps}")
    sign = hacking_sign(held)
    print("reward-hacking alert:", sign.message if sign else "none")
    print(f"home {home} run {spec.run_id}")


if __name__ == "__main__":
    main()
