"""RunReader: what a tick reads of one run and appends to its RunView.

The run's bucket folder (spec or fleet record, metric, event and sample fragments, held-out records, adapter
versions) and its jobs (stage, log lines, resource samples), each read from where the last tick stopped. A first
look reads the newest part of each and sets the rest aside for `run_history.RunHistory` to join in the background.
"""

import bisect
import json

from backend.plan.jobspec import TERMINAL_STAGES, JobStatus
from backend.runtime import layout, records
from backend.runtime.redact import redact_record
from backend.storage.adapters import AdapterVersion, final_adapter_files, list_adapter_versions
from backend.storage.observers import FragmentReader
from backend.storage.series import SeriesTable
from backend.view.job_view import MAX_LOG_LINES, RECENT_SAMPLES, JobView
from backend.view.run_records import _event_time, _is_metric_record, _is_number, _with_band, note_started

FIRST_LOOK_LOG_LINES = 1000     # a first look reads each log's newest lines; the rest of its tail in the background
MAX_REPLICA_SNAPSHOTS = 100
MAX_ADAPTER_LOADS = 500     # the proxy's newest per-replica load timings a view keeps (and a first look reads)
SAMPLE_CHUNK = 5000         # resource samples read at a time
SAMPLE_STEPS_KEPT = 100     # steps (or policy versions) whose sample completions a view keeps
# A first look at a long run reads its newest metric fragments (about 1,000 steps) and the last 20 minutes of each
# job's resource samples (the alerts read the last 15) at once, and the history before them in the background: it
# opens about as fast as a short run, whatever its length, and the charts fill in once the history is read.
HISTORY_TAIL_FRAGMENTS = 100
HISTORY_TAIL_SAMPLES = 1200
# Of the trainer's events (one fragment each: an adapter version every few steps), a first look reads the newest
# ones; the older ones are joined in front of them in the background, in time order, and whatever the view derives
# from events (versions, open alerts, the trainer's end, its engine) is derived again from all of them. Readers
# that must see every event wait for them (`wait_for_events`); the alerts wait by themselves (`events_loading`).
EVENTS_TAIL_FRAGMENTS = 100
# Of the held-out evaluation records (one fragment per evaluated version), a first look reads the newest ones and the
# base model's: the best version (best.json names it until its record is read) and the chart appear at once; the
# older records are joined in the background, after which the ranking is over every record.
EVALS_TAIL_FRAGMENTS = 100
CANARY_KEPT = 10            # the proxy's newest serving proofs a first look reads (the view keeps the last)
# A bounded view (the background watch's summary of a live run nobody watches) keeps only what the alerts and the
# runs list read: the newest steps, the events but adapter versions, the newest resource samples.
SUMMARY_FRAGMENTS = 10
SUMMARY_ROWS = 200
SUMMARY_EVENTS_SKIPPED = (records.ADAPTER_PUBLISHED, records.ADAPTERS_SUPERSEDED)


class RunReader:
    """Reads what is new for `view` (a RunView) and appends it to the view's tables; called under the view's lock."""

    def __init__(self, view):
        self.view = view
        bounded, store = view.bounded, view.store
        prefix = layout.run_prefix(view.run_id)
        # The proxy's replica snapshots each replace the last: a first look reads only the newest ones.
        self.metrics = FragmentReader(store, f"{prefix}/{layout.METRICS_DIR}", check=_is_metric_record,
                                      latest_only={layout.PROXY_WRITER: MAX_REPLICA_SNAPSHOTS,
                                                   layout.LOADS_WRITER: MAX_ADAPTER_LOADS,
                                                   layout.CANARY_WRITER: CANARY_KEPT},
                                      defer={layout.TRAINER_WRITER: SUMMARY_FRAGMENTS if bounded
                                             else HISTORY_TAIL_FRAGMENTS})
        self.events = FragmentReader(store, f"{prefix}/{layout.EVENTS_DIR}",
                                     check=lambda r: isinstance(r.get("event"), str),
                                     defer={layout.TRAINER_WRITER: EVENTS_TAIL_FRAGMENTS})
        # What the policy writes: a few completions per step; a first look reads only the newest steps.
        self.samples = FragmentReader(store, f"{prefix}/{layout.SAMPLES_DIR}",
                                      check=lambda r: isinstance(r.get("completion"), str),
                                      latest_only={layout.TRAINER_WRITER: SAMPLE_STEPS_KEPT})
        self._adapters_listed_at = float("-inf")
        self._versions_from_events = False

    @property
    def looking_back(self) -> bool:
        """Whether a first look's background listing of the bucket (metrics, events, held-out records) is pending."""
        return self.metrics.looking_back or self.events.looking_back or self.view.held_out.reader.looking_back

    @property
    def unreadable(self) -> dict[str, int]:
        """Metric and event records skipped as unreadable, per file."""
        return {**self.metrics.cursor.bad, **self.events.cursor.bad}

    def read_spec(self) -> bool:
        view = self.view
        if view.spec or view.fleet:
            return False
        try:
            spec = json.loads(view.store.read_bytes(f"{layout.run_prefix(view.run_id)}/{layout.SPEC_FILE}"))
        except (OSError, ValueError, KeyError):
            return self._read_fleet()
        view.spec = redact_record(spec) if isinstance(spec, dict) else {}
        view.held_out.member = view.member
        return bool(view.spec)

    def _read_fleet(self) -> bool:
        """A run folder without spec.json may be a sweep's shared fleet: its fleet.json, once readable."""
        view = self.view
        try:
            record = json.loads(view.store.read_bytes(f"{layout.run_prefix(view.run_id)}/{layout.FLEET_FILE}"))
        except (OSError, ValueError, KeyError):
            return False
        view.fleet = redact_record(record) if isinstance(record, dict) else {}
        return bool(view.fleet)

    def read_fragments(self, full: bool = False) -> bool:
        view = self.view
        changed = False
        for batch in self.metrics.batches(full):
            changed = True
            steps = []
            for _writer, record in batch:
                if "replicas" in record:
                    view.replica_stats.append(record)
                    continue
                if "canary" in record:
                    view.serving = record["canary"]
                    continue
                if "adapter_load" in record:
                    view.adapter_loads.append({**record["adapter_load"], "time": record.get("time")})
                    continue
                steps.append(_with_band(record))
                if _is_number(record.get("policy_version")):
                    view.first_step.setdefault(int(record["policy_version"]), record["step"])
            # In the order they were written: a resumed trainer logs the steps after its checkpoint again, and
            # the table keeps the latest.
            view.table.extend(steps)
        if view.bounded and len(view.table) > 2 * SUMMARY_ROWS:
            newest = SeriesTable()
            newest.extend(view.table.rows(last=SUMMARY_ROWS))
            view.table = newest
        for _writer, record in [] if view.bounded else self.samples.read(full):
            view.samples.append(redact_record(record))
            changed = True
        if not view.bounded:    # a watched summary keeps no held-out scores
            changed |= view.held_out.refresh(full)
        # Several writers' fragments arrive in one batch (the trainer's, each panel's): in the order they happened,
        # so an alert cleared by a restarted panel is not read back before the one that raised it.
        new_events = sorted(self.events.read(full), key=lambda pair: _event_time(pair[1]))
        for writer, record in new_events:
            record = self.event_record(writer, record)
            if record is not None:
                view.events.append(record)
                self.note_event(record)
        if not view.bounded:
            changed |= view.held_out.set_rule(view.best_by)
        return changed or bool(new_events)

    def event_record(self, writer: str, record: dict) -> dict | None:
        """An event as the view keeps it (None: one a bounded view does not keep). Masked on the way in too: a
        job's event may quote a token that its own job did not know to mask."""
        record = {"writer": writer, **redact_record(record)}
        return None if self.view.bounded and record["event"] in SUMMARY_EVENTS_SKIPPED else record

    def note_event(self, record: dict) -> None:
        """What the view derives from an event, the events read in the order they happened."""
        view = self.view
        self._note_adapter_event(record)
        if record["event"] == records.ENGINE:
            view._engine = record.get("engine")
        if record["writer"] == layout.TRAINER_WRITER and record["event"] in records.TRAINER_STAGES:
            view.trainer_end = record
        if record["event"] == records.LAUNCH_FAILED:
            view.launch_failed = record
        if record["writer"] == layout.TRAINER_WRITER and record["event"] == records.ATTEMPT:
            view.trainer_attempts.append(record)
        view.trainer_started = note_started(view.trainer_started, record)
        if record["event"] == records.BEST_BY_CHANGED and isinstance(record.get("best_by"), dict) and (
                _event_time(record) >= _event_time(view.best_by_change or {"time": float("-inf")})):
            view.best_by_change = record
        if record["event"] == records.ALERT and isinstance(record.get("key"), str):
            view.open_alerts[record["key"]] = record
        elif record["event"] == records.ALERT_CLEARED:
            view.open_alerts.pop(record.get("key"), None)

    def _note_adapter_event(self, event: dict) -> None:
        """A published version (its files may be gone: TRL deletes old serving copies) or superseded versions."""
        view = self.view
        if event["event"] == records.ADAPTERS_SUPERSEDED and isinstance(event.get("names"), list):
            for name in event["names"]:
                view.superseded[str(name)] = event.get("resumed_from_step")
        version = layout.adapter_version(event.get("name"))
        if event["event"] != records.ADAPTER_PUBLISHED or version is None or version in view.adapters:
            return
        self._versions_from_events = True
        name = event["name"]
        path = event.get("path") if isinstance(event.get("path"), str) else f"{layout.ADAPTERS_DIR}/{name}"
        step, size, when = event.get("step"), event.get("size_bytes"), event.get("time")
        bisect.insort(view._versions, version)
        view.adapters[version] = AdapterVersion(
            version=version, name=name, path=f"{layout.run_prefix(view.run_id)}/{path}",
            step=step if isinstance(step, int) else None, time=when if isinstance(when, (int, float)) else 0.0,
            size_bytes=size if isinstance(size, int) else 0)

    def read_adapters(self, full: bool = False) -> bool:
        """Versions come from the trainers' events; their folders are listed (for runs whose trainer wrote no
        such events) only as often as the metrics folder is, and final/ once the trainer says it finished."""
        view = self.view
        changed = rescan = False
        # A trainer that records its versions as events is the authority: its folders need no listing (thousands
        # of versions); one that never did (an older run) is listed as often as its metrics folder.
        if view.bounded:
            return False
        if (full or self.metrics.listed_at > self._adapters_listed_at) and not self._versions_from_events:
            self._adapters_listed_at = self.metrics.listed_at
            new = list_adapter_versions(view.store, view.run_id, known=set(view.adapters))
            view.adapters.update(new)
            for version in new:
                bisect.insort(view._versions, version)
            changed, rescan = bool(new), True
        elif full or self.metrics.listed_at > self._adapters_listed_at:
            self._adapters_listed_at = self.metrics.listed_at
            rescan = True
        finished = any(e.get("event") == records.FINISHED for e in view.events[-20:])
        if not view.final_files and (full or rescan or finished):
            view.final_files = final_adapter_files(view.store, view.run_id)
            changed |= bool(view.final_files)
        return changed

    def read_job(self, job: JobView) -> bool:
        view, executor = self.view, self.view.executor
        changed = False
        if job.log_cursor == 0:     # a first look shows the tail: a day-long log is not read from its start
            job.log_cursor = executor.tail_cursor(job.job_id, FIRST_LOOK_LOG_LINES)
            if job.log_cursor > 0 and not view.bounded:     # the rest of the tail is read with the history
                job.log_from = executor.tail_cursor(job.job_id, MAX_LOG_LINES)
        if job.history_end < 0:     # and the last hour of samples: the ones before are read in the background
            job.resource_cursor = job.history_end = executor.resources_tail_cursor(
                job.job_id, RECENT_SAMPLES if view.bounded else HISTORY_TAIL_SAMPLES)
        if job.status.stage not in TERMINAL_STAGES or job.log_cursor == 0:
            try:
                status = executor.status(job.job_id)
            except Exception as exc:  # a flaky status call must not break the dashboard
                status = JobStatus(job.status.stage, f"status unavailable: {exc}")
            changed |= status != job.status
            job.status = status
        lines, job.log_cursor = ([], job.log_cursor) if view.bounded else executor.read_logs(job.job_id,
                                                                                               job.log_cursor)
        if lines:
            job.logs.extend(lines)
            job.log_version += 1
        sampled = False
        while True:    # a day of samples on a first look is read in chunks, never all held at once
            samples, job.resource_cursor = executor.read_resources(job.job_id, job.resource_cursor,
                                                                   limit=SAMPLE_CHUNK)
            if not samples:
                break
            sampled = True
            job.resources.extend(samples)
            if not view.bounded:
                job.usage.add(samples)
        return changed or bool(lines) or sampled
