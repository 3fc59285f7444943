"""What the policy writes: a few of each step's completions with their prompt, rewards and advantage, written by
the trainer beside its metrics (`samples/trainer-NNNNNN.jsonl`, write-once fragments), where reward hacking and
degenerate output are seen. Like metrics, they are written one fragment per flush (every couple of seconds and at
the end), not one per step, so the folder holds as few files as `metrics/` however long the run. (Runs written
before held one fragment per step: the reader reads either, a fragment is a fragment.)

Bounded: at most SAMPLES_PER_STEP a logging step (the colocated trainer) or a policy version (the async one),
texts cut to MAX_TEXT characters, and masked like every event.
"""

import os
import threading
import time

from ..layout import SAMPLES_DIR, TRAINER_WRITER, FragmentWriter
from ..redact import redact_record

SAMPLES_PER_STEP = 4
MAX_TEXT = 2000


def text_of(value) -> str:
    """A prompt or completion as text: a string, or a conversation's messages one per line."""
    if isinstance(value, str):
        return value
    lines = []
    for message in value or []:
        content = message.get("content") if isinstance(message, dict) else message
        if isinstance(content, list):
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
        role = message.get("role") if isinstance(message, dict) else None
        lines.append(f"[{role}] {content}" if role else str(content))
    return "\n".join(lines)


def sample_record(step: int, version: int | None, prompt, completion, rewards: dict, advantage: float | None,
                  length: int | None, truncated: bool | None) -> dict:
    return redact_record({
        "time": time.time(), "step": step, "policy_version": version,
        "prompt": text_of(prompt)[-MAX_TEXT:], "completion": text_of(completion)[:MAX_TEXT],
        "rewards": {k: float(v) for k, v in rewards.items() if isinstance(v, (int, float))},
        "advantage": None if advantage is None else float(advantage), "length": length, "truncated": truncated})


class SampleWriter:
    """Keeps each step's samples (at most SAMPLES_PER_STEP) and writes what it holds as one fragment per flush:
    when `flush()` is called (the trainer flushes its metrics) or once `flush_every_s` has passed since the last
    one. Safe from two threads (TRL's async trainer hands samples over from a thread of its own)."""

    def __init__(self, run_dir: str, flush_every_s: float = 2.0):
        self.fragments = FragmentWriter(os.path.join(run_dir, SAMPLES_DIR), TRAINER_WRITER)
        self.flush_every_s = flush_every_s
        self.pending: list[dict] = []
        self.last_flush = time.time()
        self._lock = threading.Lock()

    def write(self, records: list[dict]) -> None:
        """One step's samples: kept, and written with the others once a flush is due."""
        with self._lock:
            self.pending += records[:SAMPLES_PER_STEP]
        if time.time() - self.last_flush >= self.flush_every_s:
            self.flush()

    def flush(self) -> None:
        with self._lock:
            pending, self.pending = self.pending, []
            self.last_flush = time.time()
            self.fragments.write(pending)


def colocated_samples(trainer, step: int, max_completion_length: int) -> list[dict]:
    """The newest completions GRPOTrainer kept for logging (its `_logs`: TRL 1.16, pinned by the recipe)."""
    logs = getattr(trainer, "_logs", None)
    if not logs or not logs.get("completion"):
        return []
    prompts, completions = list(logs["prompt"]), list(logs["completion"])
    advantages = list(logs["advantages"])
    rewards = {name: list(values) for name, values in logs["rewards"].items()}
    n = len(completions)
    picks = sorted({0, n - 1, n // 3, (2 * n) // 3})[:SAMPLES_PER_STEP]
    tokenizer = getattr(trainer, "processing_class", None)
    out = []
    for i in picks:
        length = _token_count(tokenizer, text_of(completions[i]))
        out.append(sample_record(
            step, None, prompts[i] if i < len(prompts) else "", completions[i],
            {name: values[i] for name, values in rewards.items() if i < len(values)},
            advantages[i] if i < len(advantages) else None, length,
            None if length is None else length >= max_completion_length))
    return out


def _token_count(tokenizer, text: str) -> int | None:
    try:
        return len(tokenizer(text, add_special_tokens=False)["input_ids"])
    except Exception:   # a processor without a plain text call: the length is only shown, never relied on
        return None


def async_sample(sample, step: int, max_completion_length: int) -> dict:
    """One of TRL's async RolloutSamples (prompt and completion messages, its group's reward metrics)."""
    length = int(sample.completion_mask.sum())
    rewards = {k: v for k, v in sample.metrics.items() if k == "reward" or k.startswith("rewards/")}
    return sample_record(step, int(sample.model_version), sample.prompt, sample.completion, rewards,
                         sample.advantage, length, length >= max_completion_length)


def install_async_samples(writer: SampleWriter, max_completion_length: int, step) -> None:
    """Have TRL's async trainer hand SAMPLES_PER_STEP consumed samples of every policy version to `writer`.

    TRL 1.16 (pinned by the recipe) passes a few consumed samples of every 8th policy version to
    `log_rollout_traces` (for trackio) from a thread of its own: that function is wrapped, and its queue dataset
    asks for samples of every version. `step()` is the trainer's current step."""
    from trl.experimental.async_grpo import async_grpo_trainer as module  # noqa: PLC0415 TRL only in the trainer

    original_log, original_init = module.log_rollout_traces, module.RolloutQueueDataset.__init__

    def log_rollout_traces(samples, step=None, report_to=(), **kwargs):
        try:
            writer.write([async_sample(s, current(), max_completion_length) for s in samples[:SAMPLES_PER_STEP]])
        except Exception as error:   # showing samples must never stop training
            print(f"could not write samples: {type(error).__name__}: {error}", flush=True)
        return original_log(samples, step=step, report_to=report_to, **kwargs)

    def init(dataset, *args, **kwargs):
        original_init(dataset, *args, **kwargs)
        dataset._trace_log_interval, dataset._traces_per_log = 1, SAMPLES_PER_STEP

    current = step
    module.log_rollout_traces = log_rollout_traces
    module.RolloutQueueDataset.__init__ = init
