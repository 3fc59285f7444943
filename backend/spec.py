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

from backend.executors import EXECUTORS, known_engine
from backend.runtime import rewards as runtime_rewards
from backend.runtime.redact import looks_like_token, redact_tokens
from backend.runtime.tiny_model import BENCHMARK_MODELS, BUILTIN_MODELS, TINY_MODEL
from backend.runtime.user_code import reward_function_names
from backend.vllm_args import VLLM_LORA_RANKS

MODES = ("colocated", "distributed")
MODEL_HELP = (f"a local folder, a Hub model id, {TINY_MODEL} (the demo, built on the spot), or "
              f"{' / '.join(BENCHMARK_MODELS)}: random weights shaped like Qwen2.5, built on the spot, for "
              "benchmarking throughput and memory (their rewards mean nothing)")
BUILTIN_DATASETS = ("builtin:count-to-ten", "builtin:letters")
BUILTIN_REWARDS = tuple(runtime_rewards.BUILTIN_REWARDS)
TRL_REWARDS = tuple(runtime_rewards.TRL_REWARDS)
REWARD_CHOICES = (*BUILTIN_REWARDS, *TRL_REWARDS)
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

HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$")
_REPO_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,95}$")


@dataclass(frozen=True)
class FieldError:
    field: str
    message: str

    def __str__(self) -> str:
        return f"{self.field}: {self.message}"


class SpecError(ValueError):
    """A RunSpec did not validate. `errors` lists every problem; str() reads as one message per line."""

    def __init__(self, errors: list[FieldError]):
        self.errors = errors
        super().__init__("\n".join(str(e) for e in errors))


LORA, GRPO, COLOCATED, DISTRIBUTED, STORAGE = (
    "LoRA", "GRPO training", "vLLM (colocated)", "Distributed (async GRPO)", "Hardware and storage")


def setting(default, label: str, section: str = "", help: str = "", choices=None, widget: str = "",
            limits: tuple[int, int | None] | None = None):
    """A RunSpec field as the launch form shows it (TRL's config style: the help lives with the field). A callable
    `default` makes a fresh value per spec (lists); `choices` makes a dropdown or checkboxes; `widget` names a
    special one ("flavor": the Hub's hardware with prices); `limits` are a whole number's valid (lowest, highest)
    as `validate` enforces them (None: no highest), shown with the field."""
    meta = {"label": label, "section": section, "help": help, "choices": tuple(choices or ()), "widget": widget,
            "limits": limits}
    if callable(default):
        return field(default_factory=default, metadata=meta)
    return field(default=default, metadata=meta)


def form_fields(section: str) -> list[dataclasses.Field]:
    """The RunSpec fields the launch form shows in `section`, in declaration order."""
    return [f for f in dataclasses.fields(RunSpec) if f.metadata.get("section") == section]


@dataclass
class RunSpec:
    name: str = setting("tiny-demo", "Run name")
    mode: str = field(default="colocated",
                      metadata={"help": "colocated (one job) or distributed (trainer + vLLM replicas)"})
    executor: str = field(default="local", metadata={"help": "local processes, or Hugging Face Jobs"})
    model: str = setting(TINY_MODEL, "Model", help=MODEL_HELP)
    # The task: data, prompt, rewards
    dataset: str = field(default="builtin:count-to-ten", metadata={
        "help": "builtin:<name>, a Hub dataset id (HF Jobs), or a local .jsonl / .parquet file"})
    dataset_config: str = field(default="", metadata={"help": "the Hub dataset's config (subset); empty: its first"})
    dataset_split: str = field(default="train", metadata={"help": "the Hub dataset's split to train on"})
    prompt_column: str = field(default="prompt", metadata={
        "help": "the column holding the prompt: plain text, or a list of {role, content} messages"})
    reward_columns: list[str] = field(default_factory=list, metadata={
        "help": "columns passed to the reward functions: 'solution' (same name) or 'solution=answer' (keyword=column)"})
    system_prompt: str = field(default="", metadata={
        "help": "a system message put first in every prompt (replacing the dataset's own); empty: none"})
    max_prompt_tokens: int = field(default=512, metadata={
        "help": "rows whose prompt (after the chat template) is longer are skipped; 0: no limit"})
    rewards: list[str] = field(default_factory=lambda: ["digits"], metadata={
        "help": "builtin and TRL reward functions; each is plotted as rewards/<name>"})
    reward_weights: dict[str, float] = field(default_factory=dict, metadata={
        "help": "weight per reward name (default 1), e.g. accuracy_reward=1, think_format_reward=0.2"})
    reward_code: str = field(default="", metadata={
        "help": "your own reward functions: every top-level def f(completions, **kwargs) -> list[float]"})
    overlong_max_tokens: int = field(default=0, metadata={
        "help": "soft overlong punishment: the length limit L_max in tokens; 0: max_completion_length"})
    overlong_cache_tokens: int = field(default=0, metadata={
        "help": "soft overlong punishment: the last tokens before L_max over which the penalty grows to -1"})
    repetition_ngram_size: int = field(default=3, metadata={"help": "repetition penalty: n-gram size in tokens"})
    repetition_max_penalty: float = field(default=-1.0, metadata={
        "help": "repetition penalty: the score of a fully repetitive completion (<= 0)"})
    # The launch form is built from these fields: `setting` gives each its label, help, form section and widget.
    # LoRA
    lora_r: int = setting(8, "Rank r", LORA, "adapter rank; vLLM serves 8, 16, 32, 64, 128, 256, 320 or 512",
                          limits=(1, 512))
    lora_alpha: int = setting(16, "Alpha", LORA, "scaling, typically 2x the rank", limits=(1, None))
    lora_dropout: float = setting(0.0, "Dropout", LORA)
    lora_target_modules: list[str] = setting(lambda: ["q_proj", "k_proj", "v_proj", "o_proj"], "Target modules", LORA,
                                             choices=LORA_TARGET_CHOICES)
    # GRPO
    learning_rate: float = setting(5e-3, "Learning rate", GRPO)
    gradient_accumulation_steps: int = setting(1, "Gradient accumulation", GRPO,
                                               "micro-batches per optimizer step (a colocated run also generates "
                                               "for all of them at once)", limits=(1, None))
    adam_beta2: float = setting(0.999, "Adam beta2", GRPO, "AdamW's second-moment decay (transformers' default 0.999)")
    max_steps: int = setting(200, "Steps", GRPO, limits=(1, 1_000_000))
    per_device_batch_size: int = setting(8, "Batch size / device", GRPO, limits=(1, None))
    num_generations: int = setting(8, "Generations / prompt", GRPO, "completions per prompt, compared in a group",
                                   limits=(2, None))
    max_completion_length: int = setting(16, "Max completion tokens", GRPO, limits=(1, 32768))
    temperature: float = setting(1.0, "Temperature", GRPO)
    beta: float = setting(0.0, "KL beta", GRPO, "0: no reference model")
    seed: int = setting(0, "Seed", GRPO)
    adapter_every: int = setting(20, "Publish adapter every K steps", GRPO, "publish an adapter version every K steps",
                                 limits=(1, None))
    checkpoint_every: int = setting(50, "Checkpoint every K steps", GRPO, limits=(1, None))
    logging_steps: int = setting(1, "Log every K steps", GRPO, limits=(1, None))
    # Generation engine
    use_vllm: bool = setting(False, "Generate with colocated vLLM", COLOCATED,
                             "needs a GPU; on CPU the trainer generates with transformers")
    vllm_gpu_memory_utilization: float = setting(0.3, "vLLM GPU memory share", COLOCATED,
                                                 "vLLM's weights and KV cache; the rest of the GPU is the trainer's")
    vllm_enable_sleep_mode: bool = setting(True, "Sleep between generations", COLOCATED,
                                           "level 2: weights and KV cache freed; TRL re-syncs the weights after every "
                                           "step anyway")
    vllm_tensor_parallel_size: int = setting(1, "Tensor parallel", COLOCATED,
                                             "GPUs one colocated vLLM engine spans; it must divide the data-parallel "
                                             "processes", choices=(1, 2, 4, 8))
    num_processes: int = setting(1, "Data-parallel processes", COLOCATED, "training processes (accelerate)",
                                 limits=(1, 64))
    # Distributed
    replicas: int = setting(2, "vLLM replicas", DISTRIBUTED, limits=(1, 16))
    max_staleness: int = setting(1, "Max staleness", DISTRIBUTED, "vLLM keeps max_staleness + 2 adapters",
                                 limits=(0, 16))
    vllm_flavor: str = setting("l4x1", "Replica flavor", DISTRIBUTED, "HF Jobs hardware of each replica",
                               widget="flavor")
    max_tokens_per_batch: int = setting(4096, "Token budget / batch", DISTRIBUTED,
                                        "tokens per training micro-batch (TRL's token_budget); 0: "
                                        "per_device_batch_size samples per step")
    max_inflight_tasks: int = setting(8, "Max in-flight tasks", DISTRIBUTED, limits=(1, None))
    queue_maxsize: int = setting(64, "Rollout queue size", DISTRIBUTED, limits=(1, None))
    gradient_checkpointing: bool = setting(False, "Gradient checkpointing", DISTRIBUTED)
    replica_max_model_len: int = setting(0, "Replica context (tokens)", DISTRIBUTED,
                                         "each replica's --max-model-len: prompt + completion; 0: the model's own",
                                         limits=(0, None))
    replica_gpu_memory_utilization: float = setting(0.9, "Replica GPU memory share", DISTRIBUTED,
                                                    "each HF Jobs replica's --gpu-memory-utilization (vLLM's default "
                                                    "0.9); local replicas share one machine and size their own")
    # Hardware and storage
    flavor: str = setting("cpu-basic", "Trainer flavor", STORAGE, "HF Jobs hardware, price per hour", widget="flavor")
    timeout_minutes: int = setting(30, "Timeout (minutes)", STORAGE, limits=(1, MAX_TIMEOUT_MIN))
    budget_usd: float = setting(0.0, "Budget cap (USD)", STORAGE,
                                "HF Jobs: all jobs cancelled once spend or its projection reaches it; 0: none")
    bucket: str = setting("local/grpo-runs", "Bucket (namespace/name)", STORAGE,
                          "HF Jobs: your namespace's bucket, created (private) on first launch")
    mount_path: str = setting(DEFAULT_MOUNT, "Mount path in every job", STORAGE)
    image: str = field(default="vllm/vllm-openai:v0.31.0", metadata={
        "help": "container image of HF Jobs runs; pinned with TRL 1.16, which supports vLLM 0.22-0.31"})
    run_id: str = ""
    created_at: float = 0.0

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
        need(self.mode in MODES, "mode", f"must be one of {', '.join(MODES)}")
        need(self.executor in EXECUTORS, "executor", f"must be one of {', '.join(EXECUTORS)}")
        errs += _check_model(self.model, self.executor)
        errs += self._task_errors()
        need(self.lora_r > 0, "lora_r", "LoRA rank must be a positive integer, e.g. 8 or 16")
        need(self.lora_r <= 512, "lora_r", f"LoRA rank above 512 is not served by vLLM; use one of {VLLM_LORA_RANKS}")
        need(self.lora_alpha > 0, "lora_alpha", "LoRA alpha must be positive, typically 2x the rank")
        need(0 <= self.lora_dropout < 1, "lora_dropout", "must be in [0, 1)")
        bad_targets = [t for t in self.lora_target_modules if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.]*", t)]
        need(bool(self.lora_target_modules) and not bad_targets, "lora_target_modules",
             f"name one or more module names, e.g. {', '.join(LORA_TARGET_CHOICES[:4])}")
        need(0 < self.learning_rate < 1, "learning_rate", "must be > 0 and < 1, e.g. 1e-5 .. 5e-3 for LoRA")
        need(0 < self.max_steps <= 1_000_000, "max_steps", "must be a positive number of steps (at most 1,000,000)")
        need(self.num_generations >= 2, "num_generations", "GRPO needs at least 2 generations per prompt to compare")
        need(self.per_device_batch_size > 0, "per_device_batch_size", "must be positive")
        if self.per_device_batch_size > 0 and self.num_generations >= 2 and self.mode == "colocated":
            need((self.per_device_batch_size * self.num_processes) % self.num_generations == 0, "per_device_batch_size",
                 f"batch size x processes ({self.per_device_batch_size}x{self.num_processes}) must be a multiple "
                 f"of num_generations ({self.num_generations})")
        need(0 < self.max_completion_length <= 32768, "max_completion_length", "must be between 1 and 32768 tokens")
        need(0 < self.temperature <= 2, "temperature", "must be > 0 and <= 2")
        need(self.beta >= 0, "beta", "KL coefficient must be >= 0 (0 disables the reference model)")
        need(self.gradient_accumulation_steps >= 1, "gradient_accumulation_steps",
             "must be 1 or more micro-batches per optimizer step")
        need(self.replica_max_model_len >= 0, "replica_max_model_len",
             "must be 0 (the model's own context) or a number of tokens")
        need(0 < self.adam_beta2 < 1, "adam_beta2", "must be between 0 and 1, e.g. 0.95 or 0.999")
        need(0 < self.replica_gpu_memory_utilization <= 1, "replica_gpu_memory_utilization",
             "must be a share of the GPU above 0 and at most 1, e.g. 0.85")
        need(self.logging_steps > 0, "logging_steps", "must be a positive number of steps")
        need(self.adapter_every > 0, "adapter_every", "publish an adapter every K > 0 steps")
        need(self.checkpoint_every > 0, "checkpoint_every", "save a checkpoint every K > 0 steps")
        need(0 < self.vllm_gpu_memory_utilization < 1, "vllm_gpu_memory_utilization",
             "must be strictly between 0 and 1, e.g. 0.3 leaves 70% of the GPU for training")
        need(self.vllm_tensor_parallel_size in (1, 2, 4, 8), "vllm_tensor_parallel_size", "must be 1, 2, 4 or 8")
        need(1 <= self.num_processes <= 64, "num_processes", "must be between 1 and 64")
        if self.mode == "colocated" and self.use_vllm and self.vllm_tensor_parallel_size in (2, 4, 8):
            # TRL builds one vLLM engine per group of `tensor_parallel_size` training processes and refuses the rest.
            need(self.num_processes % self.vllm_tensor_parallel_size == 0, "vllm_tensor_parallel_size",
                 f"tensor parallel size {self.vllm_tensor_parallel_size} must divide the training processes "
                 f"(num_processes={self.num_processes}): one process per GPU, e.g. num_processes="
                 f"{self.vllm_tensor_parallel_size} for TP {self.vllm_tensor_parallel_size}")
        if self.mode == "distributed":
            whole = sorted(set(self.lora_target_modules) & WHOLE_MODEL_TARGETS)
            need(not whole, "lora_target_modules",
                 f"a distributed run syncs only the adapter through the bucket, and an adapter on {', '.join(whole)} "
                 "makes TRL merge and ship the whole model at every sync: target linear layers such as "
                 f"{', '.join(LORA_TARGET_CHOICES[:4])}")
            need(1 <= self.replicas <= 16, "replicas", "a distributed run needs between 1 and 16 vLLM replicas")
            need(self.max_staleness >= 0, "max_staleness",
                 "must be >= 0 (0 means rollouts always use the newest policy)")
            need(self.max_staleness <= 16, "max_staleness",
                 "at most 16: vLLM must keep max_staleness + 2 adapters loaded")
            need(self.max_inflight_tasks > 0, "max_inflight_tasks", "must be positive")
            need(self.queue_maxsize > 0, "queue_maxsize", "must be positive")
            need(self.max_tokens_per_batch == 0 or self.max_tokens_per_batch >= self.max_completion_length,
                 "max_tokens_per_batch", "the token budget must hold at least one completion (>= "
                 "max_completion_length), or be 0 for a fixed per_device_batch_size samples per step")
        need(isinstance(self.timeout_minutes, int) and 1 <= self.timeout_minutes <= MAX_TIMEOUT_MIN, "timeout_minutes",
             f"every job needs a timeout between 1 minute and {MAX_TIMEOUT_MIN} minutes (7 days)")
        need(math.isfinite(self.budget_usd) and self.budget_usd >= 0, "budget_usd",
             "must be 0 (no cap) or a positive amount in USD, e.g. 5")
        need(_billed(self.executor) or not self.budget_usd > 0, "budget_usd",
             "local runs cost nothing: leave it 0, or run on hf_jobs")
        errs += _check_bucket(self.bucket, self.executor)
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
    def reward_names(self) -> list[str]:
        """Every reward of the run, as it is plotted: the chosen ones, then the reward code's functions."""
        return [*self.rewards, *reward_function_names(self.reward_code)]

    def _task_errors(self) -> list[FieldError]:
        from backend.task_rules import task_errors  # the task's own rules (they import FieldError from here)  # noqa: PLC0415 import cycle

        return task_errors(self)

    def check(self) -> "RunSpec":
        errors = self.validate()
        if errors:
            raise SpecError(errors)
        return self


def _without_tokens(spec: RunSpec) -> list[FieldError]:
    """A token typed into a field would be stored in spec.json, shown in previews and job names: refuse it."""
    errs = []
    for f in dataclasses.fields(spec):
        value = getattr(spec, f.name)
        texts = value if isinstance(value, list) else [value]
        if any(isinstance(t, str) and looks_like_token(t) for t in texts):
            errs.append(FieldError(f.name, "this looks like a Hugging Face token; never type a token into the form. "
                                           "Sign in (on a Space) or set HF_TOKEN: the panel passes it to jobs as a "
                                           "secret only"))
    return errs


def _billed(executor: str) -> bool:
    where = known_engine(executor)
    return where is None or where.billed     # an unknown executor is the `executor` field's own error


def reaches_hub(executor: str) -> bool:
    """Whether the executor's jobs can download models and datasets from the Hub."""
    where = known_engine(executor)
    return where is None or where.reaches_hub


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
    """Reward weights from a form ("accuracy_reward=1, think_format_reward=0.2") or spec.json (a mapping)."""
    if isinstance(value, str):
        pairs = [p.split("=", 1) for p in value.replace("\n", ",").split(",") if p.strip()]
        if any(len(p) != 2 for p in pairs):
            raise ValueError(value)
        value = {k.strip(): v.strip() for k, v in pairs}
    if not isinstance(value, dict):
        raise TypeError(value)
    return {str(k): float(v) for k, v in value.items()}
