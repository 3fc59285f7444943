"""A local job's status, read from its folder alone (`local_files.py`), so a restarted panel (or a second one) tells
the same story as the panel that launched it. A pid is trusted only together with its start time: after a restart the
same number may belong to another process. Once a job has ended, its temp dir (`<system temp>/grpo-job-<hex>-*`) and
the shared memory it left are removed here if its wrapper, which removes them, was killed.
"""

import os
import shutil
import time

import psutil

from backend.executors.local_files import LEGACY_STATUS_FILE, LocalJobFiles, Unreadable
from backend.executors.wrapper_files import ended_status
from backend.plan.jobspec import CANCELED, ERROR, RUNNING, SCHEDULING, TERMINAL_STAGES, JobStatus
from backend.runtime.job import job_wrapper as wrapper
from backend.runtime.job.shm import SHM_FILE, remove_left

START_WAIT_S = 60.0       # a job without a wrapper pid after this long never started
RECORD_WAIT_S = 10.0      # a job folder without a readable job.json this young may still be getting it
CANCELED_BY_USER = "canceled by the user"
FULL_DISK_BYTES = 1 << 20   # less free space than this where a job's records are: the disk counts as full


class LocalJobStatus(LocalJobFiles):
    """Whether a job's wrapper and its processes live, and the job's status from its records."""

    def __init__(self, home: str):
        super().__init__(home)
        self._ended: dict[str, JobStatus] = {}   # job id -> its final status

    # ---- processes
    def _wrapper_alive(self, record: dict) -> bool:
        return _same_process(record.get("pid"), record.get("pid_started_at"))

    def _job_group(self, job_id: str) -> int | None:
        """The job command's process group id, if any process of that group may still be alive."""
        proc = self._read_json(job_id, wrapper.PROCESS_FILE) or {}
        pid = proc.get("pid")
        if not isinstance(pid, int):
            return None
        started = wrapper.process_start_time(pid)
        if started is not None and not _same_start(started, proc.get("started_at")):
            return None     # that number is another process now, perhaps leading a group of its own
        # With its leader gone, a group's id cannot be reused while any member lives: the group is still ours.
        return pid if wrapper.group_alive(pid) else None

    def main_pid(self, job_id: str) -> int | None:
        """The pid of the job's own command (not its wrapper), once the wrapper has started it."""
        pid = (self._read_json(job_id, wrapper.PROCESS_FILE) or {}).get("pid")
        return pid if isinstance(pid, int) else None

    # ---- status
    def status(self, job_id: str) -> JobStatus:
        if job_id in self._ended:
            return self._ended[job_id]
        try:
            status = self._status(job_id)
        except Unreadable as exc:
            # Not an end, so not kept: a record still being written (a folder made by another writer, which need not
            # make it whole, as submit does) or mended later is read again next time.
            return self._unreadable_status(job_id, exc)
        if status.done:
            self._ended[job_id] = status
            self._remove_tmpdir(job_id)
        return status

    def _remove_tmpdir(self, job_id: str) -> None:
        """The job's temp dir and the shared memory it left, once nothing of the job is left to use them: its
        wrapper removes them, unless the wrapper itself was killed."""
        try:
            record = self._job_record(job_id)
        except (Unreadable, KeyError):
            return
        if self._wrapper_alive(record) or self._job_group(job_id) is not None:
            return
        remove_left(self._file(job_id, SHM_FILE))      # what a killed wrapper could not remove
        folder = record.get("tmpdir")
        if isinstance(folder, str) and os.path.isdir(folder):
            shutil.rmtree(folder, ignore_errors=True)

    def _status(self, job_id: str) -> JobStatus:
        ended = ended_status(self._read_json(job_id, wrapper.EXIT_FILE), lambda text: self._redact(job_id, text))
        if ended is not None:
            return ended
        legacy = self._read_json(job_id, LEGACY_STATUS_FILE)    # jobs launched before the wrapper existed
        if legacy and legacy.get("stage") in TERMINAL_STAGES:
            return JobStatus(legacy["stage"], str(legacy.get("message") or ""))
        record = self._job_record(job_id)
        cancel = self._read_json(job_id, wrapper.CANCEL_FILE)
        if self._wrapper_alive(record):
            attempt = (self._read_json(job_id, wrapper.PROCESS_FILE) or {}).get("attempt")
            retried = f"attempt {attempt} of {record['spec'].get('attempts', 1)}" if isinstance(attempt, int) \
                and attempt > 1 else ""
            return JobStatus(RUNNING, f"stopping: {cancel.get('reason')}" if cancel else retried)
        if cancel:     # stopped while its wrapper was still starting, before it could record anything
            return JobStatus(CANCELED, str(cancel.get("reason") or CANCELED_BY_USER))
        if "pid" not in record and time.time() - record["created_at"] < START_WAIT_S:
            return JobStatus(SCHEDULING)
        return JobStatus(ERROR, self._unrecorded_end(job_id))

    def _unreadable_status(self, job_id: str, exc: Unreadable) -> JobStatus:
        """A job whose job.json cannot be read: starting while its folder changed within RECORD_WAIT_S (its record
        may be on its way), else failed, saying why."""
        try:
            age = time.time() - os.stat(self._dir(job_id)).st_mtime
        except OSError:
            age = RECORD_WAIT_S
        return JobStatus(SCHEDULING) if age < RECORD_WAIT_S else JobStatus(ERROR, str(exc))

    def _unrecorded_end(self, job_id: str) -> str:
        """Why a job whose wrapper is gone left no exit record: its folder's disk is full, when it is (the cause
        first), else the likely guess."""
        try:
            free = shutil.disk_usage(self._dir(job_id)).free
        except OSError:
            free = None
        if free is not None and free < FULL_DISK_BYTES:
            return (f"{wrapper.DISK_FULL}: its wrapper could not record how the job ended ({free} bytes free where "
                    f"its records are, {self._dir(job_id)})")
        return "its wrapper process ended without recording how the job ended (was the machine restarted?)"


def _same_start(started: float | None, recorded) -> bool:
    return started is not None and isinstance(recorded, (int, float)) and abs(started - recorded) < 1.0


def _same_process(pid, started_at) -> bool:
    """Whether `pid` is still the process that started at `started_at` (and not a zombie)."""
    if not isinstance(pid, int):
        return False
    try:
        proc = psutil.Process(pid)
        return proc.status() != psutil.STATUS_ZOMBIE and _same_start(proc.create_time(), started_at)
    except psutil.Error:
        return False
