"""The one small interface every executor implements. What an executor answers before it runs anything is its
engine (`backend/plan/engines/`). Executors know nothing about Gradio."""

from collections.abc import Iterator
from typing import NamedTuple, Protocol

from backend.plan.jobspec import JobRecord, JobSpec, JobStatus


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
    name: str                   # its engine's name (`backend.plan.engines.engine(name)`)
    namespace: str | None       # the Hub namespace its jobs run in (HF Jobs); None where jobs run on machines
    lists_with_token: bool = False
    """Whether its job list is an API call made with a visitor's own token (HF Jobs: one registry per namespace and
    token). A listing that fails is then that visitor's to read about (`RunDirectory.listing_problem`), shows none of
    that registry's runs and is asked again only after its interval, while the other registries list as usual; where
    False, a failed listing is raised. Executors implement this protocol by shape, not by inheriting it: one that
    does not declare it answers this default (`answers_lists_with_token`)."""

    def submit(self, job: JobSpec, secrets: dict[str, str] | None = None) -> str:
        """Start a job and return its id. `secrets` maps the JobSpec's secret names to values."""

    def status(self, job_id: str) -> JobStatus: ...

    def read_logs(self, job_id: str, cursor: int) -> tuple[list[str], int]:
        """Log lines after `cursor`, and the cursor to pass next time. Only complete lines are returned."""

    def tail_cursor(self, job_id: str, lines: int) -> int:
        """A cursor from which `read_logs` returns about the last `lines` lines (a first look at a long log)."""

    def all_logs(self, job_id: str) -> Iterator[str]:
        """The job's whole log (masked) for a download, as pieces of whole lines (each ends with a newline), read as
        they are written out: a long log never sits in memory whole."""

    def read_resources(self, job_id: str, cursor: int, limit: int | None = None) -> tuple[list[ResourceSample], int]:
        """Samples after `cursor` (at most about `limit` of them), and the cursor to pass next time."""

    def resources_tail_cursor(self, job_id: str, samples: int) -> int:
        """A cursor from which `read_resources` returns about the last `samples` samples (a first look at a long
        job; the samples before it are read in the background)."""

    def cancel(self, job_id: str) -> None: ...

    def exposed_url(self, job_id: str, port: int) -> str:
        """Where another job reaches this job's exposed `port` (a distributed run's trainer -> replicas)."""

    def list_jobs(self, run_id: str | None = None, checks: bool = False) -> list[JobRecord]:
        """Every job this executor launched (found by labels), or only those of `run_id`, newest first. A job whose
        record cannot be read is listed as far as it can be (`unreadable`, and counted by `unreadable_records`), so
        one bad record neither empties the list nor hides its run. `checks`: the task-check jobs instead (their
        check id as the run id; none where no check runs as a job)."""

    def unreadable_records(self, run_id: str) -> dict[str, int]:
        """Records of the run's jobs that were skipped as unreadable, per file."""


def answers_lists_with_token(executor: object) -> bool:
    """`Executor.lists_with_token` of `executor`, its default where the executor does not declare it."""
    return bool(getattr(executor, "lists_with_token", Executor.lists_with_token))
