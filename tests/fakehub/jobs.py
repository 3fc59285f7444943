"""Jobs: create, list by label, inspect, cancel, logs and metrics (the SSE streams are served by server.py),
hardware; the platform's retries (`attempts`), private networks and resource groups, and the test controls that drive
a job's stages."""

import re
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from tests.fakehub.common import FakeUser, RecordedRequest, Reply, hex_id, utc_stamp

TERMINAL = frozenset({"COMPLETED", "CANCELED", "ERROR", "DELETED"})


HARDWARE = [
    {"name": "cpu-basic", "prettyName": "CPU Basic", "cpu": "2 vCPU", "ram": "16 GB",
     "ephemeralStorage": "50 GB", "accelerator": None,
     "unitCostMicroUSD": 167, "unitCostUSD": 0.000167, "unitLabel": "minute"},
    {"name": "a10g-small", "prettyName": "Nvidia A10G - small", "cpu": "4 vCPU", "ram": "15 GB",
     "ephemeralStorage": "110 GB",
     "accelerator": {"type": "gpu", "model": "A10G", "quantity": "1", "vram": "24 GB", "manufacturer": "Nvidia"},
     "unitCostMicroUSD": 16667, "unitCostUSD": 0.016667, "unitLabel": "minute"},
    {"name": "l4x1", "prettyName": "Nvidia 1xL4", "cpu": "8 vCPU", "ram": "30 GB",
     "ephemeralStorage": "400 GB",
     "accelerator": {"type": "gpu", "model": "L4", "quantity": "1", "vram": "24 GB", "manufacturer": "Nvidia"},
     "unitCostMicroUSD": 13333, "unitCostUSD": 0.013333, "unitLabel": "minute"},
    {"name": "l4x4", "prettyName": "Nvidia 4xL4", "cpu": "48 vCPU", "ram": "186 GB",
     "ephemeralStorage": "1500 GB",
     "accelerator": {"type": "gpu", "model": "L4", "quantity": "4", "vram": "96 GB", "manufacturer": "Nvidia"},
     "unitCostMicroUSD": 63333, "unitCostUSD": 0.063333, "unitLabel": "minute"},
    {"name": "a10g-large", "prettyName": "Nvidia A10G - large", "cpu": "12 vCPU", "ram": "46 GB",
     "ephemeralStorage": "200 GB",
     "accelerator": {"type": "gpu", "model": "A10G", "quantity": "1", "vram": "24 GB", "manufacturer": "Nvidia"},
     "unitCostMicroUSD": 25000, "unitCostUSD": 0.025, "unitLabel": "minute"},
    {"name": "l40sx1", "prettyName": "Nvidia 1xL40S", "cpu": "8 vCPU", "ram": "62 GB",
     "ephemeralStorage": "380 GB",
     "accelerator": {"type": "gpu", "model": "L40S", "quantity": "1", "vram": "48 GB", "manufacturer": "Nvidia"},
     "unitCostMicroUSD": 30000, "unitCostUSD": 0.03, "unitLabel": "minute"},
    {"name": "a100-large", "prettyName": "Nvidia A100 - large", "cpu": "12 vCPU", "ram": "142 GB",
     "ephemeralStorage": "1000 GB",
     "accelerator": {"type": "gpu", "model": "A100", "quantity": "1", "vram": "80 GB", "manufacturer": "Nvidia"},
     "unitCostMicroUSD": 41667, "unitCostUSD": 0.041667, "unitLabel": "minute"},
]


@dataclass
class FakeJob:
    id: str
    namespace: str
    owner: dict[str, str]
    spec: dict[str, Any]
    created_at: str
    stage: str = "SCHEDULING"
    message: str | None = None
    logs: list[dict[str, str]] = field(default_factory=list)   # SSE events {"data", "timestamp"}
    metrics: list[dict[str, Any]] = field(default_factory=list)
    drops: int = 0              # bumped to cut the job's open log streams
    refuse_logs: int = 0        # refuse this many next log connections
    refuse_status: int = 503
    created: float = 0.0        # the hub clock's epoch seconds at creation, when it started and finished running
    started: float | None = None
    finished: float | None = None
    listed_from: float = 0.0    # time.monotonic() from which job listings show it (`list_lag_s` after creation)
    attempt: int = 1            # which of its `attempts` runs now (the Hub retries a job that ends in ERROR)
    ran_before: float = 0.0     # seconds its earlier attempts ran: `durations.runningSecs` counts every attempt

    @property
    def attempts(self) -> int:
        return int(self.spec.get("attempts") or 1)


_ID = r"(?P<{}>[^/]+)"
_JOB = rf"/api/jobs/{_ID.format('ns')}/{_ID.format('job')}"
ROUTES = [
    ("GET", r"/api/jobs/hardware", "hardware"),
    ("POST", rf"/api/jobs/{_ID.format('ns')}", "create_job"),
    ("GET", rf"/api/jobs/{_ID.format('ns')}", "list_jobs"),
    ("GET", _JOB, "get_job"),
    ("POST", _JOB + "/cancel", "cancel_job"),
    ("GET", _JOB + "/logs", "job_logs"),
    ("GET", _JOB + "/metrics", "job_metrics"),
]


class JobsMixin:
    """The Hub's jobs: state, routes (`ROUTES`) and test controls."""

    def _init_jobs(self) -> None:
        self.hardware: list[dict] = [dict(h) for h in HARDWARE]
        self.hardware_error: int | None = None
        self.list_error: int | None = None     # answer every job listing with this status (the Hub refusing it)
        self.jobs: dict[str, FakeJob] = {}
        self._job_post_count = 0
        self._job_post_failures: dict[int, int] = {}
        self._job_post_created_failures: dict[int, int] = {}
        self._job_post_holds: dict[int, tuple[threading.Event, threading.Event]] = {}
        # The job list is an index that catches up with new jobs: a job is in listings this many (real) seconds
        # after its creation, though inspecting it by id works at once.
        self.list_lag_s = 0.0
        # The URL the Hub reports for an exposed port (`status.exposeUrls`); the documented form by default.
        self.expose_url_format = "https://{job_id}--{port}.hf.jobs"
        self._open_streams: dict[tuple[str, str], int] = {}
        # Resource groups of orgs: id -> org name. A job may be created in one of its own namespace's only.
        self.resource_groups: dict[str, str] = {}
        self.check_runner = None   # runs task-check jobs as the Hub would (tests/check_runner.py)

    # ---- test controls
    def set_stage(self, job_id: str, stage: str, message: str | None = None) -> None:
        """Move a job to `stage`. A job that fails (ERROR) with attempts left is retried as the Hub retries it: it
        goes back to SCHEDULING as its next attempt (same id), and RUNNING starts that attempt's log banner anew."""
        with self._cond:
            job = self.jobs[job_id]
            now = self.clock()
            if stage == "ERROR" and job.stage not in TERMINAL and job.attempt < job.attempts:
                job.ran_before += now - job.started if job.started is not None else 0.0
                job.attempt += 1
                job.stage, job.message, job.started = "SCHEDULING", message, None
                self._cond.notify_all()
                return
            if stage == "RUNNING" and job.stage == "SCHEDULING":
                # The Hub writes this banner first; the client filters it out of fetch_job_logs.
                job.logs.append({"data": f"===== Job started at {utc_stamp(now)} =====", "timestamp": utc_stamp(now)})
                job.started = now
            if stage in TERMINAL and job.stage not in TERMINAL:
                job.finished = now
            job.stage, job.message = stage, message
            self._cond.notify_all()

    def append_logs(self, job_id: str, *lines: str) -> None:
        with self._cond:
            self.jobs[job_id].logs.extend({"data": line, "timestamp": utc_stamp()} for line in lines)
            self._cond.notify_all()

    def append_metrics(self, job_id: str, *samples: dict[str, Any]) -> None:
        with self._cond:
            self.jobs[job_id].metrics.extend(samples)
            self._cond.notify_all()

    def drop_log_streams(self, job_id: str, refuse_next: int = 0, status: int = 503) -> None:
        """Cut every open log stream of the job without finishing the chunked body, like a dropped connection."""
        with self._cond:
            job = self.jobs[job_id]
            job.drops += 1
            job.refuse_logs, job.refuse_status = refuse_next, status
            self._cond.notify_all()

    def fail_nth_job_submission(self, n: int, status: int = 500) -> None:
        """Answer the n-th job creation (POST /api/jobs/{ns}, 1-based) with `status`."""
        self._job_post_failures[n] = status

    def create_then_fail_nth_job_submission(self, n: int, status: int = 504) -> None:
        """Create the n-th submitted job (1-based) as asked, then answer `status`, like a gateway timing out after
        the Hub accepted the job: the client never learns the job's id."""
        self._job_post_created_failures[n] = status

    def hold_nth_job_submission(self, n: int) -> tuple[threading.Event, threading.Event]:
        """Hold the n-th job creation (1-based) before the Hub acts on it: (arrived, release). `arrived` is set when
        the request is in; once `release` is set the job is created as asked and answered, as the Hub finishes a
        request whose client may have gone away meanwhile."""
        hold = self._job_post_holds[n] = (threading.Event(), threading.Event())
        return hold

    def network_members(self, ns: str, group: str, resource_group: str | None = None) -> dict[str, list[str]]:
        """The live jobs of network group `group` as the Hub places them: one namespace and one resource group (jobs
        elsewhere sharing the name are in another group), by the alias they claim ("" for members without one)."""
        members: dict[str, list[str]] = {}
        with self._cond:
            for job in self.jobs.values():
                network = job.spec.get("network") or {}
                place = (job.namespace, job.spec.get("resourceGroupId"), network.get("group"))
                if place != (ns, resource_group, group) or job.stage in TERMINAL:
                    continue
                for alias in network.get("aliases") or [""]:
                    members.setdefault(alias, []).append(job.id)
        return members

    def open_streams(self, job_id: str, kind: str) -> int:
        with self._cond:
            return self._open_streams.get((job_id, kind), 0)

    def job_posts(self) -> list[RecordedRequest]:
        """The bodies of every job creation request of a run, in order (task-check jobs: `check_job_posts`)."""
        return [r for r in self._job_creations() if not _is_check(r)]

    @property
    def run_jobs(self) -> dict[str, FakeJob]:
        """The jobs of runs, without the task-check jobs a Space-mode panel starts."""
        return {i: j for i, j in self.jobs.items() if (j.spec.get("labels") or {}).get("grpo-panel-role")
                != "task-check"}

    def check_job_posts(self) -> list[RecordedRequest]:
        """The bodies of every task-check job creation request, in order."""
        return [r for r in self._job_creations() if _is_check(r)]

    def _job_creations(self) -> list[RecordedRequest]:
        return [r for r in self.requests if r.method == "POST" and re.fullmatch(r"/api/jobs/[^/]+", r.path)]

    def _hardware(self, **_: Any) -> Reply:
        if self.hardware_error:
            return Reply(self.hardware_error, {"error": "hardware listing unavailable"})
        return Reply(200, self.hardware)

    def _create_job(self, user: FakeUser, ns: str, body: Any, **_: Any) -> Reply:
        with self._cond:
            hold = self._job_post_holds.pop(self._job_post_count, None)
        if hold is not None:
            hold[0].set()
            hold[1].wait(120)
        if not self._may_write(user, ns):
            return Reply(403, {"error": f"You cannot run jobs in namespace {ns}"})
        problem = _job_spec_problem(body, {h["name"] for h in self.hardware})
        if problem:
            return Reply(400, {"error": problem})
        group = body.get("resourceGroupId")
        if group is not None and self.resource_groups.get(group) != ns:
            return Reply(404, {"error": f"Resource group {group} not found in {ns}"})
        owner_type = "user" if ns == user.name else "org"
        now = self.clock()
        job = FakeJob(hex_id(f"{ns}{time.time_ns()}{len(self.jobs)}"), ns,
                      {"id": hex_id(ns), "name": ns, "type": owner_type}, body, utc_stamp(now), created=now,
                      listed_from=time.monotonic() + self.list_lag_s)
        with self._cond:
            self.jobs[job.id] = job
        late = self.created_then_failed()
        if late:
            return Reply(late, {"error": "Gateway Timeout"})
        return Reply(200, self._job_json(job))

    def _list_jobs(self, user: FakeUser, ns: str, query: dict[str, list[str]], **_: Any) -> Reply:
        if not self._may_read(user, ns):
            return Reply(403, {"error": f"You cannot list jobs of namespace {ns}"})
        if self.list_error is not None:
            return Reply(self.list_error, {"error": "Internal Error - We're working hard to fix this as soon as "
                                                    "possible!"})
        wanted = dict(label.split("=", 1) for label in query.get("label", []))
        stages = set(query.get("stage", []))
        with self._cond:
            for job in self.jobs.values():
                self._expire(job)
            found = [j for j in self.jobs.values() if j.namespace == ns and time.monotonic() >= j.listed_from
                     and wanted.items() <= (j.spec.get("labels") or {}).items()
                     and (not stages or j.stage in stages)]
            items = [self._job_json(j) for j in found]
        return self._page(f"/api/jobs/{ns}", query, items)

    def _get_job(self, user: FakeUser, ns: str, job: str, **_: Any) -> Reply:
        found = self._find_job(user, ns, job)
        if isinstance(found, Reply):
            return found
        self._expire(found)
        return Reply(200, self._job_json(found))

    def _expire(self, job: FakeJob) -> None:
        """Stop a job that has run for its `timeoutSeconds` as the Hub does: stage ERROR, status message "Job timeout"
        (hub-docs, jobs/manage.md). Counted from when it started running; applied whenever the job is looked at."""
        timeout = job.spec.get("timeoutSeconds")
        with self._cond:
            if job.stage == "RUNNING" and timeout and job.started is not None and self.clock() >= job.started + timeout:
                job.stage, job.message, job.finished = "ERROR", "Job timeout", job.started + timeout
                self._cond.notify_all()

    def _cancel_job(self, user: FakeUser, ns: str, job: str, **_: Any) -> Reply:
        found = self._find_job(user, ns, job)
        if isinstance(found, Reply):
            return found
        if not self._may_write(user, ns):
            return Reply(403, {"error": "You cannot cancel this job"})
        if found.stage not in TERMINAL:
            self.set_stage(found.id, "CANCELED")
        return Reply(200)

    def _job_logs(self, user: FakeUser, ns: str, job: str, **_: Any) -> Reply | tuple[str, FakeJob]:
        found = self._find_job(user, ns, job)
        if isinstance(found, Reply):
            return found
        with self._cond:
            if found.refuse_logs > 0:
                found.refuse_logs -= 1
                return Reply(found.refuse_status, {"error": "log service unavailable"})
        return ("logs", found)

    def _job_metrics(self, user: FakeUser, ns: str, job: str, **_: Any) -> Reply | tuple[str, FakeJob]:
        found = self._find_job(user, ns, job)
        if isinstance(found, Reply):
            return found
        if found.stage in TERMINAL:
            return Reply(406, {"error": "Job is not running"})   # the Hub's answer for finished jobs
        return ("metrics", found)

    def _find_job(self, user: FakeUser, ns: str, job: str) -> FakeJob | Reply:
        if not self._may_read(user, ns):
            return Reply(403, {"error": f"You cannot access jobs of namespace {ns}"})
        found = self.jobs.get(job)
        if found is None or found.namespace != ns:
            return Reply(404, {"error": "Job not found"})
        return found

    def _job_json(self, job: FakeJob) -> dict[str, Any]:
        spec = job.spec
        ports = (spec.get("expose") or {}).get("ports") or []
        status: dict[str, Any] = {"stage": job.stage, "message": job.message}
        if ports:
            status["exposeUrls"] = [self.expose_url_format.format(job_id=job.id, port=port) for port in ports]
        return {
            "id": job.id, "createdAt": job.created_at, "dockerImage": spec.get("dockerImage"),
            "spaceId": spec.get("spaceId"), "command": spec.get("command"), "arguments": spec.get("arguments"),
            "environment": spec.get("environment"),
            "secrets": {name: None for name in spec.get("secrets") or {}},   # values never come back
            "flavor": spec.get("flavor"), "labels": spec.get("labels"), "volumes": spec.get("volumes"),
            "expose": spec.get("expose"), "status": status, "owner": job.owner,
            "retry": job.attempts - 1, **({"network": spec["network"]} if spec.get("network") else {}),
            **({"startedAt": utc_stamp(job.started)} if job.started is not None else {}),
            **({"finishedAt": utc_stamp(job.finished)} if job.finished is not None else {}),
            "durations": self._durations(job),
        }

    def _durations(self, job: FakeJob) -> dict[str, int | None]:
        """Whole seconds, recomputed on every request while the job is in progress (as the Hub does)."""
        end = job.finished if job.finished is not None else self.clock()
        ran = job.started is not None
        running = (end - job.started if ran else 0.0) + job.ran_before
        return {"schedulingSecs": int(job.started - job.created) if ran else None,
                "runningSecs": int(running) if ran or job.ran_before else None, "totalSecs": int(end - job.created)}

    def created_then_failed(self) -> int | None:
        """The status to answer after creating the job of the job submission being handled, if a test asked."""
        with self._cond:
            return self._job_post_created_failures.pop(self._job_post_count, None)

    def _stream_open(self, job_id: str, kind: str, delta: int) -> None:
        with self._cond:
            key = (job_id, kind)
            self._open_streams[key] = self._open_streams.get(key, 0) + delta


def _is_check(request: RecordedRequest) -> bool:
    return ((request.json or {}).get("labels") or {}).get("grpo-panel-role") == "task-check"


def _job_spec_problem(body: Any, flavors: set[str]) -> str | None:
    if not isinstance(body, dict):
        return "body must be a JSON object"
    if not isinstance(body.get("command"), list):
        return "command must be a list of strings"
    if not (body.get("dockerImage") or body.get("spaceId")):
        return "dockerImage or spaceId is required"
    if body.get("flavor") not in flavors:
        return f"Invalid flavor {body.get('flavor')!r}"
    if any(not isinstance(v, str) for v in (body.get("labels") or {}).values()):
        return "label values must be strings"
    attempts = body.get("attempts", 1)
    if not isinstance(attempts, int) or isinstance(attempts, bool) or attempts < 1:
        return "attempts must be a whole number of at least 1"
    return _network_problem(body.get("network"))


def _network_problem(network: Any) -> str | None:
    """The run_job docstring's rules: a group of lowercase alphanumerics and dashes (46 at most), aliases of the same
    (34 at most), unique within the job."""
    if network is None:
        return None
    group, aliases = network.get("group") if isinstance(network, dict) else None, (network or {}).get("aliases") or []
    if not isinstance(group, str) or not re.fullmatch(r"[a-z0-9-]{1,46}", group):
        return f"Invalid network group {group!r}: lowercase alphanumerics and dashes, 46 characters max"
    if not isinstance(aliases, list) or any(not isinstance(a, str) or not re.fullmatch(r"[a-z0-9-]{1,34}", a)
                                            for a in aliases):
        return f"Invalid network aliases {aliases!r}: lowercase alphanumerics and dashes, 34 characters max"
    if len(set(aliases)) != len(aliases):
        return f"Network aliases must be unique within the job: {aliases}"
    return None
