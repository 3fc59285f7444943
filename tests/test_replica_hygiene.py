"""A replica starts whatever TMPDIR is, and a killed job leaves nothing in shared memory."""

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import requests

from backend.plan.vllm_args import vllm_serve_command, vllm_server_args, vllm_server_env
from backend.runtime.job import job_wrapper
from backend.runtime.job.shm import SHM_FILE
from backend.runtime.records import write_event
from backend.runtime.tiny_model import ensure_tiny_model

pytestmark = [pytest.mark.integration, pytest.mark.full]

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BACKEND = os.path.join(ROOT, "backend")
START_TIMEOUT_S = 400


def _wrapped(job_dir, command, tmpdir=None, env=None):
    """A job as LocalExecutor starts one: the job wrapper (its own session) around `command`."""
    line = job_wrapper.wrapper_command(sys.executable, str(job_dir), command, timeout_s=900, attempts=1,
                                       grace_s=5, tmpdir=tmpdir)
    return subprocess.Popen(line, cwd=BACKEND, env={**os.environ, "PYTHONPATH": BACKEND, **(env or {})},
                            stdout=open(os.path.join(job_dir, "log.txt"), "ab"), stderr=subprocess.STDOUT,
                            start_new_session=True)


def _kill(proc):
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)


def _command_pgid(job_dir) -> int:
    """The job command's process group (its pid), from the wrapper's process.json."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            with open(os.path.join(job_dir, job_wrapper.PROCESS_FILE)) as f:
                return json.load(f)["pid"]
        except (OSError, ValueError, KeyError):
            time.sleep(0.2)
    raise AssertionError("the wrapper never started the command")


def test_a_replica_whose_tmpdir_is_60_characters_long_starts_and_serves(tmp_path):
    """The panel's TMPDIR 60 characters long, the job's own temp dir inside it (as LocalExecutor makes it): vLLM's
    socket paths would pass a Unix socket's 107 bytes there."""
    base = tempfile.mkdtemp(prefix="tmpdir-", dir="/tmp")
    system_tmp = os.path.join(base, "t" * (60 - len(base) - 1))
    job_tmp = Path(system_tmp, "grpo-job-abcdef-k2j4h5l6")
    job_tmp.mkdir(parents=True)
    assert len(system_tmp) == 60
    run_dir, job_dir = tmp_path / "run", tmp_path / "job"
    job_dir.mkdir()
    model = ensure_tiny_model(str(run_dir / "base-model"))
    with socket_port() as port:
        pass
    serve = vllm_serve_command(vllm_server_args(model, port, 8, 1, host="127.0.0.1", dtype="float32"))
    command = [sys.executable, "-m", "runtime.serving.serve_replica", "--run-dir", str(run_dir), "--", *serve]
    env = {**vllm_server_env(cpu=True), "TMPDIR": str(job_tmp), "VLLM_CPU_OMP_THREADS_BIND": "0"}
    env_clean = {k: v for k, v in os.environ.items() if k != "VLLM_RPC_BASE_PATH"}
    proc = _wrapped(job_dir, command, tmpdir=str(job_tmp), env={**env_clean, **env})
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not _healthy(port):
            log = (job_dir / "log.txt").read_text(errors="replace")
            assert proc.poll() is None and time.monotonic() < deadline, f"the replica did not start:\n{log[-3000:]}"
            time.sleep(2)
        answer = requests.post(f"http://127.0.0.1:{port}/v1/completions", timeout=120,
                               json={"model": model, "prompt": "1 + 1 =", "max_tokens": 4}).json()
        assert answer["choices"][0]["text"] is not None
        write_event(str(run_dir), "trainer", "finished")     # the replica stops with its trainer
        assert proc.wait(120) == 0
        assert not job_tmp.exists(), "the job's temp dir goes with it"
    finally:
        _kill(proc)
        shutil.rmtree(base, ignore_errors=True)


class socket_port:
    """A free loopback port (the socket closed again before the server binds it)."""

    def __enter__(self) -> int:
        import socket

        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        return self.sock.getsockname()[1]

    def __exit__(self, *exc):
        self.sock.close()


def _healthy(port: int) -> bool:
    try:
        return requests.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200
    except requests.RequestException:
        return False


SHM_HOLDER = """
import sys, time
from multiprocessing import shared_memory
segment = shared_memory.SharedMemory(create=True, size=1 << 20)   # as vLLM's engine and workers keep theirs
segment.buf[:4] = b"grpo"
print(segment.name, flush=True)
time.sleep(600)
"""


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="no /dev/shm on this machine")
@pytest.mark.parametrize("killed", ["the job", "the job and its wrapper"])
def test_shared_memory_a_sigkilled_job_left_is_removed(tmp_path, killed):
    from backend.executors.local import LocalExecutor

    job_dir = tmp_path / "jobs" / "run--vllm-0--abc123"
    job_dir.mkdir(parents=True)
    proc = _wrapped(job_dir, [sys.executable, "-c", SHM_HOLDER])
    try:
        pgid = _command_pgid(job_dir)
        record = job_dir / SHM_FILE
        deadline = time.monotonic() + 60
        while not (record.exists() and json.loads(record.read_text())):
            assert time.monotonic() < deadline, "the wrapper never noted the job's shared memory"
            time.sleep(0.2)
        (segment,) = json.loads(record.read_text())
        assert os.path.exists(segment) and segment.startswith("/dev/shm/")
        if killed == "the job and its wrapper":
            os.killpg(proc.pid, signal.SIGKILL)      # the wrapper's session: nothing of it removes anything
            proc.wait(30)
        os.killpg(pgid, signal.SIGKILL)              # the job and its resource tracker, which would unlink it
        _wait_gone(pgid)
        if killed == "the job":
            assert proc.wait(60) == 1
        else:
            assert os.path.exists(segment), "nobody removed it yet"
            with open(job_dir / "job.json", "w") as f:
                json.dump({"job_id": job_dir.name, "spec": {"run_id": "run", "role": "vllm-0"}, "created_at": 0,
                           "pid": proc.pid}, f)
            LocalExecutor(str(tmp_path)).status(job_dir.name)   # the panel looks at the ended job
        assert not os.path.exists(segment), "the killed job's shared memory is still in /dev/shm"
    finally:
        _kill(proc)
        for path in json.loads((job_dir / SHM_FILE).read_text()) if (job_dir / SHM_FILE).exists() else []:
            if os.path.exists(path):
                os.unlink(path)


def _wait_gone(pgid: int) -> None:
    """Until no process of the group is left, zombies included (the machine's init reaps them)."""
    deadline = time.monotonic() + 60
    while job_wrapper.group_alive(pgid):
        assert time.monotonic() < deadline, "the killed group never went"
        time.sleep(0.1)


def _replica_job(run_dir, role: str, attempt: int):
    """A replica job's serve_replica whose server fails at start (as with a socket path too long), on `attempt`."""
    server = [sys.executable, "-c", "import sys; print('vLLM failed to start', flush=True); sys.exit(1)"]
    env = {**os.environ, "PYTHONPATH": BACKEND, "GRPO_ATTEMPT": str(attempt)}
    return subprocess.run([sys.executable, "-m", "runtime.serving.serve_replica", "--run-dir", str(run_dir),
                           "--role", role, "--", *server], env=env, capture_output=True, text=True, timeout=120)


def test_a_trainer_whose_every_replica_job_ended_for_good_fails_at_once_with_that_cause(tmp_path):
    from backend.runtime.serving.proxy_process import start_proxy_process
    from backend.runtime.serving.run_ends import replicas_ended
    from backend.runtime.trainer.replica_wait import ReplicasEndedError, replicas_gone, wait_for_replicas

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "spec.json").write_text(json.dumps({"attempts": 2, "replicas": 2}))
    write_event(str(run_dir), "trainer", "failed", error="an earlier launch's trainer")   # before these replicas
    with socket_port() as a, socket_port() as b:
        urls = [f"http://127.0.0.1:{a}", f"http://127.0.0.1:{b}"]
    proxy = start_proxy_process(urls)
    try:
        gone = replicas_gone(str(run_dir), 2)
        assert _replica_job(run_dir, "vllm-0", 1).returncode == 1
        assert _replica_job(run_dir, "vllm-0", 2).returncode == 1       # vllm-0 has no attempt left
        assert _replica_job(run_dir, "vllm-1", 1).returncode == 1       # vllm-1 has one
        assert set(replicas_ended(str(run_dir))) == {"vllm-0"}
        assert gone() is None, "a replica job with an attempt left may still serve"
        assert _replica_job(run_dir, "vllm-1", 2).returncode == 1
        began = time.monotonic()
        with pytest.raises(ReplicasEndedError) as failure:
            wait_for_replicas(proxy.url, 900, gone)                       # the trainer's default --replica-wait
        assert time.monotonic() - began < 900
        assert "every vLLM replica job has ended" in str(failure.value)
        assert "vllm-0: its vLLM server exited with code 1 on attempt 2 of 2" in str(failure.value)
        from backend.runtime.job.attempt import retry_helps

        assert not retry_helps(failure.value), "another trainer attempt would find no replica either"
    finally:
        proxy.stop()
