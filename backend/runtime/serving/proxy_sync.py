"""What a trainer's weight sync asks of every replica, through the proxy (runtime/serving/proxy.py's `Proxy`):
adapter loads and unloads, the engine's /pause, /resume and /reset_prefix_cache; and a replica that comes back
brought to the proxy's adapter set before it gets traffic (missing versions loaded, unknown ones unloaded).

A load is all-or-nothing: where it failed on one replica it is unloaded where it succeeded, and the error returned.
A load whose path is not yet visible on a replica's bucket mount (vLLM answers 404) is retried until
`load_deadline_s`. A sweep member's proxy pauses only its own generations (proxy_members.py).
"""

import asyncio
import json
import logging
import time

from aiohttp import web

from .proxy_replies import combined_response, error_response
from .replicas import Replica, ReplicaUnreachable, Reply

log = logging.getLogger("runtime.serving.proxy")    # the proxy's one logger, whichever of its modules writes


class WeightSync:
    """`Proxy`'s adapter and engine broadcasts; it uses the proxy's replicas, adapters, lock, calls and records."""

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
            return error_response(400, "both 'lora_name' and 'lora_path' must be given")
        if not self.members.owns(name):
            return error_response(403, f"this proxy loads only sweep member {self.members.own!r}'s adapter versions, "
                                       f"not {name!r}")
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
                return error_response(503, "no healthy vLLM replica to load the adapter on")
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
            return error_response(403, f"this proxy unloads only sweep member {self.members.own!r}'s adapter "
                                       f"versions, not {name!r}: another member's stay loaded")
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
        return combined_response(replies, {"status": "paused"})

    async def resume(self, request: web.Request) -> web.Response:
        if self.members.shared:
            self.members.resume()
            return web.json_response({"status": "resumed", "member": self.members.own})
        replies = await self._broadcast("POST", "/resume", params=dict(request.query))
        return combined_response(replies, {"status": "resumed"})

    async def reset_prefix_cache(self, request: web.Request) -> web.Response:
        replies = await self._broadcast("POST", "/reset_prefix_cache", params=dict(request.query))
        success = bool(replies) and all(r.status == 200 and '"success":true' in r.text.replace(" ", "")
                                        for r in replies.values())
        return web.json_response({"success": success, "replicas": len(replies)})

    # ---- a replica that comes back
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
