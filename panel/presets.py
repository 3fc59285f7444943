"""Launch-form presets: sensible starting points, each a set of RunSpec field overrides.

A preset is a complete starting point: `preset_values` fills every field a preset does not name with its
RunSpec default, so switching presets never keeps a value from the one before. HF Jobs presets name no
bucket: the form fills in the visitor's own `<namespace>/grpo-runs`.
"""

import dataclasses

from backend.spec import BUILTIN_MODEL, RunSpec

TINY_DEMO = "Tiny demo (CPU)"
PRESETS: dict[str, dict] = {
    TINY_DEMO: dict(name="tiny-demo", mode="colocated", executor="local", model=BUILTIN_MODEL,
                    dataset="builtin:count-to-ten", use_vllm=False, flavor="cpu-basic", bucket="local/grpo-runs"),
    "Tiny distributed (CPU, 2 vLLM replicas)": dict(
        name="tiny-distributed", mode="distributed", executor="local", model=BUILTIN_MODEL,
        dataset="builtin:count-to-ten", replicas=2, max_staleness=1, lora_r=8, max_steps=20, adapter_every=1,
        flavor="cpu-basic", bucket="local/grpo-runs", timeout_minutes=30),
    "Qwen2.5-0.5B colocated (HF Jobs, 1x A10G)": dict(
        name="qwen05b-colocated", mode="colocated", executor="hf_jobs", model="Qwen/Qwen2.5-0.5B-Instruct",
        dataset="trl-lib/DeepMath-103K", rewards=["format"], use_vllm=True, vllm_gpu_memory_utilization=0.3,
        vllm_enable_sleep_mode=True, learning_rate=1e-5, max_steps=500, per_device_batch_size=8,
        num_generations=8, max_completion_length=512, lora_r=16, lora_alpha=32, adapter_every=50,
        checkpoint_every=100, flavor="a10g-large", timeout_minutes=180),
    "Qwen2.5-1.5B distributed (HF Jobs, 2 vLLM replicas)": dict(
        name="qwen15b-async", mode="distributed", executor="hf_jobs", model="Qwen/Qwen2.5-1.5B-Instruct",
        dataset="trl-lib/DeepMath-103K", rewards=["format"], replicas=2, max_staleness=2, lora_r=32,
        lora_alpha=64, learning_rate=1e-5, max_steps=1000, max_completion_length=1024,
        max_tokens_per_batch=32768, gradient_checkpointing=True, max_inflight_tasks=64, queue_maxsize=512,
        adapter_every=1, checkpoint_every=100, flavor="a100-large", vllm_flavor="l40sx1", timeout_minutes=240),
}


def preset_values(name: str, bucket: str | None = None) -> dict:
    """Every form field's value under preset `name`; `bucket` fills an HF Jobs preset's bucket."""
    defaults = {f.name: getattr(RunSpec, f.name) if f.default is not dataclasses.MISSING else f.default_factory()
                for f in dataclasses.fields(RunSpec) if f.name not in ("run_id", "created_at", "image")}
    values = {**defaults, **PRESETS[name]}
    if values["executor"] == "hf_jobs" and "bucket" not in PRESETS[name]:
        values["bucket"] = bucket or ""
    return values
