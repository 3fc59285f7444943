"""A sweep of 4 members on one replica fleet (A) against 4 separate distributed runs, each with a fleet of its own (B).

    python benchmarks/sweep_fleet.py [--members 4] [--replicas 4] [--steps 2] [--tokens 512] [--rounds 1]
                                     [--home DIR] [--set FIELD=VALUE ...]
                                     [--trainer-flavor a10g-small] [--replica-flavor a10g-small] [--price ...]

Both arms train the same 4 members (the local preset "Tiny distributed (CPU, 2 vLLM replicas)" on the builtin tiny
model, learning rates 1e-4, 5e-4, 1e-3, 2e-3, max_staleness 1, `--steps` steps of a `--tokens` token budget, no
held-out set), launched through the panel (`Panel.launch`, as the Launch tab launches them), on the same total of
`--replicas` vLLM replica jobs on this machine's cores: A, one sweep whose one fleet has `--replicas` replicas
(each server bound to its share of the cores, `recipe.split_cores`); B, 4 runs at once, each with `--replicas` / 4
replicas of its own (each run splits the same cores between its own servers, so B's servers share cores across
runs). With `--replicas` below `--members` (`--replicas 1`: the smallest fleet of each kind) every separate run still
has one replica, so B has `--members` replicas and A `--replicas`: one fleet for the sweep against a fleet each, what a
shared fleet is for. Every trainer runs in both arms. Which arm goes first alternates between rounds.

Per member and arm it prints the generated tokens per second of its rollouts (TRL's `rollout/generated_tok_s`, median
over the member's steps), its wall time from launch to its trainer's end, and what it cost. No price here (local jobs
bill nothing), so cost is job-seconds: replica-seconds (a replica job's running time) plus trainer-seconds. In A a
member's cost is its share of the fleet's replica-seconds split by the tokens its proxy counted
(`backend/view/fleet_cost.py`, as its cost line shows it) plus its own trainer's; in B, its run's replicas plus its
trainer. Then per arm: the total job-seconds per completed member, and the ratios A/B (min and median over rounds
where `--rounds` > 1). Every run it starts is cancelled at the end, also on an error or Ctrl-C. Asserts nothing.

Priced: the jobs here run on this machine's CPUs (local jobs bill nothing), so the dollars are the measured
job-seconds priced on the Jobs price table the panel's cost lines use (`hardware.FALLBACK_FLAVORS`, the built-in
list) as if each trainer ran on `--trainer-flavor` and each replica on `--replica-flavor` (`--price T:R` adds more
pairs): a GPU-free run's seconds at GPU prices, not a bill. Start-up share: per member, the time from its arm's launch
to its trainer's first logged step, over its wall time (launch to its trainer's end).
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from backend.plan.cost import job_spend
from backend.plan.hardware import FALLBACK_FLAVORS
from backend.plan.jobspec import TERMINAL_STAGES
from backend.runs.operations import SweepForm
from backend.runtime import layout
from backend.storage.observers import FragmentCursor, read_new_records
from backend.storage.store import FolderStore
from backend.view.fleet_cost import TokenLog, fleet_split
from benchmarks.sampled_run import spec_override
from panel.actions import Panel, Settings
from panel.presets import PRESETS

PRESET = "Tiny distributed (CPU, 2 vLLM replicas)"
RATES = ("1e-4", "5e-4", "1e-3", "2e-3")
SECONDS = {"local": 3600.0}      # one "dollar" an hour: job_spend's usd is then the job's running seconds
PRICES = {f.name: f.price_per_hour_usd for f in FALLBACK_FLAVORS}


def records(run_dir: str, folder: str, writer: str) -> list[dict]:
    return [r for w, r in read_new_records(FolderStore(run_dir), folder, FragmentCursor()) if w == writer]


def settled(panel, run_ids: set[str]) -> bool:
    jobs = [j for j in panel.local.list_jobs() if j.run_id in run_ids]
    return bool(jobs) and all(j.stage in TERMINAL_STAGES for j in jobs)


def wait_settled(panel, run_ids: set[str], timeout_s: float) -> float:
    """Wait until every job of `run_ids` has ended; the seconds waited."""
    started = time.monotonic()
    while not settled(panel, run_ids):
        if time.monotonic() - started > timeout_s:
            raise TimeoutError(f"runs {sorted(run_ids)} still running after {timeout_s:.0f} s")
        time.sleep(5)
    return time.monotonic() - started


def member_figures(panel, bucket: str, run_id: str, tag: str, launched_at: float) -> dict:
    """One member's figures from its run folder and its job records: steps, TRL's generated tok/s, the tokens its
    proxy counted (a sweep member's proxy only), its trainer's end and its jobs' seconds by role."""
    run_dir = os.path.join(panel.local.bucket_root(bucket), layout.run_prefix(run_id))
    steps = records(run_dir, layout.METRICS_DIR, layout.TRAINER_WRITER)
    rates = [r["gen_tokens_per_s"] for r in steps if isinstance(r.get("gen_tokens_per_s"), (int, float))]
    log = TokenLog(tag)
    log.add(records(run_dir, layout.METRICS_DIR, layout.PROXY_WRITER))
    jobs = panel.local.list_jobs(run_id)
    now = time.time()
    trainer = next((r for r in jobs if r.role == "trainer"), None)
    first_step = min((r["time"] for r in steps if isinstance(r.get("time"), (int, float))), default=None)
    return {"tag": tag, "run_id": run_id, "steps": len(steps), "log": log, "records": jobs,
            "start_up_s": None if first_step is None else first_step - launched_at,
            "completed": trainer is not None and trainer.stage == "COMPLETED",
            "gen_tok_s": statistics.median(rates) if rates else None,
            "wall_s": ((trainer.finished_at or now) - launched_at) if trainer else None,
            "trainer_s": sum(job_spend(r, SECONDS, now).running_s for r in jobs if r.role == "trainer"),
            "replica_s": sum(job_spend(r, SECONDS, now).running_s for r in jobs if r.role != "trainer")}


def arm_a(panel, values: dict, rates: list[str], timeout_s: float, started: set[str]) -> dict:
    """One sweep of the members on one fleet of values["replicas"] replicas."""
    launched_at = time.time()
    result = panel.launch(values, sweep=SweepForm((("learning_rate", ", ".join(rates)),)))
    if not result.run_ids:
        raise RuntimeError(f"the sweep did not launch: {result.message}")
    started.update(result.run_ids)
    fleet = _spec_of(FolderStore(panel.local.bucket_root(values["bucket"])), result.run_ids[0])["fleet"]
    started.add(fleet)
    waited = wait_settled(panel, {*result.run_ids, fleet}, timeout_s)
    members = [member_figures(panel, values["bucket"], run_id, f"m{i}", launched_at)
               for i, run_id in enumerate(result.run_ids)]
    fleet_records = panel.local.list_jobs(fleet)
    split = fleet_split(fleet_records, {m["tag"]: (m["run_id"], m["records"]) for m in members},
                        {m["tag"]: m["log"] for m in members}, {}, False, time.time())
    for m in members:
        share = split.members[m["tag"]]
        m.update(fleet_share_s=share.fleet_s, token_share=share.token_share,
                 cost_s=(share.fleet_s or 0.0) + m["trainer_s"])
    return {"members": members, "wall_s": waited, "replica_s": split.fleet_s, "total_s": split.total_s}


def arm_b(panel, values: dict, rates: list[str], timeout_s: float, started: set[str]) -> dict:
    """The members as separate runs at once, each with values["replicas"] replicas of its own."""
    launched_at = time.time()
    run_ids = []
    for i, rate in enumerate(rates):
        result = panel.launch({**values, "name": f"{values['name']}-run{i}", "learning_rate": float(rate)})
        if not result.run_id:
            raise RuntimeError(f"run {i} did not launch: {result.message}")
        started.add(result.run_id)
        run_ids.append(result.run_id)
    waited = wait_settled(panel, set(run_ids), timeout_s)
    members = [member_figures(panel, values["bucket"], run_id, f"m{i}", launched_at)
               for i, run_id in enumerate(run_ids)]
    for m in members:
        m.update(cost_s=m["replica_s"] + m["trainer_s"], fleet_share_s=m["replica_s"], token_share=None)
    return {"members": members, "wall_s": waited, "replica_s": sum(m["replica_s"] for m in members),
            "total_s": sum(m["cost_s"] for m in members)}


def _spec_of(store: FolderStore, run_id: str) -> dict:
    return json.loads(store.read_bytes(f"{layout.run_prefix(run_id)}/{layout.SPEC_FILE}"))


def per_completed(arm: dict) -> float | None:
    done = sum(m["completed"] for m in arm["members"])
    return arm["total_s"] / done if done else None


def priced_per_completed(arm: dict, trainer_flavor: str, replica_flavor: str) -> float | None:
    """The arm's job-seconds priced on the Jobs price table (trainers on one flavor, replicas on another), per
    completed member."""
    done = sum(m["completed"] for m in arm["members"])
    trainer_s = arm["total_s"] - arm["replica_s"]
    usd = (trainer_s * PRICES[trainer_flavor] + arm["replica_s"] * PRICES[replica_flavor]) / 3600.0
    return usd / done if done else None


def start_up_share(arm: dict) -> float | None:
    """The median over members of (launch to first step) / (launch to the trainer's end)."""
    shares = [m["start_up_s"] / m["wall_s"] for m in arm["members"] if m["start_up_s"] and m["wall_s"]]
    return statistics.median(shares) if shares else None


def show(label: str, arm: dict, pairs: list[tuple[str, str]]) -> None:
    print(f"{label}: wall {arm['wall_s']:.0f} s, replica-s {arm['replica_s']:.0f}, job-s in all "
          f"{arm['total_s']:.0f}, per completed member "
          f"{_fmt(per_completed(arm))} ({sum(m['completed'] for m in arm['members'])} completed); start-up share "
          f"(median of members) {_fmt(start_up_share(arm))}")
    for trainer, replica in pairs:
        print(f"  priced as trainer {trainer} + replica {replica}: "
              f"${_fmt3(priced_per_completed(arm, trainer, replica))} per completed member")
    for m in arm["members"]:
        counted = (f"proxy-counted {m['log'].tokens} tokens, {100 * m['token_share']:.0f}% of the fleet's tokens"
                   if m["token_share"] is not None else "tokens not counted (a lone run's proxy counts none)")
        print(f"  {m['tag']} {m['run_id']}: {m['steps']} steps, {'completed' if m['completed'] else 'NOT completed'}"
              f", generated {_fmt(m['gen_tok_s'])} tok/s (TRL, median of its steps), {counted}; "
              f"first step at {_fmt(m['start_up_s'])} s, wall {_fmt(m['wall_s'])} s; cost {m['cost_s']:.0f} job-s "
              f"(replicas {m['fleet_share_s'] or 0:.0f} + trainer {m['trainer_s']:.0f})", flush=True)


def _fmt(value) -> str:
    return "-" if value is None else f"{value:.1f}"


def _fmt3(value) -> str:
    return "-" if value is None else f"{value:.4f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--members", type=int, default=4)
    parser.add_argument("--replicas", type=int, default=4, help="replica jobs in all, in each arm")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=512, help="max_tokens_per_batch")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--first", choices=("A", "B"), default="A", help="the arm of the first round")
    parser.add_argument("--timeout", type=float, default=900, help="seconds an arm may take")
    parser.add_argument("--home", default=None, help="the panel's home (default: a new temporary folder)")
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE", help="override a RunSpec field")
    parser.add_argument("--trainer-flavor", default="a10g-small", help="the Jobs flavor the trainers are priced at")
    parser.add_argument("--replica-flavor", default="a10g-small", help="the Jobs flavor the replicas are priced at")
    parser.add_argument("--price", action="append", default=[], metavar="TRAINER:REPLICA",
                        help="another pair of flavors to price at (e.g. h200:h200)")
    args = parser.parse_args()
    pairs = [(args.trainer_flavor, args.replica_flavor), *(tuple(p.split(":", 1)) for p in args.price)]
    unknown = sorted({f for pair in pairs for f in pair} - PRICES.keys())
    if unknown or any(len(pair) != 2 for pair in pairs):
        sys.exit(f"unknown flavor(s) {', '.join(unknown) or '?'}: price pairs as TRAINER:REPLICA, each one of "
                 f"{', '.join(PRICES)}")
    if args.replicas % args.members and args.members % args.replicas:
        sys.exit("--replicas must be a multiple of --members (each separate run gets an equal share)")
    rates = [RATES[i % len(RATES)] if i < len(RATES) else f"{(i + 1)}e-3" for i in range(args.members)]
    base = {**PRESETS[PRESET], "name": "sweep-bench", "max_steps": args.steps, "eval_source": "none",
            "monitor_rewards": [], "best_by": "", "timeout_minutes": max(5, int(args.timeout // 60) + 2),
            "max_staleness": 1, "max_tokens_per_batch": args.tokens, **dict(spec_override(s) for s in args.set)}
    values_a = {**base, "replicas": args.replicas}
    values_b = {**base, "replicas": max(1, args.replicas // args.members)}
    home = args.home or tempfile.mkdtemp(prefix="grpo-sweep-fleet-")
    panel = Panel(Settings(home=home, on_space=False, host="127.0.0.1"))
    print(f"{args.members} members x {args.steps} steps, {args.tokens} tokens a step, max_staleness 1, on "
          f"{len(os.sched_getaffinity(0))} cores; A: one fleet of {values_a['replicas']} replicas; B: "
          f"{args.members} runs of {values_b['replicas']} replica(s) each; home {home}", flush=True)
    started: set[str] = set()
    ratios = {"tok_s": [], "per_member": [], "wall": [], **{f"usd {t}:{r}": [] for t, r in pairs}}
    try:
        for round_ in range(args.rounds):
            order = ("A", "B") if (round_ % 2 == 0) == (args.first == "A") else ("B", "A")
            arms = {}
            for arm in order:
                run = arm_a if arm == "A" else arm_b
                arms[arm] = run(panel, values_a if arm == "A" else values_b, rates, args.timeout, started)
                show(f"round {round_ + 1} {arm} ({'one fleet' if arm == 'A' else 'a fleet each'})", arms[arm], pairs)
            a, b = arms["A"], arms["B"]
            tok = [[m["gen_tok_s"] for m in arm["members"] if m["gen_tok_s"]] for arm in (a, b)]   # members with steps
            if tok[0] and tok[1]:
                ratios["tok_s"].append(statistics.median(tok[0]) / statistics.median(tok[1]))
            if per_completed(a) and per_completed(b):
                ratios["per_member"].append(per_completed(a) / per_completed(b))
            ratios["wall"].append(a["wall_s"] / b["wall_s"])
            for t, r in pairs:
                usd_a, usd_b = priced_per_completed(a, t, r), priced_per_completed(b, t, r)
                if usd_a and usd_b:
                    ratios[f"usd {t}:{r}"].append(usd_a / usd_b)
        for name, label in (("tok_s", "generated tok/s per member (median of members), A/B"),
                            ("per_member", "job-seconds per completed member, A/B"),
                            ("wall", "wall time of the arm, A/B"),
                            *((f"usd {t}:{r}", f"dollars per completed member, trainer {t} + replica {r}, A/B")
                              for t, r in pairs)):
            values = ratios[name]
            if values:
                print(f"{label}: min {min(values):.3f}, median {statistics.median(values):.3f}")
    finally:
        for job in panel.local.list_jobs():
            if job.run_id in started and job.stage not in TERMINAL_STAGES:
                panel.local.cancel(job.job_id)
        panel.shutdown()


if __name__ == "__main__":
    main()
