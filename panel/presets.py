"""Launch-form presets: sensible starting points, each a set of RunSpec field overrides (form values: the text
fields of the task, such as reward_columns and reward_weights, are written as the form shows them).

A preset is a complete starting point: `preset_values` fills every field a preset does not name with its
RunSpec default, and every preset sets every task field, so switching presets never keeps a value (or one
task's reward code) from the one before. HF Jobs presets name no bucket: the form fills in the visitor's own
`<namespace>/grpo-runs`.
"""

import dataclasses

from backend.runtime.tiny_model import TINY_MODEL
from backend.spec import RunSpec

TINY_DEMO = "Tiny demo (CPU)"
TINY_TASK = "Tiny task: your reward code on a JSONL file (CPU)"

NO_TASK = dict(dataset_config="", dataset_split="train", prompt_column="prompt", reward_columns="", system_prompt="",
               max_prompt_tokens=512, reward_weights="", reward_code="", overlong_max_tokens=0,
               overlong_cache_tokens=0, repetition_ngram_size=3, repetition_max_penalty=-1.0)

# The example of a task of your own: a JSONL file shipped with the panel and two reward functions in the editor.
TINY_TASK_CODE = '''import re


def mostly_digits(completions, **kwargs) -> list[float]:
    """Share of the completion's characters that are digits: graded, so even a random tiny model has a signal."""
    texts = [completion[0]["content"] for completion in completions]
    return [sum(ch.isdigit() for ch in text) / len(text) if text else 0.0 for text in texts]


def right_answer(completions, solution, **kwargs) -> list[float]:
    """1.0 when the first number in the completion is the solution (the dataset's `solution` column)."""
    scores = []
    for completion, answer in zip(completions, solution):
        found = re.search(r"-?\\d+", completion[0]["content"])
        scores.append(1.0 if found and found.group() == str(answer) else 0.0)
    return scores
'''
TINY_TASK_FIELDS = dict(
    NO_TASK, dataset="examples/tiny-math.jsonl",
    prompt_column="question",            # plain text: the panel makes it a user message
    reward_columns="solution",           # passed to right_answer as `solution`
    system_prompt="Answer with the number only.",
    rewards=[], reward_code=TINY_TASK_CODE,
    reward_weights="mostly_digits=1, right_answer=2",   # a right answer is worth more than looking numeric
)

# A real task for HF Jobs: DeepMath-103K's math problems (a conversational `prompt` and a `solution` column, as in
# TRL's own GRPO example), scored by TRL's accuracy_reward plus a small format bonus. The launch check reads the
# first rows through the dataset viewer and refuses the run if those columns are not there.
MATH_TASK = dict(
    NO_TASK, dataset="trl-lib/DeepMath-103K", dataset_split="train", prompt_column="prompt",
    reward_columns="solution",           # the reference answer accuracy_reward parses and compares with math_verify
    # think_format_reward wants the completion to open with <think>...</think>; accuracy_reward reads the first
    # \boxed{} answer. Qwen2.5-Instruct does neither unasked, so the system prompt asks for both.
    system_prompt="Think step by step inside <think> and </think>, then give the final answer in \\boxed{}.",
    max_prompt_tokens=512,               # DeepMath problems are short; the rare longer one is skipped, not truncated
    rewards=["accuracy_reward", "think_format_reward"],
    # Correctness dominates; the format term is a small shaping bonus, so format alone cannot win the group.
    reward_weights="accuracy_reward=1, think_format_reward=0.2",
)

PRESETS: dict[str, dict] = {
    TINY_DEMO: dict(NO_TASK, name="tiny-demo", mode="colocated", executor="local", model=TINY_MODEL,
                    dataset="builtin:count-to-ten", rewards=["digits"], use_vllm=False, flavor="cpu-basic",
                    bucket="local/grpo-runs"),
    TINY_TASK: dict(TINY_TASK_FIELDS, name="tiny-task", mode="colocated", executor="local", model=TINY_MODEL,
                    use_vllm=False, max_steps=100, flavor="cpu-basic", bucket="local/grpo-runs"),
    "Tiny distributed (CPU, 2 vLLM replicas)": dict(
        NO_TASK, name="tiny-distributed", mode="distributed", executor="local", model=TINY_MODEL,
        dataset="builtin:count-to-ten", rewards=["digits"], replicas=2, max_staleness=1, lora_r=8, max_steps=20,
        adapter_every=1, flavor="cpu-basic", bucket="local/grpo-runs", timeout_minutes=30),
    "Qwen2.5-0.5B math, colocated (HF Jobs, 1x A10G)": dict(
        MATH_TASK, name="qwen05b-math", mode="colocated", executor="hf_jobs", model="Qwen/Qwen2.5-0.5B-Instruct",
        use_vllm=True,
        vllm_gpu_memory_utilization=0.3,  # vLLM's weights + KV cache; the rest of the 24 GB is the trainer's
        vllm_enable_sleep_mode=True,      # free vLLM's memory while the trainer steps
        learning_rate=1e-5,               # conservative for GRPO; LoRA often tolerates up to ~5e-5 if reward is flat
        max_steps=500, per_device_batch_size=8,
        num_generations=8,                # 8 answers per problem: enough spread for a group-relative advantage
        max_completion_length=1024,       # room for a short chain of thought; a cut answer has no \boxed{} and scores 0
        lora_r=16, lora_alpha=32,         # alpha = 2 x rank, the usual LoRA scaling
        adapter_every=50, checkpoint_every=100, flavor="a10g-large",
        timeout_minutes=180),             # 500 steps x 8 x 1024 tokens on one A10G, with margin
    "Qwen2.5-1.5B math, distributed (HF Jobs, 2 vLLM replicas)": dict(
        MATH_TASK, name="qwen15b-math-async", mode="distributed", executor="hf_jobs",
        model="Qwen/Qwen2.5-1.5B-Instruct", replicas=2, lora_r=32, lora_alpha=64,
        learning_rate=1e-5, max_steps=1000, max_completion_length=1024,
        # Long completions cost generation time for nothing (a cut answer scores 0): DAPO's soft overlong
        # punishment starts 256 tokens before the 1024-token cap and reaches -1 at it.
        rewards=["accuracy_reward", "think_format_reward", "soft_overlong_punishment_reward"],
        overlong_cache_tokens=256,
        reward_weights="accuracy_reward=1, think_format_reward=0.2, soft_overlong_punishment_reward=0.5",
        # As the published async GRPO + LoRA study tuned it (3.9x faster than its first setting):
        max_tokens_per_batch=32768,       # token-budget packing: 32 completions of 1024 tokens per optimizer step
        gradient_checkpointing=False,     # a rank-32 LoRA on 1.5B fits an A100-80GB without it; it recomputes forwards
        max_inflight_tasks=128,           # raise in-flight requests before adding replicas: keeps both replicas full
        max_staleness=4,                  # the trainer may use rollouts up to 4 versions old ...
        adapter_every=4,                  # ... since it syncs every 4 steps: across a bucket a sync costs seconds,
                                          # so syncing every step would double the step time
        queue_maxsize=512,                # the queue holds the staleness window: max_staleness x 128 samples
        checkpoint_every=100, flavor="a100-large", vllm_flavor="l40sx1", timeout_minutes=240),
}


def preset_values(name: str, bucket: str | None = None) -> dict:
    """Every form field's value under preset `name`; `bucket` fills an HF Jobs preset's bucket."""
    defaults = {f.name: getattr(RunSpec, f.name) if f.default is not dataclasses.MISSING else f.default_factory()
                for f in dataclasses.fields(RunSpec) if f.name not in ("run_id", "created_at", "image")}
    values = {**defaults, **PRESETS[name]}
    if values["executor"] == "hf_jobs" and "bucket" not in PRESETS[name]:
        values["bucket"] = bucket or ""
    return values
