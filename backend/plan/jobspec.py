"""JobSpec: everything an executor needs to start one job of a run, and nothing it has to look up."""

import re
import shlex
from dataclasses import dataclass, field

# Job stages, in the Hugging Face Jobs vocabulary, so local and remote runs read the same.
SCHEDULING, RUNNING, COMPLETED, ERROR, CANCELED, DELETED = (
    "SCHEDULING", "RUNNING", "COMPLETED", "ERROR", "CANCELED", "DELETED")
TERMINAL_STAGES = frozenset({COMPLETED, ERROR, CANCELED, DELETED})


def run_stage(stages: dict[str, str]) -> str:
    """The one rule for a run's stage from its jobs' (role -> stage), used by the runs list and a run's view: the
    trainer's while it has one (a failed replica makes a run degraded, not failed), else the most telling of the
    others' (a sweep's fleet, replicas alone: running while any replica still serves, its members train on it; else
    failed if one failed), else any of theirs; UNKNOWN for a run without jobs."""
    if "trainer" in stages:
        return stages["trainer"]
    for stage in (RUNNING, ERROR, SCHEDULING, CANCELED, COMPLETED):
        if stage in stages.values():
            return stage
    return next(iter(stages.values()), "UNKNOWN")

LABEL_APP = "grpo-panel"
LABEL_RUN = "grpo-panel-run"
LABEL_ROLE = "grpo-panel-role"
APP_LABEL_VALUE = "1"   # the value under LABEL_APP on every job this panel launches; list_jobs filters on it
CHECK_APP_LABEL = "task-check"      # a task-check job's: the runs list never shows one (`list_jobs(checks=True)`)


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
    ports: tuple = ()                       # a replica job's vLLM servers' ports, in order: the trainer reaches each
    labels: dict[str, str] = field(default_factory=dict)
    namespace: str | None = None
    attempts: int = 1                       # runs in all, the first included (the executor retries a failed one)
    network_group: str | None = None        # HF Jobs: the run's jobs reach each other on every port inside it
    network_aliases: tuple[str, ...] = ()   # names the other members reach this job at
    resource_group_id: str | None = None    # HF Jobs: the org's resource group (access, spending limits)

    def local_preview(self) -> str:
        """The command as a local process runs it (env first), for local runs; wrapped for reading."""
        env = [f"{k}={v}" for k, v in sorted(self.env.items())]
        return wrapped([*env, *self.command])

    def cli_preview(self) -> str:
        """The equivalent `hf jobs run ...` command, wrapped for reading. Secret values never appear: only their
        names."""
        return wrapped(self.cli_preview_args())

    def cli_preview_args(self) -> list[str]:
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
        if self.attempts > 1:
            parts += ["--attempts", str(self.attempts)]
        if self.network_group:
            parts += ["--network-group", self.network_group]
        for alias in self.network_aliases:
            parts += ["--network-alias", alias]
        if self.resource_group_id:
            parts += ["--resource-group-id", self.resource_group_id]
        return [*parts, self.image, *self.command]


# Where a run's code in the bucket has runtime/'s sub-packages. A run launched by a panel from before them has the flat
# runtime/ (`runtime/train.py`): resumed, its jobs run that code, so they name its modules as it has them.
CODE_LAYOUT_MARK = "runtime/trainer/__init__.py"
FLAT_CODE_MARK = "runtime/train.py"
_SUB_PACKAGE = re.compile(r"\bruntime\.(?:trainer|serving|check|job)\.(?=[a-z_]+\b)")


def flat_code_command(command: list[str]) -> list[str]:
    """`command` as it runs on the flat runtime: `runtime.trainer.train` -> `runtime.train`."""
    return [_SUB_PACKAGE.sub("runtime.", part) for part in command]


WRAP_AT = 100


def wrapped(tokens: list[str], width: int = WRAP_AT) -> str:
    """A command line as bash reads it, laid out for a person: lines broken between arguments with a trailing
    backslash, and a `bash -c` script one step per line (its steps joined by `&&`, long ones broken the same way).
    Pasted into bash it runs exactly the tokens given."""
    words = []
    for i, token in enumerate(tokens):
        script = i >= 2 and tokens[i - 1] == "-c" and tokens[i - 2] == "bash"
        words.append(_script(token, width) if script else shlex.quote(token))
    return _fill(_paired(words), width, "  ")


def _script(script: str, width: int) -> str:
    # The steps were joined by " && " from shlex-quoted arguments (recipe.shell), so they split back exactly.
    steps = [_fill(_paired([shlex.quote(t) for t in shlex.split(step)]), width, "      ")
             for step in script.split(" && ")]
    return shlex.quote("\n    " + " &&\n    ".join(steps) + "\n")


def _paired(words: list[str]) -> list[str]:
    """An option stays on one line with its value ("--flavor a10g-small")."""
    out: list[str] = []
    for word in words:
        if (out and out[-1].startswith("-") and out[-1] != "--" and " " not in out[-1] and not word.startswith("-")
                and "\n" not in word):
            out[-1] += " " + word
        else:
            out.append(word)
    return out


def _fill(words: list[str], width: int, indent: str) -> str:
    out, column = "", 0
    for word in words:
        if out and column + 1 + len(word.split("\n", 1)[0]) > width:
            out, column = out + " \\\n" + indent, len(indent)
        elif out:
            out, column = out + " ", column + 1
        out += word
        column = len(word.rsplit("\n", 1)[-1]) if "\n" in word else column + len(word)
    return out


@dataclass(frozen=True)
class JobStatus:
    stage: str
    message: str = ""
    timed_out: bool = False       # ended (ERROR) because it ran past its timeout

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
    timed_out: bool = False        # it ended because it ran past its timeout
    unreadable: bool = False       # its record could not be read: run and role come from where it was found
