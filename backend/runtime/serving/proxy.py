"""LoRA-aware proxy: one base URL in front of N vLLM replicas, so TRL's async trainer sees one server.

    python -m runtime.serving.proxy --port 8000 --replica http://r1:8000 --replica http://r2:8000 [--stats-dir DIR]

- A sweep member's proxy (`--member TAG`) shares its replicas with the other members' proxies: it loads, unloads,
  reconciles and serves only its member's versions, holds its own generations on /pause, caps them in flight and
  counts their tokens (proxy_members.py). Without `--member` (a lone run) what follows holds unchanged.
- Adapter loads, unloads, /pause, /resume and /reset_prefix_cache go to every live replica. A load is
  all-or-nothing: where it failed on one replica it is unloaded where it succeeded, and the error returned.
  A load whose path is not yet visible on a replica's bucket mount (vLLM answers 404) is retried until
  `load_deadline_s`.
- Completions are routed by rendezvous hashing of (adapter name, prompt prefix), so the generations of one
  prompt share one replica's prefix cache; they spill to the least-loaded replica when the preferred one has
  `spill_threshold` more requests in flight than it (prompts sharing a long system prompt share a key).
- A replica that stops answering is marked down and routed around. Broadcasts skip it: the trainer must not
  stall on a dead replica, and it cannot serve a stale policy because it gets no traffic until it is healthy
  again and has been reconciled to the proxy's adapter set (missing versions loaded, unknown ones unloaded).
- `/health` is 200 while at least one replica is healthy: TRL only polls it at start, and one replica can
  generate and take adapter loads; late replicas join through reconciliation. Its body counts the healthy
  replicas: the trainer's start-up waits until all are (or at least one, after a while). `/health?require=all`
  is 200 only when every replica is healthy.
- Each replica is one vLLM server (a replica job may run several on its GPUs: runtime/serving/serve_replica.py); its
  /metrics is read every `load_interval_s` for its generated tok/s and its API process's CPU.
- `GET /proxy/stats` reports each replica, and the proxy's own CPU seconds and generations relayed; with a stats
  dir, changed snapshots become write-once fragments, and each broadcast load one record of how long every replica
  took to load it (the dashboard's Sync chart).
Requests to replicas carry `Authorization: Bearer $HF_TOKEN` when it is set (exposed HF Jobs ports need it), except
on the run's private network (GRPO_REPLICA_AUTH=none, proxy_env.py): there no token travels with a rollout.

This module is the server (routes, broadcasts, health) and how a trainer starts it; which replica a generation goes
to is replicas.py, the serving proof canary.py, what is recorded for the dashboard proxy_stats.py.
"""

import argparse
import asyncio
import ctypes
import json
import logging
import os
import resource
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import aiohttp
from aiohttp import web

from .canary import ServingProof
from .cpu_pinning import pin_self
from .proxy_env import replica_token
from .proxy_members import MAX_COUNTED_BODY, Members
from .proxy_stats import LoadRecorder, StatsRecorder, carry_counts
from .replicas import (
    Replica,
    ReplicaUnreachable,
    Reply,
    load_rates,
    parse_load,
    pick,
    request_route,
)
from .server_info import ANSWER_TIMEOUT_S, ServerInfoCache
from .server_info import PATH as SERVER_INFO

log = logging.getLogger("runtime.serving.proxy")

COMPLETION_PATHS = ("/v1/completions", "/v1/chat/completions")
GENERATION_PATHS = (*COMPLETION_PATHS, "/tokenize", "/detokenize")
FORWARDED_HEADERS = ("Content-Type", "Accept")
LOAD_INTERVAL_ENV = "GRPO_PROXY_LOAD_INTERVAL_S"   # how often each server's /metrics is read (default 10 s)
CANARY_INTERVAL_ENV = "GRPO_PROXY_CANARY_INTERVAL_S"   # how often the newest version is proved again (default 30 s)
HEALTH_MISSES = 3          # failed health checks in a row that mark a replica down
SERVED_BY = "X-Served-By"  # which replica answered: for logs and tests, never needed for correctness
HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "date", "server"}


class Proxy:
    def __init__(self, replica_urls: list[str], *, spill_threshold: int = 8, load_deadline_s: float = 60.0,
                 health_interval_s: float = 1.0, stats_dir: str | None = None, stats_interval_s: float = 2.0,
                 stats_flush_s: float = 30.0, token: str | None = None, canary_interval_s: float = 30.0,
                 load_interval_s: float = 10.0, member: str | None = None, member_cap: int = 0):
        if not replica_urls:
            raise ValueError("the proxy needs at least one --replica URL")
        self.replicas = [Replica(u.rstrip("/")) for u in replica_urls]
        if stats_dir:       # a trainer started again (a retry, a resume): the run's counts go on, not from 0
            carry_counts(self.replicas, stats_dir)
        self.spill_threshold = spill_threshold
        self.load_deadline_s = load_deadline_s
        self.health_interval_s = health_interval_s
        self.adapters: dict[str, str] = {}  # name -> path of every adapter loaded through the proxy
        token = token if token is not None else replica_token()
        self._auth = {"Authorization": f"Bearer {token}"} if token else {}
        self._stats = StatsRecorder(stats_dir, stats_interval_s, stats_flush_s) if stats_dir else None
        self._loads = LoadRecorder(stats_dir) if stats_dir else None
        self._proof = ServingProof(self._call, stats_dir)
        self.canary_interval_s = canary_interval_s
        self.newest: str | None = None        # the adapter loaded last: what the trainer samples from
        self.load_interval_s = load_interval_s
        self._readings: dict[str, tuple[float, dict]] = {}   # server url -> its last /metrics reading
        self.forwarded = 0                    # generations relayed: with the process's CPU time, its cost per request
        # A sweep member's proxy (`member` its tag) shares the replicas with the other members' proxies: see
        # proxy_members.py. None: a lone run's, whose replicas are its own.
        self.members = Members(member, member_cap)
        # Each server's /server_info, asked once (runtime/serving/server_info.py).
        self._server_info = ServerInfoCache()
        self._session: aiohttp.ClientSession | None = None
        self._lock: asyncio.Lock | None = None
        self._tasks: list[asyncio.Task] = []

    # ---- lifecycle
    def build_app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_get("/health", self.health)
        app.router.add_get("/proxy/stats", self.stats)
        app.router.add_post("/v1/load_lora_adapter", self.load_adapter)
        app.router.add_post("/v1/unload_lora_adapter", self.unload_adapter)
        app.router.add_post("/pause", self.pause)
        app.router.add_post("/resume", self.resume)
        app.router.add_post("/reset_prefix_cache", self.reset_prefix_cache)
        for path in GENERATION_PATHS:
            app.router.add_post(path, self.generate)
        app.router.add_get("/{tail:.*}", self.pass_through)
        app.router.add_post("/{tail:.*}", self.refuse)
        app.on_startup.append(self._start)
        app.on_cleanup.append(self._stop)
        return app

    async def _start(self, _app) -> None:
        # No total timeout: a generation may legitimately run for minutes, or sit paused during a sync.
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=5)
        self._session = aiohttp.ClientSession(timeout=timeout, auto_decompress=False,
                                              connector=aiohttp.TCPConnector(limit=0))
        self._lock = asyncio.Lock()
        self._tasks = [asyncio.create_task(self._health_loop()), asyncio.create_task(self._canary_loop()),
                       asyncio.create_task(self._load_loop())]
        if self._stats:
            self._tasks.append(asyncio.create_task(self._stats_loop()))

    async def _stop(self, _app) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._stats:
            self._stats.sample(self.replicas, force=True, members=self._member_stats())
        await self._session.close()

    # ---- replica calls
    async def _call(self, replica: Replica, method: str, path: str, *, json_body=None, params=None,
                    timeout: float | None = None) -> Reply:
        request = dict(json=json_body, params=params, headers=self._auth,
                       timeout=aiohttp.ClientTimeout(total=timeout, sock_connect=5))
        try:
            try:
                return await self._request(method, replica.url + path, request)
            except aiohttp.ServerDisconnectedError:
                # A pooled keep-alive connection the server closed as it was reused (uvicorn closes idle ones after
                # 5 s): seen on a loaded machine, where it marked the one live replica down in the middle of a
                # sync's /pause. Once more on a fresh connection before the replica counts as down.
                return await self._request(method, replica.url + path, request)
        except (TimeoutError, aiohttp.ClientError, OSError) as error:
            raise ReplicaUnreachable(f"{type(error).__name__}: {error}") from error

    async def _request(self, method: str, url: str, request: dict) -> Reply:
        async with self._session.request(method, url, **request) as resp:
            return Reply(resp.status, await resp.text())

    async def _broadcast(self, method: str, path: str, **kwargs) -> dict[Replica, Reply]:
        """Send to every healthy replica at once; replicas that do not answer are marked down and left out."""
        live = [r for r in self.replicas if r.healthy]
        replies = await asyncio.gather(*(self._call(r, method, path, **kwargs) for r in live), return_exceptions=True)
        answered = {}
        for replica, reply in zip(live, replies):
            if isinstance(reply, ReplicaUnreachable):
                self._mark_down(replica, str(reply))
            elif isinstance(reply, BaseException):
                raise reply
            else:
                answered[replica] = reply
        return answered

    def _mark_down(self, replica: Replica, reason: str) -> None:
        if replica.healthy:
            log.warning("replica %s is down: %s", replica.url, reason)
        if replica.healthy:
            replica.held_when_down = bool(replica.adapters)
        replica.healthy = False
        self._server_info.forget(replica.url)
        replica.last_error = reason
        replica.errors += 1
        # A replica that is down serves none of its adapters (a restarted one holds none); rejoining reloads them.
        replica.adapters = set()
        self._record()

    def _record(self) -> None:
        """Sample the stats now: a change of health or adapters must not fall between two periodic samples."""
        if self._stats:
            self._stats.sample(self.replicas, members=self._member_stats())

    def _member_stats(self) -> dict | None:
        """A sweep member's traffic, for its stats records (a lone run's records stay as they were)."""
        return self.members.snapshot() if self.members.shared else None

    # ---- adapter broadcasts
    async def _load_on(self, replica: Replica, name: str, path: str) -> Reply:
        deadline = time.monotonic() + self.load_deadline_s
        delay = 0.25
        while True:
            reply = await self._call(replica, "POST", "/v1/load_lora_adapter",
                                     json_body={"lora_name": name, "lora_path": path, "load_inplace": False})
            # A bucket mount may show a freshly renamed folder to other machines only seconds later.
            if not reply.path_missing or time.monotonic() + delay > deadline:
                return reply
            await asyncio.sleep(delay)
            delay = min(delay * 2, 2.0)

    async def _timed_load(self, replica: Replica, name: str, path: str) -> tuple[Reply, float]:
        began = time.monotonic()
        reply = await self._load_on(replica, name, path)
        return reply, time.monotonic() - began

    def _record_loads(self, name: str, live: list[Replica], timed: list) -> None:
        if self._loads:
            self._loads.record(name, self.replicas, live, timed)

    async def load_adapter(self, request: web.Request) -> web.Response:
        body = await request.json()
        name, path = body.get("lora_name"), body.get("lora_path")
        if not name or not path:
            return _error(400, "both 'lora_name' and 'lora_path' must be given")
        if not self.members.owns(name):
            return _error(403, f"this proxy loads only sweep member {self.members.own!r}'s adapter versions, not "
                               f"{name!r}")
        async with self._lock:
            live = [r for r in self.replicas if r.healthy]
            timed = await asyncio.gather(*(self._timed_load(r, name, path) for r in live), return_exceptions=True)
            self._record_loads(name, live, timed)
            replies = [t if isinstance(t, BaseException) else t[0] for t in timed]
            loaded, failures = [], []
            for replica, reply in zip(live, replies):
                if isinstance(reply, ReplicaUnreachable):
                    self._mark_down(replica, str(reply))
                elif reply.status == 200:
                    loaded.append(replica)
                else:
                    failures.append((replica, reply))
            if failures:
                await self._roll_back(loaded, name)
                replica, reply = failures[0]
                log.error("loading %s failed on %s (%s): %s", name, replica.url, reply.status, reply.text[:500])
                return web.Response(status=reply.status, text=reply.text, content_type="application/json")
            if not loaded:
                return _error(503, "no healthy vLLM replica to load the adapter on")
            self.adapters[name] = path
            self.newest = name
            for replica in loaded:
                replica.adapters.add(name)
            self._record()
        # Proof that every replica serves it, without holding up the trainer's sync.
        self._tasks = [t for t in self._tasks if not t.done()] + [asyncio.create_task(self.prove(name))]
        return web.Response(text=f"Success: LoRA adapter '{name}' added on {len(loaded)} replica(s).")

    async def _roll_back(self, loaded: list[Replica], name: str) -> None:
        await asyncio.gather(*(self._call(r, "POST", "/v1/unload_lora_adapter", json_body={"lora_name": name})
                               for r in loaded), return_exceptions=True)

    async def unload_adapter(self, request: web.Request) -> web.Response:
        body = await request.json()
        name = body.get("lora_name")
        if not self.members.owns(str(name)):
            return _error(403, f"this proxy unloads only sweep member {self.members.own!r}'s adapter versions, not "
                               f"{name!r}: another member's stay loaded")
        async with self._lock:
            replies = await self._broadcast("POST", "/v1/unload_lora_adapter", json_body={"lora_name": name})
            self.adapters.pop(name, None)
            for replica in self.replicas:
                replica.adapters.discard(name)
            self._record()
        # 404 means the replica does not hold it: the goal, absence, is reached there too.
        failed = [(r, rep) for r, rep in replies.items() if rep.status not in (200, 404)]
        if failed:
            return web.Response(status=failed[0][1].status, text=failed[0][1].text, content_type="application/json")
        return web.Response(text=f"Success: LoRA adapter '{name}' removed.")

    # ---- engine control broadcasts
    async def pause(self, request: web.Request) -> web.Response:
        if self.members.shared:
            # The engines serve every member: pausing them would stall the others' rollouts. This member's new
            # generations wait here instead (its adapter versions have names of their own, so none is overwritten).
            self.members.pause()
            return web.json_response({"status": "paused", "member": self.members.own})
        replies = await self._broadcast("POST", "/pause", params=dict(request.query))
        paused = [r for r, rep in replies.items() if rep.status == 200]
        if len(paused) < len(replies):
            # All or nothing: a half-paused fleet would keep generating with the policy being replaced.
            await asyncio.gather(*(self._call(r, "POST", "/resume") for r in paused), return_exceptions=True)
        return _combined(replies, {"status": "paused"})

    async def resume(self, request: web.Request) -> web.Response:
        if self.members.shared:
            self.members.resume()
            return web.json_response({"status": "resumed", "member": self.members.own})
        replies = await self._broadcast("POST", "/resume", params=dict(request.query))
        return _combined(replies, {"status": "resumed"})

    async def reset_prefix_cache(self, request: web.Request) -> web.Response:
        replies = await self._broadcast("POST", "/reset_prefix_cache", params=dict(request.query))
        success = bool(replies) and all(r.status == 200 and '"success":true' in r.text.replace(" ", "")
                                        for r in replies.values())
        return web.json_response({"success": success, "replicas": len(replies)})

    # ---- generation routing
    def pick(self, key: str, exclude: set[str]) -> Replica | None:
        return pick(self.replicas, key, exclude, self.spill_threshold)

    async def generate(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        model, key = request_route(body)
        if not self.members.shared:
            return await self._route(request, body, key)
        foreign = self.members.foreign(model)
        if foreign:
            return _error(403, foreign)
        async with self.members.slot(self.members.member_of(model)) as traffic:
            return await self._route(request, body, key, traffic)

    async def _route(self, request: web.Request, body: bytes, key: str, traffic=None) -> web.StreamResponse:
        """Forward to the replica the key picks, then to the others as each proves unreachable. `traffic`: a sweep
        member's counts (proxy_members.py), None for a lone run."""
        tried: set[str] = set()
        while (replica := self.pick(key, tried)) is not None:
            tried.add(replica.url)
            try:
                return await self._forward(request, replica, body, traffic)
            except ReplicaUnreachable as error:
                self._mark_down(replica, str(error))
        return _error(503, "no healthy vLLM replica")

    async def _forward(self, request: web.Request, replica: Replica, body: bytes,
                       traffic=None) -> web.StreamResponse:
        headers = {h: request.headers[h] for h in FORWARDED_HEADERS if h in request.headers} | self._auth
        replica.in_flight += 1
        try:
            try:
                upstream = await self._session.request(request.method, replica.url + request.path,
                                                       params=request.query, data=body, headers=headers)
            except (TimeoutError, aiohttp.ClientError, OSError) as error:
                raise ReplicaUnreachable(f"{type(error).__name__}: {error}") from error
            try:
                return await self._relay(request, replica, upstream, traffic)
            finally:
                upstream.release()  # closes the connection, aborting the request in vLLM, if unread data is left
        finally:
            replica.in_flight -= 1

    async def _relay(self, request: web.Request, replica: Replica, upstream, traffic=None) -> web.StreamResponse:
        """Copy the replica's answer chunk by chunk, so streamed completions stream through the proxy; a completion's
        JSON answer is kept too, for the tokens it generated (`traffic`: its member's counts)."""
        headers = {k: v for k, v in upstream.headers.items() if k.lower() not in HOP_BY_HOP}
        response = web.StreamResponse(status=upstream.status, headers=headers | {SERVED_BY: replica.url})
        if upstream.content_length is not None:
            response.content_length = upstream.content_length
        try:
            await response.prepare(request)
        except ConnectionResetError:
            return response  # the caller went away while the replica answered
        counted = [] if traffic is not None and _counts_tokens(request, upstream) else None
        size = 0
        while True:
            try:
                chunk = await upstream.content.readany()
            except (TimeoutError, aiohttp.ClientError) as error:
                self._mark_down(replica, f"died mid-response: {error}")
                return response
            if not chunk:
                break
            if counted is not None and (size := size + len(chunk)) <= MAX_COUNTED_BODY:
                counted.append(chunk)
            try:
                await response.write(chunk)
            except ConnectionResetError:
                return response  # the caller went away; not the replica's fault
        await response.write_eof()
        self.forwarded += 1
        if upstream.status < 400:
            replica.served += 1
            if counted is not None:
                Members.count(traffic, b"".join(counted) if size <= MAX_COUNTED_BODY else None)
        else:
            replica.errors += 1
        return response

    # ---- pass-through and status
    async def pass_through(self, request: web.Request) -> web.Response:
        if request.path == SERVER_INFO:
            return await self.server_info(request)
        for replica in [r for r in self.replicas if r.healthy]:
            try:
                reply = await self._call(replica, "GET", request.path, params=dict(request.query), timeout=30)
            except ReplicaUnreachable as error:
                self._mark_down(replica, str(error))
                continue
            return web.Response(status=reply.status, text=reply.text, content_type=_content_type(reply.text))
        return _error(503, "no healthy vLLM replica")

    async def server_info(self, request: web.Request) -> web.Response:
        """TRL's first question, answered from one request per server however many callers ask at once; a slow
        answer marks no server down (runtime/serving/server_info.py says why)."""
        last = "no healthy vLLM replica yet"
        for replica in [r for r in self.replicas if r.healthy]:
            def ask(replica=replica):
                return self._call(replica, "GET", SERVER_INFO, params=dict(request.query), timeout=ANSWER_TIMEOUT_S)
            try:
                reply = await self._server_info.get(replica.url, request.query_string, ask)
            except ReplicaUnreachable as error:
                last = f"{replica.url}: {error}"
                continue
            if reply.status == 200:
                return web.Response(status=200, text=reply.text, content_type=_content_type(reply.text))
            last = f"{replica.url} answered {reply.status}: {reply.text[:200]}"
        return _error(503, f"{SERVER_INFO}: {last}")

    async def refuse(self, request: web.Request) -> web.Response:
        return _error(404, f"the proxy does not forward POST {request.path}: it is neither a generation route nor "
                           "one it knows how to broadcast to every replica")

    async def health(self, request: web.Request) -> web.Response:
        healthy = sum(r.healthy for r in self.replicas)
        need = len(self.replicas) if request.query.get("require") == "all" else 1
        return web.json_response({"healthy": healthy, "replicas": len(self.replicas)},
                                 status=200 if healthy >= need else 503)

    async def stats(self, _request: web.Request) -> web.Response:
        return web.json_response(self.snapshot())

    def snapshot(self) -> dict:
        return {"time": time.time(), "replicas": [r.snapshot() for r in self.replicas], "adapters": dict(self.adapters),
                "proxy": {"cpu_s": round(time.process_time(), 3), "forwarded": self.forwarded},
                **({"member": self.members.own, "members": self.members.snapshot()} if self.members.shared else {})}

    # ---- background loops
    async def _health_loop(self) -> None:
        while True:
            await asyncio.gather(*(self._check(r) for r in self.replicas), return_exceptions=True)
            await asyncio.sleep(self.health_interval_s)

    async def _check(self, replica: Replica) -> None:
        try:
            reply = await self._call(replica, "GET", "/health", timeout=5)
            ok, reason = reply.status == 200, f"/health answered {reply.status}"
        except ReplicaUnreachable as error:
            ok, reason = False, str(error)
        if not ok:
            replica.failed_checks += 1
            # Three misses in a row (a dead server refuses at once: ~3 s; a hung one times out: ~18 s), so one or
            # two slow answers on a busy CPU (a fresh server collecting its environment for /server_info) do not
            # take a replica out of rotation.
            if replica.healthy and replica.failed_checks >= HEALTH_MISSES:
                self._mark_down(replica, reason)
            elif not replica.healthy:
                replica.last_error = reason
            return
        replica.failed_checks = 0
        if not replica.healthy:
            await self._rejoin(replica)

    async def _rejoin(self, replica: Replica) -> None:
        """Bring a (re)started replica to the proxy's adapter set before it gets traffic."""
        async with self._lock:
            try:
                models = json.loads((await self._call(replica, "GET", "/v1/models", timeout=30)).text)
                # In a sweep the replica also holds the other members' versions: they are not this proxy's to touch.
                held = {m["id"] for m in models["data"] if m.get("parent") and self.members.owns(m["id"])}
                # A server that comes back holding none of the adapters it held is a new one (its job ran again);
                # one still holding some only stopped answering for a while (a disconnect, a stall, a missed check).
                back = replica.joined >= 1      # its first join under this proxy is no return (nor a proxy's restart)
                restarted = back and replica.held_when_down and not held
                # Unknown names may be a previous trainer's: a resumed trainer reuses them with new weights.
                for name in held - set(self.adapters):
                    await self._call(replica, "POST", "/v1/unload_lora_adapter", json_body={"lora_name": name})
                for name in set(self.adapters) - held:
                    reply = await self._load_on(replica, name, self.adapters[name])
                    if reply.status != 200:
                        raise ReplicaUnreachable(f"could not reload {name}: {reply.status} {reply.text[:200]}")
            except (ReplicaUnreachable, ValueError, KeyError) as error:
                replica.last_error = f"rejoin failed: {error}"
                return
            replica.adapters = set(self.adapters)
            replica.healthy = True
            replica.joined += 1
            replica.restarted += restarted
            replica.reconnected += back and not restarted
            replica.last_error = ""
            self._record()
            log.info("replica %s is healthy (%d adapters)", replica.url, len(self.adapters))

    async def _load_loop(self) -> None:
        """Each server's generated tok/s and its API process's CPU, from its /metrics, every `load_interval_s`: the
        dashboard's per-server rates and its "API-server bound" verdict."""
        while True:
            await asyncio.sleep(self.load_interval_s)
            await asyncio.gather(*(self._read_load(r) for r in self.replicas if r.healthy), return_exceptions=True)

    async def _read_load(self, replica: Replica) -> None:
        reply = await self._call(replica, "GET", "/metrics", timeout=10)
        if reply.status != 200:
            return
        reading = (time.monotonic(), parse_load(reply.text))
        before = self._readings.get(replica.url)
        self._readings[replica.url] = reading
        if before:
            replica.load = load_rates(before, reading)

    # ---- serving proof
    async def _canary_loop(self) -> None:
        """Re-prove the newest adapter now and then: a replica that restarted, or lost an adapter, shows."""
        while True:
            await asyncio.sleep(self.canary_interval_s)
            if self.newest:
                await self.prove(self.newest)

    @property
    def proofs(self) -> dict[str, dict]:
        """Replica url -> its latest serving proof."""
        return self._proof.proofs

    async def prove(self, name: str) -> dict:
        """Prove which replicas serve adapter `name` (see canary.py); a miss is counted and recorded at once."""
        record = await self._proof.prove(self.replicas, name)
        self._record()
        return record

    async def _stats_loop(self) -> None:
        while True:
            self._stats.sample(self.replicas, members=self._member_stats())
            await asyncio.sleep(self._stats.interval_s)


def _counts_tokens(request: web.Request, upstream) -> bool:
    """A completion answered as one JSON body (not a stream, a tokenization): it says the tokens it generated."""
    return request.path in COMPLETION_PATHS and upstream.content_type == "application/json"


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": {"message": message, "code": status}}, status=status)


def _content_type(text: str) -> str:
    return "application/json" if text[:1] in "{[" else "text/plain"


def _combined(replies: dict[Replica, Reply], ok_body: dict) -> web.Response:
    failed = [rep for rep in replies.values() if rep.status != 200]
    if failed:
        return web.Response(status=failed[0].status, text=failed[0].text, content_type=_content_type(failed[0].text))
    if not replies:
        return _error(503, "no healthy vLLM replica")
    return web.json_response(ok_body)


class ProxyHandle:
    """A proxy running on its own event loop in a daemon thread of the calling process."""

    def __init__(self, proxy: Proxy, loop: asyncio.AbstractEventLoop, runner: web.AppRunner, url: str):
        self.proxy, self._loop, self._runner, self.url = proxy, loop, runner, url
        self._stop_lock = threading.Lock()
        self._stopped = False

    def stats(self) -> dict:
        return asyncio.run_coroutine_threadsafe(_snapshot(self.proxy), self._loop).result(10)

    def prove(self, name: str) -> dict:
        """Run the serving proof of adapter `name` now and return its record."""
        return asyncio.run_coroutine_threadsafe(self.proxy.prove(name), self._loop).result(120)

    def stop(self) -> None:
        """Stop serving (idempotent: a stopping trainer may ask twice, from two threads)."""
        with self._stop_lock:
            if self._stopped:
                return
            self._stopped = True
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(30)
            self._loop.call_soon_threadsafe(self._loop.stop)


async def _snapshot(proxy: Proxy) -> dict:
    return proxy.snapshot()


def start_proxy(replica_urls: list[str], *, host: str = "127.0.0.1", port: int = 0, **options) -> ProxyHandle:
    """Start a proxy in a background thread; port 0 picks a free one. Returns once it accepts connections."""
    proxy = Proxy(replica_urls, **options)
    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, name="lora-proxy", daemon=True).start()

    async def serve() -> tuple[web.AppRunner, int]:
        # The trainer stops the proxy when it stops: in-flight generations are its own, and it wants none of them
        # (aiohttp would otherwise wait 60 s for them, past a cancelled job's grace period).
        runner = web.AppRunner(proxy.build_app(), access_log=None, shutdown_timeout=2.0)
        await runner.setup()
        site = web.TCPSite(runner, host, port)
        await site.start()
        return runner, site._server.sockets[0].getsockname()[1]

    runner, bound = asyncio.run_coroutine_threadsafe(serve(), loop).result(30)
    return ProxyHandle(proxy, loop, runner, f"http://{host}:{bound}")


class ProxyProcess:
    """A proxy running as a child process: its event loop shares no GIL with the trainer that starts it, which
    held a proxy thread to ~0.7x of a replica's direct throughput at concurrency 8."""

    def __init__(self, proc: subprocess.Popen, url: str):
        self.proc, self.url = proc, url
        self._stop_lock = threading.Lock()

    def stats(self) -> dict:
        with urllib.request.urlopen(f"{self.url}/proxy/stats", timeout=10) as response:
            return json.load(response)

    def stop(self, grace_s: float = 10.0) -> None:
        """Stop serving (idempotent: a stopping trainer may ask twice, from two threads)."""
        with self._stop_lock:
            if self.proc.poll() is None:
                self.proc.terminate()
                try:
                    self.proc.wait(timeout=grace_s)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait()


def start_proxy_process(replica_urls: list[str], *, stats_dir: str | None = None, token: str | None = None,
                        port: int = 0, host: str = "127.0.0.1", start_timeout_s: float = 60.0,
                        member: str | None = None, member_cap: int = 0) -> ProxyProcess:
    """Start `python -m runtime.serving.proxy` as a child that dies with its parent; returns once it answers /health.
    `host` 0.0.0.0 serves it on every interface too (a private-network trainer exposes it to the panel). `member`: a
    sweep member's tag (its replicas are shared), with at most `member_cap` generations in flight (0: no cap)."""
    if not port:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
    package = __name__.rsplit(".", 1)[0]     # "runtime" in a job, "backend.runtime" in the panel's tests
    command = [sys.executable, "-m", f"{package}.proxy", "--host", host, "--port", str(port),
               "--parent-pid", str(os.getpid())]
    for url in replica_urls:
        command += ["--replica", url]
    if stats_dir:
        command += ["--stats-dir", stats_dir]
    if member:
        command += ["--member", member, "--member-cap", str(member_cap)]
    env = {**os.environ, **({"HF_TOKEN": token} if token else {})}
    proc = subprocess.Popen(command, env=env)
    handle = ProxyProcess(proc, f"http://127.0.0.1:{port}")
    deadline = time.monotonic() + start_timeout_s
    while True:
        try:
            urllib.request.urlopen(f"{handle.url}/health", timeout=2).close()
            return handle
        except urllib.error.HTTPError:
            return handle            # 503 (no replica healthy yet) still means the proxy is serving
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                handle.stop()
                raise RuntimeError(f"the proxy did not start (exit code {proc.poll()})") from None
            time.sleep(0.2)


def raise_open_files_limit() -> int:
    """Lift this process's open-file limit to its hard limit, and return it: each generation in flight holds a
    socket in the trainer's rollout worker and two in the proxy, and a soft limit of 1024 (common in containers)
    would refuse the trainer's 1024 in flight with "Too many open files". Children inherit it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            return hard
        except (ValueError, OSError):
            return soft
    return soft


def die_with_parent(parent_pid: int) -> None:
    """Get SIGTERM when the parent dies, however it dies (a SIGKILLed or OOM-killed trainer): a proxy alone
    would keep a job's process group, and its bill, alive."""
    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)
    if os.getppid() != parent_pid:       # the parent died before the line above took effect
        sys.exit("the process that started this proxy is gone")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--replica", action="append", required=True, help="a vLLM replica's base URL (repeat)")
    parser.add_argument("--stats-dir", help="write per-replica stats here as write-once fragments")
    parser.add_argument("--spill-threshold", type=int, default=8,
                        help="requests in flight beyond the least-loaded replica's before a prompt leaves its own")
    parser.add_argument("--load-deadline", type=float, default=60.0, help="seconds to wait for an adapter path")
    parser.add_argument("--parent-pid", type=int, help="stop when this process (the trainer) is gone")
    parser.add_argument("--member", help="a sweep member's tag: the replicas are shared with other members' proxies")
    parser.add_argument("--member-cap", type=int, default=0, help="the member's generations in flight at most (0: any)")
    args = parser.parse_args()
    if args.parent_pid:
        die_with_parent(args.parent_pid)
    raise_open_files_limit()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    pinned = pin_self()     # a core of its own where the engine kept one (cpu_pinning.py), before any thread starts
    if pinned:
        logging.getLogger("proxy").info("proxy %s", pinned)
    proxy = Proxy(args.replica, spill_threshold=args.spill_threshold, load_deadline_s=args.load_deadline,
                  stats_dir=args.stats_dir, load_interval_s=float(os.environ.get(LOAD_INTERVAL_ENV) or 10.0),
                  canary_interval_s=float(os.environ.get(CANARY_INTERVAL_ENV) or 30.0),
                  member=args.member or None, member_cap=args.member_cap)
    # On SIGTERM the trainer wants none of the generations in flight: aiohttp would wait 60 s for them by default,
    # past a cancelled job's grace period.
    web.run_app(proxy.build_app(), host=args.host, port=args.port, access_log=None, print=None, shutdown_timeout=2.0)


if __name__ == "__main__":
    main()
