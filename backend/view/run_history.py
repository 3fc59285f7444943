"""RunHistory: a long run's older rows, events and held-out records, read in background threads and joined in front
of what its RunView read since.

A first look (`bucket_reader.RunReader`) reads the newest part of a run and sets the rest aside; this reads that
rest, each kind in a thread of its own, and joins it in one swap under the view's lock. A read that fails is handed
back and tried again later, the failure said in the meantime (`history_failure`).
"""

import logging
import math
import threading
import time
from collections import deque

from backend.storage.series import SeriesTable
from backend.view.bucket_reader import SAMPLE_CHUNK
from backend.view.job_view import MAX_LOG_LINES, ResourceUsage
from backend.view.run_records import STARTED_NONE, _event_time, _is_number, _is_step_record, _with_band

log = logging.getLogger(__name__)

# A background read of the history that fails (a bucket that did not answer) is tried again, this long after
# the failure, doubling up to the cap: the rows it did not bring are never silently left out.
HISTORY_RETRY_S = 2.0
HISTORY_RETRY_MAX_S = 60.0
# How long a request that needs a long run's whole history (a comparison, a held-out download) waits for it.
HISTORY_WAIT_S = 30.0
HISTORY_WAIT_FAILURES = 3    # a wait with no deadline (a resume's plan) gives up after this many failed reads


class RunHistory:
    """The background reads of `view` (a RunView) and their joins."""

    def __init__(self, view):
        self.view = view
        self.failure = ""     # why the last background read of the history failed ("" if none did)
        self._failures = 0
        self._retry_at = float("-inf")
        self.rows_thread: threading.Thread | None = None      # reads a long run's history in the background
        self.events_thread: threading.Thread | None = None    # and its older events
        self.evals_thread: threading.Thread | None = None     # and its older held-out records

    @property
    def pending(self) -> bool:
        """Whether older rows or events a first look left for later are still being found or read."""
        metrics = self.view.reader.metrics
        return (_alive(self.rows_thread) or self.events_loading or metrics.looking_back
                or bool(metrics.deferred) or self.view.held_out.older_pending)

    @property
    def events_loading(self) -> bool:
        """Whether older events a first look left for later are still being found or read: until they are,
        `events` holds the newest ones (and whatever the other writers' fragments held that was read)."""
        events = self.view.reader.events
        return _alive(self.events_thread) or events.looking_back or bool(events.deferred)

    def wait_for_history(self, timeout: float | None = None) -> bool:
        """Wait until the history is read (for a one-off drawing such as Compare); True if it is."""
        reader = self.view.reader
        return self._wait(lambda: self.pending, (reader.metrics, reader.events, self.view.held_out.reader),
                          lambda: (self.rows_thread, self.events_thread, self.evals_thread), timeout)

    def wait_for_events(self, timeout: float | None = None) -> bool:
        """Wait until every event is read (for what must see them all: a resume plan, "try it"); True if it is."""
        return self._wait(lambda: self.events_loading, (self.view.reader.events,), lambda: (self.events_thread,),
                          timeout)

    def _wait(self, pending, readers, threads, timeout: float | None) -> bool:
        view = self.view
        deadline = None if timeout is None else time.monotonic() + timeout
        failures = self._failures
        while pending():
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            for reader in readers:
                reader.wait_for_listing(left)
            if any(reader.looking_back or reader.deferred for reader in readers):
                with view.reading():    # the listing's news read now (what a tick would do), the history started
                    for full in (False, True):      # a listing that failed: list now
                        if any(reader.looking_back and not reader.listing_pending for reader in readers):
                            view.version += view.reader.read_fragments(full)
                    self.start()
            for thread in threads():
                if thread is not None:
                    thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
            if deadline is not None and time.monotonic() >= deadline:
                break
            if pending() and not any(_alive(t) for t in threads()):   # a failed read waits for its retry
                if deadline is None and self._failures - failures >= HISTORY_WAIT_FAILURES:
                    break
                until = self._retry_at if deadline is None else min(self._retry_at, deadline)
                time.sleep(max(0.0, min(until - time.monotonic(), HISTORY_RETRY_MAX_S)))
        return not pending()

    def start(self) -> None:
        """Read what a first look set aside, in threads of their own (called under the view's lock); after a failed
        read, not before its retry is due."""
        view, reader = self.view, self.view.reader
        if time.monotonic() < self._retry_at:
            return
        if reader.events.deferred and not _alive(self.events_thread):
            fragments, reader.events.deferred = reader.events.deferred, []
            self.events_thread = threading.Thread(target=self._read_events, args=(fragments,),
                                                  name=f"events-{view.run_id}", daemon=True)
            self.events_thread.start()
        if view.held_out.reader.deferred and not view.bounded and not _alive(self.evals_thread):
            older = view.held_out.take_older()
            self.evals_thread = threading.Thread(target=self._read_evals, args=(older,),
                                                 name=f"evals-{view.run_id}", daemon=True)
            self.evals_thread.start()
        if _alive(self.rows_thread):
            return
        fragments, reader.metrics.deferred = reader.metrics.deferred, []
        if view.bounded:        # a summary needs no history
            for job in view.jobs.values():
                job.history_end = min(job.history_end, 0)
            return
        samples, logs = {}, {}
        for job in view.jobs.values():
            if job.history_end > 0:
                samples[job.job_id], job.history_end = job.history_end, 0
            if job.log_from >= 0:
                logs[job.job_id], job.log_from = job.log_from, -1
        if fragments or samples or logs:
            self.rows_thread = threading.Thread(target=self._read_rows, args=(fragments, samples, logs),
                                                name=f"history-{view.run_id}", daemon=True)
            self.rows_thread.start()

    def _read_rows(self, fragments: list, samples: dict[str, int], logs: dict[str, int] | None = None) -> None:
        """The rows before what a first look read, joined in front of the rows read since (one swap under the
        lock; what is drawn is built here, so the swap costs the rows read since, not the history)."""
        view, executor = self.view, self.view.executor
        try:
            with view.reading():
                drawn = view.table.drawn()
                # Each job's samples up to the first one a first look read (a chunk can run past it), drawn alike.
                jobs = {job.job_id: (job.usage.table.times[0] if len(job.usage.table) else math.inf,
                                     job.usage.table.drawn()) for job in view.jobs.values()}
            table, first_step = SeriesTable(), {}
            for batch in view.reader.metrics.read_deferred(fragments):
                steps = [_with_band(record) for _writer, record in batch if _is_step_record(record)]
                for record in steps:
                    if _is_number(record.get("policy_version")):
                        first_step.setdefault(int(record["policy_version"]), record["step"])
                table.extend(steps)
            for key in drawn:
                table.sketch(*key)
            usages = {}
            for job_id, end in samples.items():
                usage, cursor = ResourceUsage(), 0
                first, drawn_usage = jobs.get(job_id, (math.inf, []))
                while cursor < end:
                    chunk, cursor = executor.read_resources(job_id, cursor, limit=SAMPLE_CHUNK)
                    if not chunk:
                        break
                    usage.add([sample for sample in chunk if sample.time < first])
                for key in drawn_usage:
                    usage.table.sketch(*key)
                usages[job_id] = usage
            tails = {job_id: executor.read_logs(job_id, start) for job_id, start in (logs or {}).items()}
            with view.reading():
                for job in view.jobs.values():
                    if job.job_id in tails:     # the log's tail from where it begins to now (a short read here)
                        lines, end = tails[job.job_id]
                        more, job.log_cursor = executor.read_logs(job.job_id, end)
                        job.logs = deque([*lines, *more], maxlen=MAX_LOG_LINES)
                        job.log_version += 1
                view.table = view.table.after(table)
                for version, step in first_step.items():
                    if step < view.first_step.get(version, step + 1):
                        view.first_step[version] = step
                for job in view.jobs.values():
                    if job.job_id in usages:
                        job.usage.table = job.usage.table.after(usages[job.job_id].table)
                self._joined()
        except Exception as e:  # the dashboard goes on with the rows it has, and reads them again
            with view.reading():
                view.reader.metrics.deferred = [*fragments, *view.reader.metrics.deferred]
                for job in view.jobs.values():
                    job.history_end = samples.get(job.job_id, job.history_end)
                    job.log_from = (logs or {}).get(job.job_id, job.log_from)
                self._failed(e, "history")

    def _read_events(self, fragments: list) -> None:
        """The events before what a first look read, joined in time order; what the view derives from events is
        derived again from all of them (one pass under the lock)."""
        view, reader = self.view, self.view.reader
        try:
            older = []
            for batch in reader.events.read_deferred(fragments):
                older += [reader.event_record(writer, record) for writer, record in batch]
            older = [record for record in older if record is not None]
            with view.reading():
                view.events = sorted([*older, *view.events], key=_event_time)
                view._engine, view.trainer_end, view.open_alerts, view.superseded = None, {}, {}, {}
                view.launch_failed, view.trainer_attempts = None, []
                view.trainer_started = STARTED_NONE
                for record in view.events:
                    reader.note_event(record)
                self._joined()
        except Exception as e:  # the dashboard goes on with the events it has, and reads them again
            with view.reading():
                reader.events.deferred = [*fragments, *reader.events.deferred]
                self._failed(e, "older events")

    def _read_evals(self, fragments: list) -> None:
        """The held-out records before what a first look read, joined behind those read since (one pass under the
        lock): the ranking is then over every record."""
        held_out = self.view.held_out
        try:
            older = held_out.read_older(fragments)
            with self.view.reading():
                held_out.join_older(older)
                self._joined()
        except Exception as e:  # the dashboard goes on with the records it has, and reads them again
            with self.view.reading():
                held_out.give_back(fragments)
                self._failed(e, "older held-out records")

    def _joined(self) -> None:
        """A background read joined what it read (called under the lock): any earlier failure is over."""
        self.failure, self._failures = "", 0
        self.view.version += 1

    def _failed(self, error: Exception, what: str) -> None:
        """A background read failed (called under the lock, its work handed back): say why, and try again later,
        each retry twice as late as the one before, up to HISTORY_RETRY_MAX_S."""
        self._failures += 1
        delay = min(HISTORY_RETRY_S * 2 ** (self._failures - 1), HISTORY_RETRY_MAX_S)
        self._retry_at = time.monotonic() + delay
        self.failure = f"{type(error).__name__}: {error}"[:300]
        self.view.version += 1
        log.warning("could not read the %s of run %s (%s); trying again in %.0f s", what, self.view.run_id,
                    self.failure, delay)


def _alive(thread: threading.Thread | None) -> bool:
    return thread is not None and thread.is_alive()
