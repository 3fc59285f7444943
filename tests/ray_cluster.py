"""A real one-node Ray cluster for tests: `ray start --head --block` on free ports, its own temp dir, a small object
store, stopped by PID (its process tree and its process group, SIGTERM then SIGKILL), also when the test failed.

Ray's workers and job supervisors leave the head's process group (each its own), so the stop takes the whole tree
found under the `ray start` process as well as its group.
"""

import contextlib
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

import psutil
from browser_helpers import free_port, tail

PORT_FLAGS = ("port", "dashboard-port", "dashboard-agent-listen-port", "dashboard-agent-grpc-port",
              "runtime-env-agent-port", "metrics-export-port", "node-manager-port", "object-manager-port",
              "ray-client-server-port")
OBJECT_STORE_BYTES = 100 * 2**20


@contextlib.contextmanager
def ray_cluster(num_cpus: int = 4, startup_s: float = 120.0):
    """Yields the cluster's dashboard address (what RAY_ADDRESS names)."""
    temp = tempfile.mkdtemp(prefix="ray-", dir="/tmp")    # Ray's socket paths must stay short
    # The workers' 200 ports, in Ray's own worker band (10002-19999), where no free_port() falls: a panel or vLLM
    # server started on a port picked in that range could find a Ray worker on it (seen: the panel's page answered
    # by a worker's gRPC). Ray refuses a component port inside that range; free_port() picks above it.
    low = random.randrange(10002, 19999 - 200)
    ports = {flag: free_port() for flag in PORT_FLAGS}     # never the same port twice
    args = [os.path.join(os.path.dirname(sys.executable), "ray"), "start", "--head", "--block",
            "--node-ip-address", "127.0.0.1", "--dashboard-host", "127.0.0.1", "--include-dashboard=true",
            "--num-cpus", str(num_cpus), "--num-gpus", "0", "--object-store-memory", str(OBJECT_STORE_BYTES),
            "--temp-dir", temp, "--disable-usage-stats", "--min-worker-port", str(low),
            "--max-worker-port", str(low + 200)]
    for flag, port in ports.items():
        args += [f"--{flag}", str(port)]
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS" and not k.startswith("HF_TOKEN")}
    log_path = os.path.join(temp, "ray-start.log")
    log = open(log_path, "wb")
    # Ray's memory monitor kills jobs when the *machine* is short of memory: on a machine shared with other test
    # runs it killed this cluster's jobs for memory other processes held.
    env.update(RAY_USAGE_STATS_ENABLED="0", RAY_memory_monitor_refresh_ms="0")
    proc = subprocess.Popen(args, env=env, stdout=log, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    address = f"http://127.0.0.1:{ports['dashboard-port']}"
    try:
        deadline = time.time() + startup_s
        while not _jobs_api_answers(address):
            assert proc.poll() is None, tail(log_path)
            assert time.time() < deadline, f"Ray did not start within {startup_s:.0f} s:\n{tail(log_path)}"
            time.sleep(0.5)
        yield address
    finally:
        stop(proc)
        log.close()
        shutil.rmtree(temp, ignore_errors=True)


def _jobs_api_answers(address: str) -> bool:
    try:
        with urllib.request.urlopen(f"{address}/api/jobs/", timeout=2) as answer:
            return answer.status == 200
    except OSError:
        return False


def stop(proc: subprocess.Popen, grace_s: float = 5.0) -> None:
    """The `ray start` process, every process under it and its process group: SIGTERM, then SIGKILL."""
    try:
        tree = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        tree = []
    for p in tree:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.terminate()
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    _, alive = psutil.wait_procs(tree, timeout=grace_s)
    for p in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    psutil.wait_procs(alive, timeout=grace_s)
    proc.wait(timeout=grace_s)
