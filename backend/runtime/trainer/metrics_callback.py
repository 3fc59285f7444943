"""What a trainer writes into its run folder while it trains: metrics, adapter versions, the final adapter, events.

`canonical_metrics` is the one place where TRL's metric names (GRPOTrainer's and the async trainer's) become
the names the panel plots; `RunFolderCallback` is the `TrainerCallback` the colocated trainer uses.
"""

import json
import math
import os
import time
from collections import defaultdict

from transformers import TrainerCallback

from ..layout import (
    ADAPTER_META_FILE,
    ADAPTERS_DIR,
    FINAL_DIR,
    METRICS_DIR,
    TRAINER_WRITER,
    FragmentWriter,
    adapter_name,
    publish_folder,
)
from ..records import ADAPTER_PUBLISHED, FINISHED, STARTED, write_event
from ..versions import highest_published
from .samples import SampleWriter, colocated_samples

# TRL name -> canonical name. GRPOTrainer and AsyncGRPOTrainer both log some of these; async-only keys
# are absent from colocated runs (the callback fills the staleness pair with 0 there).
RENAMES = {
    "step": "step",
    "reward": "reward",
    "reward_std": "reward_std",
    "kl": "kl",
    "entropy": "entropy",
    "completions/mean_length": "completion_length",
    "loss": "loss",
    "grad_norm": "grad_norm",
    "learning_rate": "learning_rate",
    "step_time": "step_time",
    "perf/step_s": "step_time",
    "sample/staleness_mean": "staleness_mean",
    "sample/staleness_max": "staleness_max",
    "sample/dropped_stale_total": "dropped_stale_total",
    "sample/time_in_queue_s": "time_in_queue_s",
    "ratio": "ratio",
    "perf/weight_sync_s": "weight_sync_s",
    "rollout/generated_tok_s": "gen_tokens_per_s",
    "perf/trained_tok_s_wall_clock": "train_tokens_per_s",
    "perf/fwd_bwd_s": "fwd_bwd_s",
    "perf/rollout_wait_s": "rollout_wait_s",
}


def _number(value) -> float | None:
    # transformers prints floats as '%.4g' strings, so a parsed stdout dict carries strings; None/NaN mean "no value".
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def _canonical_name(key: str) -> str | None:
    if key in RENAMES:
        return RENAMES[key]
    # GRPOTrainer logs "rewards/<func>/mean" and "/std"; the async trainer logs "rewards/<func>".
    if key.startswith("rewards/"):
        name = key[len("rewards/"):]
        if name.endswith("/mean"):
            return "rewards/" + name[: -len("/mean")]
        if "/" not in name:
            return key
    return None


def canonical_metrics(logs: dict) -> dict:
    """One TRL log dict (GRPOTrainer or AsyncGRPOTrainer) as a metric record: every numeric value under its TRL
    name (nothing a user may want later is dropped), plus the panel's canonical names for the ones it plots;
    missing values are left out.

    The async trainer's trained tokens per second also fills `tokens_per_s`, the throughput the panel plots
    for every run.
    """
    out = {}
    for key, value in logs.items():
        number = _number(value)
        if number is None:
            continue
        out[key] = number
        name = _canonical_name(key)
        if name is not None:
            out[name] = number
    if "step" in out:
        out["step"] = int(out["step"])
    if "train_tokens_per_s" in out:
        out.setdefault("tokens_per_s", out["train_tokens_per_s"])
    return out


def folder_size(path: str) -> int:
    return sum(os.path.getsize(os.path.join(root, f)) for root, _, files in os.walk(path) for f in files)


def publish_adapter(model, dest: str, meta: dict) -> dict:
    """Save `model`'s adapter to `dest`, published whole (`publish_folder`); return its version.json."""
    with publish_folder(dest) as tmp:
        model.save_pretrained(tmp)
        meta = {**meta, "time": time.time(), "size_bytes": folder_size(tmp)}
        with open(os.path.join(tmp, ADAPTER_META_FILE), "w") as f:
            json.dump(meta, f)
    return meta


GENERATE_BLOCKS = (".vLLM.generate", ".transformers.generate", ".transformers.generate_batch")
SYNC_BLOCK = ".sync_weights"


class ProfiledSeconds:
    """Seconds GRPOTrainer spent generating and syncing weights into its colocated vLLM since the last `take()`.

    TRL times both (`profiling_context`: "GRPOTrainer.vLLM.generate", "GRPOTrainer.sync_weights") but hands the
    durations only to wandb, mlflow and trackio; this keeps the main process's durations for the run's metrics."""

    def __init__(self):
        self.totals: dict[str, float] = defaultdict(float)

    def install(self) -> "ProfiledSeconds":
        from trl.extras import profiling  # noqa: PLC0415 TRL only in the trainer, not in the panel

        original, totals = profiling.ProfilingContext._log_metrics, self.totals

        def log_metrics(context, duration: float) -> None:
            if context.is_main_process:
                totals[context.name] += duration
            original(context, duration)

        profiling.ProfilingContext._log_metrics = log_metrics
        return self

    def take(self) -> dict:
        """{"generation_s", "weight_sync_s"}: the seconds since the last call, only the blocks that ran."""
        out = {}
        generation = [v for k, v in self.totals.items() if k.endswith(GENERATE_BLOCKS)]
        if generation:
            out["generation_s"] = sum(generation)
        sync = [v for k, v in self.totals.items() if k.endswith(SYNC_BLOCK)]
        if sync:
            out["weight_sync_s"] = sum(sync)
        self.totals.clear()
        return out


class RunFolderCallback(TrainerCallback):
    """Writes metric fragments, adapter versions, final/ and events into `run_dir` as the trainer runs."""

    def __init__(self, run_dir: str, adapter_every: int, flush_every_s: float = 2.0,
                 profiled: ProfiledSeconds | None = None):
        self.run_dir = run_dir
        self.adapter_every = adapter_every
        self.flush_every_s = flush_every_s
        self.metrics = FragmentWriter(os.path.join(run_dir, METRICS_DIR), TRAINER_WRITER)
        self.samples = SampleWriter(run_dir, flush_every_s)   # flushed with the metrics
        self.trainer = None     # set once the trainer exists: its newest completions are written as samples
        self.pending: list[dict] = []
        self.last_flush = time.time()
        self.start = time.time()
        self.last_log = (self.start, None)  # (time, num_tokens) at the previous log, for tokens_per_s
        self.last_step = 0
        self.profiled = profiled
        self.version = highest_published(run_dir)   # a resumed run numbers past every version ever published
        self.published_step = None
        self.max_steps = 0
        self.evaluation = None  # a HeldOutEvaluation (runtime/trainer/evaluate.py) when the run has a held-out set

    def flush(self) -> None:
        self.metrics.write(self.pending)
        self.pending = []
        self.last_flush = time.time()
        try:
            self.samples.flush()
        except Exception as error:   # showing samples must never stop training
            print(f"could not write samples: {type(error).__name__}: {error}", flush=True)

    def on_train_begin(self, args, state, control, **kwargs):
        if not state.is_world_process_zero:
            return  # with several training processes, only the first one writes into the run folder
        self.start = time.time()
        self.last_log = (self.start, state.num_input_tokens_seen)
        self.last_step = state.global_step
        self.max_steps = state.max_steps
        write_event(self.run_dir, TRAINER_WRITER, STARTED, step=state.global_step, max_steps=state.max_steps)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or not logs or "reward" not in logs:
            return  # other processes write nothing; the end-of-training summary (train_runtime, ...) is no step
        record = {"step": state.global_step, "time": time.time(), **canonical_metrics(logs)}
        record.update(staleness_mean=0.0, staleness_max=0.0)  # colocated: every rollout uses the current policy
        record.update(self.profiled.take() if self.profiled else {})
        self._add_completion_rate(record, args, state.global_step)
        self._add_token_rate(record, _number(logs.get("num_tokens")))
        self.pending.append(record)
        if self.trainer is not None:
            try:
                self.samples.write(colocated_samples(self.trainer, state.global_step, args.max_completion_length))
            except Exception as error:   # showing samples must never stop training
                print(f"could not write samples: {type(error).__name__}: {error}", flush=True)
        if time.time() - self.last_flush >= self.flush_every_s:
            self.flush()
        print(self._progress_line(record, state.max_steps), flush=True)

    def _add_completion_rate(self, record: dict, args, step: int) -> None:
        """Completion tokens per second of wall clock since the previous log: a colocated run trains every token it
        generates, so the generated and trained rates are one figure, comparable with the async trainer's two."""
        then, _ = self.last_log
        steps, self.last_step = step - self.last_step, step
        length = record.get("completion_length")
        if length is None or steps <= 0 or record["time"] <= then:
            return
        completions = args.per_device_train_batch_size * args.world_size * args.gradient_accumulation_steps * steps
        record["gen_tokens_per_s"] = record["train_tokens_per_s"] = length * completions / (record["time"] - then)

    def _add_token_rate(self, record: dict, num_tokens: float | None) -> None:
        then, tokens_then = self.last_log
        if num_tokens is not None and tokens_then is not None and record["time"] > then:
            record["tokens_per_s"] = (num_tokens - tokens_then) / (record["time"] - then)
        self.last_log = (record["time"], num_tokens)

    def _progress_line(self, record: dict, max_steps: int) -> str:
        reward = record.get("reward")
        reward_text = "n/a" if reward is None else f"{reward:.3f}"
        return f"step {record['step']}/{max_steps}  reward {reward_text}  {record['time'] - self.start:.1f}s"

    def on_step_end(self, args, state, control, model=None, **kwargs):
        if state.is_world_process_zero and state.global_step % self.adapter_every == 0:
            self.publish_version(model, state.global_step)

    def publish_version(self, model, step: int, last: bool = False) -> None:
        self.version += 1
        self.published_step = step
        name = adapter_name(self.version)
        dest = os.path.join(self.run_dir, ADAPTERS_DIR, name)
        meta = publish_adapter(model, dest, {"version": self.version, "step": step})
        write_event(self.run_dir, TRAINER_WRITER, ADAPTER_PUBLISHED, name=name, **meta)
        print(f"published adapter {name} at step {step}", flush=True)
        if self.evaluation is not None and self.evaluation.due(step, last or step >= self.max_steps):
            from .evaluate import progress_line  # noqa: PLC0415 only runs with a held-out set

            try:
                print(progress_line(self.evaluation.evaluate(self.version, step, dest)), flush=True)
            except Exception as error:   # a held-out score must never stop training (a monitor reward may fail)
                print(f"held-out {name} (step {step}) not evaluated: {type(error).__name__}: {error}", flush=True)

    def on_train_end(self, args, state, control, model=None, **kwargs):
        if not state.is_world_process_zero:
            return
        self.flush()
        if self.published_step != state.global_step:  # so final/ is always also the newest version
            self.publish_version(model, state.global_step, last=True)
        dest = os.path.join(self.run_dir, FINAL_DIR)
        meta = publish_adapter(model, dest, {"version": self.version, "step": state.global_step})
        write_event(self.run_dir, TRAINER_WRITER, FINISHED, final=FINAL_DIR, **meta)
