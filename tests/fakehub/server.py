"""The fake Hub itself: its HTTP server, authentication, routing, pagination and the SSE streams of job logs and
metrics; each concern's routes and state come from its module (jobs, buckets, repos, datasets)."""

import contextlib
import json
import re
import socket
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self
from urllib.parse import parse_qs, unquote, urlencode, urlsplit

from tests.fakehub import buckets, jobs, repos
from tests.fakehub.buckets import BucketsMixin
from tests.fakehub.common import DEFAULT_TOKEN, FakeUser, RecordedRequest, Reply, bearer, hex_id, parse_json
from tests.fakehub.datasets import VIEWER_PATHS, DatasetsMixin
from tests.fakehub.jobs import TERMINAL, FakeJob, JobsMixin
from tests.fakehub.repos import ReposMixin

KEEPALIVE_S = 5.0


ROUTES = [("GET", r"/api/whoami-v2", "whoami"), *jobs.ROUTES, *buckets.ROUTES, *repos.ROUTES]


class FakeHub(JobsMixin, BucketsMixin, ReposMixin, DatasetsMixin):
    """The Hub's state plus the server that serves it. `start()` returns self; `stop()` (or the end of a `with`
    block) closes every stream."""

    def __init__(self, users: dict[str, FakeUser] | None = None):
        self.users = users or {DEFAULT_TOKEN: FakeUser("alice", {"acme": "write", "readers": "read"})}
        # The Hub's clock: job timestamps and durations are read from it, so a test can make time pass.
        self.clock: Callable[[], float] = time.time
        self.token = next(iter(self.users))
        self.page_size = 100
        self.requests: list[RecordedRequest] = []
        self.transfers: list[tuple[str, str, str]] = []   # (kind: upload, download, delete, lfs-upload; where; path)
        self._cond = threading.Condition(threading.RLock())
        self._post_count = 0
        self._post_failures: dict[int, int] = {}
        self._stopping = False
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._init_jobs()
        self._init_buckets()
        self._init_repos()
        self._init_datasets()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

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

    def fail_nth_post(self, n: int, status: int = 500) -> None:
        """Answer the n-th POST (counted from the server's start, 1-based) with `status`."""
        self._post_failures[n] = status

    # ---- protocol
    def handle(self, method: str, raw_path: str, query: dict[str, list[str]], body: Any,
               user: FakeUser) -> Reply | tuple[str, FakeJob]:
        """Route one authenticated request. A (kind, job) tuple means: serve that job's SSE stream."""
        for route_method, pattern, name in ROUTES:
            match = re.fullmatch(pattern, raw_path)
            if route_method == method and match:
                args = {k: unquote(v) if v is not None else None for k, v in match.groupdict().items()}
                return getattr(self, "_" + name)(user=user, query=query, body=body, **args)
        return Reply(404, {"error": f"no route for {method} {raw_path}"})

    def _may_read(self, user: FakeUser, namespace: str) -> bool:
        return namespace == user.name or namespace in user.orgs

    def _may_write(self, user: FakeUser, namespace: str) -> bool:
        return namespace == user.name or user.orgs.get(namespace) not in (None, "read")

    def _whoami(self, user: FakeUser, **_: Any) -> Reply:
        orgs = [{"type": "org", "name": name, "fullname": name.title(), "roleInOrg": role}
                for name, role in user.orgs.items()]
        return Reply(200, {"type": "user", "id": hex_id(user.name), "name": user.name,
                           "fullname": user.name.title(), "orgs": orgs,
                           "auth": {"type": "access_token", "accessToken": {"displayName": "test", "role": "write"}}})

    def _page(self, path: str, query: dict[str, list[str]], items: list) -> Reply:
        """One page of `items`, with a GitHub-style Link header to the next one (as the Hub paginates)."""
        start = int(query.get("cursor", ["0"])[0])
        end = start + self.page_size
        headers = {}
        if end < len(items):
            next_query = {k: v for k, v in query.items() if k != "cursor"} | {"cursor": [str(end)]}
            headers["Link"] = f'<{self.url}{path}?{urlencode(next_query, doseq=True)}>; rel="next"'
        return Reply(200, items[start:end], headers)

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


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    hub: FakeHub

    def log_message(self, format: str, *args: Any) -> None:
        pass   # keep pytest output readable

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def do_HEAD(self) -> None:
        """huggingface_hub's telemetry pings (`HEAD /api/telemetry/<topic>`, which Gradio's analytics use too),
        answered 200 as the Hub does; recorded like every request, so a test can tell that none was sent."""
        path = unquote(urlsplit(self.path).path)
        headers = {k.lower(): v for k, v in self.headers.items() if k.lower() != "authorization"}
        self.hub._record(RecordedRequest("HEAD", path, {}, None, headers, None))
        self.send_response(200 if path.startswith("/api/telemetry/") else 404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def _dispatch(self, method: str) -> None:
        parts = urlsplit(self.path)
        query = parse_qs(parts.query)
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        body = parse_json(raw, self.headers.get("Content-Type", ""))
        token = bearer(self.headers.get("Authorization", ""))
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
