"""The proxy as a child process of the trainer that starts it (`python -m runtime.serving.proxy`), and what that
process does for itself: it dies with its parent, and lifts its open-file limit.
"""

import ctypes
import json
import os
import resource
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request


class ProxyProcess:
    """A proxy running as a child process: its event loop shares no GIL with the trainer that starts it, which
    held a proxy thread to ~0.7x of a replica's direct throughput at concurrency 8."""

    def __init__(self, proc: subprocess.Popen, url: str):
        self.proc, self.url = proc, url
        self._stop_lock = threading.Lock()

    def stats(self) -> dict:
        with urllib.request.urlopen(f"{self.url}/proxy/stats", timeout=10) as response:
            return json.load(response)

    def stop(self, grace_s: float = 10.0) -> None:
        """Stop serving (idempotent: a stopping trainer may ask twice, from two threads)."""
        with self._stop_lock:
            if self.proc.poll() is None:
                self.proc.terminate()
                try:
                    self.proc.wait(timeout=grace_s)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait()


def start_proxy_process(replica_urls: list[str], *, stats_dir: str | None = None, token: str | None = None,
                        port: int = 0, host: str = "127.0.0.1", start_timeout_s: float = 60.0,
                        member: str | None = None, member_cap: int = 0) -> ProxyProcess:
    """Start `python -m runtime.serving.proxy` as a child that dies with its parent; returns once it answers /health.
    `host` 0.0.0.0 serves it on every interface too (a private-network trainer exposes it to the panel). `member`: a
    sweep member's tag (its replicas are shared), with at most `member_cap` generations in flight (0: no cap)."""
    if not port:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
    package = __name__.rsplit(".", 1)[0]     # "runtime" in a job, "backend.runtime" in the panel's tests
    command = [sys.executable, "-m", f"{package}.proxy", "--host", host, "--port", str(port),
               "--parent-pid", str(os.getpid())]
    for url in replica_urls:
        command += ["--replica", url]
    if stats_dir:
        command += ["--stats-dir", stats_dir]
    if member:
        command += ["--member", member, "--member-cap", str(member_cap)]
    env = {**os.environ, **({"HF_TOKEN": token} if token else {})}
    proc = subprocess.Popen(command, env=env)
    handle = ProxyProcess(proc, f"http://127.0.0.1:{port}")
    deadline = time.monotonic() + start_timeout_s
    while True:
        try:
            urllib.request.urlopen(f"{handle.url}/health", timeout=2).close()
            return handle
        except urllib.error.HTTPError:
            return handle            # 503 (no replica healthy yet) still means the proxy is serving
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                handle.stop()
                raise RuntimeError(f"the proxy did not start (exit code {proc.poll()})") from None
            time.sleep(0.2)


def raise_open_files_limit() -> int:
    """Lift this process's open-file limit to its hard limit, and return it: each generation in flight holds a
    socket in the trainer's rollout worker and two in the proxy, and a soft limit of 1024 (common in containers)
    would refuse the trainer's 1024 in flight with "Too many open files". Children inherit it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            return hard
        except (ValueError, OSError):
            return soft
    return soft


def die_with_parent(parent_pid: int) -> None:
    """Get SIGTERM when the parent dies, however it dies (a SIGKILLed or OOM-killed trainer): a proxy alone
    would keep a job's process group, and its bill, alive."""
    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)
    if os.getppid() != parent_pid:       # the parent died before the line above took effect
        sys.exit("the process that started this proxy is gone")
