"""A replica whose GPU is the trainer's too (the local engine on one GPU): how many vLLM servers it runs there, and
whether they fit beside the trainer. Pure functions; the engine says where a replica shares the trainer's GPU
(`Engine.replica_shares_trainer_gpu`).

Why 1 there: on a GPU of its own, four servers generate x4.43 what one does (their API processes, not the GPU, bound
one server), but where the trainer shares the GPU extra servers take the GPU time the trainer's forward and backward
need. Measured on one H100 shared by the trainer and the replica job (docs/replica-scaling.md, section 6): K = 2
trained x1.00 of K = 1's tokens a second, K = 4 x0.79, with the card at 77.3 and 78.9 of 80 GiB.
"""

import json
import os

from backend.plan.servers import footprint
from backend.runtime.serving.gpu_split import SERVER_OVERHEAD_BYTES, gib
from backend.runtime.tiny_model import BUILTIN_MODELS, model_config

SHARED_GPU_DOC = "docs/replica-scaling.md, section 6"
# K -> (trained tok/s against K = 1, the card's peak memory in GiB of 80): one H100, trainer and replica job on it.
MEASURED_ON_SHARED_H100 = {1: (1.00, 52.9), 2: (1.00, 77.3), 4: (0.79, 78.9)}
SLOWER_FROM = 4     # the smallest K measured slower than one server on a shared GPU
SHARED_SERVER_KV_BYTES = 2**30   # each local server's fixed KV cache on a shared GPU (engines/local.py)
# The trainer's peak a micro-batch token: float32 logits (the logits, their log-softmax and its gradient) and each
# layer's saved activations in 16 bits. The counts (3 copies; 13 x hidden + 3 x intermediate a layer) are chosen so
# the one shape measured comes out as measured: Qwen2.5-0.5B's, 16,384-token micro-batches, 52.9 GiB on the card with
# one server beside it. Not validated at other shapes: an estimate, used to refuse only what cannot fit.
LOGIT_COPIES = 3
LOGIT_BYTES = 4
ACTIVATION_BYTES = 2


def measured_reason() -> str:
    """The measurement behind K = 1 on a shared GPU, in a sentence's words."""
    k2, k4 = MEASURED_ON_SHARED_H100[2], MEASURED_ON_SHARED_H100[4]
    return (f"on one H100 shared by the trainer and the replica, more servers trained no faster: K=2 x{k2[0]:.2f} and "
            f"K=4 x{k4[0]:.2f} of one server's trained tok/s, with the card at {k2[1]} and {k4[1]} of 80 GiB "
            f"({SHARED_GPU_DOC})")


def micro_batch_tokens(spec) -> int:
    """Tokens in one training micro-batch: the token budget, else a batch of full completions (prompts uncounted, so
    the estimate errs towards fitting)."""
    return spec.max_tokens_per_batch or spec.per_device_batch_size * spec.max_completion_length


def trainer_peak_bytes(spec) -> int | None:
    """The trainer's estimated peak GPU memory: weights, and each micro-batch token's logits and activations; None
    where the model's config is not here (a Hub id: the local engine cannot download it anyway)."""
    config = _config(spec.model)
    need = footprint(spec.model)
    if config is None or need is None:
        return None
    hidden, layers = config["hidden_size"], config["num_hidden_layers"]
    intermediate = config.get("intermediate_size", 4 * hidden)
    layer = ACTIVATION_BYTES * (13 * hidden + 3 * intermediate)
    # With checkpointing only each layer's input is kept, and one layer's activations are recomputed at a time.
    kept = layers * ACTIVATION_BYTES * hidden + layer if spec.gradient_checkpointing else layers * layer
    per_token = LOGIT_COPIES * LOGIT_BYTES * (config.get("vocab_size") or 0) + kept
    return need.weights_bytes + micro_batch_tokens(spec) * per_token


def shared_server_bytes(spec) -> int | None:
    """What one local server holds on a GPU it shares with the trainer: weights, its fixed KV cache, its runtime."""
    need = footprint(spec.model, spec.replica_max_model_len)
    return None if need is None else need.weights_bytes + SHARED_SERVER_KV_BYTES + SERVER_OVERHEAD_BYTES


def slower_problem(spec) -> str | None:
    """Why this many servers a GPU is refused where the replica shares the trainer's GPU, or None."""
    if spec.servers_per_gpu < SLOWER_FROM:
        return None
    return (f"{spec.servers_per_gpu} vLLM servers share the trainer's GPU here, and {measured_reason()}: use 1 "
            "server a GPU here, or give the replica a GPU of its own (a machine with a GPU for the trainer and one for "
            "each replica), where 4 servers generated x4.43 what one did")


def slower_warning(spec) -> str | None:
    """A preview's warning for 2 or 3 servers on the trainer's GPU (measured no faster, near the card's memory)."""
    if not 1 < spec.servers_per_gpu < SLOWER_FROM:
        return None
    return f"{spec.servers_per_gpu} servers a GPU on the trainer's GPU gain nothing measured: {measured_reason()}"


def memory_problem_beside_trainer(spec, gpu_bytes: int) -> str | None:
    """Why the replicas' servers do not fit beside the trainer's estimated peak on one GPU of `gpu_bytes`, or None
    (also where either cannot be sized). Only added servers are refused: one server beside the trainer is what a run
    on one GPU always was, and the estimate is not good enough to refuse a run that has no other choice."""
    trainer, server = trainer_peak_bytes(spec), shared_server_bytes(spec)
    if spec.servers_per_gpu <= 1 or trainer is None or server is None:
        return None
    servers = spec.replicas * spec.servers_per_gpu
    if trainer + servers * server <= gpu_bytes:
        return None
    most = (gpu_bytes - trainer) // server // spec.replicas
    fix = (f"lower servers_per_gpu to {most}" if most >= 1 else
           "use 1 server a GPU, lower max_tokens_per_batch (each micro-batch token holds its logits), turn on "
           "gradient_checkpointing")
    return (f"the trainer and {servers} vLLM server(s) share this machine's GPU ({gib(gpu_bytes)}): the trainer's peak "
            f"is ~{gib(trainer)} (estimated: {micro_batch_tokens(spec):,}-token micro-batches of {spec.model}) and "
            f"each server holds ~{gib(server)} (weights, a {gib(SHARED_SERVER_KV_BYTES)} KV cache, runtime), "
            f"{gib(trainer + servers * server)} in all: {fix}, fewer replicas, or give the replicas GPUs of their own")


def shared_gpu_problems(spec, gpu_bytes: int | None) -> list[str]:
    """Every reason to refuse a run whose replicas share the trainer's GPU (of `gpu_bytes`; None: not known)."""
    problems = [slower_problem(spec), memory_problem_beside_trainer(spec, gpu_bytes) if gpu_bytes else None]
    return [p for p in problems if p]


def _config(model: str) -> dict | None:
    if model in BUILTIN_MODELS:
        return model_config(model)
    try:
        with open(os.path.join(os.path.expanduser(model), "config.json")) as f:
            config = json.load(f)
        return config if isinstance(config.get("hidden_size"), int) and \
            isinstance(config.get("num_hidden_layers"), int) else None
    except (OSError, ValueError, AttributeError):
        return None
