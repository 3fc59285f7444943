"""A local job's folder and the records in it, as `LocalExecutor` reads them.

Each job gets `<home>/jobs/<job_id>/`: `job.json` (the spec, and the wrapper's pid with its start time) and `log.txt`,
written by the executor; `process.json`, `resources.jsonl` and `exit.json`, written by the job's wrapper
(`backend/runtime/job/job_wrapper.py`). A record that exists but cannot be read is skipped and counted per file, never
fatal; the job's log and resource samples are read from a cursor, its secrets masked.
"""

import json
import logging
import os
import threading
from collections.abc import Iterator

from backend.executors.base import ResourceSample
from backend.executors.wrapper_files import SAMPLE_BYTES, log_text, read_complete_lines, read_samples, tail_offset
from backend.runtime.job import job_wrapper as wrapper
from backend.runtime.layout import atomic_write_bytes
from backend.runtime.redact import redact_tokens

log = logging.getLogger(__name__)

JOB_FILE, LEGACY_STATUS_FILE = "job.json", "status.json"


class Unreadable(ValueError):
    """A job file that exists but holds no usable record."""


class LocalJobFiles:
    """The jobs' folders under `<home>/jobs/` and the records in them (what does not change once written is kept)."""

    def __init__(self, home: str):
        self.home = os.path.abspath(home)
        self.jobs_dir = os.path.join(self.home, "jobs")
        os.makedirs(self.jobs_dir, exist_ok=True)
        self._secrets: dict[str, tuple[str, ...]] = {}     # job id -> the secret values masked in what it shows
        self._bad: dict[str, set[int]] = {}      # job file -> offsets of the records in it that were skipped
        # What does not change once written, kept so that listing 200 runs does not re-read 600 job files a tick:
        self._records: dict[str, dict] = {}      # job id -> its job.json once complete (with the wrapper's pid)
        self._lock = threading.Lock()

    # ---- paths
    def bucket_root(self, bucket: str) -> str:
        return os.path.join(self.home, "buckets", *bucket.split("/"))

    def _dir(self, job_id: str) -> str:
        if "/" in job_id or job_id.startswith("."):
            raise ValueError(f"bad job id {job_id!r}")
        return os.path.join(self.jobs_dir, job_id)

    def _file(self, job_id: str, name: str) -> str:
        return os.path.join(self._dir(job_id), name)

    def log_path(self, job_id: str) -> str:
        return self._file(job_id, wrapper.LOG_FILE)

    # ---- job files
    def _read_json(self, job_id: str, name: str) -> dict | None:
        """A job file as a dict; None if it does not exist. A file that is not a JSON object is counted, then None."""
        path = self._file(job_id, name)
        try:
            with open(path, "rb") as f:
                data = json.loads(f.read())
        except FileNotFoundError:
            return None
        except (OSError, ValueError):
            data = None
        if not isinstance(data, dict):
            self._count_bad(path, 0)
            return None
        return data

    def _count_bad(self, path: str, offset: int) -> None:
        with self._lock:
            seen = self._bad.setdefault(path, set())
            if offset not in seen:
                seen.add(offset)
                log.warning("skipped an unreadable record in %s (byte %d)", path, offset)

    def _job_record(self, job_id: str) -> dict:
        cached = self._records.get(job_id)
        if cached is not None:
            return cached
        data = self._read_json(job_id, JOB_FILE)
        if data is None:
            if not os.path.isdir(self._dir(job_id)):
                raise KeyError(f"no local job {job_id!r}")
            raise Unreadable(f"job {job_id}: no readable {JOB_FILE}")
        spec = data.get("spec")
        ok = (isinstance(spec, dict) and isinstance(spec.get("run_id"), str) and isinstance(spec.get("role"), str)
              and isinstance(spec.get("volumes", []), list) and isinstance(data.get("created_at"), (int, float)))
        if not ok:
            self._count_bad(self._file(job_id, JOB_FILE), 0)
            raise Unreadable(f"job {job_id}: {JOB_FILE} is not a job record")
        if "pid" in data:
            self._records[job_id] = data
        return data

    def unreadable_records(self, run_id: str) -> dict[str, int]:
        """Skipped records per job file of the run's jobs (paths relative to this executor's home)."""
        prefix = os.path.join(self.jobs_dir, f"{run_id}--")
        with self._lock:
            return {os.path.relpath(path, self.home): len(offsets) for path, offsets in self._bad.items()
                    if path.startswith(prefix)}

    # ---- logs and resource samples
    def _redact(self, job_id: str, text: str) -> str:
        return redact_tokens(text, self._secrets.get(job_id, ()))

    def read_logs(self, job_id: str, cursor: int) -> tuple[list[str], int]:
        data = read_complete_lines(self.log_path(job_id), cursor)
        text = data.decode("utf-8", errors="replace")
        lines = [self._redact(job_id, line) for line in text.splitlines()]
        return lines, cursor + len(data)

    def all_logs(self, job_id: str) -> Iterator[str]:
        return log_text(self.log_path(job_id), lambda text: self._redact(job_id, text))

    def tail_cursor(self, job_id: str, lines: int) -> int:
        """The offset of the line start `lines` lines before the log's end (0 for a shorter log)."""
        return tail_offset(self.log_path(job_id), lines, 400)

    def resources_tail_cursor(self, job_id: str, samples: int) -> int:
        """A cursor from which `read_resources` returns about the last `samples` samples (0 for fewer)."""
        return tail_offset(self._file(job_id, wrapper.RESOURCES_FILE), samples, SAMPLE_BYTES)

    def read_resources(self, job_id: str, cursor: int, limit: int | None = None) -> tuple[list[ResourceSample], int]:
        path = self._file(job_id, wrapper.RESOURCES_FILE)
        return read_samples(path, cursor, limit, skipped=lambda offset: self._count_bad(path, offset))


def write_json(path: str, data: dict) -> None:
    atomic_write_bytes(path, json.dumps(data).encode())
