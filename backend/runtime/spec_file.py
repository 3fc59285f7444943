"""spec.json as the jobs read it: every RunSpec field the runtime reads, with its type, and the one reader of the file.

The panel writes spec.json from `backend.plan.spec.RunSpec`, which the runtime cannot import (it runs in jobs,
without the rest of backend); `SpecFile` is the part of it the trainers, the replicas, the evaluation and the task
check read (the check's request carries the same dict). `tests/test_spec_file.py` ties it to RunSpec: every key is a
RunSpec field of the same type, and every key the runtime's code reads from a spec is declared here, so a field
renamed in RunSpec fails a unit test instead of a job. A run launched before a field existed has no such key in its
spec.json: its readers say what they assume with `spec.get(key, <RunSpec's default>)`, which the same test checks.

Standard library only: it runs in jobs.
"""

import json
import os
from typing import TypedDict

from .layout import FLEET_FILE, SPEC_FILE


class SpecFile(TypedDict):
    # the run
    name: str
    run_id: str
    mode: str
    model: str
    seed: int
    attempts: int
    # the task: data, prompts, rewards
    dataset: str
    dataset_config: str
    dataset_split: str
    prompt_column: str
    reward_columns: list[str]
    system_prompt: str
    max_prompt_tokens: int
    rewards: list[str]
    reward_weights: dict[str, float]
    reward_code: str
    overlong_max_tokens: int
    overlong_cache_tokens: int
    repetition_ngram_size: int
    repetition_max_penalty: float
    # held-out evaluation
    eval_source: str
    eval_split: str
    eval_file: str
    eval_rows: int
    eval_max_prompts: int
    monitor_rewards: list[str]
    best_by: dict[str, float]
    eval_every: int
    eval_greedy: bool
    eval_samples_per_prompt: int
    eval_max_inflight: int
    # LoRA and GRPO
    lora_r: int
    lora_alpha: int
    lora_dropout: float
    lora_target_modules: list[str]
    learning_rate: float
    gradient_accumulation_steps: int
    adam_beta2: float
    max_steps: int
    per_device_batch_size: int
    num_generations: int
    max_completion_length: int
    temperature: float
    beta: float
    adapter_every: int
    checkpoint_every: int
    logging_steps: int
    gradient_checkpointing: bool
    # colocated: vLLM inside the trainer
    use_vllm: bool
    vllm_gpu_memory_utilization: float
    vllm_enable_sleep_mode: bool
    vllm_tensor_parallel_size: int
    # distributed: TRL's async trainer
    replicas: int
    max_staleness: int
    max_tokens_per_batch: int
    max_inflight_tasks: int
    queue_maxsize: int
    # trackio
    trackio: bool
    trackio_project: str
    trackio_space: str
    # a sweep member (layout.spec_member): its tag names its adapter versions
    sweep_id: str
    sweep_member: str
    fleet: str              # its sweep's shared fleet (runs/<fleet>/ holds a builtin base model), "" for its own


def read_spec(run_dir: str) -> SpecFile:
    """The run's spec.json (`OSError` or `ValueError` where it is missing or not JSON)."""
    with open(os.path.join(run_dir, SPEC_FILE)) as f:
        spec = json.load(f)
    if not isinstance(spec, dict):
        raise ValueError(f"{SPEC_FILE} in {run_dir} is not a JSON object")  # noqa: TRY004 read as unreadable JSON
    return spec


def read_fleet(run_dir: str) -> dict:
    """A sweep's shared fleet's fleet.json (its folder has no spec.json): the sweep, its members, its replicas'
    attempts in all, ... (`OSError` or `ValueError` where it is missing or not JSON)."""
    with open(os.path.join(run_dir, FLEET_FILE)) as f:
        record = json.load(f)
    if not isinstance(record, dict):
        raise ValueError(f"{FLEET_FILE} in {run_dir} is not a JSON object")  # noqa: TRY004 read as unreadable JSON
    return record
