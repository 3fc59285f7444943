"""What each of a replica job's vLLM servers is started with: its command (its port, a dtype where CUDA is absent,
the run's key, the CPU build's CLI, its share of the GPU: gpu_split.py) and its environment (its cores, its GPU, a
compile cache of its own).
"""

import os
import shutil
import subprocess
import sys

from .gpu_split import SERVER_OVERHEAD_BYTES, gib, server_memory_args
from .replica_key import MIDDLEWARE as KEY_MIDDLEWARE
from .replica_key import REPLICA_KEY_ENV
from .vllm_cli import has_vllm_distribution

VLLM_PORT = "8000"      # `vllm serve`'s port where its command names none


def option_value(command: list[str], option: str, default: str | None = None) -> str | None:
    """The last value the command gives `option` (`--opt V` or `--opt=V`), else `default`."""
    value = default
    for i, arg in enumerate(command):
        if arg == option and i + 1 < len(command):
            value = command[i + 1]
        elif arg.startswith(option + "="):
            value = arg.split("=", 1)[1]
    return value


def job_ports(command: list[str], ports: list[str] | None) -> list[str]:
    """This job's servers' ports: each of `--ports`, else the command's `--port` (vLLM's 8000 where it names none)."""
    return list(ports) if ports else [option_value(command, "--port", VLLM_PORT)]


def server_urls(command: list[str], ports: list[str] | None) -> list[str]:
    """Where this job's servers answer on its own machine; a server listens on loopback or on every interface."""
    return [f"http://127.0.0.1:{port}" for port in job_ports(command, ports)]


def with_dtype_without_cuda(command: list[str], dtype: str | None, cuda_available) -> list[str]:
    """The server command, with `--dtype dtype` added where CUDA is absent and the command names no dtype."""
    if dtype and "--dtype" not in command and not cuda_available():
        return [*command, "--dtype", dtype]
    return command


def vllm_script_works() -> bool:
    """Whether `vllm` on PATH can start: the script is there (an install into a folder on PYTHONPATH has none) and
    its distribution is named vllm (the CPU build's is not)."""
    return shutil.which("vllm") is not None and has_vllm_distribution()


def with_key(command: list[str], env=os.environ) -> list[str]:
    """The server command, demanding the run's key on every route but /health where the job (`env`) has one."""
    if env.get(REPLICA_KEY_ENV):
        return [*command, "--middleware", KEY_MIDDLEWARE]
    return command


def server_command(command: list[str], script_works=vllm_script_works) -> list[str]:
    """The command to start: `vllm ARGS` as given where the `vllm` script works, else vLLM's same CLI run by this
    interpreter through `runtime.serving.vllm_cli` (the CPU build, or vLLM installed without its scripts)."""
    if command[:1] == ["vllm"] and not script_works():
        return [sys.executable, "-m", f"{__package__}.vllm_cli", *command[1:]]
    return command


def cuda_available() -> bool:
    import torch  # noqa: PLC0415 heavy: only to ask about CUDA

    return torch.cuda.is_available()


def with_option(command: list[str], option: str, value: str | None) -> list[str]:
    """The command with `option` set to `value` (None: removed), whether it held the option or not."""
    out, skip = [], False
    for arg in command:
        if skip:
            skip = False
        elif arg == option:
            skip = True
        elif not arg.startswith(option + "="):
            out.append(arg)
    return out if value is None else [*out, option, value]


def server_commands(command: list[str], ports: list[str], memory_args: list[str] | None = None) -> list[list[str]]:
    """One server command per port: the given command on that port, with `memory_args` (gpu_split) where given."""
    commands = []
    for port in ports:
        one = with_option(command, "--port", port)
        for option, value in zip(memory_args[::2], memory_args[1::2]) if memory_args else ():
            one = with_option(one, option, value)
        commands.append(one)
    return commands


def server_envs(count: int, cpu_binds: list[str] | None, gpus: int, per_gpu: int, env=os.environ) -> list[dict]:
    """Each server's own environment: its cores, its GPU (servers 0..per_gpu-1 on the first), and, with several
    servers, a vLLM compile cache of its own (they compile at the same moment)."""
    visible = [g for g in (env.get("CUDA_VISIBLE_DEVICES") or "").split(",") if g] or [str(g) for g in range(gpus)]
    cache = env.get("VLLM_CACHE_ROOT") or os.path.expanduser("~/.cache/vllm")
    out = []
    for k in range(count):
        own = {"VLLM_CPU_OMP_THREADS_BIND": cpu_binds[k]} if cpu_binds else {}
        if gpus > 1:
            own["CUDA_VISIBLE_DEVICES"] = visible[min(k // max(per_gpu, 1), len(visible) - 1)]
        if count > 1:
            own["VLLM_CACHE_ROOT"] = os.path.join(cache, f"server-{k}")
        out.append(own)
    return out


def gpu_memory_args(split: float | None, per_gpu: int, model_bytes: int) -> list[str] | None:
    """Each server's share of its GPU and fixed KV cache, from the GPU's real memory; None without a split or a GPU.
    Exits where the servers cannot fit (the plan refuses what it can size; a Ray node's GPU it cannot)."""
    if not split or per_gpu <= 1 or not cuda_available():
        return None
    total = gpu_total_bytes()
    args = server_memory_args(total, split, per_gpu, model_bytes)
    if int(args[-1]) <= 0:
        sys.exit(f"{per_gpu} vLLM servers cannot share this GPU ({gib(total)}, a share of {split:g}): each would "
                 f"have {gib(split * total / per_gpu)} for {gib(model_bytes)} of weights and "
                 f"~{gib(SERVER_OVERHEAD_BYTES)} of runtime; lower servers_per_gpu")
    return args


def gpu_total_bytes() -> int:
    """The first visible GPU's memory, asked by a child process: CUDA in this wrapper would keep a context (0.5 GiB
    on an H200) on the GPU its servers share for as long as they run."""
    asked = subprocess.run([sys.executable, "-c", "import torch; print(torch.cuda.mem_get_info()[1])"],
                           capture_output=True, text=True, timeout=300, check=True)
    return int(asked.stdout.split()[-1])
