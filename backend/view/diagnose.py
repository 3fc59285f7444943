"""Why a run is slow or off: a bottleneck verdict with a proposed change, and alerts. Pure functions over the
metrics the trainers log (TRL's own names) and the run's spec; no I/O.

The verdict follows how the published async GRPO + LoRA study found its 3.9x: look at whether the trainer waits
for rollouts, whether generation is held back by its in-flight cap, and what share of wall time weight sync
takes, then change the one setting that bounds the run.
"""

import itertools
import math
import statistics
from dataclasses import dataclass, field

from backend.plan.servers import MAX_SERVERS_PER_GPU
from backend.runtime import records
from backend.runtime.serving.canary import canary_problems
from backend.view.servers import latest_servers, replica_gpu_busy

WINDOW = 20                  # recent logged steps a verdict reads
WAITING_SHARE = 0.30         # the trainer waits for rollouts this share of a step or more: generation bounds it
IDLE_WAIT_SHARE = 0.05       # ... this share or less, with a full queue: the trainer bounds it
FULL = 0.8                   # a queue or an in-flight count at this share of its cap is "at its cap"
SYNC_SHARE = 0.25            # weight sync takes this share of wall time or more: sync bounds it
TARGET_SYNC_SHARE = 0.10     # what the proposed sync interval aims at

# The importance ratio trainer/vLLM logprobs. A published healthy run stayed within 0.9993-1.0004, and the local
# tiny runs here within 0.996-1.005 (small batches are noisier); a policy that was lost or never loaded drifts
# past 1% and stays there. The old +-0.1 band was never crossed by a replica serving the base model early on.
RATIO_BAND = 0.01
STALL_FACTOR = 10            # no new step for this many median step times ...
STALL_FLOOR_S = 60.0         # ... and at least this long: a 0.1 s-step run that pauses 1 s is not stalled
# Pauses a run makes on purpose, each allowed on top of the stall limit: saving a checkpoint (optimizer state too,
# into the bucket), publishing an adapter version (a distributed run's weight sync: save, load on every replica),
# and a resumed trainer starting up (model load, vLLM warm-up, the first generation). The trainers here run no
# evaluation (GRPOConfig's eval_strategy stays "no"), so there is no evaluation pause to allow for.
PAUSE_ALLOWANCE_S = {"checkpoint save": 300.0, "adapter publish": 120.0, "start-up": 900.0}
# Before the third logged step there is no step time of the run's own to judge by: a first or second step that takes
# this long (on top of the pause due then) is stalled. The first step carries the warm-up (the first generations, a
# vLLM server's first answers): minutes on a loaded CPU, seconds on a GPU.
FEW_STEPS_LIMIT_S = 300.0
# How long a trainer may stay at one start-up mark (backend/view/startup.py) before it is said to be stalled there,
# by the newest start-up event it wrote (the header's words come from logs a summary view does not read, so the
# allowance keys on the events): from `attempt` to `engine` it installs the runtime (HF Jobs: minutes), builds a
# builtin model (seconds to a minute), and a distributed trainer waits for its replicas until its own start deadline
# (runtime/trainer/train_async.py, 900 s by default), failing by itself then; from `engine` to `started` it imports
# TRL and builds the trainer (and scores the base model on a held-out set); from `started` it trains its first step.
# On this 2-core machine those took seconds idle and a few minutes at load 40. A machine not yet given (SCHEDULING)
# and a job that has written nothing yet have no allowance: the platform's queue is not the run's stall.
START_UP_ALLOWANCE_S = {records.ATTEMPT: 1200.0, records.ENGINE: 600.0, records.STARTED: 600.0}
METRICS_FLUSH_S = 2.0        # the trainers write logged steps at most this often (RunFolderCallback.flush_every_s)
NO_SIGNAL_STEPS = 10         # logged steps in a row in which every group's completions scored alike: no signal
ZERO_STD = 1e-6
STALE_DROP_SHARE = 0.20      # stale samples dropped, as a share of samples scored, above which to alert
GPU_IDLE_PERCENT = 5.0       # a GPU below this utilisation ...
GPU_IDLE_MINUTES = 5.0       # ... for this long while the run trains is idle


API_BOUND_CPU = 0.9          # a server's API process busy this share of a core or more: its main thread is saturated
GPU_ROOM_PERCENT = 80.0      # replica GPUs busy less than this have room for another server's work


@dataclass(frozen=True)
class Verdict:
    kind: str                          # "trainer-bound", "generation-bound", "sync-bound", "healthy", "unknown"
    line: str                          # one sentence with the evidence numbers
    advice: str = ""                   # what the study found for this case
    change: dict = field(default_factory=dict)    # RunSpec fields to change for "New run with this change"


def _values(rows: list[dict], key: str) -> list[float]:
    return [float(r[key]) for r in rows if isinstance(r.get(key), (int, float)) and math.isfinite(r[key])]


def _median(rows: list[dict], key: str) -> float | None:
    values = _values(rows, key)
    return statistics.median(values) if values else None


def view_verdict(view) -> Verdict:
    """The verdict of a run's view: its last WINDOW logged steps, its servers' newest load, its replicas' GPU use."""
    return verdict(view.table.rows(last=WINDOW), view.spec, latest_servers(view), replica_gpu_busy(view))


def api_bound(servers: list[dict], gpu_busy: float | None) -> tuple[float, float] | None:
    """(the servers' median API-process CPU, the replicas' GPU %) when the healthy servers' API processes are
    saturated while their GPUs have room; None otherwise, or where no GPU is reported (a CPU replica)."""
    cpus = [s["api_cpu"] for s in servers if isinstance(s, dict) and s.get("healthy")
            and isinstance(s.get("api_cpu"), (int, float))]
    if not cpus or gpu_busy is None:
        return None
    cpu = statistics.median(cpus)
    return (cpu, gpu_busy) if cpu >= API_BOUND_CPU and gpu_busy < GPU_ROOM_PERCENT else None


def verdict(rows: list[dict], spec: dict, servers: list[dict] = (), gpu_busy: float | None = None) -> Verdict:
    """Which side bounds a distributed run over its last WINDOW logged steps, with the evidence and a change;
    `servers` (the proxy's newest snapshot) and `gpu_busy` (the replicas' GPU %) tell an API-server bound."""
    if spec.get("mode") != "distributed":
        return Verdict("unknown", "Colocated runs alternate generation and training on the same GPUs: there is no "
                                  "queue between them to read a bottleneck from.")
    window = rows[-WINDOW:]
    step_s = _median(window, "perf/step_s")
    wait_s = _median(window, "perf/rollout_wait_s")
    if not step_s or wait_s is None:
        return Verdict("unknown", "Not enough steps logged yet for a verdict.")
    wait_share = wait_s / step_s
    queue, cap_queue = _median(window, "sample/rollout_queue_size"), spec.get("queue_maxsize") or 0
    inflight, cap_inflight = _median(window, "rollout/inflight"), spec.get("max_inflight_tasks") or 0
    sync_s, every = _median(window, "perf/weight_sync_s"), max(int(spec.get("adapter_every") or 1), 1)
    sync_share = (sync_s / (every * step_s)) if sync_s else 0.0

    if sync_share >= SYNC_SHARE:
        new_every = max(every * 2, math.ceil(every * sync_share / TARGET_SYNC_SHARE))
        return Verdict(
            "sync-bound",
            f"Sync-bound: weight sync takes {sync_s:.2f} s every {every} step(s) of {step_s:.2f} s, "
            f"{sync_share:.0%} of wall time.",
            f"Sync less often: every {new_every} steps keeps sync near {TARGET_SYNC_SHARE:.0%} of wall time "
            "(staleness grows by the same number of versions, so keep max_staleness above it).",
            {"adapter_every": new_every, "max_staleness": max(int(spec.get("max_staleness") or 0), new_every)})
    if wait_share >= WAITING_SHARE:
        at_cap = inflight is not None and cap_inflight and inflight >= FULL * cap_inflight
        evidence = (f"Generation-bound: the trainer waits {wait_s:.2f} s of each {step_s:.2f} s step for rollouts "
                    f"({wait_share:.0%})" + (f"; in flight {inflight:.0f} of {cap_inflight}" if inflight is not None
                                            else "") + ".")
        saturated = api_bound(servers, gpu_busy)
        if saturated:
            return _api_bound_verdict(evidence, saturated, spec)
        if at_cap or inflight is None:
            return Verdict("generation-bound", evidence,
                           "Raise max_inflight_tasks before adding replicas: the replicas may have room the cap "
                           "keeps idle.", {"max_inflight_tasks": max(int(cap_inflight or 1) * 2, 2)})
        return Verdict("generation-bound", evidence,
                       "In-flight requests are below their cap, so the replicas themselves are saturated: add one.",
                       {"replicas": int(spec.get("replicas") or 1) + 1})
    queue_full = queue is not None and cap_queue and queue >= FULL * cap_queue
    if wait_share <= IDLE_WAIT_SHARE and queue_full:
        evidence = (f"Trainer-bound: the trainer waits {wait_s:.2f} s of each {step_s:.2f} s step ({wait_share:.0%}) "
                    f"and the rollout queue holds {queue:.0f} of {cap_queue}.")
        if spec.get("gradient_checkpointing"):
            return Verdict("trainer-bound", evidence,
                           "Turn gradient checkpointing off where the model fits: it recomputes the forward pass.",
                           {"gradient_checkpointing": False})
        budget = int(spec.get("max_tokens_per_batch") or 0)
        return Verdict("trainer-bound", evidence,
                       "Pack more tokens per optimizer step (token-budget packing): fewer, fuller steps.",
                       {"max_tokens_per_batch": max(budget * 2, 1)})
    return Verdict("healthy", f"Healthy: the trainer waits {wait_share:.0%} of each {step_s:.2f} s step, weight sync "
                              f"takes {sync_share:.0%} of wall time.")


def _api_bound_verdict(evidence: str, saturated: tuple[float, float], spec: dict) -> Verdict:
    cpu, gpu = saturated
    line = (f"{evidence} API-server bound: the vLLM servers' API processes use {cpu:.2f} of a core each (median) "
            f"while the replicas' GPUs are {gpu:.0f}% busy.")
    servers = int(spec.get("servers_per_gpu") or 1)
    if servers >= MAX_SERVERS_PER_GPU:
        return Verdict("generation-bound", line, "Add replicas: each server already has its own API process.",
                       {"replicas": int(spec.get("replicas") or 1) + 1})
    more = min(servers * 2, MAX_SERVERS_PER_GPU)
    inflight = int(spec.get("max_inflight_tasks") or 1)
    return Verdict("generation-bound", line,
                   f"Raise servers per GPU to {more}: each server brings its own API process and engine core, and "
                   "the GPU has room; requests in flight rise alike so each server stays fed.",
                   {"servers_per_gpu": more, "max_inflight_tasks": inflight * more // servers})


@dataclass(frozen=True)
class Alert:
    kind: str  # "ratio", "stall", "no-signal", "job-error", "replica-down", "stale-drops", "gpu-idle", "serving"
    message: str
    key: str           # stable while the problem lasts: an alert is written and sent when its key appears


def ratio_alert(rows: list[dict], window: int = 5) -> Alert | None:
    values = _values(rows[-window:], "ratio")
    if not values:
        return None
    mean = sum(values) / len(values)
    if abs(mean - 1) <= RATIO_BAND:
        return None
    return Alert("ratio", f"ratio {mean:.4f} over the last {len(values)} steps is outside 1 ± {RATIO_BAND}: the "
                          "trainer and vLLM disagree on the policy (a version lost, or not loaded on a replica)",
                 "ratio")


def stall_alert(rows: list[dict], now: float, running: bool, spec: dict | None = None,
                started_at: float | None = None) -> Alert | None:
    """No new step for STALL_FACTOR median step times, and at least STALL_FLOOR_S, while the run's jobs run; a
    pause the run makes on purpose right then gets its allowance on top. `started_at`: when the trainer's current
    launch started training (a resumed run's), if after its newest step: the wait is then counted from it."""
    times = _values(rows, "time")
    if not running or not times:
        return None
    gaps = [b - a for a, b in itertools.pairwise(times[-WINDOW - 1:]) if b > a]
    typical = statistics.median(gaps) if len(times) >= 3 and gaps else None
    since, pause = times[-1], intended_pause(rows[-1].get("step"), typical or FEW_STEPS_LIMIT_S, spec or {})
    if started_at is not None and started_at > since:
        since, pause = started_at, "start-up"
    idle = now - since
    limit = max(STALL_FACTOR * typical, STALL_FLOOR_S) if typical else FEW_STEPS_LIMIT_S
    allowance = PAUSE_ALLOWANCE_S.get(pause, 0.0)
    if idle < limit + allowance:
        return None
    why = f" plus {allowance:.0f} s for the {pause} due then" if pause else ""
    rule = (f"{STALL_FACTOR}x the median step time of {typical:.1f} s, at least {STALL_FLOOR_S:.0f} s" if typical
            else f"the limit before the run has a step time of its own: {len(times)} logged step(s)")
    return Alert("stall", f"no new step for {idle:.0f} s, past the limit of {limit + allowance:.0f} s "
                          f"({rule}{why}); last step {rows[-1].get('step')}", "stall")


def start_up_stall_alert(stage, now: float) -> Alert | None:
    """A run that has not logged its first step and has stayed at one start-up mark (`stage`: a
    `backend.view.startup.StartUp`) past its allowance: stalled there. A trainer that died says so through its job;
    this is one that lives and does not move."""
    allowance = START_UP_ALLOWANCE_S.get(stage.mark) if stage is not None else None
    if allowance is None or stage.since is None or now - stage.since < allowance:
        return None
    return Alert("stall", f"no progress for {now - stage.since:.0f} s: still {stage.stage}, past the start-up "
                          f"allowance of {allowance:.0f} s; the trainer's log says what it is doing", "stall")


def intended_pause(step, typical_s: float, spec: dict) -> str | None:
    """The pause the run makes on purpose right after logged step `step`, if one is due: a checkpoint save or an
    adapter publish at a step within those it may have logged but not yet written (it writes them every
    METRICS_FLUSH_S), so a save at step 50 counts while step 48 is the newest one read."""
    if not isinstance(step, (int, float)):
        return None
    every_log = max(int(spec.get("logging_steps") or 1), 1)
    ahead = every_log * (1 + math.ceil(METRICS_FLUSH_S / max(typical_s, 1e-3)))
    first, last = int(step), int(step) + ahead
    for pause, key in (("checkpoint save", "checkpoint_every"), ("adapter publish", "adapter_every")):
        every = int(spec.get(key) or 0)
        # A pause made at every logged step (a distributed run syncing each step) is in the median step time already.
        if every <= every_log:
            continue
        if last // every > (first - 1) // every:    # a multiple of `every` in [first, last]
            return pause
    return None


def _flat(row: dict) -> bool | None:
    """Whether every group of the step scored its completions alike (None: the step does not say). GRPOTrainer
    logs the share of groups whose rewards have zero std (`frac_reward_zero_std`); the async trainer logs each
    group's own std, averaged over the step's samples (`reward_std`), zero only when every group's is."""
    frac = row.get("frac_reward_zero_std")
    if isinstance(frac, (int, float)) and math.isfinite(frac):
        return frac >= 1 - ZERO_STD
    std = row.get("reward_std")
    if isinstance(std, (int, float)) and math.isfinite(std):
        return std <= ZERO_STD
    return None


def no_signal_alert(rows: list[dict], spec: dict) -> Alert | None:
    """Every group's completions scored alike in each of the last NO_SIGNAL_STEPS logged steps: GRPO's advantages
    are all 0, so the adapter does not move. Says what would make the scores within a group differ."""
    recent = rows[-NO_SIGNAL_STEPS:]
    if len(recent) < NO_SIGNAL_STEPS or not all(_flat(r) for r in recent):
        return None
    rewards = _values(recent, "reward")
    mean = sum(rewards) / len(rewards) if rewards else None
    scored = f" (mean reward {mean:.3g})" if mean is not None else ""
    n = spec.get("num_generations")
    temperature = spec.get("temperature")
    more = f"num_generations, now {n}" if n else "num_generations"
    hotter = f"temperature, now {temperature:g}" if isinstance(temperature, (int, float)) else "temperature"
    return Alert("no-signal",
                 f"no learning signal: in each of the last {len(recent)} logged steps every prompt's completions got "
                 f"the same score{scored}, so every advantage is 0 and nothing is learned (the adapter stays as it "
                 f"started). Make scores differ within a group: an easier dataset or a reward that gives partial "
                 f"credit (a format bonus, a graded score), more completions per prompt ({more}), or a higher "
                 f"{hotter}.", "no-signal")


def stale_drop_alert(rows: list[dict], spec: dict) -> Alert | None:
    """Stale samples dropped as a share of the samples the trainer received (scored) so far."""
    dropped = _values(rows, "sample/dropped_stale_total")
    if not dropped or not rows:
        return None
    per_step = int(spec.get("per_device_batch_size") or 1) * max(int(spec.get("num_processes") or 1), 1)
    scored = dropped[-1] + per_step * len(rows)
    share = dropped[-1] / scored if scored else 0.0
    if share <= STALE_DROP_SHARE:
        return None
    return Alert("stale-drops", f"{dropped[-1]:.0f} stale samples dropped, {share:.0%} of those scored: generation "
                                "is wasted; raise max_staleness or sync more often", "stale-drops")


def job_alerts(stages: dict[str, str], messages: dict[str, str]) -> list[Alert]:
    """A job in ERROR (the trainer, or a replica: then the run is degraded)."""
    out = []
    for role, stage in sorted(stages.items()):
        if stage != "ERROR":
            continue
        kind = "replica-down" if role.startswith("vllm-") else "job-error"
        out.append(Alert(kind, f"job {role} failed: {messages.get(role) or 'see its log'}", f"{kind}-{role}"))
    return out


def gpu_idle_alert(role: str, samples: list, now: float, running: bool) -> Alert | None:
    """Every GPU of a job below GPU_IDLE_PERCENT for GPU_IDLE_MINUTES while the run trains."""
    if not running:
        return None
    recent = [s for s in samples if now - s.time <= GPU_IDLE_MINUTES * 60 and s.gpu_util]
    if not recent or now - recent[0].time < 0.9 * GPU_IDLE_MINUTES * 60:
        return None
    if any(max(s.gpu_util) >= GPU_IDLE_PERCENT for s in recent):
        return None
    return Alert("gpu-idle", f"{role}: GPUs below {GPU_IDLE_PERCENT:.0f}% utilisation for {GPU_IDLE_MINUTES:.0f} "
                             "minutes while the run trains: it pays for hardware it does not use", f"gpu-idle-{role}")


def serving_alerts(proof: dict) -> list[Alert]:
    """What the proxy's serving proof of the newest version says is wrong on each replica: it does not list the
    version, another model answered, or it answers like its base model while another replica does not (a canary
    miss, counted per replica by the proxy), or it did not answer."""
    alerts = []
    for r, (problem, _missed) in zip(proof.get("replicas") or [], canary_problems(proof)):
        if problem:
            url = r.get("url", "?")
            alerts.append(Alert("serving", f"replica {url} {problem}", f"serving-{url}"))
    return alerts
