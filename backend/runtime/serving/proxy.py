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

This module is the server (its routes, replica calls, health, stats), its command line, and how a trainer starts it in
a thread (`start_proxy`); the weight sync's broadcasts and a replica's rejoining are proxy_sync.py, forwarding a
request proxy_routing.py, which replica a generation goes to replicas.py, the serving proof canary.py, what is
recorded for the dashboard proxy_stats.py, and the proxy as a trainer's child process (`start_proxy_process`)
proxy_process.py.
"""

import argparse
import asyncio
import logging
import os
import threading
import time

import aiohttp
from aiohttp import web

from .canary import ServingProof
from .cpu_pinning import pin_self
from .proxy_env import replica_token
from .proxy_members import Members
from .proxy_process import die_with_parent, raise_open_files_limit
from .proxy_routing import GENERATION_PATHS, GenerationRouting
from .proxy_stats import LoadRecorder, StatsRecorder, carry_counts
from .proxy_sync import WeightSync
from .replicas import Replica, ReplicaUnreachable, Reply, load_rates, parse_load
from .server_info import ServerInfoCache

log = logging.getLogger("runtime.serving.proxy")

LOAD_INTERVAL_ENV = "GRPO_PROXY_LOAD_INTERVAL_S"   # how often each server's /metrics is read (default 10 s)
CANARY_INTERVAL_ENV = "GRPO_PROXY_CANARY_INTERVAL_S"   # how often the newest version is proved again (default 30 s)
HEALTH_MISSES = 3          # failed health checks in a row that mark a replica down


class Proxy(WeightSync, GenerationRouting):
    """The proxy's server: its routes, its calls to the replicas, their health and the stats; what a weight sync asks
    of every replica is proxy_sync.py's `WeightSync`, where a generation goes proxy_routing.py's `GenerationRouting`."""

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

    # ---- status
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
