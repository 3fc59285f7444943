"""The one small interface every executor implements, and what each answers before it runs anything (its
`Engine`). Executors know nothing about Gradio."""

from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple, Protocol

from backend.jobspec import JobRecord, JobSpec, JobStatus
from backend.vllm_args import vllm_server_env

# An engine plans jobs for a RunSpec (`spec` below) and lists `hardware.Flavor`s, while the spec asks engines in
# turn (see executors/__init__.py): this module imports neither, so no import circle forms.


class ResourceSample(NamedTuple):
    """One utilisation sample of a job. GPU fields are per-device lists (empty where there is no GPU); `gpu_index`
    names the machine's GPU of each entry where a job sees only some of them (empty: 0, 1, ... in order).
    A named tuple: a first look at a long job makes hundreds of thousands of them."""

    time: float
    cpu_percent: float | None = None
    ram_bytes: int | None = None
    gpu_util: tuple[float, ...] = ()
    gpu_mem_bytes: tuple[int, ...] = ()
    gpu_mem_total_bytes: tuple[int, ...] = ()
    gpu_index: tuple[int, ...] = ()

    def gpu_name(self, position: int) -> str:
        return f"GPU{self.gpu_index[position] if position < len(self.gpu_index) else position}"


class SubmitError(RuntimeError):
    """A job could not be submitted; nothing of it is running."""


class Executor(Protocol):
    name: str

    def submit(self, job: JobSpec, secrets: dict[str, str] | None = None) -> str:
        """Start a job and return its id. `secrets` maps the JobSpec's secret names to values."""

    def status(self, job_id: str) -> JobStatus: ...

    def read_logs(self, job_id: str, cursor: int) -> tuple[list[str], int]:
        """Log lines after `cursor`, and the cursor to pass next time. Only complete lines are returned."""

    def tail_cursor(self, job_id: str, lines: int) -> int:
        """A cursor from which `read_logs` returns about the last `lines` lines (a first look at a long log)."""

    def all_logs(self, job_id: str) -> list[str]:
        """The job's whole log (masked), for a download."""

    def read_resources(self, job_id: str, cursor: int, limit: int | None = None) -> tuple[list[ResourceSample], int]:
        """Samples after `cursor` (at most about `limit` of them), and the cursor to pass next time."""

    def resources_tail_cursor(self, job_id: str, samples: int) -> int:
        """A cursor from which `read_resources` returns about the last `samples` samples (a first look at a long
        job; the samples before it are read in the background)."""

    def cancel(self, job_id: str) -> None: ...

    def exposed_url(self, job_id: str, port: int) -> str:
        """Where another job reaches this job's exposed `port` (a distributed run's trainer -> replicas)."""

    def list_jobs(self, run_id: str | None = None) -> list[JobRecord]:
        """Every job this executor launched (found by labels), or only those of `run_id`, newest first. A job whose
        record cannot be read is listed as far as it can be (`unreadable`, and counted by `unreadable_records`), so
        one bad record neither empties the list nor hides its run."""

    def unreadable_records(self, run_id: str) -> dict[str, int]:
        """Records of the run's jobs that were skipped as unreadable, per file."""


@dataclass(frozen=True)
class Placement:
    """Where a run's jobs start, as the engine plans them: the interpreter, the ports, and (one machine shared by
    every job) the CPU cores and GPUs of each. None leaves the recipe's default (a machine per job)."""

    python: str = "python"
    master_port: int | str | None = None       # a colocated run's torch.distributed rendezvous port
    ports: list | None = None                  # one per replica
    cpu_binds: list[str] | None = None         # one per replica (VLLM_CPU_OMP_THREADS_BIND)
    trainer_gpu: str | None = None
    replica_gpus: list[str] | None = None      # one per replica


class Engine:
    """What an executor answers before (and without) an executor object: for a RunSpec, a preview, the form.

    One instance per executor module (`ENGINE`), registered by name in `backend/executors/__init__.py`. Code outside
    `backend/executors/` asks these facts and methods instead of comparing an executor's name."""

    name: str = ""
    label: str = ""                  # where the jobs run, in a user's words ("Hugging Face Jobs")
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
    retry_gap_s: int = 0             # how long a retried job may take to run again (rescheduled, reinstalled)

    def runtime_problem(self) -> str | None:
        """Why this deployment cannot run this engine's jobs at all, or None."""
        return None

    def spec_problems(self, spec) -> list:
        """What this engine refuses in a spec that validates (`spec_fields.FieldError`s): checked before a preview
        or a launch, never once anything runs."""
        return []

    def shared_executor(self, home: str):
        """The executor of this engine's runs that every permitted visitor of this deployment shares (a cluster's),
        or None: local runs are the panel's own registry, Hub runs are reached per token."""

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
