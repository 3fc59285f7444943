"""Recipe: RunSpec -> JobSpecs. Pure functions, no I/O; the launch form previews exactly what they return.

Colocated: one trainer job (TRL GRPOTrainer; vLLM inside the training process on GPUs).
Distributed: N vLLM replica jobs, then one trainer job whose proxy fronts the replicas. The trainer's
JobSpec needs the replicas' URLs, which exist only once they are submitted, so it is built afterwards.
"""

import dataclasses
import hashlib
import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field

from backend.plan.engines.base import Placement
from backend.plan.jobspec import (
    APP_LABEL_VALUE,
    LABEL_APP,
    LABEL_ROLE,
    LABEL_RUN,
    JobSpec,
    VolumeSpec,
    flat_code_command,
)
from backend.plan.servers import footprint, server_ports, servers_per_job
from backend.plan.spec import RunSpec
from backend.plan.vllm_args import vllm_serve_command, vllm_server_args
from backend.runtime import layout, rewards
from backend.runtime.layout import FLEET_DIR_ENV
from backend.runtime.serving.cpu_pinning import PROXY_CORE_ENV
from backend.runtime.serving.proxy_env import (
    PROXY_HOST_ENV,
    PROXY_PORT_ENV,
    REPLICA_AUTH_ENV,
    REPLICA_KEY_ENV,
    REPLICAS_ENV,
)
from backend.runtime.tiny_model import BUILTIN_MODELS
from backend.runtime.user_code import imported_modules

# Pinned: vLLM's flags and TRL's trainer are part of the recipe. TRL 1.16 supports vLLM 0.22-0.31.
TRL_VERSION = "1.16.0"
PEFT_VERSION = "0.21.2"
VLLM_IMAGE = RunSpec.image   # the default; a run's jobs use its spec.image
RUNTIME_PIP = f"trl=={TRL_VERSION} peft=={PEFT_VERSION}"
TRACKIO_PIP = "trackio==0.43.0"   # as requirements-runtime.txt pins it (works with huggingface_hub 2.x)
REPLICA_PORT = 8000
PROXY_PORT = 8000          # a private-network trainer's one exposed port: its proxy, for the panel (visitor's token)
NETWORK_PREFIX = "${HF_NETWORK_GROUP_PREFIX}"   # expanded inside a job: members reach `<prefix><alias>`
TRAINER_ALIAS = "trainer"
GONE_AFTER_ENV, TRAINER_GONE_AFTER_S = "GRPO_TRAINER_GONE_AFTER_S", 90
TOKEN_SECRET = "HF_TOKEN"
# A distributed run's replicas demand it of its trainer (runtime/serving/replica_key.py).
REPLICA_KEY_SECRET = REPLICA_KEY_ENV
REPLICA_URL_PLACEHOLDER = "<vllm-{i} url>"
PY = "__PYTHON__"  # stands for the interpreter until the launcher knows which one (shlex leaves it unquoted)


def reward_packages(spec: RunSpec) -> list[str]:
    """What the run's rewards import beyond TRL (TRL's math rewards and code that imports math_verify)."""
    wanted = {rewards.NEEDS_PACKAGE[r] for r in spec.rewards if r in rewards.NEEDS_PACKAGE}
    wanted |= {rewards.PACKAGE_FOR_IMPORT[m] for m in imported_modules(spec.reward_code)
               if m in rewards.PACKAGE_FOR_IMPORT}
    return sorted(wanted)


def model_path(spec: RunSpec) -> str:
    """Where jobs find the base model: a builtin one is built into the run folder on the spot (a member of a sweep
    on a shared fleet: into the fleet's folder, by the first of its members' trainers, one model for them all)."""
    return f"{fleet_path(spec)}/{layout.BASE_MODEL_DIR}" if spec.model in BUILTIN_MODELS else spec.model


def fleet_path(spec: RunSpec) -> str:
    """The folder of the replicas a run's trainer uses: a sweep member's shared fleet's, else the run's own."""
    return f"{spec.mount_path.rstrip('/')}/{layout.RUNS_DIR}/{spec.fleet}" if spec.fleet else spec.run_path


def _labels(spec: RunSpec, role: str) -> dict[str, str]:
    return {LABEL_APP: APP_LABEL_VALUE, LABEL_RUN: spec.run_id, LABEL_ROLE: role}


def _job(spec: RunSpec, role: str, command: list[str], flavor: str, *, read_only: bool = False,
         env: dict[str, str] | None = None, expose: tuple[int, ...] = (), alias: str | None = None,
         fleet: bool = False) -> JobSpec:
    where = spec.engine
    group = network_group(spec, fleet)
    return JobSpec(
        run_id=spec.run_id, role=role, command=command, timeout_s=spec.timeout_minutes * 60,
        env={"PYTHONPATH": f"{spec.run_path}/code", "PYTHONUNBUFFERED": "1", **(env or {})},
        secrets=(*((TOKEN_SECRET,) if where.needs_token else ()),
                 *((REPLICA_KEY_SECRET,) if where.replicas_need_key and spec.mode == "distributed" else ())),
        volumes=(VolumeSpec(spec.bucket, spec.mount_path, read_only=read_only),),
        expose=expose, labels=_labels(spec, role), attempts=spec.attempts,
        network_group=group, network_aliases=(alias,) if group and alias else (), **where.job_fields(spec, flavor),
    )


def on_private_network(mode: str | None, network: str | None, engine) -> bool:
    """Whether a run's jobs share a private network: a distributed run on private networking, where its engine has
    network groups. Its replicas then expose no port (nothing there a visitor's request could reach): the trainer
    reaches them at their aliases, and only the trainer's proxy port is exposed, behind the visitor's token."""
    return mode == "distributed" and network == "private" and bool(engine.network_groups)


def network_group(spec: RunSpec, fleet: bool = False) -> str | None:
    """The network group of a distributed run on private networking (`on_private_network`), named after the run as
    the Hub wants it (lowercase letters, digits and dashes, at most 46); else None. `fleet`: a sweep member's trainer
    on its sweep's shared fleet joins the fleet's group (named after the fleet's id, as the fleet's own replicas
    are), where it reaches the fleet's replicas at their aliases."""
    if not on_private_network(spec.mode, spec.network, spec.engine):
        return None
    run_id = spec.fleet if fleet and spec.fleet else spec.run_id
    name = re.sub(r"-+", "-", re.sub(r"[^a-z0-9-]", "-", f"grpo-{run_id}".lower())).strip("-")
    if len(name) > 46:
        name = f"{name[:37].rstrip('-')}-{hashlib.sha256(run_id.encode()).hexdigest()[:8]}"
    return name


def trainer_alias(spec: RunSpec, fleet: bool = False) -> str:
    """The alias a trainer claims in its network group: a member's trainer on a shared fleet names its member
    (`trainer-m0`), so the trainers that share the fleet's group are told apart."""
    return f"{TRAINER_ALIAS}-{spec.sweep_member}" if fleet and spec.sweep_member else TRAINER_ALIAS


def replica_alias(i: int) -> str:
    return f"vllm-{i}"


def group_url(alias: str, port) -> str:
    """Where a member of the run's network group reaches `alias` (the job expands the prefix)."""
    return f"http://{NETWORK_PREFIX}{alias}:{port}"


def server_ports_of(job: JobSpec) -> list:
    """The ports of a replica job's servers, in order."""
    return list(job.ports or job.expose or (REPLICA_PORT,))


def shell(spec: RunSpec, steps: list[list[str]], python: str, install: bool) -> list[str]:
    """One `bash -c` line: the image's entrypoint is replaced, so the job states every step itself. A trainer's
    (`install`) starts with `runtime.job.attempt`, before anything is installed: every attempt is recorded, and one
    after a failure that a retry cannot fix stops there."""
    lines = [shlex.join(s) for s in steps]
    if install and spec.engine.installs_runtime:
        trackio = [TRACKIO_PIP] if spec.trackio else []
        lines.insert(0, f"pip install --quiet {' '.join([RUNTIME_PIP, *trackio, *reward_packages(spec)])}")
    if install:
        lines.insert(0, shlex.join([PY, "-m", "runtime.job.attempt", "--run-dir", spec.run_path]))
    lines[-1] = "exec " + lines[-1]
    return ["bash", "-c", " && ".join(lines).replace(PY, shlex.quote(python))]


def _ensure_model_step(spec: RunSpec) -> list[list[str]]:
    if spec.model not in BUILTIN_MODELS:
        return []
    return [[PY, "-m", "runtime.tiny_model", "--out", model_path(spec), "--seed", str(spec.seed), "--name", spec.model]]


def colocated_jobs(spec: RunSpec, python: str = "python", master_port: int | None = None) -> list[JobSpec]:
    """The colocated run's one job. `master_port` (local runs) is the torch.distributed rendezvous port of its
    processes and its vLLM: two local runs at once would otherwise both take 29500, and the second fails with
    EADDRINUSE (seen on two H200s, two 1-GPU runs side by side)."""
    port = ["--main_process_port", str(master_port)] if master_port else []
    if spec.num_processes > 1:
        # accelerate's launcher as a module of the job's own interpreter: an `accelerate` script on the PATH may
        # belong to another Python (a local run's panel environment is not the shell's).
        train = [PY, "-m", "accelerate.commands.launch", "--num_processes", str(spec.num_processes),
                 "--num_machines", "1", *port, "--dynamo_backend", "no", "-m", "runtime.trainer.train"]
    else:
        train = [PY, "-m", "runtime.trainer.train"]
    command = shell(spec, [*_ensure_model_step(spec), [*train, "--run-dir", spec.run_path]], python, install=True)
    env = {"MASTER_PORT": str(master_port)} if master_port else None
    return [_job(spec, "trainer", command, spec.flavor, env=env)]


VLLM_DEFAULT_GPU_SHARE = 0.9         # vLLM's own --gpu-memory-utilization: not repeated in a replica's command


def split_cores(cores: list[int], parts: int) -> list[str]:
    """`parts` disjoint CPU lists (as VLLM_CPU_OMP_THREADS_BIND wants them, "0,1"), one per local replica; with
    fewer cores than replicas they take turns. Without this every vllm-cpu server binds its threads to core 0,
    so two replicas served fewer requests a second than one."""
    cores = sorted(cores)
    if len(cores) < parts:
        return [str(cores[i % len(cores)]) for i in range(parts)]
    size = len(cores) // parts
    return [",".join(map(str, cores[i * size:(i + 1) * size])) for i in range(parts)]


def assign_local_gpus(gpus: list[str], replicas: int) -> tuple[str | None, list[str] | None]:
    """(the trainer's GPU, one GPU per replica) when a local machine has a GPU for each job of a distributed run,
    else (None, None): then every job shares what it sees (the first GPU) and the replicas split half of it."""
    if len(gpus) < replicas + 1:
        return None, None
    return gpus[0], gpus[1:replicas + 1]


def server_count(spec: RunSpec) -> int:
    """The vLLM servers of a distributed run: `servers_per_gpu` on each GPU of each replica job."""
    return spec.replicas * servers_per_job(spec.servers_per_gpu, spec.engine.replica_gpus(spec))


def replica_jobs(spec: RunSpec, ports: list | None = None, python: str = "python",
                 cpu_binds: list | None = None, gpus: list[str] | None = None, slots: int | None = None,
                 member_dirs: tuple[str, ...] = ()) -> list[JobSpec]:
    """One job per replica, each running `servers_per_job` vLLM servers; `ports` (a port or a list of its servers'
    ports per replica), `cpu_binds` (cores per replica, or per server) and `gpus` (a GPU of its own per replica,
    from assign_local_gpus) are for local runs only (one machine, N jobs). A sweep's fleet (`FleetJobs`) gives its
    adapter `slots` and its members' run folders (`member_dirs`): it stops once every member's trainer has ended."""
    where = spec.engine
    count = server_count(spec) // spec.replicas
    ports = ports or [REPLICA_PORT] * spec.replicas
    jobs = []
    for i, port in enumerate(ports):
        mine = _ports(port, count)
        # serve_replica stops the servers once the trainer ends, and waits for a builtin model the trainer
        # builds (replicas mount the bucket read-only).
        wrapper = [PY, "-m", "runtime.serving.serve_replica", "--run-dir", spec.run_path, "--role", f"vllm-{i}"]
        options, wrapper_args = where.replica_server(spec, gpus)
        wrapper += wrapper_args + _server_args(spec, mine, cpu_binds[i] if cpu_binds else None, gpus, options)
        wrapper += [arg for member in member_dirs for arg in ("--member-run-dir", member)]
        if spec.model in BUILTIN_MODELS:
            wrapper += ["--wait-for", model_path(spec)]
        serve = vllm_serve_command(vllm_server_args(model_path(spec), mine[0], spec.lora_r, spec.max_staleness,
                                                    max_model_len=spec.replica_max_model_len or None, slots=slots,
                                                    **options))
        command = shell(spec, [[*wrapper, "--", *serve]], python, install=False)
        env = where.replica_env()
        gap = where.retry_gap_s
        if spec.attempts > 1 and gap:
            # A retried trainer is silent while its job is rescheduled and reinstalled: the replicas wait for it
            # longer than for a trainer that is simply gone (runtime/job/heartbeat.py's 90 s).
            env[GONE_AFTER_ENV] = str(TRAINER_GONE_AFTER_S + gap)
        if cpu_binds and isinstance(cpu_binds[i], str):
            env["VLLM_CPU_OMP_THREADS_BIND"] = cpu_binds[i]
        if gpus:
            env["CUDA_VISIBLE_DEVICES"] = gpus[i]
        # On the run's network group the trainer reaches each server at the replica's alias: no port is exposed.
        expose = () if network_group(spec) else tuple(mine)
        job = _job(spec, f"vllm-{i}", command, spec.vllm_flavor, read_only=True, env=env, expose=expose,
                   alias=replica_alias(i))
        jobs.append(dataclasses.replace(job, ports=tuple(mine)))
    return jobs


def _ports(port, count: int) -> list:
    """A replica's servers' ports: as placed (a list), or its port and those after it."""
    if isinstance(port, (list, tuple)):
        return list(port)
    return server_ports(port, count) if isinstance(port, int) else [port]


def _server_args(spec: RunSpec, ports: list, binds, gpus: list[str] | None, options: dict) -> list[str]:
    """serve_replica's arguments for a job of several servers: each one's port and cores, the job's GPUs, and how
    they split each GPU's memory (the split replaces the engine's own --gpu-memory-utilization)."""
    if len(ports) == 1:
        return []
    args = ["--ports", *map(str, ports)]
    if isinstance(binds, (list, tuple)):
        args += ["--cpu-binds", *binds]
    if spec.engine.replica_gpus(spec) > 1:
        args += ["--gpus", str(spec.engine.replica_gpus(spec))]
    share = spec.engine.replica_gpu_share(spec, gpus)
    need = footprint(spec.model, spec.replica_max_model_len)
    if share and need:
        options.pop("gpu_memory_utilization", None)
        args += ["--split-gpu", f"{share:g}", "--servers-per-gpu", str(spec.servers_per_gpu),
                 "--model-bytes", str(need.weights_bytes)]
    return args


def trainer_job(spec: RunSpec, replica_urls: list[str], python: str = "python", gpu: str | None = None,
                fleet: bool = False, proxy_core: str | None = None) -> JobSpec:
    """The distributed run's trainer; `gpu` pins a local trainer to one GPU (from assign_local_gpus); `fleet`: it
    uses its sweep's shared fleet, whose replicas record their ends in the fleet's folder; `proxy_core`: the core its
    proxy runs on (a local run whose servers have cores of their own)."""
    train = [PY, "-m", "runtime.trainer.train_async", "--run-dir", spec.run_path]
    env = {"CUDA_VISIBLE_DEVICES": gpu} if gpu else {}
    if proxy_core is not None:
        env[PROXY_CORE_ENV] = proxy_core
    if fleet:
        env[FLEET_DIR_ENV] = fleet_path(spec)
    if not network_group(spec, fleet):
        command = shell(spec, [*_ensure_model_step(spec), train], python, install=True)
        return _job(spec, "trainer", command, spec.flavor, env={REPLICAS_ENV: ",".join(replica_urls), **env})
    # Private network: the replicas at their aliases (one --replica each: the URLs together outgrow a preview's
    # line), rollout requests without a token; the proxy listens on every interface of the trainer job, and its one
    # exposed port is what the panel reaches (the proxy, the replicas' stats), with the visitor's token. A member on
    # its sweep's shared fleet joins the fleet's group, under an alias of its own.
    train += [arg for url in replica_urls for arg in ("--replica", url)]
    command = shell(spec, [*_ensure_model_step(spec), train], python, install=True)
    env.update({REPLICA_AUTH_ENV: "none", PROXY_HOST_ENV: "0.0.0.0", PROXY_PORT_ENV: str(PROXY_PORT)})
    return _job(spec, "trainer", command, spec.flavor, env=env, expose=(PROXY_PORT,),
                alias=trainer_alias(spec, fleet), fleet=fleet)


def placeholder_url(i: int, port) -> str:
    """Where a preview says replica `i`'s server on `port` is reached (its URL exists once it is submitted)."""
    name = replica_alias(i) if port in (REPLICA_PORT, None) else f"{replica_alias(i)}:{port}"
    return REPLICA_URL_PLACEHOLDER.replace("vllm-{i}", name)


def flat_code_job(job: JobSpec) -> JobSpec:
    """`job` as a run whose bucket holds the flat runtime runs it: `runtime.trainer.train` -> `runtime.train`."""
    return dataclasses.replace(job, command=flat_code_command(job.command))


@dataclass(frozen=True)
class RunJobs:
    """A run's jobs in the order they are submitted, assembled one way for the preview and the launch: `first()` (a
    colocated run's one job, or a distributed run's replicas), then `trainer(urls)`, which needs the replicas' URLs
    (known once they are submitted). `place` is where the engine starts them (ports, cores, GPUs)."""

    spec: RunSpec
    place: Placement = field(default_factory=Placement)
    # A sweep member's trainer on its sweep's shared fleet: where it reaches the fleet's servers (it starts no
    # replicas of its own). None: the run starts its own (a lone run; a member resumed once its fleet is gone).
    fleet_urls: tuple[str, ...] | None = None
    on_fleet: bool = False      # a preview of a member launched on its sweep's fleet: its trainer alone
    # A resumed run launched before runtime/ had sub-packages: its bucket's code is flat (`runtime/train.py`), and
    # its jobs run that code, so they name its modules as it has them (`flat_code_job`).
    flat_code: bool = False

    def first(self) -> list[JobSpec]:
        spec, place = self.spec, self.place
        if self.fleet_urls is not None:
            return []
        if spec.mode == "colocated":
            jobs = colocated_jobs(spec, python=place.python, master_port=place.master_port)
        else:
            jobs = replica_jobs(spec, ports=place.ports, python=place.python, cpu_binds=place.cpu_binds,
                                gpus=place.replica_gpus)
        return [flat_code_job(j) for j in jobs] if self.flat_code else jobs

    def trainer(self, replica_urls: list[str]) -> JobSpec:
        """A distributed run's trainer, given where it reaches each replica (the fleet's, for a member on one)."""
        urls = list(self.fleet_urls) if self.fleet_urls is not None else replica_urls
        job = trainer_job(self.spec, urls, python=self.place.python, gpu=self.place.trainer_gpu,
                          fleet=self.fleet_urls is not None, proxy_core=self.place.proxy_core)
        return flat_code_job(job) if self.flat_code else job

    def preview(self, replica_url: Callable[[int, object], str] = placeholder_url) -> list[JobSpec]:
        """Every job, each server of replica `i` reached at `replica_url(i, its port)`. A sweep member on a shared
        fleet: its trainer alone, reaching the fleet's servers (`FleetJobs` previews them once for the sweep)."""
        if self.on_fleet and self.fleet_urls is None:
            fleet = FleetJobs((self.spec,), 0, self.spec.lora_r, self.place).jobs()
            urls = server_urls(fleet, lambda i, job, port: replica_url(i, port))
            return [RunJobs(self.spec, self.place, tuple(urls)).trainer(urls)]
        first = self.first()
        if self.spec.mode == "colocated":
            return first
        return [*first, self.trainer(server_urls(first, lambda i, job, port: replica_url(i, port)))]


@dataclass(frozen=True)
class FleetJobs:
    """A sweep's one replica fleet, started once for all its members (an engine with `shared_fleet`): the replica
    jobs of the members' common settings, as a run of its own whose id is the fleet's (the sweep's id: its jobs'
    label, its folder runs/<fleet>/), each server with the adapter slots and rank of every member at once
    (`sweep.fleet_size`), stopping once every member's trainer has ended. `place`: the engine's placement of
    `spec` (ports, cores, GPUs)."""

    members: tuple[RunSpec, ...]
    slots: int
    rank: int
    place: Placement = field(default_factory=Placement)

    @property
    def spec(self) -> RunSpec:
        """The fleet as a run's settings: the first member's (what the fleet serves is one for all), its own id and
        name, the largest rank; it is no member itself."""
        first = self.members[0]
        sweep_name = first.name.removesuffix(f"-{first.sweep_member}")     # the members' `<sweep name>-m0`
        return dataclasses.replace(first, run_id=first.fleet, name=f"{sweep_name[:58]}-fleet", lora_r=self.rank,
                                   sweep_id="", sweep_member="", fleet="")

    def jobs(self) -> list[JobSpec]:
        place = self.place
        return replica_jobs(self.spec, ports=place.ports, python=place.python, cpu_binds=place.cpu_binds,
                            gpus=place.replica_gpus, slots=self.slots or None,
                            member_dirs=tuple(m.run_path for m in self.members))


def server_urls(replicas: list[JobSpec], reach: Callable[[int, JobSpec, object], str]) -> list[str]:
    """Where the trainer reaches every server of every replica job, in order: at the replica's alias on the run's
    network group, else where `reach(i, job, port)` says (an exposed port, a local port)."""
    return [reached_at(job, port) or reach(i, job, port)
            for i, job in enumerate(replicas) for port in server_ports_of(job)]


def reached_at(job: JobSpec, port) -> str | None:
    """Where the trainer reaches a replica's server on the run's network group (its alias), or None (not in one)."""
    return group_url(job.network_aliases[0], port) if job.network_group and job.network_aliases else None
