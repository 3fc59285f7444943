"""Several vLLM servers on one replica job (`servers_per_gpu`): how many a job runs, on which ports, and whether the
replica's GPU memory holds them for the run's model and context. Pure functions; a local model folder's config is
read to size it.

To the trainer's proxy every server is a replica of its own (health, adapter loads, affinity, the canary), so the
proxy needs no other change. On HF Jobs' private network the trainer reaches each server at the replica's alias and
the server's own port; with exposed ports each server's port is exposed. An in-job router behind one port would add
a hop, and the canary would then prove the router rather than each server (docs/replica-scaling.md measures both).
"""

import json
import os
import re
from dataclasses import dataclass

from backend.runtime.serving.gpu_split import SERVER_OVERHEAD_BYTES, gib, kv_cache_bytes
from backend.runtime.tiny_model import BUILTIN_MODELS, model_config

MAX_SERVERS_PER_GPU = 8
SERVED_BYTES_PER_PARAM = 2   # vLLM serves a float32 checkpoint in 16 bits on a GPU ("auto" dtype)
ASSUMED_CONTEXT = 32768      # a Hub model sized by its name: the context most current models declare
# A Hub model sized by its name: KV-cache bytes a token per parameter. Qwen2.5 0.5B-7B hold 12-56 KiB a token
# (2 x layers x KV heads x head size x 2 bytes), 2.4e-5 to 0.8e-5 of their parameters: the larger figure, so the
# check errs towards refusing.
KV_BYTES_PER_PARAM = 2.4e-5
# "Qwen2.5-Math-1.5B", "Llama-3.1-8B-Instruct", "SmolLM2-135M", "Mixtral-8x7B": a size in billions or millions.
SIZE_IN_NAME = re.compile(r"(?<![\w.])(?:(\d+)x)?(\d+(?:\.\d+)?)([bm])(?![a-z])", re.IGNORECASE)


@dataclass(frozen=True)
class Footprint:
    """What one server of a model holds on a GPU besides its overhead: weights, and a KV cache for `context` tokens."""

    weights_bytes: int
    kv_bytes_per_token: int
    context: int
    sized_by: str       # "its config" or "its name (estimated)"

    @property
    def one_sequence_bytes(self) -> int:
        """vLLM refuses to start when its KV cache cannot hold one sequence of the full context."""
        return self.kv_bytes_per_token * self.context


def config_footprint(config: dict, context: int) -> Footprint:
    """A decoder's served weights and KV bytes a token, from its config.json."""
    hidden, layers = config["hidden_size"], config["num_hidden_layers"]
    heads = config["num_attention_heads"]
    head_dim = config.get("head_dim") or hidden // heads
    kv_heads = config.get("num_key_value_heads") or heads
    vocab = config.get("vocab_size") or 0
    attention = hidden * head_dim * (2 * heads + 2 * kv_heads)
    mlp = 3 * hidden * config.get("intermediate_size", 4 * hidden)
    params = vocab * hidden * (1 if config.get("tie_word_embeddings") else 2) + layers * (attention + mlp)
    return Footprint(params * SERVED_BYTES_PER_PARAM, 2 * layers * kv_heads * head_dim * SERVED_BYTES_PER_PARAM,
                     context or config.get("max_position_embeddings") or ASSUMED_CONTEXT, "its config")


def name_footprint(model: str, context: int) -> Footprint | None:
    """A Hub model's footprint estimated from the size its name states ("...-1.5B"), or None."""
    match = SIZE_IN_NAME.search(model.rsplit("/", 1)[-1])
    if not match:
        return None
    experts, size, unit = match.groups()
    params = float(size) * (1e9 if unit.lower() == "b" else 1e6) * int(experts or 1)
    return Footprint(int(params * SERVED_BYTES_PER_PARAM), int(params * KV_BYTES_PER_PARAM),
                     context or ASSUMED_CONTEXT, "its name (estimated)")


def footprint(model: str, context: int = 0) -> Footprint | None:
    """What one server of `model` needs (`context`: the replica's --max-model-len, 0: the model's own), or None
    where nothing says: a Hub id that names no size, a folder without a readable config."""
    if model in BUILTIN_MODELS:
        return config_footprint(model_config(model), context)
    config_path = os.path.join(os.path.expanduser(model), "config.json")
    if os.path.isfile(config_path):
        try:
            with open(config_path) as f:
                return config_footprint(json.load(f), context)
        except (OSError, ValueError, KeyError, TypeError, ZeroDivisionError):
            return None
    return name_footprint(model, context)


def unsized_problem(spec) -> str | None:
    """Why several servers a GPU cannot be sized for the spec's model, or None (one server needs no sizing)."""
    if spec.mode != "distributed" or spec.servers_per_gpu <= 1 or footprint(spec.model) is not None:
        return None
    return (f"{spec.servers_per_gpu} servers a GPU each get a fixed part of its memory, sized from the model's "
            f"weights, but {spec.model!r} has no config here and its name states no size (such as '-1.5B'): use 1, "
            "or a local model folder")


def memory_problem(spec, gpu_bytes: float, share: float, servers: int, where: str) -> str | None:
    """Why `servers` servers of the spec's model, each with 1/servers of `share` of a GPU of `gpu_bytes`, do not
    fit (with a KV cache for one sequence of the replica's context), or None."""
    need = footprint(spec.model, spec.replica_max_model_len)
    if need is None or servers <= 1:
        return None
    kv = kv_cache_bytes(int(gpu_bytes), share, servers, need.weights_bytes)
    if kv >= need.one_sequence_bytes:
        return None
    most = max((k for k in range(1, servers) if kv_cache_bytes(int(gpu_bytes), share, k, need.weights_bytes)
                >= need.one_sequence_bytes), default=0)
    fits = f"at most {most} fit" if most > 1 else "only one fits"
    return (f"{servers} vLLM servers on {where} ({gib(gpu_bytes)}, a share of {share:g}) leave each "
            f"{gib(share * gpu_bytes / servers)}, but {spec.model} needs {gib(need.weights_bytes)} of weights (by "
            f"{need.sized_by}), ~{gib(SERVER_OVERHEAD_BYTES)} of runtime and {gib(need.one_sequence_bytes)} of KV "
            f"cache for one {need.context:,}-token sequence: {fits}; lower servers_per_gpu, the replica context "
            "(replica_max_model_len), or pick a GPU with more memory")


def servers_per_job(servers_per_gpu: int, gpus: int) -> int:
    """Servers a replica job starts: `servers_per_gpu` on each of its GPUs (a CPU job counts as one)."""
    return servers_per_gpu * max(gpus, 1)


def server_ports(first: int, count: int) -> list[int]:
    """Each server's port on a machine of its own: `first` and those after it."""
    return [first + k for k in range(count)]
