"""What an executor answers before it runs anything (its `Engine`), and where a run's jobs start (`Placement`).

An engine plans jobs for a RunSpec and lists `hardware.Flavor`s, while the RunSpec asks engines in turn while it
validates: the registry (`backend/plan/engines/__init__.py`) names engine modules rather than importing them, so no
import circle forms.
"""

from collections.abc import Callable
from dataclasses import dataclass

from backend.plan.jobspec import JobSpec
from backend.plan.vllm_args import vllm_server_env


@dataclass(frozen=True)
class Placement:
    """Where a run's jobs start, as the engine plans them: the interpreter, the ports, and (one machine shared by
    every job) the CPU cores and GPUs of each. None leaves the recipe's default (a machine per job)."""

    python: str = "python"
    master_port: int | str | None = None       # a colocated run's torch.distributed rendezvous port
    ports: list | None = None                  # per replica: its port, or its servers' ports (a list)
    cpu_binds: list | None = None              # per replica: its cores (VLLM_CPU_OMP_THREADS_BIND), or each server's
    trainer_gpu: str | None = None
    replica_gpus: list[str] | None = None      # one per replica
    proxy_core: str | None = None              # the core kept for the trainer's proxy beside the servers' cores


class Engine:
    """What an executor answers before (and without) an executor object: for a RunSpec, a preview, the form.

    One instance per engine module (`ENGINE`), registered by name in `backend/plan/engines/__init__.py`. Code outside
    the engines and executors asks these facts and methods instead of comparing an executor's name."""

    name: str = ""
    label: str = ""                  # where the jobs run, in a user's words ("Hugging Face Jobs")
    choice: str = ""                 # the form's *Run on* choice in words ("This machine"); empty: the name
    billed: bool = False             # jobs cost money: launch and resume are reviewed first, a budget cap applies
    needs_token: bool = False        # jobs act with the visitor's Hugging Face token, passed as a job secret
    installs_runtime: bool = False   # a job installs TRL and PEFT before it starts (its image has vLLM only)
    reaches_hub: bool = True         # jobs can download models and datasets from the Hub
    bucket_on_hub: bool = False      # a run's bucket is a Hub Storage Bucket of a namespace (else a local folder)
    on_panel_machine: bool = False   # jobs run on the panel's own machine (who may, and with which runtime)
    operators_machines: bool = False  # jobs use the operator's machines (this one, or its cluster): who may launch
                                      # and see them follows the local-runs policy (GRPO_PANEL_LOCAL_RUNS)
    chooses_hardware: bool = False   # the spec's flavor fields pick each job's machine (`flavors` lists them)
    job_list_lags: bool = False      # the job list can lag behind a job created by a request that failed
    replicas_need_key: bool = False  # replicas listen where others reach them: each run's demand a key of its own
    network_groups: bool = False     # a run's jobs can share a private network (replicas reached at an alias)
    shared_fleet: bool = False       # a sweep's members share one replica fleet (else each starts its own replicas)
    retry_gap_s: int = 0             # how long a retried job may take to run again (rescheduled, reinstalled)

    def default_mount(self, home: str) -> str | None:
        """The form's mount path for runs on this engine, for a panel whose home is `home`; None: the spec's default
        (a folder inside every job's own machine)."""
        return None

    @property
    def cost_rule(self) -> str:
        """How a run's cost is reckoned, in words, for the run header's cost line ("" where the prices speak for
        themselves: a billed engine's spend is shown)."""
        return ""

    def runtime_problem(self) -> str | None:
        """Why this deployment cannot run this engine's jobs at all, or None."""
        return None

    def spec_problems(self, spec) -> list:
        """What this engine refuses in a spec that validates (`spec_fields.FieldError`s): checked before a preview
        or a launch, never once anything runs."""
        return []

    def flavors(self, token: str | None) -> list:
        """The hardware a job can ask for, with hourly prices (none where the spec does not choose hardware)."""
        return []

    def other_accepted_flavors(self) -> list:
        """Flavors a spec may name besides `flavors` (the form does not list them): none unless the engine maps
        them onto its own."""
        return []

    def job_fields(self, spec, flavor: str) -> dict:
        """A JobSpec's image, flavor and namespace for this engine."""
        raise NotImplementedError

    def placement(self, spec, preview: bool) -> Placement:
        """Where the run's jobs start. `preview`: as a preview shows them (no port is taken yet)."""
        return Placement()

    def replica_server(self, spec, gpus: list[str] | None) -> tuple[dict, list[str]]:
        """A replica's vLLM options (vllm_server_args keywords) and its wrapper's extra arguments."""
        return {}, []

    def replica_gpus(self, spec) -> int:
        """GPUs one replica job has (its `servers_per_gpu` servers run on each); 1 where it has one or none."""
        return 1

    def replica_shares_trainer_gpu(self, spec) -> bool:
        """Whether a distributed run's replicas run on the trainer's own GPU (then more than one server a GPU takes
        GPU time from the trainer: shared_gpu.py). Engines that give each job machines or GPUs of its own: never."""
        return False

    def replica_gpu_share(self, spec, gpus: list[str] | None) -> float | None:
        """The share of each GPU a replica job's servers split between them (runtime/serving/gpu_split.py), or None
        where they need no split: on CPU, or where each server already gets a fixed KV cache."""
        return None

    def replica_env(self) -> dict[str, str]:
        """A replica's environment: runtime LoRA loading and TRL's dev routes, plus what this engine's machines need."""
        return vllm_server_env()

    def replica_url(self, i: int, port) -> str:
        """Where a preview says the trainer reaches replica `i` (known for real once it is submitted)."""
        raise NotImplementedError

    def preview_command(self, job: JobSpec, bucket_root: Callable[[str], str]) -> str:
        """The job's command as a preview shows it; `bucket_root` is where a bucket lives on the panel's machine."""
        raise NotImplementedError

    def preview_note(self, spec, bucket_root: Callable[[str], str]) -> str | None:
        """A line a preview adds about where and how the jobs run, or None."""
        return None
