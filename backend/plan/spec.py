"""RunSpec: one validated, serialisable description of a GRPO + LoRA run.

Validation happens here, once: `RunSpec.validate()` returns every problem as a `FieldError` naming the
field and what would be valid; `check()` raises `SpecError` carrying all of them. Nothing is launched
from a spec that does not validate.
"""

import dataclasses
import hashlib
import json
import math
import os
import re
import secrets as _secrets
import time
from dataclasses import dataclass, field

from backend.plan.engines import EXECUTORS, billed, engine, reaches_hub
from backend.plan.engines.base import Engine
from backend.plan.servers import MAX_SERVERS_PER_GPU, unsized_problem
from backend.plan.spec_fields import (
    COLOCATED,
    DISTRIBUTED,
    GRPO,
    HELD_OUT_EVALUATION,
    HELD_OUT_SET,
    LORA,
    STORAGE,
    TASK,
    FieldError,
    SpecError,
    declared_problems,
)
from backend.plan.task_spec import BUILTIN_DATASETS, EVAL_SOURCES, HUB_ID, REWARD_CHOICES, task_errors
from backend.runtime import layout
from backend.runtime.best_rule import parse_best_by
from backend.runtime.redact import looks_like_token, redact_tokens
from backend.runtime.tiny_model import BENCHMARK_MODELS, BUILTIN_MODELS, TINY_MODEL
from backend.runtime.user_code import reward_function_names

MODES = ("colocated", "distributed")
NETWORKS = ("private", "exposed")   # a distributed HF Jobs run: a network group, or exposed ports with a token
MAX_ATTEMPTS = 5
RESOURCE_GROUP_ID = re.compile(r"[0-9a-f]{24}")
MODEL_HELP = (f"a local folder, a Hub model id, {TINY_MODEL} (the demo, built on the spot), or "
              f"{' / '.join(BENCHMARK_MODELS)}: random weights shaped like Qwen2.5, built on the spot, for "
              "benchmarking throughput and memory (their rewards mean nothing)")
# Modules whose adapters vLLM cannot serve as a LoRA: TRL falls back to syncing merged weights (DoRA and
# modules_to_save would too; the form offers neither).
WHOLE_MODEL_TARGETS = frozenset({"lm_head", "embed_tokens", "wte", "embed_out", "word_embeddings"})
LORA_TARGET_CHOICES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
MAX_TIMEOUT_MIN = 7 * 24 * 60
DEFAULT_MOUNT = "/bucket"
# A bucket mounted over one of these would hide what the job needs to run (and /vllm-workspace is the pinned
# image's working directory).
SYSTEM_FOLDERS = frozenset({"/", "/tmp", "/usr", "/bin", "/sbin", "/lib", "/lib64", "/etc", "/proc", "/dev", "/sys",
                            "/root", "/home", "/var", "/opt", "/boot", "/run", "/vllm-workspace"})

_REPO_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,95}$")


def form_fields(section: str) -> list[dataclasses.Field]:
    """The RunSpec fields the launch form shows in `section`, in declaration order."""
    return [f for f in dataclasses.fields(RunSpec) if f.metadata.get("section") == section]


@dataclass
class RunSpec:
    name: str = field(default="tiny-demo", metadata={
        "label": "Run name", "help": "what the runs list calls the run: 1-64 letters, digits, '-', '_' or '.'"})
    mode: str = field(default="colocated", metadata={
        "help": "colocated (one job) or distributed (trainer + vLLM replicas)", "choices": MODES})
    executor: str = field(default="local", metadata={
        "help": "local processes, or Hugging Face Jobs", "choices": EXECUTORS})
    model: str = field(default=TINY_MODEL, metadata={"label": "Model", "help": MODEL_HELP, "task_check": True})
    # The task: data, prompt, rewards (the form's "Your task" section, panel/task_form.py)
    dataset: str = field(default="builtin:count-to-ten", metadata={
        "label": "Dataset", "section": TASK, "suggestions": BUILTIN_DATASETS,
        "help": "a builtin prompt set, a Hub dataset id (HF Jobs), or a local .jsonl / .parquet file (HF Jobs runs "
                "get a copy in the bucket)"})
    dataset_config: str = field(default="", metadata={
        "label": "Config (Hub)", "section": TASK, "help": "the Hub dataset's config (subset); empty: its first"})
    dataset_split: str = field(default="train", metadata={
        "label": "Split (Hub)", "section": TASK, "help": "the Hub dataset's split to train on"})
    prompt_column: str = field(default="prompt", metadata={
        "label": "Prompt column", "section": TASK,
        "help": "the column holding the prompt: plain text, or a list of {role, content} messages"})
    reward_columns: list[str] = field(default_factory=list, metadata={
        "label": "Columns for the rewards", "section": TASK,
        "help": "columns passed to the reward functions: 'solution' (same name) or 'solution=answer' (keyword=column)"})
    system_prompt: str = field(default="", metadata={
        "label": "System prompt (optional)", "section": TASK,
        "help": "a system message put first in every prompt (replacing the dataset's own); empty: none"})
    max_prompt_tokens: int = field(default=512, metadata={
        "label": "Max prompt tokens", "section": TASK, "limits": (0, None),
        "help": "rows whose prompt (after the chat template) is longer are skipped; 0: no limit"})
    rewards: list[str] = field(default_factory=lambda: ["digits"], metadata={
        "label": "Rewards", "section": TASK, "choices": REWARD_CHOICES,
        "help": "builtin toy rewards and TRL's reward library (accuracy rewards need a 'solution' column); each is "
                "plotted as rewards/<name>"})
    reward_weights: dict[str, float] = field(default_factory=dict, metadata={
        "label": "Reward weights", "section": TASK,
        "help": "weight per reward name (default 1), e.g. accuracy_reward=1, think_format_reward=0.2"})
    reward_code: str = field(default="", metadata={
        "label": "Your reward functions (Python)", "section": TASK, "widget": "code",
        "help": "every top-level def name(completions, **kwargs) -> list[float] is a reward, plotted as "
                "rewards/<name>; mapped columns arrive as keyword arguments"})
    overlong_max_tokens: int = field(default=0, metadata={
        "label": "Overlong: limit (tokens)", "section": TASK,
        "help": "soft overlong punishment: the length limit L_max in tokens; 0: max_completion_length"})
    overlong_cache_tokens: int = field(default=0, metadata={
        "label": "Overlong: soft zone (tokens)", "section": TASK,
        "help": "soft overlong punishment: the last tokens before L_max over which the penalty grows to -1"})
    repetition_ngram_size: int = field(default=3, metadata={
        "label": "Repetition: n-gram size", "section": TASK, "help": "repetition penalty: n-gram size in tokens"})
    repetition_max_penalty: float = field(default=-1.0, metadata={
        "label": "Repetition: max penalty", "section": TASK,
        "help": "repetition penalty: the score of a fully repetitive completion (<= 0)"})
    # Held-out evaluation (the task section's "Held-out evaluation"; runtime/trainer/evaluate.py)
    eval_source: str = field(default="none", metadata={
        "label": "Held-out set", "section": TASK, "group": HELD_OUT_SET, "choices": EVAL_SOURCES,
        "help": "prompts never trained on, scored at each adapter version: 'split' (a split of the dataset: a Hub "
                "dataset's, or a builtin set's 'test'), 'file' (a .jsonl / .parquet file), 'rows' (the dataset's "
                "first rows, kept out of training); none: no held-out evaluation"})
    eval_split: str = field(default="test", metadata={
        "label": "Held-out split", "section": TASK, "group": HELD_OUT_SET,
        "help": "with 'split': the split to evaluate on, other than the training split (a builtin set's is 'test')"})
    eval_file: str = field(default="", metadata={
        "label": "Held-out file", "section": TASK, "group": HELD_OUT_SET,
        "help": "with 'file': a local .jsonl / .parquet file with the training data's columns (the run keeps a copy)"})
    eval_rows: int = field(default=16, metadata={
        "label": "Held-out rows", "section": TASK, "group": HELD_OUT_SET, "limits": (1, 100_000),
        "help": "with 'rows': this many of the dataset's first rows are held out; training uses the rest"})
    eval_max_prompts: int = field(default=64, metadata={
        "label": "Held-out prompts per evaluation", "section": TASK, "group": HELD_OUT_EVALUATION,
        "limits": (1, 10_000),
        "help": "at most this many held-out prompts are scored per adapter version (the first ones, the same each "
                "time)"})
    monitor_rewards: list[str] = field(default_factory=list, metadata={
        "label": "Monitor-only rewards", "section": TASK, "group": HELD_OUT_SET, "choices": REWARD_CHOICES,
        "help": "rewards scored on the held-out set with weight 0, never trained on: e.g. accuracy_reward while "
                "training on a format reward (a run's reward weighted 0 is monitor-only too)"})
    best_by: dict[str, float] = field(default_factory=dict, metadata={
        "label": "Best version by", "section": TASK, "group": HELD_OUT_SET,
        "help": "which held-out score decides the best version: a held-out reward (trained or monitor-only), e.g. "
                "right_answer, or a weighting, e.g. right_answer=1, varied=0.5; empty: the trained rewards' "
                "weighted score. Ties go to the earliest version; the best must beat the base model (version 0). "
                "Changeable on the run later"})
    eval_every: int = field(default=0, metadata={
        "label": "Evaluate every K steps", "section": TASK, "group": HELD_OUT_EVALUATION, "limits": (0, None),
        "help": "0: every published adapter version; K: the first version published K or more steps after the "
                "last one evaluated (the last version is always evaluated)"})
    eval_greedy: bool = field(default=True, metadata={
        "label": "Greedy held-out answers", "section": TASK, "group": HELD_OUT_EVALUATION,
        "help": "greedy decoding (one answer per prompt); off: sampled at the training temperature"})
    eval_samples_per_prompt: int = field(default=1, metadata={
        "label": "Held-out samples per prompt", "section": TASK, "group": HELD_OUT_EVALUATION, "limits": (1, 64),
        "help": "sampled answers per held-out prompt (greedy decoding gives one)"})
    eval_max_inflight: int = field(default=4, metadata={
        "label": "Held-out requests in flight", "section": TASK, "group": HELD_OUT_EVALUATION, "limits": (1, 1024),
        "help": "distributed runs: held-out requests sent to the replicas at once, so rollouts are not starved"})
    # LoRA
    lora_r: int = field(default=8, metadata={
        "label": "Rank r", "section": LORA, "limits": (1, 512),
        "help": "adapter rank; vLLM serves 8, 16, 32, 64, 128, 256, 320 or 512"})
    lora_alpha: int = field(default=16, metadata={
        "label": "Alpha", "section": LORA, "limits": (1, None), "help": "scaling, typically 2x the rank"})
    lora_dropout: float = field(default=0.0, metadata={
        "label": "Dropout", "section": LORA, "help": "dropout on the adapter's input, in [0, 1)"})
    lora_target_modules: list[str] = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"], metadata={
        "label": "Target modules", "section": LORA, "choices": LORA_TARGET_CHOICES,
        "help": "the linear layers that get an adapter"})
    # GRPO
    learning_rate: float = field(default=5e-3, metadata={
        "label": "Learning rate", "section": GRPO, "help": "AdamW's step size, > 0 and < 1 (1e-5 .. 5e-3 for LoRA)"})
    gradient_accumulation_steps: int = field(default=1, metadata={
        "label": "Gradient accumulation", "section": GRPO, "limits": (1, None),
        "help": "micro-batches per optimizer step (a colocated run also generates for all of them at once)"})
    adam_beta2: float = field(default=0.999, metadata={
        "label": "Adam beta2", "section": GRPO, "help": "AdamW's second-moment decay (transformers' default 0.999)"})
    max_steps: int = field(default=200, metadata={
        "label": "Steps", "section": GRPO, "limits": (1, 1_000_000), "help": "optimizer steps the run trains for"})
    per_device_batch_size: int = field(default=8, metadata={
        "label": "Batch size / device", "section": GRPO, "limits": (1, None),
        "help": "completions per training process per micro-batch; with the processes, a multiple of the "
                "generations per prompt"})
    num_generations: int = field(default=8, metadata={
        "label": "Generations / prompt", "section": GRPO, "limits": (2, None),
        "help": "completions per prompt, compared in a group"})
    max_completion_length: int = field(default=16, metadata={
        "label": "Max completion tokens", "section": GRPO, "limits": (1, 32768),
        "help": "a completion stops at this many tokens"})
    temperature: float = field(default=1.0, metadata={
        "label": "Temperature", "section": GRPO, "help": "sampling temperature of the generations, > 0 and <= 2"})
    beta: float = field(default=0.0, metadata={"label": "KL beta", "section": GRPO, "help": "0: no reference model"})
    seed: int = field(default=0, metadata={
        "label": "Seed", "section": GRPO, "help": "the trainer's random seed (and a builtin model's weights)"})
    adapter_every: int = field(default=20, metadata={
        "label": "Publish adapter every K steps", "section": GRPO, "limits": (1, None),
        "help": "publish an adapter version every K steps"})
    checkpoint_every: int = field(default=50, metadata={
        "label": "Checkpoint every K steps", "section": GRPO, "limits": (1, None),
        "help": "save a checkpoint into the bucket every K steps, for resume"})
    logging_steps: int = field(default=1, metadata={
        "label": "Log every K steps", "section": GRPO, "limits": (1, None),
        "help": "write a metrics record every K steps"})
    # Generation engine
    use_vllm: bool = field(default=False, metadata={
        "label": "Generate with colocated vLLM", "section": COLOCATED,
        "help": "needs a GPU; on CPU the trainer generates with transformers"})
    vllm_gpu_memory_utilization: float = field(default=0.3, metadata={
        "label": "vLLM GPU memory share", "section": COLOCATED,
        "help": "vLLM's weights and KV cache; the rest of the GPU is the trainer's"})
    vllm_enable_sleep_mode: bool = field(default=True, metadata={
        "label": "Sleep between generations", "section": COLOCATED,
        "help": "level 2: weights and KV cache freed; TRL re-syncs the weights after every step anyway"})
    vllm_tensor_parallel_size: int = field(default=1, metadata={
        "label": "Tensor parallel", "section": COLOCATED, "choices": (1, 2, 4, 8),
        "help": "GPUs one colocated vLLM engine spans; it must divide the data-parallel processes"})
    num_processes: int = field(default=1, metadata={
        "label": "Data-parallel processes", "section": COLOCATED, "limits": (1, 64),
        "help": "training processes (accelerate)"})
    # Distributed
    replicas: int = field(default=2, metadata={
        "label": "vLLM replicas", "section": DISTRIBUTED, "limits": (1, 16),
        "help": "vLLM server jobs generating for the trainer, behind its proxy"})
    max_staleness: int = field(default=1, metadata={
        "label": "Max staleness", "section": DISTRIBUTED, "limits": (1, 16),
        "help": "vLLM keeps max_staleness + 2 adapters; at least 1: TRL's async trainer unloads the previous "
                "version before its rollout worker moves to the new one, so with 0 a rollout in flight asks for an "
                "unloaded adapter and the run fails"})
    vllm_flavor: str = field(default="l4x1", metadata={
        "label": "Replica flavor", "section": DISTRIBUTED, "widget": "flavor",
        "help": "HF Jobs hardware of each replica"})
    max_tokens_per_batch: int = field(default=4096, metadata={
        "label": "Token budget / batch", "section": DISTRIBUTED,
        "help": "tokens per training micro-batch (TRL's token_budget); 0: per_device_batch_size samples per step"})
    max_inflight_tasks: int = field(default=8, metadata={
        "label": "Max in-flight tasks", "section": DISTRIBUTED, "limits": (1, None),
        "help": "generation requests the trainer keeps open at once (TRL's max_inflight_tasks)"})
    queue_maxsize: int = field(default=64, metadata={
        "label": "Rollout queue size", "section": DISTRIBUTED, "limits": (1, None),
        "help": "finished rollouts waiting for the trainer (TRL's queue_maxsize); generation pauses when full"})
    gradient_checkpointing: bool = field(default=False, metadata={
        "label": "Gradient checkpointing", "section": DISTRIBUTED,
        "help": "recompute activations in the backward pass: less trainer memory, more time per step"})
    replica_max_model_len: int = field(default=0, metadata={
        "label": "Replica context (tokens)", "section": DISTRIBUTED, "limits": (0, None),
        "help": "each replica's --max-model-len: prompt + completion; 0: the model's own"})
    replica_gpu_memory_utilization: float = field(default=0.9, metadata={
        "label": "Replica GPU memory share", "section": DISTRIBUTED,
        "help": "each HF Jobs replica's --gpu-memory-utilization (vLLM's default 0.9); local replicas share one "
                "machine and size their own"})
    servers_per_gpu: int = field(default=1, metadata={
        "label": "vLLM servers per GPU", "section": DISTRIBUTED, "limits": (1, MAX_SERVERS_PER_GPU),
        "help": "vLLM servers each replica job runs on each of its GPUs (a CPU replica: in all), each with 1/K of the "
                "replica's GPU memory and a port of its own, each a replica to the proxy: one server's API process "
                "keeps an H200 busy only part of the time, 4 filled it (docs/replica-scaling.md); where the "
                "replicas share the trainer's GPU (a local run on one GPU) keep 1: more trained no faster there "
                "(section 6)"})
    # Hardware and storage
    flavor: str = field(default="cpu-basic", metadata={
        "label": "Trainer flavor", "section": STORAGE, "widget": "flavor", "help": "HF Jobs hardware, price per hour"})
    timeout_minutes: int = field(default=30, metadata={
        "label": "Timeout (minutes)", "section": STORAGE, "limits": (1, MAX_TIMEOUT_MIN),
        "help": "every job's timeout: it is stopped once it runs this long, at most 7 days"})
    budget_usd: float = field(default=0.0, metadata={
        "label": "Budget cap (USD)", "section": STORAGE,
        "help": "HF Jobs: all jobs cancelled once spend or its projection reaches it; 0: none"})
    bucket: str = field(default="local/grpo-runs", metadata={
        "label": "Bucket (namespace/name)", "section": STORAGE,
        "help": "HF Jobs: your namespace's bucket, created (private) on first launch"})
    mount_path: str = field(default=DEFAULT_MOUNT, metadata={
        "label": "Mount path in every job", "section": STORAGE,
        "help": "where every job sees the bucket: an absolute folder of its own, such as /bucket"})
    # Platform: where a distributed run's jobs reach each other, retries, the org's resource group (HF Jobs)
    network: str = field(default="private", metadata={
        "label": "Replica network", "section": DISTRIBUTED, "choices": NETWORKS,
        "help": "HF Jobs: private puts the trainer and replicas in one network group named after the run (no replica "
                "port exposed, no token on rollout requests); exposed reaches each replica's port through the public "
                "Jobs proxy with your token (the published recipe)"})
    attempts: int = field(default=1, metadata={
        "label": "Attempts per job", "section": STORAGE, "limits": (1, MAX_ATTEMPTS),
        "help": "a job that fails is started again up to this many times in all (1: no retry); a retried trainer "
                "resumes from the newest checkpoint, a retried replica rejoins; each attempt is billed"})
    resource_group_id: str = field(default="", metadata={
        "label": "Resource group id (HF Jobs, org)", "section": STORAGE,
        "help": "create the jobs in this resource group of the bucket's organisation, so its access rules and "
                "spending limits apply (the id from the org's settings, 24 hex digits); empty: none"})
    # trackio: the run in the visitor's own tracker too (the trainer's report_to="trackio"; runtime/trainer/common.py)
    trackio: bool = field(default=False, metadata={
        "label": "Also log to trackio", "section": STORAGE,
        "help": "the trainer also reports its metrics to trackio under the run's name; the panel's charts stay"})
    trackio_project: str = field(default="grpo-panel", metadata={
        "label": "trackio project", "section": STORAGE, "help": "the trackio project the run appears in"})
    trackio_space: str = field(default="", metadata={
        "label": "trackio Space (optional)", "section": STORAGE,
        "help": "a Space (you/name) trackio logs to, created if need be (HF Jobs); empty: the run's own folder "
                "runs/<id>/trackio/ in the bucket"})
    image: str = field(default="vllm/vllm-openai:v0.31.0", metadata={
        "help": "container image of HF Jobs runs; pinned with TRL 1.16, which supports vLLM 0.22-0.31"})
    run_id: str = field(default="", metadata={"help": "the run's id, <UTC time>-<6 hex>; empty: made on creation"})
    # A sweep (backend/plan/sweep.py): its members are ordinary runs tied by the sweep's id, each with a tag that is
    # part of its adapter versions' names, so members sharing one replica fleet never serve each other's adapter.
    sweep_id: str = field(default="", metadata={"help": "the sweep this run is a member of; empty: a lone run"})
    sweep_member: str = field(default="", metadata={
        "help": "this member's tag in its sweep (1-12 lowercase letters or digits), in its versions' names "
                "(trl-policy-<tag>-v<N>); empty: a lone run (trl-policy-v<N>)"})
    fleet: str = field(default="", metadata={
        "help": "the replica fleet a sweep member's trainer uses, shared with the other members (the sweep's id: "
                "its jobs and its folder runs/<fleet>/ hold the replicas and a builtin base model); empty: the "
                "run's own replicas"})
    created_at: float = field(default=0.0, metadata={
        "help": "when the spec was created (Unix seconds); the charts' wall-time axis starts here"})

    def __post_init__(self):
        if not self.run_id:
            stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
            self.run_id = f"{stamp}-{_secrets.token_hex(3)}"
        if not self.created_at:
            self.created_at = time.time()

    # ---- serialisation
    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    @classmethod
    def from_dict(cls, data: dict) -> "RunSpec":
        """Build a spec from a form or spec.json. Unknown keys are refused; values are coerced by type."""
        known = {f.name: f for f in dataclasses.fields(cls)}
        errors = [FieldError(k, "is not a RunSpec field") for k in data if k not in known]
        kwargs = {}
        for key, value in data.items():
            if key not in known:
                continue
            try:
                kwargs[key] = _coerce(value, known[key].type)
            except (TypeError, ValueError):
                errors.append(FieldError(key, _what_to_write(known[key].type, value)))
        if errors:
            raise SpecError(errors)
        return cls(**kwargs)

    def fingerprint(self) -> str:
        """A short hash of every setting that decides what runs and what it costs (not the run id or its
        creation time): a reviewed preview is bound to it, so a changed form needs a new review."""
        settings = {k: v for k, v in self.to_dict().items() if k not in ("run_id", "created_at")}
        return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:10]

    @property
    def bucket_namespace(self) -> str:
        return self.bucket.split("/", 1)[0]

    @property
    def run_path(self) -> str:
        """The run's folder as every job sees it, inside the bucket mount."""
        return f"{self.mount_path.rstrip('/')}/runs/{self.run_id}"

    # ---- validation
    def validate(self) -> list[FieldError]:
        errs: list[FieldError] = []

        def need(ok: bool, name: str, message: str):
            if not ok:
                errs.append(FieldError(name, message))

        need(bool(re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}", self.name or "")), "name",
             "use 1-64 letters, digits, '-', '_' or '.', starting with a letter or digit")
        errs += declared_problems(self, self.mode)
        errs += _check_model(self.model, self.executor)
        errs += task_errors(self)
        need(0 <= self.lora_dropout < 1, "lora_dropout", "must be in [0, 1)")
        bad_targets = [t for t in self.lora_target_modules if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.]*", t)]
        need(bool(self.lora_target_modules) and not bad_targets, "lora_target_modules",
             f"name one or more module names, e.g. {', '.join(LORA_TARGET_CHOICES[:4])}")
        need(0 < self.learning_rate < 1, "learning_rate", "must be > 0 and < 1, e.g. 1e-5 .. 5e-3 for LoRA")
        if self.per_device_batch_size > 0 and self.num_generations >= 2 and self.mode == "colocated":
            need((self.per_device_batch_size * self.num_processes) % self.num_generations == 0, "per_device_batch_size",
                 f"batch size x processes ({self.per_device_batch_size}x{self.num_processes}) must be a multiple "
                 f"of num_generations ({self.num_generations})")
        need(0 < self.temperature <= 2, "temperature", "must be > 0 and <= 2")
        need(self.beta >= 0, "beta", "KL coefficient must be >= 0 (0 disables the reference model)")
        need(0 < self.adam_beta2 < 1, "adam_beta2", "must be between 0 and 1, e.g. 0.95 or 0.999")
        need(0 < self.replica_gpu_memory_utilization <= 1, "replica_gpu_memory_utilization",
             "must be a share of the GPU above 0 and at most 1, e.g. 0.85")
        need(0 < self.vllm_gpu_memory_utilization < 1, "vllm_gpu_memory_utilization",
             "must be strictly between 0 and 1, e.g. 0.3 leaves 70% of the GPU for training")
        if self.mode == "colocated" and self.use_vllm and self.vllm_tensor_parallel_size in (2, 4, 8):
            # TRL builds one vLLM engine per group of `tensor_parallel_size` training processes and refuses the rest.
            need(self.num_processes % self.vllm_tensor_parallel_size == 0, "vllm_tensor_parallel_size",
                 f"tensor parallel size {self.vllm_tensor_parallel_size} must divide the training processes "
                 f"(num_processes={self.num_processes}): one process per GPU, e.g. num_processes="
                 f"{self.vllm_tensor_parallel_size} for TP {self.vllm_tensor_parallel_size}")
        need(self.mode == "distributed" or self.servers_per_gpu == 1, "servers_per_gpu",
             "a colocated run has no replica jobs (vLLM runs inside the trainer): leave it 1, or choose the "
             "distributed mode")
        unsized = unsized_problem(self)
        need(unsized is None, "servers_per_gpu", unsized or "")
        errs += _sweep_problems(self)
        if self.mode == "distributed":
            whole = sorted(set(self.lora_target_modules) & WHOLE_MODEL_TARGETS)
            need(not whole, "lora_target_modules",
                 f"a distributed run syncs only the adapter through the bucket, and an adapter on {', '.join(whole)} "
                 "makes TRL merge and ship the whole model at every sync: target linear layers such as "
                 f"{', '.join(LORA_TARGET_CHOICES[:4])}")
            need(self.max_tokens_per_batch == 0 or self.max_tokens_per_batch >= self.max_completion_length,
                 "max_tokens_per_batch", "the token budget must hold at least one completion (>= "
                 "max_completion_length), or be 0 for a fixed per_device_batch_size samples per step")
        need(math.isfinite(self.budget_usd) and self.budget_usd >= 0, "budget_usd",
             "must be 0 (no cap) or a positive amount in USD, e.g. 5")
        need(billed(self.executor) or not self.budget_usd > 0, "budget_usd",
             "local runs cost nothing: leave it 0, or run on hf_jobs")
        need(not self.resource_group_id or bool(RESOURCE_GROUP_ID.fullmatch(self.resource_group_id)),
             "resource_group_id", "a resource group id is 24 hex digits (the org's settings, Resource groups), e.g. "
             "66980ecfc1e12a49c8f0e42d; empty: none")
        need(billed(self.executor) or not self.resource_group_id, "resource_group_id",
             "resource groups are for runs on Hugging Face Jobs: leave it empty for local runs")
        errs += _check_bucket(self.bucket, self.executor)
        errs += _check_trackio(self)
        mount = os.path.normpath(self.mount_path or "")
        need(mount not in SYSTEM_FOLDERS and not mount.startswith(("/proc/", "/dev/", "/sys/")), "mount_path",
             f"{self.mount_path!r} would hide a system folder inside every job; use a folder of its own such as "
             f"{DEFAULT_MOUNT}")
        need(self.mount_path.startswith("/") and self.mount_path != "/" and " " not in self.mount_path, "mount_path",
             "must be an absolute folder path such as /bucket")
        need(bool(re.fullmatch(r"[a-z0-9][a-z0-9-]*", self.flavor or "")), "flavor",
             "pick a hardware flavor such as cpu-basic or a10g-small")
        need(bool(re.fullmatch(r"\d{8}-\d{6}-[0-9a-f]{6}|[A-Za-z0-9][A-Za-z0-9_.-]{0,63}", self.run_id)), "run_id",
             "letters, digits, '-', '_', '.' only")
        # A message may quote the value it refuses: never quote a token back.
        return [FieldError(e.field, redact_tokens(e.message)) for e in _without_tokens(self) + errs]

    @property
    def engine(self) -> Engine:
        """What the run's executor answers before anything runs (KeyError for an executor this panel lacks)."""
        return engine(self.executor)

    @property
    def reward_names(self) -> list[str]:
        """Every reward of the run, as it is plotted: the chosen ones, then the reward code's functions."""
        return [*self.rewards, *reward_function_names(self.reward_code)]

    def check(self) -> "RunSpec":
        errors = self.validate()
        if errors:
            raise SpecError(errors)
        return self


def _named(keep) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(RunSpec) if keep(f.metadata))


# Groups of fields, read from their declarations (`spec_fields` describes the metadata), in declaration order.
TASK_FIELDS = _named(lambda meta: meta.get("section") == TASK or meta.get("task_check"))   # what a task check reads
HELD_OUT_SETTINGS = _named(lambda meta: meta.get("group") == HELD_OUT_EVALUATION)         # how it is evaluated
HELD_OUT_FIELDS = frozenset(_named(lambda meta: meta.get("group") in (HELD_OUT_SET, HELD_OUT_EVALUATION)))


def _without_tokens(spec: RunSpec) -> list[FieldError]:
    """A token typed into a field would be stored in spec.json, shown in previews and job names: refuse it."""
    errs = []
    for f in dataclasses.fields(spec):
        if any(looks_like_token(t) for t in _texts(getattr(spec, f.name))):
            errs.append(FieldError(f.name, "this looks like a Hugging Face token; never type a token into the form. "
                                           "Sign in (on a Space) or set HF_TOKEN: the panel passes it to jobs as a "
                                           "secret only"))
    return errs


def _texts(value) -> list[str]:
    """Every string in a field's value: a list's items, a dict's keys and values (reward weights by name)."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [t for k, v in value.items() for t in (*_texts(k), *_texts(v))]
    if isinstance(value, (list, tuple)):
        return [t for item in value for t in _texts(item)]
    return []


def _sweep_problems(spec: "RunSpec") -> list[FieldError]:
    """A sweep member's tie to its sweep: both or neither, a tag that can be part of an adapter's name, and the
    distributed mode (only replicas are shared by several runs)."""
    if not spec.sweep_id and not spec.sweep_member:
        return [FieldError("fleet", "only a sweep's members share a replica fleet")] if spec.fleet else []
    if not spec.sweep_member or not layout.MEMBER_RE.match(spec.sweep_member):
        return [FieldError("sweep_member", "a sweep member's tag is 1-12 lowercase letters or digits, e.g. m0")]
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}", spec.sweep_id):
        return [FieldError("sweep_id", "a sweep member names its sweep: 1-64 letters, digits, '-', '_' or '.'")]
    if spec.mode != "distributed":
        return [FieldError("mode", "a sweep's members share one replica fleet: choose the distributed mode")]
    if spec.fleet and spec.fleet != spec.sweep_id:
        return [FieldError("fleet", "a sweep member shares its sweep's fleet, named by the sweep's id")]
    return []


def _check_model(model: str, executor: str) -> list[FieldError]:
    if model in BUILTIN_MODELS:
        return []
    if model.startswith("builtin:"):
        return [FieldError("model", f"no builtin model {model!r}; the builtin models are {', '.join(BUILTIN_MODELS)}")]
    path = os.path.expanduser(model or "")
    if HUB_ID.match(model or "") and not os.path.exists(path):
        if not reaches_hub(executor):
            return [FieldError("model", "local runs cannot download from the Hub; use a local folder or "
                                        f"{TINY_MODEL}, or run on Hugging Face Jobs")]
        return []
    if not os.path.isdir(path):
        return [FieldError("model", f"no model folder at {model!r}; give an existing folder with config.json, "
                                    f"a Hub id like 'Qwen/Qwen2.5-0.5B-Instruct', or {TINY_MODEL}")]
    if not os.path.isfile(os.path.join(path, "config.json")):
        return [FieldError("model", f"{model!r} has no config.json; is it a transformers model folder?")]
    return []


def _check_trackio(spec: RunSpec) -> list[FieldError]:
    if not spec.trackio:
        return []
    errs = []
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,95}", spec.trackio_project or ""):
        errs.append(FieldError("trackio_project", "use 1-96 letters, digits, '-', '_' or '.', starting with a "
                                                  "letter or digit, e.g. grpo-panel"))
    if spec.trackio_space and not HUB_ID.match(spec.trackio_space):
        errs.append(FieldError("trackio_space", "write the Space as 'namespace/name', e.g. 'my-user/trackio', or "
                                                "leave it empty to log into the run's own folder"))
    elif spec.trackio_space and not reaches_hub(spec.executor):
        errs.append(FieldError("trackio_space", "local runs do not reach the Hub: leave it empty (the run logs to "
                                                "trackio in its own folder), or run on Hugging Face Jobs"))
    return errs


def bucket_name_problem(name: str) -> str | None:
    """Why Hugging Face would refuse this bucket name part, or None if it is acceptable."""
    if not _REPO_NAME.match(name):
        return "use 1-96 letters, digits, '-', '_' or '.', starting with a letter or digit"
    if "--" in name or ".." in name:
        return "must not contain '--' or '..'"
    if name.endswith((".git", ".", "-")):
        return "must not end with '.git', '.' or '-'"
    return None


def _check_bucket(bucket: str, executor: str) -> list[FieldError]:
    parts = (bucket or "").split("/")
    if len(parts) != 2:
        return [FieldError("bucket", "write the bucket as 'namespace/name', e.g. 'my-user/grpo-runs'")]
    for part, what in zip(parts, ("namespace", "name")):
        problem = bucket_name_problem(part)
        if problem:
            return [FieldError("bucket", f"bucket {what} {part!r}: {problem}")]
    return []


def _what_to_write(tp, value) -> str:
    """What a field of type `tp` takes, for a value that is not one, with what was there."""
    got = "the field is empty" if value is None or value == "" else f"got {redact_tokens(repr(value))}"
    kind = str(getattr(tp, "__name__", tp))
    if kind.startswith("dict"):
        return (f"write name=weight pairs separated by commas, e.g. accuracy_reward=1, think_format_reward=0.2 "
                f"({got})")
    if kind.startswith("list"):
        return f"write names separated by commas, e.g. q_proj, v_proj ({got})"
    what = {"int": "enter a whole number", "float": "enter a number, e.g. 4e-05", "bool": "true or false",
            "str": "enter text"}
    return f"{what.get(kind, 'invalid')} ({got})"


def _coerce(value, tp):
    if tp in ("bool", bool):
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false", "1", "0", "yes", "no"):
            return value.lower() in ("true", "1", "yes")
        raise ValueError(value)
    if tp in ("int", int):
        if isinstance(value, bool):
            raise TypeError(value)
        if isinstance(value, float) and not value.is_integer():
            raise ValueError(value)
        return int(value)
    if tp in ("float", float):
        if isinstance(value, bool):
            raise TypeError(value)
        return float(value)
    if tp in ("str", str):
        if not isinstance(value, str):
            raise TypeError(value)
        return value.strip()
    if str(tp).startswith("dict"):
        return _weights(value)
    if str(tp).startswith("list"):
        if isinstance(value, str):
            value = [v.strip() for v in value.split(",") if v.strip()]
        if not isinstance(value, (list, tuple)):
            raise TypeError(value)
        return [str(v) for v in value]
    return value


def _weights(value) -> dict[str, float]:
    """Reward weights or best_by from a form ("accuracy_reward=1, varied=0.2") or spec.json (a mapping)."""
    if isinstance(value, str):
        return parse_best_by(value)     # "name=w, ..."; a bare name weighs 1
    if not isinstance(value, dict):
        raise TypeError(value)
    return {str(k): float(v) for k, v in value.items()}
