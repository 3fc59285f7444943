""""Try it" on CPU: one prompt answered by a base model and LoRA adapter versions of it, greedy, in this process.

    python -m runtime.check.try_adapter < request.json

The panel starts this in its sandbox (`backend.outcome.try_it`), never in its own process: an adapter is a visitor's
data. So nothing of an adapter is trusted: its `adapter_config.json` is read as plain JSON and only the LoRA settings
below are taken from it, checked (never `base_model_name_or_path`, which would make PEFT fetch a model, nor any
setting that runs an initialisation or names code); its weights are read from safetensors only (no pickle) and must
match the layers that config makes, name for name and shape for shape. The base model is loaded with
`use_safetensors`, no remote code and no network. The process lowers its own limits (memory, CPU time, file size)
before it reads any of it.

The request: {"nonce", "base", "adapters": {label: folder}, "prompt", "system_prompt", "max_new_tokens",
"limits", "drop_uid"}. Each line written to stdout is a JSON object carrying the nonce: {"event": a kind of
`records.TRY_MESSAGES`, ...}; anything else there (a library's print) is not part of the answer.
"""

import json
import math
import os
import re
import sys
import time

from ..records import TRY_ANSWER, TRY_DONE, TRY_ERROR, TRY_LOADED, TRY_LOADING

LORA_KEYS = {"r": int, "lora_alpha": (int, float), "lora_dropout": (int, float), "target_modules": (list, str),
             "bias": str, "use_rslora": bool, "fan_in_fan_out": bool, "task_type": (str, type(None)),
             "peft_type": str, "inference_mode": bool}
MAX_RANK = 512
MODULE_NAME = re.compile(r"^[A-Za-z0-9_.]{1,100}$")
MAX_ADAPTER_BYTES = 512 * 2**20


class AdapterRefused(ValueError):
    """The adapter cannot be loaded as a plain LoRA of this base model; the message says why."""


def lora_settings(config: dict) -> dict:
    """The LoRA settings of an adapter_config.json this worker accepts, or AdapterRefused naming the bad key."""
    if not isinstance(config, dict):
        raise AdapterRefused("adapter_config.json is not a JSON object")
    if config.get("peft_type", "LORA") != "LORA":
        raise AdapterRefused(f"peft_type {config.get('peft_type')!r}: only plain LoRA adapters can be tried")
    settings = {}
    for key, kinds in LORA_KEYS.items():
        if key in config and config[key] is not None:
            if not isinstance(config[key], kinds) or (kinds is int and isinstance(config[key], bool)):
                raise AdapterRefused(f"adapter_config.json: {key} has the wrong type")
            settings[key] = config[key]
    rank = settings.get("r", 8)
    if not 1 <= rank <= MAX_RANK:
        raise AdapterRefused(f"adapter_config.json: r={rank} is outside 1..{MAX_RANK}")
    alpha = settings.get("lora_alpha", 8)
    if not (math.isfinite(alpha) and 0 < alpha <= 1e6):
        raise AdapterRefused("adapter_config.json: lora_alpha must be a positive finite number")
    targets = settings.get("target_modules", [])
    names = [targets] if isinstance(targets, str) else targets
    if not names or len(names) > 64 or not all(isinstance(n, str) and MODULE_NAME.match(n) for n in names):
        raise AdapterRefused("adapter_config.json: target_modules must be up to 64 module names "
                             "(letters, digits, '_' and '.')")
    if settings.get("bias", "none") != "none":
        raise AdapterRefused("adapter_config.json: only bias='none' adapters can be tried")
    settings["target_modules"] = names
    settings["lora_dropout"] = 0.0
    settings.update(peft_type="LORA", task_type="CAUSAL_LM", inference_mode=True, bias="none")
    return settings


def emit(nonce: str, **event) -> None:
    sys.stdout.write(json.dumps({"nonce": nonce, **event}) + "\n")
    sys.stdout.flush()


def load_adapter(model, name: str, folder: str) -> None:
    """Add the adapter in `folder` to the PEFT `model` under `name`, its weights checked against its layers."""
    from peft import LoraConfig, set_peft_model_state_dict  # noqa: PLC0415 the checks above need no torch
    from safetensors.torch import load_file  # noqa: PLC0415

    try:
        with open(os.path.join(folder, "adapter_config.json"), "rb") as f:
            raw = f.read(1 << 20)
    except OSError:
        raise AdapterRefused("the adapter has no adapter_config.json") from None
    try:
        config = LoraConfig(**lora_settings(json.loads(raw)))
    except (ValueError, TypeError) as exc:
        raise AdapterRefused(str(exc)) from None
    weights = os.path.join(folder, "adapter_model.safetensors")
    if not os.path.isfile(weights) or os.path.getsize(weights) > MAX_ADAPTER_BYTES:
        raise AdapterRefused(f"adapter_model.safetensors is missing or over {MAX_ADAPTER_BYTES >> 20} MB")
    try:
        state = load_file(weights)
    except Exception as exc:   # not safetensors, or torn: say so, do not guess
        raise AdapterRefused(f"adapter_model.safetensors cannot be read: {str(exc)[:200]}") from None
    try:
        model.add_adapter(name, config)
    except ValueError as exc:     # e.g. a target module this base model does not have
        raise AdapterRefused(f"adapter_config.json does not fit the base model: {str(exc)[:200]}") from None
    expected = {k: v.shape for k, v in _adapter_state(model, name).items()}
    given = {_plain_key(k): v for k, v in state.items()}
    if set(given) != set(expected) or any(tuple(given[k].shape) != tuple(expected[k]) for k in given):
        model.delete_adapter(name)
        raise AdapterRefused("adapter_model.safetensors does not match its config's layers (names or shapes)")
    set_peft_model_state_dict(model, state, adapter_name=name)


def _adapter_state(model, name: str) -> dict:
    from peft import get_peft_model_state_dict  # noqa: PLC0415

    return {_plain_key(k): v for k, v in get_peft_model_state_dict(model, adapter_name=name).items()}


def _plain_key(key: str) -> str:
    return key.replace(".default.", ".").removeprefix("base_model.model.")


def answer(model, tokenizer, messages: list[dict], max_new_tokens: int) -> str:
    import torch  # noqa: PLC0415

    from ..task import render_prompt  # noqa: PLC0415

    text = render_prompt(tokenizer, messages)
    inputs = tokenizer(text, return_tensors="pt", add_special_tokens=False)
    with torch.no_grad():
        out = model.generate(**inputs, do_sample=False, max_new_tokens=max_new_tokens,
                             pad_token_id=tokenizer.pad_token_id or tokenizer.eos_token_id)
    return tokenizer.decode(out[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True)


def main() -> None:
    request = json.loads(sys.stdin.read(1 << 20))
    nonce = str(request["nonce"])
    from .confinement import confine  # noqa: PLC0415

    confine(request.get("limits") or {}, request.get("drop_uid"))
    os.environ.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    began = time.monotonic()
    emit(nonce, event=TRY_LOADING, what="the base model")
    # Imported once the limits are lowered: loading them is most of the memory a try needs.
    import torch  # noqa: PLC0415
    from peft import LoraConfig, PeftModel  # noqa: PLC0415
    from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: PLC0415

    from ..task import to_messages  # noqa: PLC0415

    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    base = request["base"]
    tokenizer = AutoTokenizer.from_pretrained(base, local_files_only=True, trust_remote_code=False)
    model = AutoModelForCausalLM.from_pretrained(base, local_files_only=True, trust_remote_code=False,
                                                 use_safetensors=True, dtype=torch.float32)
    model.eval()
    messages = to_messages(str(request["prompt"]), str(request.get("system_prompt") or ""))
    limit = int(request["max_new_tokens"])
    labels = list(request["adapters"])
    # A PEFT wrapper with a placeholder adapter that changes nothing (lora_B starts at zero), so each version is
    # added beside it; the base model answers with every adapter disabled.
    linear = next(n.rsplit(".", 1)[-1] for n, m in model.named_modules()
                  if isinstance(m, torch.nn.Linear) and not n.endswith("lm_head"))
    peft = PeftModel(model, LoraConfig(r=1, target_modules=[linear], task_type="CAUSAL_LM"), "_placeholder")
    emit(nonce, event=TRY_LOADED, seconds=round(time.monotonic() - began, 2))
    if request.get("with_base"):
        with peft.disable_adapter():
            emit(nonce, event=TRY_ANSWER, label="base", text=answer(peft, tokenizer, messages, limit))
    for i, label in enumerate(labels):
        name = f"try{i}"
        try:
            load_adapter(peft, name, request["adapters"][label])
        except AdapterRefused as exc:
            emit(nonce, event=TRY_ERROR, label=label, message=str(exc))
            continue
        peft.set_adapter(name)
        emit(nonce, event=TRY_ANSWER, label=label, text=answer(peft, tokenizer, messages, limit))
        peft.set_adapter("_placeholder")
        peft.delete_adapter(name)
    emit(nonce, event=TRY_DONE, seconds=round(time.monotonic() - began, 2))


if __name__ == "__main__":
    main()
