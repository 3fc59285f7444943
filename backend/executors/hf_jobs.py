"""HfJobsExecutor: runs JobSpecs on Hugging Face Jobs through huggingface_hub 2.4.

Logs and resource samples arrive as server-sent-event streams. The first `read_logs` / `read_resources`
of a job starts a background reader that follows its stream and buffers what it reads, so a panel tick
is a cheap cursor read, and a fresh executor (after a panel restart) can follow jobs it finds by label.
"""

import itertools
import re
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from huggingface_hub import HfApi, Volume
from huggingface_hub.errors import HfHubHTTPError

from backend.executors.base import ResourceSample, SubmitError
from backend.plan.engines.hf_jobs import ENGINE, exposed_url
from backend.plan.hardware import list_flavors
from backend.plan.jobspec import (
    APP_LABEL_VALUE,
    CHECK_APP_LABEL,
    DELETED,
    ERROR,
    LABEL_APP,
    LABEL_ROLE,
    LABEL_RUN,
    JobRecord,
    JobSpec,
    JobStatus,
)
from backend.runtime.redact import redact_tokens

PERMANENT_HTTP_ERRORS = frozenset({401, 403, 404})
_SUBMIT_HINTS = {
    401: "the Hugging Face token was refused: sign in again",
    402: "the namespace has no payment method for paid hardware",
    403: "this token may not run Jobs in the namespace (it needs write access and the `jobs` scope)",
}


# What a reader keeps of one job's stream: a long run's log or a day of 1 Hz samples must not grow the panel
# without bound. Cursors count from the stream's start, so readers that fall behind lose the oldest items only.
MAX_LOG_LINES = 20_000
MAX_SAMPLES = 7_200


@dataclass
class _Feed:
    """What one reader thread has taken from one job's stream: the newest `limit` items, and how many came before."""

    limit: int
    items: deque = field(default_factory=deque)
    dropped: int = 0
    thread: threading.Thread | None = None
    error: str | None = None

    def append(self, item) -> None:
        self.items.append(item)
        if len(self.items) > self.limit:
            self.items.popleft()
            self.dropped += 1

    @property
    def count(self) -> int:
        """Items taken since the stream started, kept or not."""
        return self.dropped + len(self.items)

    def since(self, cursor: int) -> tuple[list, int]:
        start = max(cursor - self.dropped, 0)
        return list(itertools.islice(self.items, start, None)), self.count


class HfJobsExecutor:
    """Submits, watches and cancels the jobs of runs in one Hub namespace (a user or an org)."""

    name = ENGINE.name
    lists_with_token = True     # each registry lists its namespace's jobs with its visitor's token (`base.Executor`)

    def __init__(self, token: str | None, namespace: str, *, reconnect_delay_s: float = 2.0):
        self.namespace = namespace
        self._api = HfApi(token=token)
        self._secrets: tuple[str, ...] = (token,) if token else ()
        self._reconnect_delay_s = reconnect_delay_s
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._feeds: dict[tuple[str, str], _Feed] = {}

    # ---- submit / status / cancel
    def submit(self, job: JobSpec, secrets: dict[str, str] | None = None) -> str:
        """Start `job` on HF Jobs; its secrets travel only as Job secrets, never as env variables."""
        values = self._secret_values(job, secrets or {})
        args = self._run_job_args(job, values)
        with self._lock:
            self._secrets = tuple(dict.fromkeys([*self._secrets, *values.values()]))
        try:
            info = self._api.run_job(**args)
        except Exception as err:
            raise SubmitError(self._submit_failure(job, err)) from err
        return info.id

    def status(self, job_id: str) -> JobStatus:
        try:
            info = self._api.inspect_job(job_id=job_id, namespace=self.namespace)
        except HfHubHTTPError as err:
            if _http_status(err) == 404:
                return JobStatus(DELETED, "the job no longer exists on the Hub")
            raise
        # The Hub's own words, which can quote the job's command or output: masked before anything shows them.
        message = redact_tokens(info.status.message or "", self._secrets)
        gave_up = self.reader_error(job_id)
        if gave_up:
            message = f"{message} (log stream stopped: {gave_up})".strip()
        stage = _stage(info.status.stage)
        return JobStatus(stage, message, timed_out=_timed_out(stage, info.status.message))

    def cancel(self, job_id: str) -> None:
        try:
            self._api.cancel_job(job_id=job_id, namespace=self.namespace)
        except HfHubHTTPError as err:
            if _http_status(err) != 404:   # a job that is gone needs no cancelling
                raise

    def list_jobs(self, run_id: str | None = None, checks: bool = False) -> list[JobRecord]:
        """Every job of this app in the namespace (or of one run; with `checks`, the task-check jobs instead, their
        check id as the run id), found by label, so a restarted panel finds them, newest first."""
        labels = {LABEL_APP: CHECK_APP_LABEL if checks else APP_LABEL_VALUE, **({LABEL_RUN: run_id} if run_id else {})}
        infos = self._api.list_jobs(labels=labels, namespace=self.namespace)
        listed_at = time.time()
        return sorted((_record(info, listed_at) for info in infos), key=lambda r: r.created_at, reverse=True)

    def flavors(self) -> list:
        """The Jobs hardware and hourly prices as this executor's token sees them (the built-in list if the Hub
        cannot be asked)."""
        return list_flavors(self._api)

    def unreadable_records(self, run_id: str) -> dict[str, int]:
        return {}    # the Hub's job records and streams arrive parsed; there is no file of ours to misread

    def exposed_url(self, job_id: str, port: int) -> str:
        """Where an exposed port answers (callers send `Authorization: Bearer <token>`): the URL the Hub reports
        for that port, else the documented `https://<job id>--<port>.hf.jobs`."""
        try:
            info = self._api.inspect_job(job_id=job_id, namespace=self.namespace)
            urls = dict(zip(info.expose or [], info.status.expose_urls or []))
        except Exception:   # the job was just created: a failed look-up falls back to the documented form
            urls = {}
        return urls.get(port) or exposed_url(job_id, port)

    # ---- logs and resources
    def read_logs(self, job_id: str, cursor: int) -> tuple[list[str], int]:
        feed = self._feed("logs", job_id, self._follow_logs, MAX_LOG_LINES)
        with self._lock:
            return feed.since(cursor)

    def tail_cursor(self, job_id: str, lines: int) -> int:
        feed = self._feed("logs", job_id, self._follow_logs, MAX_LOG_LINES)
        with self._lock:
            return max(feed.count - lines, 0)

    def all_logs(self, job_id: str) -> Iterator[str]:
        """The job's whole log, a line at a time: what the reader holds, or, where it has dropped old lines, the
        Hub's copy as it streams in."""
        feed = self._feed("logs", job_id, self._follow_logs, MAX_LOG_LINES)
        with self._lock:
            held = None if feed.dropped else list(feed.items)
        if held is not None:
            yield from (f"{line}\n" for line in held)
            return
        for line in self._api.fetch_job_logs(job_id=job_id, namespace=self.namespace, follow=False):
            yield redact_tokens(line.rstrip("\r\n"), self._secrets) + "\n"

    def read_resources(self, job_id: str, cursor: int, limit: int | None = None) -> tuple[list[ResourceSample], int]:
        feed = self._feed("metrics", job_id, self._follow_metrics, MAX_SAMPLES)
        with self._lock:
            samples, end = feed.since(cursor)
        if limit is not None and len(samples) > limit:
            return samples[:limit], end - (len(samples) - limit)
        return samples, end

    def resources_tail_cursor(self, job_id: str, samples: int) -> int:
        """0: the feed holds at most MAX_SAMPLES samples, few enough to read at once."""
        return 0

    def reader_error(self, job_id: str, kind: str = "logs") -> str | None:
        """Why a job's reader gave up for good (401/403/404), if it did."""
        feed = self._feeds.get((kind, job_id))
        return feed.error if feed else None

    def stop(self, timeout: float = 2.0) -> None:
        """End the reader threads. One blocked on a silent stream leaves at its next event (threads are daemons)."""
        self._stopping.set()
        deadline = time.monotonic() + timeout
        for feed in list(self._feeds.values()):
            if feed.thread is not None:
                feed.thread.join(max(0.0, deadline - time.monotonic()))

    # ---- internals: submission
    def _secret_values(self, job: JobSpec, secrets: dict[str, str]) -> dict[str, str]:
        missing = [name for name in job.secrets if not secrets.get(name)]
        if missing:
            raise SubmitError(f"The {job.role} job of run {job.run_id} needs a value for secret(s) "
                              f"{', '.join(missing)}; none was given.")
        values = {name: secrets[name] for name in job.secrets}
        leaked = sorted(k for k, v in job.env.items() if k in values or v in values.values())
        if leaked:
            raise SubmitError(f"The {job.role} job of run {job.run_id} puts a secret in its environment "
                              f"({', '.join(leaked)}); secrets must be passed as secrets only.")
        return values

    def _run_job_args(self, job: JobSpec, secret_values: dict[str, str]) -> dict[str, Any]:
        if job.namespace and job.namespace != self.namespace:
            raise SubmitError(f"The {job.role} job of run {job.run_id} is for namespace {job.namespace!r}, "
                              f"but this executor launches in {self.namespace!r}.")
        if job.timeout_s <= 0:
            raise SubmitError(f"The {job.role} job of run {job.run_id} has no timeout; set one in minutes.")
        # A run's jobs carry the app's label (the runs list finds them by it); a check job carries its own.
        labels = {LABEL_APP: APP_LABEL_VALUE, **job.labels, LABEL_RUN: job.run_id, LABEL_ROLE: job.role}
        volumes = [Volume(type="bucket", source=v.bucket, mount_path=v.mount_path, read_only=v.read_only)
                   for v in job.volumes]
        return dict(image=job.image, command=list(job.command), env=dict(job.env),
                    secrets=secret_values or None, flavor=job.flavor, timeout=job.timeout_s, labels=labels,
                    name=None if "name" in labels else _job_name(job), volumes=volumes or None,
                    expose=list(job.expose) or None, namespace=self.namespace,
                    # Sent only where a job asks for them: a plain job's request stays what it always was.
                    attempts=job.attempts if job.attempts > 1 else None, network_group=job.network_group,
                    network_aliases=list(job.network_aliases) or None, resource_group_id=job.resource_group_id)

    def _submit_failure(self, job: JobSpec, err: Exception) -> str:
        status = _http_status(err)
        if status is not None:
            server = getattr(err, "server_message", None) or str(err).splitlines()[0]
            reason = f"HTTP {status}: {_SUBMIT_HINTS.get(status, server.strip())}"
        else:
            reason = f"{type(err).__name__}: {err}"
        message = (f"Could not start the {job.role} job of run {job.run_id} on Hugging Face Jobs "
                   f"(namespace {self.namespace}, flavor {job.flavor}): {reason}")
        return redact_tokens(message, self._secrets)

    # ---- internals: readers
    def _feed(self, kind: str, job_id: str, target: Callable[[str, _Feed], None], limit: int) -> _Feed:
        with self._lock:
            feed = self._feeds.get((kind, job_id))
            if feed is None:
                feed = self._feeds[(kind, job_id)] = _Feed(limit)
                feed.thread = threading.Thread(target=target, args=(job_id, feed), daemon=True,
                                               name=f"hf-jobs-{kind}-{job_id}")
                feed.thread.start()
        return feed

    def _follow_logs(self, job_id: str, feed: _Feed) -> None:
        # The Hub replays a job's whole log on every connection, and huggingface_hub skips the replay only
        # within one fetch_job_logs call. When that call dies (HTTP error, retries exhausted), the next
        # call starts from line one again: skip as many lines as are already buffered (the library's own
        # event-index dedup, one level up), so a reconnect neither loses nor repeats a line.
        def stream() -> Iterable[str]:
            return self._api.fetch_job_logs(job_id=job_id, namespace=self.namespace, follow=True)

        def take(line: str, seen: int) -> None:
            with self._lock:
                if seen > feed.count:
                    feed.append(redact_tokens(line.rstrip("\r\n"), self._secrets))

        self._follow(job_id, feed, stream, take)

    def _follow_metrics(self, job_id: str, feed: _Feed) -> None:
        # Metrics have no history (each connection starts at the current sample): nothing to skip.
        def stream() -> Iterable[dict[str, Any]]:
            return self._api.fetch_job_metrics(job_id=job_id, namespace=self.namespace, follow=True)

        def take(payload: dict[str, Any], _seen: int) -> None:
            sample = _resource_sample(payload, time.time())
            with self._lock:
                feed.append(sample)

        self._follow(job_id, feed, stream, take)

    def _follow(self, job_id: str, feed: _Feed, stream: Callable[[], Iterable[Any]],
                take: Callable[[Any, int], None]) -> None:
        """Read `stream()` until the job ends, reconnecting after drops; `take(event, n)` gets the n-th event."""
        while not self._stopping.is_set():
            try:
                for seen, event in enumerate(stream(), start=1):
                    take(event, seen)
                    if self._stopping.is_set():
                        return
                if self._job_ended(job_id):
                    return
            except HfHubHTTPError as err:
                if _http_status(err) in PERMANENT_HTTP_ERRORS:
                    feed.error = redact_tokens(str(err).splitlines()[0], self._secrets)
                    return
            except Exception:
                pass   # a dropped connection or an unreachable Hub: try again after a pause
            self._stopping.wait(self._reconnect_delay_s)

    def _job_ended(self, job_id: str) -> bool:
        try:
            return self.status(job_id).done
        except Exception:
            return False


def _job_name(job: JobSpec) -> str:
    # Job names allow [a-zA-Z0-9._-]; the Hub UI lists jobs by it.
    return re.sub(r"[^a-zA-Z0-9._-]", "-", f"{job.run_id}-{job.role}")


def _stage(stage: Any) -> str:
    return str(getattr(stage, "value", stage))   # JobStage is a str Enum, or a plain str from the JSON


def _http_status(err: Exception) -> int | None:
    response = getattr(err, "response", None)
    return getattr(response, "status_code", None)


def _record(info: Any, listed_at: float | None = None) -> JobRecord:
    labels = info.labels or {}
    durations = getattr(info, "durations", None)
    return JobRecord(
        job_id=info.id, run_id=labels.get(LABEL_RUN, ""), role=labels.get(LABEL_ROLE, ""),
        stage=_stage(info.status.stage), created_at=info.created_at.timestamp() if info.created_at else 0.0,
        url=info.url, flavor=_stage(info.flavor) if info.flavor else None,
        bucket=next((v.source for v in info.volumes or [] if v.type == "bucket"), None),
        started_at=_epoch(getattr(info, "started_at", None)), finished_at=_epoch(getattr(info, "finished_at", None)),
        running_s=getattr(durations, "running_secs", None), listed_at=listed_at,
        timed_out=_timed_out(_stage(info.status.stage), info.status.message),
    )


def _timed_out(stage: str, message: str | None) -> bool:
    # The Hub stops a job that runs past its timeout with stage ERROR and the status message "Job timeout".
    return stage == ERROR and bool(re.search(r"\btime ?out\b", message or "", re.IGNORECASE))


def _epoch(moment: Any) -> float | None:
    return moment.timestamp() if moment else None


def _resource_sample(payload: dict[str, Any], received_at: float) -> ResourceSample:
    """One HF Jobs metrics event -> ResourceSample; GPUs are keyed by an opaque id, ordered by it."""
    gpus = [payload["gpus"][key] for key in sorted(payload.get("gpus") or {})]
    return ResourceSample(
        time=received_at,
        cpu_percent=payload.get("cpu_usage_pct"),
        ram_bytes=payload.get("memory_used_bytes"),
        gpu_util=tuple(float(g.get("utilization") or 0) for g in gpus),
        gpu_mem_bytes=tuple(int(g.get("memory_used_bytes") or 0) for g in gpus),
        gpu_mem_total_bytes=tuple(int(g.get("memory_total_bytes") or 0) for g in gpus),
    )

