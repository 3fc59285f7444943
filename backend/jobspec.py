"""JobSpec: everything an executor needs to start one job of a run, and nothing it has to look up."""

import shlex
from dataclasses import dataclass, field

# Job stages, in the Hugging Face Jobs vocabulary, so local and remote runs read the same.
SCHEDULING, RUNNING, COMPLETED, ERROR, CANCELED, DELETED = (
    "SCHEDULING", "RUNNING", "COMPLETED", "ERROR", "CANCELED", "DELETED")
TERMINAL_STAGES = frozenset({COMPLETED, ERROR, CANCELED, DELETED})

LABEL_APP = "grpo-panel"
LABEL_RUN = "grpo-panel-run"
LABEL_ROLE = "grpo-panel-role"
APP_LABEL_VALUE = "1"   # the value under LABEL_APP on every job this panel launches; list_jobs filters on it


@dataclass(frozen=True)
class VolumeSpec:
    """A bucket mounted into a job: `bucket` is "namespace/name", `mount_path` an absolute path."""

    bucket: str
    mount_path: str
    read_only: bool = False

    def cli(self) -> str:
        return f"hf://buckets/{self.bucket}:{self.mount_path}" + (":ro" if self.read_only else "")


@dataclass(frozen=True)
class JobSpec:
    """One job of a run. Secrets hold only the *names* of secrets; executors supply the values."""

    run_id: str
    role: str                      # "trainer", "vllm-0", "vllm-1", ...
    image: str
    command: list[str]
    flavor: str
    timeout_s: int
    env: dict[str, str] = field(default_factory=dict)
    secrets: tuple[str, ...] = ()
    volumes: tuple[VolumeSpec, ...] = ()
    expose: tuple[int, ...] = ()
    labels: dict[str, str] = field(default_factory=dict)
    namespace: str | None = None

    def local_preview(self) -> str:
        """The command as a local process runs it (env first), for local runs."""
        env = [f"{k}={v}" for k, v in sorted(self.env.items())]
        return shlex.join([*env, *self.command])

    def cli_preview(self) -> str:
        """The equivalent `hf jobs run ...` command. Secret values never appear: only their names."""
        parts = ["hf", "jobs", "run", "--flavor", self.flavor, "--timeout", f"{self.timeout_s}s"]
        if self.namespace:
            parts += ["--namespace", self.namespace]
        for k, v in sorted(self.labels.items()):
            parts += ["--label", f"{k}={v}"]
        for k, v in sorted(self.env.items()):
            parts += ["-e", f"{k}={v}"]
        for name in self.secrets:
            parts += ["-s", name]
        for vol in self.volumes:
            parts += ["-v", vol.cli()]
        for port in self.expose:
            parts += ["--expose", str(port)]
        parts += [self.image, *self.command]
        return shlex.join(parts)


@dataclass(frozen=True)
class JobStatus:
    stage: str
    message: str = ""

    @property
    def done(self) -> bool:
        return self.stage in TERMINAL_STAGES


@dataclass(frozen=True)
class JobRecord:
    """A job as an executor knows it: enough to rebuild the run list after the panel restarts."""

    job_id: str
    run_id: str
    role: str
    stage: str
    created_at: float
    url: str | None = None
    flavor: str | None = None
    bucket: str | None = None      # "namespace/name" of the run's bucket volume
    # What the cost of a job is computed from (HF Jobs; None where the executor does not say): when it started
    # and finished running, in epoch seconds, and the running seconds the Hub counted as of `listed_at`.
    started_at: float | None = None
    finished_at: float | None = None
    running_s: float | None = None
    listed_at: float | None = None
