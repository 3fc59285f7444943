"""One job of a run as its view keeps it: its stage, its newest log lines, and its resource samples (the newest raw
ones for the alerts, all of them as bounded series for the charts)."""

from collections import deque
from dataclasses import dataclass, field

from backend.executors.base import ResourceSample
from backend.plan.jobspec import JobStatus
from backend.storage.series import SeriesTable, Sketch

MAX_LOG_LINES = 5000
RECENT_SAMPLES = 900        # raw resource samples kept per job (15 minutes at 1 Hz): alerts read them


def _usage_row(sample: ResourceSample) -> dict:
    row = {"time": sample.time, "cpu_percent": sample.cpu_percent,
           "ram_gib": None if sample.ram_bytes is None else sample.ram_bytes / 2**30}
    for i, util in enumerate(sample.gpu_util):
        row[f"{sample.gpu_name(i)} util"] = util
    for i, used in enumerate(sample.gpu_mem_bytes):
        row[f"{sample.gpu_name(i)} memory_gib"] = used / 2**30
    return row


class ResourceUsage:
    """A job's resource samples as columns against time: CPU %, RAM, and per GPU its utilisation and memory
    (GPUs named by the machine's index where the sampler knows it), drawn as bounded series."""

    def __init__(self):
        self.table = SeriesTable(axes=("time",))

    def add(self, samples: list[ResourceSample]) -> None:
        if len(samples) < 64 or any(s.gpu_util or s.gpu_mem_bytes for s in samples):
            self.table.extend([_usage_row(s) for s in samples])
            return
        # CPU-only samples (a local job), column by column: a first look at a day of them makes no dict each.
        self.table.extend_columns({
            "time": [s.time for s in samples], "cpu_percent": [s.cpu_percent for s in samples],
            "ram_gib": [None if s.ram_bytes is None else s.ram_bytes / 2**30 for s in samples]})

    def sketch(self, key: str) -> Sketch | None:
        return self.table.sketch(key, "time")

    def gpus(self) -> list[str]:
        return [key[: -len(" util")] for key in self.table.columns if key.endswith(" util")]

    @property
    def version(self) -> int:
        return self.table.version


@dataclass
class JobView:
    job_id: str
    role: str
    status: JobStatus = field(default_factory=lambda: JobStatus("SCHEDULING"))
    log_cursor: int = 0
    resource_cursor: int = 0
    history_end: int = -1     # where a first look started reading samples (-1: not looked at yet; >0: history)
    log_from: int = -1        # where the log's tail begins, when a first look read less of it (-1: nothing left)
    logs: deque = field(default_factory=lambda: deque(maxlen=MAX_LOG_LINES))
    log_version: int = 0
    resources: deque = field(default_factory=lambda: deque(maxlen=RECENT_SAMPLES))   # the newest raw samples
    usage: ResourceUsage = field(default_factory=ResourceUsage)                       # all of them, bounded
    current: bool = True      # of the run's latest launch (False: an earlier launch, before a resume)
