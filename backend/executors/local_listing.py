"""Every local job, listed from the jobs' folders: newest first, a job whose record cannot be read still listed (as
far as its folder's name tells), and a listing costs what changed since the last one, not every job ever run.
"""

import dataclasses
import os
import time

from backend.executors.local_files import Unreadable
from backend.executors.local_status import LocalJobStatus
from backend.plan.jobspec import JobRecord, JobStatus
from backend.runtime.job import job_wrapper as wrapper

FINAL_LISTING_S = 2.0      # a jobs folder unchanged this long before a listing: a later change gives a later mtime


class LocalJobListing(LocalJobStatus):
    """The jobs' listing (`list_jobs`), with what does not change once a job has ended kept."""

    def __init__(self, home: str):
        super().__init__(home)
        self._ended_records: dict[str, JobRecord] = {}   # job id -> its listing record, once final
        self._final_listing: tuple[int, list[JobRecord]] | None = None    # (jobs folder's mtime, every job ended)
        self._ended_times: dict[str, tuple[float | None, float | None]] = {}   # job id -> (start, end) once ended

    def list_jobs(self, run_id: str | None = None, checks: bool = False) -> list[JobRecord]:
        """Every local job, newest first. A job whose job.json cannot be read is still listed (marked unreadable,
        its run and role read from its folder's name), so its run does not vanish from the runs list. (No task
        check runs as a local job: `checks` lists none.)"""
        if checks:
            return []
        if run_id is None:
            return self._all_jobs()
        return self._listed_jobs(run_id)

    def _all_jobs(self) -> list[JobRecord]:
        """Every job, newest first: the same list as last time while no job folder came or went and every job had
        ended (the folder's mtime says so once it is older than FINAL_LISTING_S: a change after that has a later
        one, however coarse the file system's clock), so a listing costs what changed, not every job ever run."""
        before = time.time()
        changed = os.stat(self.jobs_dir).st_mtime_ns
        kept = self._final_listing
        if kept is not None and kept[0] == changed:
            return kept[1]
        names = self._job_names()
        records = self._listed_jobs(None, names)
        # Final: every folder is a job that has ended (one still being written, or not a job's, is asked again).
        final = (before - changed / 1e9 > FINAL_LISTING_S and len(records) == len(names)
                 and all(self._ended_records.get(r.job_id) is r for r in records))
        self._final_listing = (changed, records) if final else None
        return records

    def _job_names(self) -> list[str]:
        """The jobs' folders (a hidden one is a job still being submitted)."""
        return [name for name in os.listdir(self.jobs_dir) if not name.startswith(".")]

    def _listed_jobs(self, run_id: str | None, names: list[str] | None = None) -> list[JobRecord]:
        records = []
        for job_id in self._job_names() if names is None else names:
            if run_id and not job_id.startswith(f"{run_id}--"):
                continue
            ended = self._ended_records.get(job_id)
            if ended is not None:      # an ended job's record is final: a listing costs the jobs that changed
                records.append(ended)
                continue
            try:
                status = self.status(job_id)
                started, finished = self._times(job_id, status)
            except (OSError, ValueError, KeyError):
                continue    # gone meanwhile, or not a job's folder
            try:
                data = self._job_record(job_id)
            except Unreadable:
                record = _unreadable_record(job_id, self._dir(job_id), status)
                if record is not None:
                    records.append(dataclasses.replace(record, started_at=started, finished_at=finished))
                continue    # counted by _job_record; one bad job must not take the list down
            except (OSError, ValueError, KeyError):
                continue
            spec = data["spec"]
            volumes = [v for v in spec.get("volumes") or [] if isinstance(v, dict)]
            records.append(JobRecord(job_id, spec["run_id"], spec["role"], status.stage, data["created_at"],
                                     flavor=spec.get("flavor"), bucket=volumes[0].get("bucket") if volumes else None,
                                     started_at=started, finished_at=finished, timed_out=status.timed_out))
            if status.done and finished is not None:
                self._ended_records[job_id] = records[-1]
        return sorted(records, key=lambda r: r.created_at, reverse=True)

    def _times(self, job_id: str, status: JobStatus) -> tuple[float | None, float | None]:
        """When the job's command started and when it ended (epoch seconds; None while unknown), from the files its
        wrapper wrote, so a restarted panel knows how long a finished run took."""
        if job_id in self._ended_times:
            return self._ended_times[job_id]
        started = (self._read_json(job_id, wrapper.PROCESS_FILE) or {}).get("started_at")
        started = float(started) if isinstance(started, (int, float)) else None
        finished = None
        if status.done:
            ended = (self._read_json(job_id, wrapper.EXIT_FILE) or {}).get("time")
            finished = float(ended) if isinstance(ended, (int, float)) else _last_write(self._dir(job_id))
            self._ended_times[job_id] = (started, finished)
        return started, finished


def _unreadable_record(job_id: str, folder: str, status: JobStatus) -> JobRecord | None:
    """A job whose job.json is unreadable, as far as its folder tells: `<run_id>--<role>--<hex>`, and its age."""
    parts = job_id.split("--")
    if len(parts) < 3 or not all(parts):
        return None
    try:
        created = os.stat(folder).st_mtime
    except OSError:
        return None
    return JobRecord(job_id, "--".join(parts[:-2]), parts[-2], status.stage, created, unreadable=True,
                     timed_out=status.timed_out)


def _last_write(folder: str) -> float | None:
    """When the job last wrote its log or a resource sample: its end, where its wrapper could not record one."""
    times = []
    for name in (wrapper.LOG_FILE, wrapper.RESOURCES_FILE):
        try:
            times.append(os.stat(os.path.join(folder, name)).st_mtime)
        except OSError:
            pass
    return max(times, default=None)
