"""How K vLLM servers of one replica job share a GPU: each gets 1/K of the replica's share of its memory, as a fixed
KV cache. Pure functions: the plan checks a RunSpec with them (a flavor's GPU memory), `serve_replica` sizes its
servers with them (the GPU's real memory).

Why several servers at all: with TRL's request body one server is bound by its API server's main thread, at a
fraction of an H200 (docs/replica-scaling.md); each added server brings its own API server and engine core.
Why a fixed KV cache: vLLM sizes its cache by profiling the GPU's free memory, and a sibling server starting at the
same moment counts as its own use ("No available memory for the cache blocks"). With `--kv-cache-memory-bytes`
vLLM skips that; `--gpu-memory-utilization` must still be at most the server's share, since each server checks at
start that the GPU has that much free.
"""

import math

# What one server holds besides its weights and KV cache: the CUDA context, the activations of its largest batch,
# CUDA graphs, the sampler's buffers (what an H200 server held: docs/replica-scaling.md).
SERVER_OVERHEAD_BYTES = 3 * 2**30
MIN_SHARE = 0.01


def server_share(share: float, servers: int) -> float:
    """Each server's `--gpu-memory-utilization`: its part of the replica's `share`, rounded down."""
    return max(math.floor(share / servers * 100) / 100, MIN_SHARE)


def kv_cache_bytes(gpu_bytes: int, share: float, servers: int, model_bytes: int) -> int:
    """Each server's KV cache: its part of the share, less its weights and overhead (negative: it does not fit)."""
    return int(share * gpu_bytes / servers) - model_bytes - SERVER_OVERHEAD_BYTES


def server_memory_args(gpu_bytes: int, share: float, servers: int, model_bytes: int) -> list[str]:
    """The vLLM options that size one of `servers` servers on a GPU of `gpu_bytes`."""
    return ["--gpu-memory-utilization", str(server_share(share, servers)),
            "--kv-cache-memory-bytes", str(kv_cache_bytes(gpu_bytes, share, servers, model_bytes))]


def gib(n: float) -> str:
    return f"{n / 2**30:.1f} GiB"
