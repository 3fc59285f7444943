"""Launch-form presets: sensible starting points, each a set of RunSpec field overrides (form values: the text
fields of the task, such as reward_columns and reward_weights, are written as the form shows them).

A preset is a complete starting point: `preset_values` fills every field a preset does not name with its
RunSpec default, and every preset sets every task field, so switching presets never keeps a value (or one
task's reward code) from the one before. HF Jobs presets name no bucket: the form fills in the visitor's own
`<namespace>/grpo-runs`.
"""

import dataclasses

from backend.plan.engines import engine
from backend.plan.spec import LORA_TARGET_CHOICES, RunSpec
from backend.runtime.tiny_model import TINY_MODEL, TINY_REPEATER

TINY_DEMO = "Tiny demo (CPU)"
TINY_HACKING = "Tiny reward-hacking demo (CPU)"
TINY_TASK = "Tiny task: your reward code on a JSONL file (CPU)"

NO_TASK = dict(dataset_config="", dataset_split="train", prompt_column="prompt", reward_columns="", system_prompt="",
               max_prompt_tokens=512, reward_weights="", reward_code="", overlong_max_tokens=0,
               overlong_cache_tokens=0, repetition_ngram_size=3, repetition_max_penalty=-1.0,
               eval_source="none", eval_split="test", eval_file="", eval_rows=16, eval_max_prompts=64,
               monitor_rewards=[], best_by="", eval_every=0, eval_greedy=True, eval_samples_per_prompt=1,
               eval_max_inflight=4)
# The default demo learns a real skill: repeat three letters ("Say cab" -> "cab"), paid 1 for the exact answer and 0
# otherwise (`exact_answer`: no constant or repeated answer wins), judged on 24 questions it never trains on (unseen
# combinations of letters it has seen at each place). Its model is the tiny one after a brief supervised warm-up
# (tiny_model.TINY_REPEATER): right on some answers, not reliably; GRPO makes it reliable. The held-out answers are
# sampled as training samples them (temperature 1, 4 a question), so the score is how often the policy is right, not
# whether its likeliest answer is: greedy decoding would call a policy right 40% of the time "solved". It watches
# `format` and `distinct_chars` as the other demos do; neither falls on an honest run, so no alert.
REPEAT_TASK = dict(NO_TASK, dataset="builtin:repeat-letters", rewards=["exact_answer"], reward_columns="answer",
                   eval_source="split", eval_split="test", monitor_rewards=["format", "distinct_chars"],
                   eval_greedy=False, eval_samples_per_prompt=4)

# The other tiny demos evaluate on their builtin set's held-out prompts (its 'test' split) at every version, and watch
# `format` (plain printable text) and `distinct_chars` beside the `digits` they train on: a policy that learns to
# write digits as byte soup shows it in the first, one that writes "8888888888" (the usual hack of `digits`) in the
# second, which raises the reward-hacking alert. The best version is the one that writes digits *and* varies them,
# so that demo never stars "8888888888".
TINY_HELD_OUT = dict(eval_source="split", eval_split="test", monitor_rewards=["format", "distinct_chars"],
                     best_by="digits=1, distinct_chars=1")

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
    eval_source="rows", eval_rows=8,     # 8 of the 48 questions never trained on: does right_answer generalise?
    monitor_rewards=["distinct_chars"],  # "6666666666" scores mostly_digits 1: watched, it raises the alert
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
    # DeepMath has one split: its first 64 problems are held out of training and answered greedily at each version.
    eval_source="rows", eval_rows=64, eval_max_prompts=64,
)

# The published async GRPO + LoRA study (TRL's async trainer on HF Jobs, its adapters synced through a bucket):
# what it set, as the RunSpec fields that set it here. Its tuned runs: Qwen2.5-Math-1.5B with a rank-1 LoRA
# (alpha 2) on every linear layer, lr 4e-5, AdamW beta2 0.95, 8 samples a prompt, up to 3000 generated tokens in a
# 4096-token context, a checkpoint every 50 steps; a token budget of 16384 with gradient accumulation 6 (128+
# completions a step), 384 requests in flight, a queue of 768 (max_staleness x 128), the trainer on h200x2 and
# two h200 replicas at --gpu-memory-utilization 0.85.
STUDY_NAME = "the async GRPO + LoRA study"
STUDY = dict(
    model="Qwen/Qwen2.5-Math-1.5B", lora_r=1, lora_alpha=2, lora_target_modules=list(LORA_TARGET_CHOICES),
    learning_rate=4e-5, adam_beta2=0.95, num_generations=8, max_completion_length=3000, checkpoint_every=50,
)
STUDY_DISTRIBUTED = dict(
    max_tokens_per_batch=16384, gradient_accumulation_steps=6, max_inflight_tasks=384, queue_maxsize=768,
    max_staleness=6, replicas=2, flavor="h200x2", vllm_flavor="h200", replica_max_model_len=4096,
    replica_gpu_memory_utilization=0.85,
)
STUDY_COMPLETIONS_PER_STEP = 128

# Several vLLM servers a GPU, from the H200 measurements (docs/replica-scaling.md, TRL's request body, 0.5B shape): one
# server is bound by its API process's main thread with the GPU mostly idle. With 512 requests in flight on one H200,
# 4 servers generated 2.77x one (2 servers 2.41x); with 1024, 4.43x; with 256, 4 servers gave less than 2 (1.35x
# against 1.64x): each server needs ~128 requests of its own. So the H200 preset runs 4 servers a GPU and keeps 512
# requests in flight a replica GPU. What is in flight and queued must be trained within max_staleness steps, or it is
# dropped as stale once the trainer is the bound (seen: a run that queued 12 steps' worth with max_staleness 4 dropped
# 428 samples in 6 steps): max_staleness covers in flight + queue at the study's 128 completions a step. Other GPUs were
# not measured: their presets keep one server.
SERVERS_PER_GPU = {"h200": 4}
IN_FLIGHT_PER_GPU = 512
QWEN15_REPLICAS = 2
QWEN15_IN_FLIGHT = IN_FLIGHT_PER_GPU * QWEN15_REPLICAS
QWEN15_QUEUE = 128          # a step's worth ready: the trainer does not wait while generation keeps pace

QWEN05_COLOCATED = "Qwen2.5-0.5B math, colocated (HF Jobs, 1x A10G)"
QWEN15_DISTRIBUTED = "Qwen2.5-1.5B math, distributed (HF Jobs, 2 vLLM replicas)"

# Where a preset departs from the study, and why: the form shows these under the preset picker.
DIFFERENCES: dict[str, dict[str, str]] = {
    QWEN05_COLOCATED: dict(
        model="a 0.5B model so that one A10G holds the trainer and vLLM together: the cheapest GPU start; the "
              "Instruct model follows the system prompt's format unasked",
        max_completion_length="1024, not 3000: 128 completions a step of up to 3000 tokens on one A10G would make "
                              "each step several times longer (an estimate: not run on HF Jobs from here)",
    ),
    QWEN15_DISTRIBUTED: dict(
        flavor="h200, not h200x2: the distributed trainer here runs one training process, so a second GPU would "
               "be paid for and idle",
        max_inflight_tasks=f"{IN_FLIGHT_PER_GPU} a replica GPU, 128 for each of its {SERVERS_PER_GPU['h200']} vLLM "
                           "servers: one server's API process bounds it, 4 on one H200 generated 2.77x one at 512 in "
                           "flight, and each needs ~128 requests of its own",
        queue_maxsize=f"{QWEN15_QUEUE}, a step's worth: with {QWEN15_IN_FLIGHT} in flight a longer queue only ages the "
                      "samples past max_staleness once the trainer is the bound",
        max_staleness="what is in flight and queued is trained within it at 128 completions a step "
                      f"(({QWEN15_IN_FLIGHT} + {QWEN15_QUEUE}) / 128); older samples would be dropped",
    ),
}

PRESETS: dict[str, dict] = {
    TINY_DEMO: dict(REPEAT_TASK, name="tiny-demo", mode="colocated", executor="local", model=TINY_REPEATER,
                    use_vllm=False, flavor="cpu-basic", bucket="local/grpo-runs", max_steps=300, adapter_every=30),
    # The demo of the reward-hacking alert: `digits` pays for any digit, so the tiny random model learns to write
    # "8888888888"; the alert says so (the monitor distinct_chars falls) and the best version is chosen by the rule
    # that also weighs variety.
    TINY_HACKING: dict(NO_TASK, **TINY_HELD_OUT, name="reward-hacking-demo", mode="colocated", executor="local",
                       model=TINY_MODEL, dataset="builtin:count-to-ten", rewards=["digits"], use_vllm=False,
                       flavor="cpu-basic", bucket="local/grpo-runs"),
    TINY_TASK: dict(TINY_TASK_FIELDS, name="tiny-task", mode="colocated", executor="local", model=TINY_MODEL,
                    use_vllm=False, max_steps=100, flavor="cpu-basic", bucket="local/grpo-runs"),
    "Tiny distributed (CPU, 2 vLLM replicas)": dict(
        NO_TASK, **TINY_HELD_OUT, name="tiny-distributed", mode="distributed", executor="local", model=TINY_MODEL,
        dataset="builtin:count-to-ten", rewards=["digits"], replicas=2, max_staleness=1, lora_r=8, max_steps=20,
        # A version a step: the held-out questions are asked at the first version, then every 5 steps and at the
        # last, 2 at a time, beside the rollouts on the same two CPU replicas.
        eval_every=5, eval_max_inflight=2,
        adapter_every=1, flavor="cpu-basic", bucket="local/grpo-runs", timeout_minutes=30),
    QWEN05_COLOCATED: dict(
        MATH_TASK, name="qwen05b-math", mode="colocated", executor="hf_jobs", model="Qwen/Qwen2.5-0.5B-Instruct",
        use_vllm=True,
        vllm_gpu_memory_utilization=0.3,  # vLLM's weights + KV cache; the rest of the 24 GB is the trainer's
        vllm_enable_sleep_mode=True,      # free vLLM's memory while the trainer steps
        # The study's LoRA and optimizer: rank 1 on every linear layer learns GRPO's few bits per step as well as
        # a larger rank, with its learning rate and beta2.
        lora_r=1, lora_alpha=2, lora_target_modules=list(LORA_TARGET_CHOICES), learning_rate=4e-5, adam_beta2=0.95,
        num_generations=8,                # the study's 8 answers per problem: spread for a group-relative advantage
        # 8 completions a micro-batch, 16 micro-batches a step: the study's 128 completions (16 prompts) a step,
        # generated at once; a micro-batch of 8 is what one A10G trains beside vLLM.
        per_device_batch_size=8, gradient_accumulation_steps=16,
        max_completion_length=1024,       # see DIFFERENCES; a cut answer has no \boxed{} and scores 0
        max_steps=200, adapter_every=50, checkpoint_every=50,
        flavor="a10g-large",
        timeout_minutes=600),             # 200 steps of 128 completions; estimated, not measured: the cost cap is yours
    QWEN15_DISTRIBUTED: dict(
        MATH_TASK, name="qwen15b-math-async", mode="distributed", executor="hf_jobs",
        # As the study ran it: its model, LoRA, optimizer and lengths (the model's context is 4096 tokens, so the
        # replicas serve exactly that: up to 3000 generated after a prompt of up to 512).
        model="Qwen/Qwen2.5-Math-1.5B", lora_r=1, lora_alpha=2, lora_target_modules=list(LORA_TARGET_CHOICES),
        learning_rate=4e-5, adam_beta2=0.95, num_generations=8, max_completion_length=3000,
        replica_max_model_len=4096, replica_gpu_memory_utilization=0.85, checkpoint_every=50,
        # Long completions cost generation time for nothing (a cut answer scores 0): DAPO's soft overlong
        # punishment starts 256 tokens before the 3000-token cap and reaches -1 at it (not part of the study).
        rewards=["accuracy_reward", "think_format_reward", "soft_overlong_punishment_reward"],
        overlong_cache_tokens=256,
        reward_weights="accuracy_reward=1, think_format_reward=0.2, soft_overlong_punishment_reward=0.5",
        # The study's tuned run (3.9x faster than its first setting): 16384-token micro-batches, 6 of them a step
        # (128+ completions), 384 requests in flight so both replicas stay full, a queue of max_staleness x 128.
        # Generation at the GPU's pace: 4 vLLM servers on each replica's H200, 128 requests in flight each.
        max_tokens_per_batch=16384, gradient_accumulation_steps=6, servers_per_gpu=SERVERS_PER_GPU["h200"],
        max_inflight_tasks=QWEN15_IN_FLIGHT, queue_maxsize=QWEN15_QUEUE,
        max_staleness=-(-(QWEN15_IN_FLIGHT + QWEN15_QUEUE) // STUDY_COMPLETIONS_PER_STEP),
        # A version every 4 steps is 250 versions: evaluate one every 50 steps, 16 held-out requests beside the 384
        # rollouts in flight (about 4% of the replicas' requests while it runs).
        eval_every=50, eval_max_inflight=16,
        adapter_every=4,                  # not set by the study's summary: across a bucket a sync costs seconds,
                                          # so every 4 steps, within max_staleness
        gradient_checkpointing=False,     # a rank-1 LoRA on 1.5B fits an H200 without it; it recomputes forwards
        replicas=QWEN15_REPLICAS, flavor="h200", vllm_flavor="h200",
        max_steps=1000, timeout_minutes=480),   # not from the study, not measured here: the cost cap is yours
}


def study_differences(name: str) -> dict[str, str]:
    """The fields where preset `name` departs from the study, each with its reason."""
    return DIFFERENCES.get(name, {})


def preset_note(name: str) -> str:
    """What the form shows under the preset picker: for an HF Jobs preset, what it takes from the study and
    where it differs, with why."""
    values = preset_values(name)
    if engine(values["executor"]).on_panel_machine:
        return "Runs on this machine: a tiny model built on the spot, no account, no GPU."
    published = {**STUDY, **(STUDY_DISTRIBUTED if values["mode"] == "distributed" else {})}
    differences = study_differences(name)
    same = [field for field in published if field not in differences]
    lines = [f"Follows {STUDY_NAME} (Qwen2.5-Math-1.5B, rank-1 LoRA, lr 4e-5, 128+ completions a step) in: "
             + ", ".join(f"`{field}`" for field in same) + "."]
    lines += [f"- `{field}` = `{values[field]}` (study: `{published[field]}`): {reason}"
              for field, reason in differences.items()]
    return "\n".join(lines)


def preset_values(name: str, bucket: str | None = None) -> dict:
    """Every form field's value under preset `name`; `bucket` fills an HF Jobs preset's bucket."""
    defaults = {f.name: getattr(RunSpec, f.name) if f.default is not dataclasses.MISSING else f.default_factory()
                for f in dataclasses.fields(RunSpec) if f.name not in ("run_id", "created_at", "image")}
    values = {**defaults, **PRESETS[name]}
    if engine(values["executor"]).bucket_on_hub and "bucket" not in PRESETS[name]:
        values["bucket"] = bucket or ""
    return values
