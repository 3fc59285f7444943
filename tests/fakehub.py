"""A loopback fake of the Hugging Face Hub REST protocol, driven through the real `huggingface_hub` client.

It is a real HTTP/1.1 server (stdlib `ThreadingHTTPServer`, a free port on 127.0.0.1, a background thread)
that speaks the paths and JSON shapes `huggingface_hub` 2.4 uses: Jobs (create, list by label, inspect,
cancel, logs and metrics as server-sent events, hardware), `whoami-v2`, and Buckets (create, info, tree,
paths-info). Every call needs `Authorization: Bearer <known token>` (401 otherwise), and a token only
reaches the namespaces of its user and orgs (403 otherwise).

Pointing the real client at it: `huggingface_hub.constants.ENDPOINT` is read from `HF_ENDPOINT` once, when
huggingface_hub is first imported, so setting the env variable later changes nothing. `HfApi.__init__`
copies `constants.ENDPOINT` each time an `HfApi` is built, so patch the constant before building one:

    hub = FakeHub().start()
    hub.patch_endpoint(monkeypatch)          # monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", hub.url)
    api = HfApi(token=hub.token)             # or HfApi(endpoint=hub.url, token=hub.token)

Module-level helpers (`huggingface_hub.whoami`, `huggingface_hub.list_jobs`, ...) are bound to an `HfApi`
built at import time and keep the real endpoint; `HfApi.list_jobs` without `namespace=` calls that
module-level `whoami`. Call methods on an `HfApi` instance and always pass `namespace=`. (The client also
GETs `/api/agent-harnesses` once, unauthenticated, to detect coding agents: the fake answers 401 and the
client ignores it.)

Bucket file bytes travel over Xet in the real client, which this fake does not speak:
`install_bucket_transfers(monkeypatch)` replaces `HfApi.batch_bucket_files` and
`HfApi.download_bucket_files` with functions that read and write the fake's in-memory files (recorded in
`transfers`). Listing (`/tree`, `/paths-info`) stays HTTP, served from the same files.

Model repos: create (`/api/repos/create`), card metadata check (`/api/validate-yaml`), `preupload` (regular or
LFS per file), `commit` (the ndjson body `create_commit` sends) and model info. File bytes that `preupload` sends
to LFS travel over Xet or LFS in the real client: `install_repo_transfers(monkeypatch)` replaces
`huggingface_hub._commit_api._upload_files` with a function that stores them in the fake (`lfs_objects`), and the
commit refuses an LFS pointer to bytes it never received, as the Hub does.

It also answers the dataset viewer API (datasets-server: `/splits`, `/rows`) from `datasets`, with the JSON
shapes of its OpenAPI description: public datasets need no token, a private one answers 401 to anonymous
callers and 404 to others (both with the viewer's "does not exist, or is not accessible" error), an unknown
config or split 404 "Not found.", a bad parameter 422. `patch_endpoint` points huggingface_hub's
`DATASETS_SERVER_ENDPOINT` constant at the fake too. A public stand-in for "trl-lib/DeepMath-103K" (three
rows: a conversational `prompt` and a `solution`) is there from the start; `put_dataset` adds others.

Task-check jobs (label `grpo-panel-role=task-check`) run as Jobs would run them, on a "machine" of their own
(tests/check_runner.py): their log and stage come from the real check they run. Every other job is the test's to
drive. Test controls: `set_stage`, `append_logs`, `append_metrics`, `drop_log_streams` (cut every open log
stream of a job mid-way, optionally refusing the next reconnects), `fail_nth_post`,
`fail_nth_job_submission`, `create_then_fail_nth_job_submission` (the job exists, the answer is a 504),
`bucket_read_error` (bucket listings fail), `list_lag_s` (a new job shows in job listings only that many seconds
after its creation), `expose_url_format`, `hardware_error`, `page_size` (Link-header
pagination), `requests` (every call, Authorization header removed), `clock` (the Hub's time: job timestamps and
`durations` follow it; a RUNNING job whose `timeoutSeconds` have passed on it ends ERROR, "Job timeout").

Platform features as `run_job`'s docstring describes them: `attempts` (a job set to ERROR with attempts left goes
back to SCHEDULING as its next attempt, same id; JobInfo reports `retry` = attempts - 1, and `durations.runningSecs`
counts every attempt), `network` (group and aliases checked as documented and reported back in JobInfo;
`network_members` lists a group's live members of one namespace and resource group by alias) and `resourceGroupId`
(accepted only for a group of the job's namespace in `resource_groups`, id -> org, else 404; recorded in the job's
spec).
"""

import base64
import contextlib
import hashlib
import json
import re
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlencode, urlsplit

TERMINAL = frozenset({"COMPLETED", "CANCELED", "ERROR", "DELETED"})
KEEPALIVE_S = 5.0
DEFAULT_TOKEN = "hf_" + "fakeHubTokenOfAliceForTestsOnly0"

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


def utc_stamp(at: float | None = None) -> str:
    """A Hub timestamp: ISO 8601, milliseconds, ending in Z."""
    moment = datetime.fromtimestamp(time.time() if at is None else at, UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def wait_until(predicate: Callable[[], Any], timeout: float = 10.0, interval: float = 0.02,
               what: str = "condition") -> Any:
    """Poll `predicate` until it returns something truthy; fail the test after `timeout` seconds, naming `what`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"{what} not met within {timeout}s")


@dataclass
class FakeUser:
    name: str
    orgs: dict[str, str] = field(default_factory=dict)   # org name -> roleInOrg ("admin", "write", "read")


@dataclass(frozen=True)
class RecordedRequest:
    method: str
    path: str                   # decoded, without the query string
    query: dict[str, list[str]]
    json: Any                   # parsed JSON body, or None
    headers: dict[str, str]     # lower-case names, Authorization removed
    user: str | None            # whose token it carried


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


@dataclass
class FakeObject:
    data: bytes
    mtime: str
    uploaded_at: str

    @property
    def xet_hash(self) -> str:
        return hashlib.sha256(self.data).hexdigest()


@dataclass
class FakeBucket:
    id: str
    private: bool
    created_at: str
    files: dict[str, FakeObject] = field(default_factory=dict)


@dataclass
class FakeRepo:
    id: str
    type: str
    private: bool
    created_at: str
    files: dict[str, bytes] = field(default_factory=dict)
    lfs: set[str] = field(default_factory=set)          # paths committed as LFS pointers
    commits: list[dict[str, Any]] = field(default_factory=list)   # {"oid", "summary", "paths"} newest last

    @property
    def sha(self) -> str:
        return self.commits[-1]["oid"] if self.commits else "0" * 40

    def oid(self, path: str) -> str:
        """What the Hub's preupload answers for a file already there: sha256 for LFS, git's blob sha1 otherwise."""
        data = self.files[path]
        if path in self.lfs:
            return hashlib.sha256(data).hexdigest()
        return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclass
class Reply:
    status: int
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)


class FakeHub:
    """The Hub's state plus the server that serves it. `start()` returns self; `stop()` closes every stream."""

    def __init__(self, users: dict[str, FakeUser] | None = None):
        self.users = users or {DEFAULT_TOKEN: FakeUser("alice", {"acme": "write", "readers": "read"})}
        # The Hub's clock: job timestamps and durations are read from it, so a test can make time pass.
        self.clock: Callable[[], float] = time.time
        self.token = next(iter(self.users))
        self.hardware: list[dict] = [dict(h) for h in HARDWARE]
        self.hardware_error: int | None = None
        self.page_size = 100
        self.requests: list[RecordedRequest] = []
        self.transfers: list[tuple[str, str, str]] = []   # ("upload" | "download" | "delete", bucket, path)
        self.jobs: dict[str, FakeJob] = {}
        self.buckets: dict[str, FakeBucket] = {}
        self.repos: dict[str, FakeRepo] = {}
        self.lfs_objects: dict[tuple[str, str], bytes] = {}   # (repo id, sha256) -> bytes uploaded beside git
        deepmath = FakeDataset("trl-lib/DeepMath-103K", False, {("default", "train"): DEEPMATH_STAND_IN})
        self.datasets: dict[str, FakeDataset] = {deepmath.id: deepmath}
        self._cond = threading.Condition(threading.RLock())
        self._post_count = 0
        self._post_failures: dict[int, int] = {}
        self._job_post_count = 0
        self._job_post_failures: dict[int, int] = {}
        self._job_post_created_failures: dict[int, int] = {}
        self.bucket_read_error: int | None = None     # answer bucket listings with this status (e.g. 500)
        # The job list is an index that catches up with new jobs: a job is in listings this many (real) seconds
        # after its creation, though inspecting it by id works at once.
        self.list_lag_s = 0.0
        # The URL the Hub reports for an exposed port (`status.exposeUrls`); the documented form by default.
        self.expose_url_format = "https://{job_id}--{port}.hf.jobs"
        self._open_streams: dict[tuple[str, str], int] = {}
        # Resource groups of orgs: id -> org name. A job may be created in one of its own namespace's only.
        self.resource_groups: dict[str, str] = {}
        self._stopping = False
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self.check_runner = None   # runs task-check jobs as the Hub would (tests/check_runner.py)

    # ---- lifecycle
    @property
    def url(self) -> str:
        assert self._server is not None, "start() the FakeHub first"
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> "FakeHub":
        handler = type("BoundHandler", (_Handler,), {"hub": self})
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._server.daemon_threads = True
        # A short poll: stop() waits for it, once per test using the fake.
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="fakehub", daemon=True)
        self._thread.start()
        from tests.check_runner import CheckJobRunner

        self.check_runner = CheckJobRunner(self).start()
        return self

    def stop(self) -> None:
        if self.check_runner is not None:
            self.check_runner.stop()
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    @contextlib.contextmanager
    def serving(self, monkeypatch: Any, host_token: str, repos: bool = False):
        """This started fake as the Hub for the test: every `HfApi` pointed at it, bucket (and, with `repos`, repo)
        transfers through it, `host_token` as the host's HF_TOKEN; stopped at the end."""
        self.patch_endpoint(monkeypatch)
        self.install_bucket_transfers(monkeypatch)
        if repos:
            self.install_repo_transfers(monkeypatch)
        monkeypatch.setenv("HF_TOKEN", host_token)
        try:
            yield self
        finally:
            self.stop()

    def patch_endpoint(self, monkeypatch: Any) -> None:
        """Point every `HfApi` built from now on at this fake (see the module docstring for why this works)."""
        import huggingface_hub.constants

        monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", self.url)
        monkeypatch.setattr(huggingface_hub.constants, "DATASETS_SERVER_ENDPOINT", self.url)

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

    def fail_nth_post(self, n: int, status: int = 500) -> None:
        """Answer the n-th POST (counted from the server's start, 1-based) with `status`."""
        self._post_failures[n] = status

    def fail_nth_job_submission(self, n: int, status: int = 500) -> None:
        """Answer the n-th job creation (POST /api/jobs/{ns}, 1-based) with `status`."""
        self._job_post_failures[n] = status

    def create_then_fail_nth_job_submission(self, n: int, status: int = 504) -> None:
        """Create the n-th submitted job (1-based) as asked, then answer `status`, like a gateway timing out after
        the Hub accepted the job: the client never learns the job's id."""
        self._job_post_created_failures[n] = status

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

    def put_dataset(self, dataset_id: str, rows: list[dict], config: str = "default", split: str = "train",
                    private: bool = False) -> None:
        """Serve `rows` as one split of a dataset through the dataset viewer API (adds to an existing dataset)."""
        with self._cond:
            found = self.datasets.setdefault(dataset_id, FakeDataset(dataset_id, private))
            found.private = private
            found.splits[(config, split)] = [dict(r) for r in rows]

    def put_file(self, bucket_id: str, path: str, data: bytes) -> None:
        with self._cond:
            now = utc_stamp()
            self.buckets[bucket_id].files[path] = FakeObject(data, now, now)

    # ---- bucket bytes, faked at the method level (the real client moves them over Xet)
    def install_bucket_transfers(self, monkeypatch: Any) -> None:
        from huggingface_hub import HfApi

        hub = self

        def batch_bucket_files(api, bucket_id, *, add=None, copy=None, delete=None, token=None):
            hub._check_transfer_token(api, token, bucket_id)
            for source, dest in add or []:
                data = source if isinstance(source, bytes) else Path(source).read_bytes()
                hub.put_file(bucket_id, dest, data)
                hub.transfers.append(("upload", bucket_id, dest))
            for path in delete or []:
                with hub._cond:
                    hub.buckets[bucket_id].files.pop(path, None)
                hub.transfers.append(("delete", bucket_id, path))

        def download_bucket_files(api, bucket_id, files, *, raise_on_missing_files=False, token=None):
            hub._check_transfer_token(api, token, bucket_id)
            if hub.bucket_read_error:
                raise OSError(f"{hub.bucket_read_error}: bucket storage unavailable")
            for remote, local in files:
                path = remote if isinstance(remote, str) else remote.path
                stored = hub.buckets[bucket_id].files.get(path)
                if stored is None:
                    if raise_on_missing_files:
                        raise FileNotFoundError(f"{path} not in bucket {bucket_id}")
                    continue
                _write_local(str(local), stored.data)
                hub.transfers.append(("download", bucket_id, path))

        monkeypatch.setattr(HfApi, "batch_bucket_files", batch_bucket_files)
        monkeypatch.setattr(HfApi, "download_bucket_files", download_bucket_files)

    # ---- LFS/Xet file bytes of repo commits, faked at the method level (the real client moves them over Xet or
    # LFS; the JSON endpoints around them, preupload and commit, stay HTTP)
    def install_repo_transfers(self, monkeypatch: Any) -> None:
        import huggingface_hub._commit_api as commit_api

        hub = self

        def upload_files(*, additions, repo_type, repo_id, headers, endpoint=None, num_threads=5, revision=None,
                         create_pr=None):
            user = hub.users.get(_bearer(headers.get("authorization") or headers.get("Authorization") or ""))
            if user is None or not hub._may_write(user, repo_id.split("/")[0]):
                raise PermissionError(f"401/403: token may not upload to {repo_type} {repo_id}")
            for op in additions:
                with op.as_file() as f:
                    hub.put_lfs_object(repo_id, f.read())
                hub.transfers.append(("lfs-upload", repo_id, op.path_in_repo))

        monkeypatch.setattr(commit_api, "_upload_files", upload_files)

    def put_lfs_object(self, repo_id: str, data: bytes) -> None:
        with self._cond:
            self.lfs_objects[(repo_id, hashlib.sha256(data).hexdigest())] = data

    def _check_transfer_token(self, api: Any, token: Any, bucket_id: str) -> None:
        user = self.users.get(token if isinstance(token, str) else api.token)
        if user is None or not self._may_read(user, bucket_id.split("/")[0]):
            raise PermissionError(f"401/403: token may not write to bucket {bucket_id}")
        if bucket_id not in self.buckets:
            raise FileNotFoundError(f"bucket {bucket_id} does not exist")

    # ---- protocol
    def handle(self, method: str, raw_path: str, query: dict[str, list[str]], body: Any,
               user: FakeUser) -> Reply | tuple[str, FakeJob]:
        """Route one authenticated request. A (kind, job) tuple means: serve that job's SSE stream."""
        for route_method, pattern, name in _ROUTES:
            match = re.fullmatch(pattern, raw_path)
            if route_method == method and match:
                args = {k: unquote(v) if v is not None else None for k, v in match.groupdict().items()}
                return getattr(self, "_" + name)(user=user, query=query, body=body, **args)
        return Reply(404, {"error": f"no route for {method} {raw_path}"})

    def viewer(self, path: str, query: dict[str, list[str]], user: FakeUser | None) -> Reply:
        """One dataset viewer call (`/splits` or `/rows`); `user` is None for an anonymous or unknown token."""
        dataset = (query.get("dataset") or [""])[0]
        if not dataset:
            return _viewer_error(422, "Parameter 'dataset' is required", "MissingRequiredParameter")
        with self._cond:
            found = self.datasets.get(dataset)
            if found is None or (found.private and (user is None or not self._may_read(user, dataset.split("/")[0]))):
                if user is None:
                    return _viewer_error(401, VIEWER_NOT_ACCESSIBLE, "ExternalUnauthenticatedError")
                return _viewer_error(404, VIEWER_NOT_ACCESSIBLE, "ExternalAuthenticatedError")
            if path == "/splits":
                splits = [{"dataset": dataset, "config": c, "split": sp} for c, sp in found.splits]
                return Reply(200, {"splits": splits, "pending": [], "failed": []})
            return _viewer_rows(found, query)

    def _may_read(self, user: FakeUser, namespace: str) -> bool:
        return namespace == user.name or namespace in user.orgs

    def _may_write(self, user: FakeUser, namespace: str) -> bool:
        return namespace == user.name or user.orgs.get(namespace) not in (None, "read")

    def _whoami(self, user: FakeUser, **_: Any) -> Reply:
        orgs = [{"type": "org", "name": name, "fullname": name.title(), "roleInOrg": role}
                for name, role in user.orgs.items()]
        return Reply(200, {"type": "user", "id": _hex_id(user.name), "name": user.name,
                           "fullname": user.name.title(), "orgs": orgs,
                           "auth": {"type": "access_token", "accessToken": {"displayName": "test", "role": "write"}}})

    def _hardware(self, **_: Any) -> Reply:
        if self.hardware_error:
            return Reply(self.hardware_error, {"error": "hardware listing unavailable"})
        return Reply(200, self.hardware)

    def _create_job(self, user: FakeUser, ns: str, body: Any, **_: Any) -> Reply:
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
        job = FakeJob(_hex_id(f"{ns}{time.time_ns()}{len(self.jobs)}"), ns,
                      {"id": _hex_id(ns), "name": ns, "type": owner_type}, body, utc_stamp(now), created=now,
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

    def _create_bucket(self, user: FakeUser, ns: str, name: str, body: Any, **_: Any) -> Reply:
        bucket_id, url = f"{ns}/{name}", f"{self.url}/buckets/{ns}/{name}"
        if not self._may_write(user, ns):
            return Reply(403, {"error": f"You cannot create buckets in {ns}"})
        with self._cond:
            if bucket_id in self.buckets:
                return Reply(409, {"error": "You already created this bucket", "url": url})
            private = (body or {}).get("visibility") == "private"
            self.buckets[bucket_id] = FakeBucket(bucket_id, private, utc_stamp())
        return Reply(200, {"url": url, "name": name, "id": bucket_id})

    def _bucket_info(self, user: FakeUser, ns: str, name: str, **_: Any) -> Reply:
        bucket = self._find_bucket(user, ns, name)
        if isinstance(bucket, Reply):
            return bucket
        return Reply(200, {"id": bucket.id, "private": bucket.private, "createdAt": bucket.created_at,
                           "size": sum(len(f.data) for f in bucket.files.values()),
                           "totalFiles": len(bucket.files)})

    def _bucket_tree(self, user: FakeUser, ns: str, name: str, query: dict[str, list[str]],
                     prefix: str | None = None, **_: Any) -> Reply:
        if self.bucket_read_error:
            return Reply(self.bucket_read_error, {"error": "bucket storage unavailable"})
        bucket = self._find_bucket(user, ns, name)
        if isinstance(bucket, Reply):
            return bucket
        recursive = query.get("recursive", ["false"])[0].lower() == "true"
        items = _tree_items(bucket, prefix or "", recursive)
        path = f"/api/buckets/{ns}/{name}/tree" + (f"/{prefix}" if prefix else "")
        return self._page(path, query, items)

    def _paths_info(self, user: FakeUser, ns: str, name: str, body: Any, **_: Any) -> Reply:
        if self.bucket_read_error:
            return Reply(self.bucket_read_error, {"error": "bucket storage unavailable"})
        bucket = self._find_bucket(user, ns, name)
        if isinstance(bucket, Reply):
            return bucket
        with self._cond:
            wanted = [p for p in (body or {}).get("paths", []) if p in bucket.files]
            return Reply(200, [_file_json(p, bucket.files[p]) for p in wanted])

    def _fake_put_files(self, user: FakeUser, body: Any, **_: Any) -> Reply:
        bucket_id = body["bucket"]
        if bucket_id not in self.buckets or not self._may_write(user, bucket_id.split("/")[0]):
            return Reply(403, {"error": f"may not write to bucket {bucket_id}"})
        for path, data in body.get("add", {}).items():
            self.put_file(bucket_id, path, base64.b64decode(data))
            self.transfers.append(("upload", bucket_id, path))
        for path in body.get("delete", []):
            with self._cond:
                self.buckets[bucket_id].files.pop(path, None)
            self.transfers.append(("delete", bucket_id, path))
        return Reply(200, {})

    def _fake_read_file(self, user: FakeUser, body: Any, **_: Any) -> Reply:
        bucket_id, path = body["bucket"], body["path"]
        if self.bucket_read_error:
            return Reply(self.bucket_read_error, {"error": "bucket storage unavailable"})
        if bucket_id not in self.buckets or not self._may_read(user, bucket_id.split("/")[0]):
            return Reply(403, {"error": f"may not read bucket {bucket_id}"})
        stored = self.buckets[bucket_id].files.get(path)
        if stored is None:
            return Reply(404, {"error": f"{path} not in bucket {bucket_id}"})
        self.transfers.append(("download", bucket_id, path))
        return Reply(200, {"data": base64.b64encode(stored.data).decode()})

    # ---- model repos: create, validate a card's metadata, preupload, commit, info
    def _create_repo(self, user: FakeUser, body: Any, **_: Any) -> Reply:
        body = body or {}
        ns, name = body.get("organization") or user.name, str(body.get("name") or "")
        repo_type, repo_id = body.get("type") or "model", f"{ns}/{name}"
        url = f"{self.url}/{repo_id}" if repo_type == "model" else f"{self.url}/{repo_type}s/{repo_id}"
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,95}", name) or "--" in name or ".." in name:
            return Reply(400, {"error": "Invalid repo name"})
        if not self._may_write(user, ns):
            message = f'You don\'t have the rights to create a {repo_type} under the namespace "{ns}"'
            return Reply(403, {"error": message})
        with self._cond:
            if repo_id in self.repos:
                return Reply(409, {"error": f"You already created this {repo_type} repo", "url": url})
            self.repos[repo_id] = FakeRepo(repo_id, repo_type, body.get("visibility") == "private", utc_stamp())
        return Reply(200, {"url": url, "name": repo_id, "id": _hex_id(repo_id)})

    def _validate_yaml(self, body: Any, **_: Any) -> Reply:
        import yaml

        content = str((body or {}).get("content") or "")
        match = re.match(r"^---\n(.*?)\n---\n", content, re.DOTALL)
        try:
            meta = yaml.safe_load(match.group(1)) if match else {}
        except yaml.YAMLError as err:
            return Reply(400, {"errors": [{"message": f"Invalid YAML: {err}"}], "warnings": []})
        if match and not isinstance(meta, dict):
            return Reply(400, {"errors": [{"message": "metadata must be a YAML mapping"}], "warnings": []})
        warnings = [] if match else [{"message": "empty or missing yaml metadata in repo card"}]
        return Reply(200, {"errors": [], "warnings": warnings})

    def _writable_repo(self, user: FakeUser, ns: str, name: str) -> FakeRepo | Reply:
        repo = self.repos.get(f"{ns}/{name}")
        if repo is None or (repo.private and not self._may_read(user, ns)):
            return Reply(404, {"error": "Repository not found"}, {"X-Error-Code": "RepoNotFound"})
        if not self._may_write(user, ns):
            return Reply(403, {"error": f"You don't have the rights to write to {ns}/{name}"})
        return repo

    def _preupload(self, user: FakeUser, ns: str, name: str, body: Any, **_: Any) -> Reply:
        repo = self._writable_repo(user, ns, name)
        if isinstance(repo, Reply):
            return repo
        files = []
        for item in (body or {}).get("files", []):
            sample = base64.b64decode(item.get("sample") or "")
            lfs = item["path"].endswith(LFS_SUFFIXES) or b"\0" in sample or int(item.get("size") or 0) > 10 * 2**20
            files.append({"path": item["path"], "uploadMode": "lfs" if lfs else "regular", "shouldIgnore": False,
                          **({"oid": repo.oid(item["path"])} if item["path"] in repo.files else {})})
        return Reply(200, {"files": files, "commitOid": repo.sha})

    def _commit(self, user: FakeUser, ns: str, name: str, body: Any, **_: Any) -> Reply:
        repo = self._writable_repo(user, ns, name)
        if isinstance(repo, Reply):
            return repo
        lines = body if isinstance(body, list) else []
        header = next((line["value"] for line in lines if line.get("key") == "header"), None)
        if not header or not header.get("summary"):
            return Reply(400, {"error": "A commit needs a header with a summary"})
        added: dict[str, tuple[bytes, bool]] = {}
        deleted = []
        with self._cond:
            for line in lines:
                key, value = line.get("key"), line.get("value") or {}
                if key == "file":
                    added[value["path"]] = (base64.b64decode(value["content"]), False)
                elif key == "lfsFile":
                    data = self.lfs_objects.get((repo.id, value.get("oid")))
                    if data is None:
                        return Reply(422, {"error": f"Your push was rejected because an LFS pointer pointed to a file "
                                                    f"that does not exist ({value.get('path')})"})
                    added[value["path"]] = (data, True)
                elif key in ("deletedFile", "deletedFolder"):
                    deleted.append(value["path"])
            for path in deleted:
                repo.files.pop(path, None)
                repo.lfs.discard(path)
            for path, (data, lfs) in added.items():
                repo.files[path] = data
                (repo.lfs.add if lfs else repo.lfs.discard)(path)
            oid = hashlib.sha1(f"{repo.sha}{header['summary']}{sorted(added)}{time.time_ns()}".encode()).hexdigest()
            repo.commits.append({"oid": oid, "summary": header["summary"], "paths": sorted(added)})
        return Reply(200, {"success": True, "commitOid": oid, "commitUrl": f"{self.url}/{repo.id}/commit/{oid}",
                           "hookOutput": ""})

    def _model_info(self, user: FakeUser, ns: str, name: str, **_: Any) -> Reply:
        repo = self.repos.get(f"{ns}/{name}")
        if repo is None or (repo.private and not self._may_read(user, ns)):
            return Reply(404, {"error": "Repository not found"}, {"X-Error-Code": "RepoNotFound"})
        return Reply(200, {"id": repo.id, "author": ns, "sha": repo.sha, "private": repo.private,
                           "createdAt": repo.created_at, "lastModified": repo.created_at,
                           "siblings": [{"rfilename": path} for path in sorted(repo.files)]})

    def _fake_put_lfs(self, user: FakeUser, body: Any, **_: Any) -> Reply:
        repo_id = body["repo"]
        if repo_id not in self.repos or not self._may_write(user, repo_id.split("/")[0]):
            return Reply(403, {"error": f"may not upload to {repo_id}"})
        self.put_lfs_object(repo_id, base64.b64decode(body["data"]))
        self.transfers.append(("lfs-upload", repo_id, body.get("path", "")))
        return Reply(200, {})

    def _find_bucket(self, user: FakeUser, ns: str, name: str) -> FakeBucket | Reply:
        bucket = self.buckets.get(f"{ns}/{name}")
        if bucket is None or not self._may_read(user, ns):
            return Reply(404, {"error": "Bucket not found"}, {"X-Error-Code": "RepoNotFound"})
        return bucket

    def _page(self, path: str, query: dict[str, list[str]], items: list) -> Reply:
        """One page of `items`, with a GitHub-style Link header to the next one (as the Hub paginates)."""
        start = int(query.get("cursor", ["0"])[0])
        end = start + self.page_size
        headers = {}
        if end < len(items):
            next_query = {k: v for k, v in query.items() if k != "cursor"} | {"cursor": [str(end)]}
            headers["Link"] = f'<{self.url}{path}?{urlencode(next_query, doseq=True)}>; rel="next"'
        return Reply(200, items[start:end], headers)

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

    # ---- bookkeeping used by the handler
    def _record(self, request: RecordedRequest) -> int | None:
        """Record a request; return the status to fail it with when it is the POST a test asked to fail."""
        with self._cond:
            self.requests.append(request)
            if request.method != "POST":
                return None
            self._post_count += 1
            failure = self._post_failures.pop(self._post_count, None)
            if re.fullmatch(r"/api/jobs/[^/]+", request.path):
                self._job_post_count += 1
                failure = self._job_post_failures.pop(self._job_post_count, failure)
            return failure

    def created_then_failed(self) -> int | None:
        """The status to answer after creating the job of the job submission being handled, if a test asked."""
        with self._cond:
            return self._job_post_created_failures.pop(self._job_post_count, None)

    def _stream_open(self, job_id: str, kind: str, delta: int) -> None:
        with self._cond:
            key = (job_id, kind)
            self._open_streams[key] = self._open_streams.get(key, 0) + delta


_ID = r"(?P<{}>[^/]+)"
_JOB = rf"/api/jobs/{_ID.format('ns')}/{_ID.format('job')}"
_BUCKET = rf"/api/buckets/{_ID.format('ns')}/{_ID.format('name')}"
_MODEL = rf"/api/models/{_ID.format('ns')}/{_ID.format('name')}"
_ROUTES = [
    ("GET", r"/api/whoami-v2", "whoami"),
    ("GET", r"/api/jobs/hardware", "hardware"),
    ("POST", rf"/api/jobs/{_ID.format('ns')}", "create_job"),
    ("GET", rf"/api/jobs/{_ID.format('ns')}", "list_jobs"),
    ("GET", _JOB, "get_job"),
    ("POST", _JOB + "/cancel", "cancel_job"),
    ("GET", _JOB + "/logs", "job_logs"),
    ("GET", _JOB + "/metrics", "job_metrics"),
    ("POST", _BUCKET, "create_bucket"),
    ("GET", _BUCKET, "bucket_info"),
    ("GET", _BUCKET + r"/tree(?:/(?P<prefix>.+))?", "bucket_tree"),
    ("POST", _BUCKET + "/paths-info", "paths_info"),
    ("POST", r"/api/repos/create", "create_repo"),
    ("POST", r"/api/validate-yaml", "validate_yaml"),
    ("POST", _MODEL + r"/preupload/(?P<rev>[^/]+)", "preupload"),
    ("POST", _MODEL + r"/commit/(?P<rev>[^/]+)", "commit"),
    ("GET", _MODEL + r"(?:/revision/(?P<rev>[^/]+))?", "model_info"),
    ("POST", r"/_fake/lfs-objects", "fake_put_lfs"),
    # Test-only: bucket bytes for a panel running in another process (the real client moves them over Xet).
    ("POST", r"/_fake/bucket-files", "fake_put_files"),
    ("POST", r"/_fake/bucket-files/read", "fake_read_file"),
]


def install_remote_bucket_transfers(hub_url: str) -> None:
    """In a process that is not the fake's (the panel started as a Space), move bucket bytes through the fake's
    test-only routes instead of Xet. `HfApi.batch_bucket_files` and `download_bucket_files` are replaced for good."""
    import urllib.error
    import urllib.request

    from huggingface_hub import HfApi

    def call(api, token, route: str, payload: dict) -> dict:
        request = urllib.request.Request(f"{hub_url}{route}", data=json.dumps(payload).encode(), method="POST",
                                         headers={"Content-Type": "application/json",
                                                  "Authorization": f"Bearer {token or api.token}"})
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return json.load(response)
        except urllib.error.HTTPError as err:
            raise OSError(f"{err.code}: {err.read().decode(errors='replace')}") from None

    def batch_bucket_files(api, bucket_id, *, add=None, copy=None, delete=None, token=None):
        files = {dest: base64.b64encode(src if isinstance(src, bytes) else Path(src).read_bytes()).decode()
                 for src, dest in add or []}
        call(api, token, "/_fake/bucket-files", {"bucket": bucket_id, "add": files, "delete": list(delete or [])})

    def download_bucket_files(api, bucket_id, files, *, raise_on_missing_files=False, token=None):
        for remote, local in files:
            path = remote if isinstance(remote, str) else remote.path
            try:
                data = call(api, token, "/_fake/bucket-files/read", {"bucket": bucket_id, "path": path})["data"]
            except OSError as err:
                if str(err).startswith("404") and not raise_on_missing_files:
                    continue
                raise
            _write_local(str(local), base64.b64decode(data))

    HfApi.batch_bucket_files = batch_bucket_files
    HfApi.download_bucket_files = download_bucket_files


def install_remote_repo_transfers(hub_url: str) -> None:
    """In a process that is not the fake's, move the LFS/Xet bytes of repo commits through the fake's test-only
    route. `huggingface_hub._commit_api._upload_files` is replaced for good; preupload and commit stay HTTP."""
    import urllib.request

    import huggingface_hub._commit_api as commit_api

    def upload_files(*, additions, repo_type, repo_id, headers, endpoint=None, num_threads=5, revision=None,
                     create_pr=None):
        auth = headers.get("authorization") or headers.get("Authorization") or ""
        for op in additions:
            with op.as_file() as f:
                payload = {"repo": repo_id, "path": op.path_in_repo, "data": base64.b64encode(f.read()).decode()}
            request = urllib.request.Request(f"{hub_url}/_fake/lfs-objects", data=json.dumps(payload).encode(),
                                             method="POST", headers={"Content-Type": "application/json",
                                                                     "Authorization": auth})
            with urllib.request.urlopen(request, timeout=30):
                pass

    commit_api._upload_files = upload_files


# Paths the Hub's default .gitattributes stores with LFS (a subset that covers model weights and archives).
LFS_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".h5", ".msgpack", ".onnx", ".gguf", ".npy", ".npz",
                ".pkl", ".zip", ".gz", ".tar", ".parquet", ".arrow")
VIEWER_PATHS = ("/splits", "/rows")
VIEWER_NOT_ACCESSIBLE = ("The dataset does not exist, or is not accessible without authentication (private or gated). "
                         "Please check the spelling of the dataset name or retry with authentication.")
VIEWER_MAX_LENGTH = 100
DEEPMATH_STAND_IN = [
    {"prompt": [{"role": "user", "content": "What is the remainder when $2^{10}$ is divided by 7?"}], "solution": "2"},
    {"prompt": [{"role": "user", "content": "Compute $\\int_0^1 2x\\,dx$."}], "solution": "1"},
    {"prompt": [{"role": "user", "content": "How many positive divisors does 36 have?"}], "solution": "9"},
    # More rows, so that the math presets' 64 held-out rows leave some to train on, as on the real DeepMath.
    *({"prompt": [{"role": "user", "content": f"What is {n} + {n}?"}], "solution": str(2 * n)} for n in range(4, 81)),
]


@dataclass
class FakeDataset:
    id: str
    private: bool
    splits: dict[tuple[str, str], list[dict]] = field(default_factory=dict)   # (config, split) -> rows


def _viewer_error(status: int, message: str, code: str) -> Reply:
    return Reply(status, {"error": message}, {"X-Error-Code": code})


def _viewer_rows(found: FakeDataset, query: dict[str, list[str]]) -> Reply:
    for name in ("config", "split"):
        if not (query.get(name) or [""])[0]:
            return _viewer_error(422, f"Parameter '{name}' is required", "MissingRequiredParameter")
    numbers = {}
    for name, default in (("offset", 0), ("length", VIEWER_MAX_LENGTH)):
        raw = (query.get(name) or [str(default)])[0]
        if not raw.lstrip("-").isdigit():
            return _viewer_error(422, f"Parameter '{name}' must be integer", "InvalidParameter")
        numbers[name] = int(raw)
        if numbers[name] < 0:
            return _viewer_error(422, f"Parameter '{name}' must be positive", "InvalidParameter")
    if numbers["length"] > VIEWER_MAX_LENGTH:
        return _viewer_error(422, f"Parameter 'length' must not be greater than {VIEWER_MAX_LENGTH}",
                             "InvalidParameter")
    rows = found.splits.get((query["config"][0], query["split"][0]))
    if rows is None:
        return _viewer_error(404, "Not found.", "ResponseNotFound")
    start, page = numbers["offset"], rows[numbers["offset"]:numbers["offset"] + numbers["length"]]
    columns = list(dict.fromkeys(k for r in rows for k in r))
    features = [{"feature_idx": i, "name": c, "type": _feature_type(next((r[c] for r in rows if c in r), None))}
                for i, c in enumerate(columns)]
    return Reply(200, {"features": features,
                       "rows": [{"row_idx": start + i, "row": r, "truncated_cells": []} for i, r in enumerate(page)],
                       "num_rows_total": len(rows), "num_rows_per_page": VIEWER_MAX_LENGTH, "partial": False})


def _feature_type(value: Any) -> dict[str, Any]:
    """A column's type as the viewer describes it (the `datasets` Features JSON)."""
    if isinstance(value, list):
        inner = _feature_type(value[0]) if value else {"dtype": "string", "_type": "Value"}
        if value and isinstance(value[0], dict):
            inner = {k: _feature_type(v) for k, v in value[0].items()}
        return {"feature": inner, "_type": "List"}
    if isinstance(value, dict):
        return {k: _feature_type(v) for k, v in value.items()}
    dtype = {bool: "bool", int: "int64", float: "float64", str: "string"}.get(type(value), "null")
    return {"dtype": dtype, "_type": "Value"}


def _is_check(request: RecordedRequest) -> bool:
    return ((request.json or {}).get("labels") or {}).get("grpo-panel-role") == "task-check"


def _hex_id(seed: str) -> str:
    return hashlib.sha1(seed.encode()).hexdigest()[:24]


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


def _file_json(path: str, stored: FakeObject) -> dict[str, Any]:
    return {"type": "file", "path": path, "size": len(stored.data), "xetHash": stored.xet_hash,
            "mtime": stored.mtime, "uploadedAt": stored.uploaded_at}


def _tree_items(bucket: FakeBucket, prefix: str, recursive: bool) -> list[dict[str, Any]]:
    """Files whose path starts with `prefix`; without `recursive`, one level below it plus its folders."""
    items, folders = [], set()
    base = prefix.rstrip("/") + "/" if prefix else ""
    for path in sorted(bucket.files):
        if not path.startswith(prefix):
            continue
        rest = path[len(base):] if path.startswith(base) else path[len(prefix):]
        if not recursive and "/" in rest:
            folders.add(base + rest.split("/", 1)[0])
            continue
        items.append(_file_json(path, bucket.files[path]))
    items += [{"type": "directory", "path": f, "uploadedAt": bucket.created_at} for f in sorted(folders)]
    return items


def _write_local(path: str, data: bytes) -> None:
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(data)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    hub: FakeHub

    def log_message(self, format: str, *args: Any) -> None:
        pass   # keep pytest output readable

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def _dispatch(self, method: str) -> None:
        parts = urlsplit(self.path)
        query = parse_qs(parts.query)
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        body = _parse_json(raw, self.headers.get("Content-Type", ""))
        token = _bearer(self.headers.get("Authorization", ""))
        user = self.hub.users.get(token) if token else None
        headers = {k.lower(): v for k, v in self.headers.items() if k.lower() != "authorization"}
        forced = self.hub._record(RecordedRequest(method, unquote(parts.path), query, body, headers,
                                                  user.name if user else None))
        if parts.path in VIEWER_PATHS and method == "GET":
            self._reply(self.hub.viewer(parts.path, query, user))
        elif user is None:
            self._reply(Reply(401, {"error": "Invalid credentials in Authorization header"},
                              {"X-Error-Message": "Invalid credentials in Authorization header"}))
        elif forced:
            message = "Internal Error - We're working hard to fix this as soon as possible!"
            self._reply(Reply(forced, {"error": message}))
        else:
            result = self.hub.handle(method, parts.path, query, body, user)
            if isinstance(result, tuple):
                self._serve_stream(*result)
            else:
                self._reply(result)

    def _reply(self, reply: Reply) -> None:
        data = b"" if reply.body is None else json.dumps(reply.body).encode()
        self.send_response(reply.status)
        for name, value in reply.headers.items():
            self.send_header(name, value)
        if data:
            self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _serve_stream(self, kind: str, job: FakeJob) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        with self.hub._cond:
            # Where the stream starts is fixed before the stream counts as open: a test that waits for
            # `open_streams` and then appends must see its events arrive.
            tail = self._query_int("tail")
            logs_from = max(len(job.logs) - tail, 0) if tail is not None else 0
            metrics_from = max(len(job.metrics) - 1, 0)   # no history: start at the current sample
            drops = job.drops
            self.hub._stream_open(job.id, kind, +1)
        try:
            if kind == "logs":
                self._stream_logs(job, logs_from, drops)
            else:
                self._stream_metrics(job, metrics_from)
        except OSError:
            self.close_connection = True   # the client went away
        finally:
            self.hub._stream_open(job.id, kind, -1)

    def _stream_logs(self, job: FakeJob, sent: int, drops: int) -> None:
        while True:
            batch, ended, cut, idle = self._next_batch(job, lambda: job.logs, sent, lambda: job.drops != drops)
            if cut:
                return self._abort()
            for event in batch:
                self._chunk(f"data: {json.dumps(event)}\n\n")
            sent += len(batch)
            if ended:
                return self._end_chunks()
            if idle:
                self._chunk(": keep-alive\n\n")

    def _stream_metrics(self, job: FakeJob, sent: int) -> None:
        while True:
            batch, ended, cut, idle = self._next_batch(job, lambda: job.metrics, sent, lambda: False)
            if cut:
                return self._abort()
            for sample in batch:
                self._chunk(f"event: metric\ndata: {json.dumps(sample)}\n\n")
            sent += len(batch)
            if ended:
                return self._end_chunks()
            if idle:
                self._chunk(": keep-alive\n\n")

    def _next_batch(self, job: FakeJob, events: Callable[[], list], sent: int,
                    dropped: Callable[[], bool]) -> tuple[list, bool, bool, bool]:
        """Wait for new events; return (events, job ended, stream cut, nothing happened for a while)."""
        hub = self.hub
        with hub._cond:
            idle = False
            hub._expire(job)
            if sent >= len(events()) and job.stage not in TERMINAL and not dropped() and not hub._stopping:
                idle = not hub._cond.wait(KEEPALIVE_S)
            return events()[sent:], job.stage in TERMINAL, dropped() or hub._stopping, idle

    def _chunk(self, text: str) -> None:
        data = text.encode()
        self.wfile.write(f"{len(data):X}\r\n".encode() + data + b"\r\n")

    def _end_chunks(self) -> None:
        self.wfile.write(b"0\r\n\r\n")

    def _abort(self) -> None:
        """Close the socket in the middle of the chunked body: the client sees an incomplete read."""
        self.close_connection = True
        try:
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def _query_int(self, name: str) -> int | None:
        values = parse_qs(urlsplit(self.path).query).get(name)
        return int(values[0]) if values else None


def _bearer(header: str) -> str | None:
    scheme, _, value = header.partition(" ")
    return value.strip() if scheme.lower() == "bearer" and value.strip() else None


def _parse_json(raw: bytes, content_type: str) -> Any:
    if not raw:
        return None
    if "ndjson" in content_type:
        return [json.loads(line) for line in raw.splitlines() if line.strip()]
    try:
        return json.loads(raw)
    except ValueError:
        return None


@contextlib.contextmanager
def panel_factory(home: str, **defaults):
    """`make(**settings)` builds a Panel over `home` (a second one is the panel after a restart), off a Space, on
    loopback, with `defaults`; every panel made is shut down at the end."""
    from panel.actions import Panel, Settings

    made = []

    def make(**settings):
        made.append(Panel(Settings(**{"home": home, "on_space": False, "host": "127.0.0.1", **defaults, **settings})))
        return made[-1]

    try:
        yield make
    finally:
        for panel in made:
            panel.shutdown()
