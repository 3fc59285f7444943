"""Where the proxy (runtime/serving/proxy.py's `Proxy`) sends a request: a generation to the replica its key picks
(replicas.py), then to the others as each proves unreachable, its answer relayed chunk by chunk; other GETs to the
first healthy replica, /server_info answered from one request per server (server_info.py); any other POST refused.
"""

import aiohttp
from aiohttp import web

from .proxy_members import MAX_COUNTED_BODY, Members
from .proxy_replies import content_type_of, error_response
from .replicas import Replica, ReplicaUnreachable, pick, request_route
from .server_info import ANSWER_TIMEOUT_S
from .server_info import PATH as SERVER_INFO

COMPLETION_PATHS = ("/v1/completions", "/v1/chat/completions")
GENERATION_PATHS = (*COMPLETION_PATHS, "/tokenize", "/detokenize")
FORWARDED_HEADERS = ("Content-Type", "Accept")
SERVED_BY = "X-Served-By"  # which replica answered: for logs and tests, never needed for correctness
HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "date", "server"}


class GenerationRouting:
    """`Proxy`'s routes that forward to one replica; it uses the proxy's replicas, session, calls and members."""

    def pick(self, key: str, exclude: set[str]) -> Replica | None:
        return pick(self.replicas, key, exclude, self.spill_threshold)

    async def generate(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        model, key = request_route(body)
        if not self.members.shared:
            return await self._route(request, body, key)
        foreign = self.members.foreign(model)
        if foreign:
            return error_response(403, foreign)
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
        return error_response(503, "no healthy vLLM replica")

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
            return web.Response(status=reply.status, text=reply.text, content_type=content_type_of(reply.text))
        return error_response(503, "no healthy vLLM replica")

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
                return web.Response(status=200, text=reply.text, content_type=content_type_of(reply.text))
            last = f"{replica.url} answered {reply.status}: {reply.text[:200]}"
        return error_response(503, f"{SERVER_INFO}: {last}")

    async def refuse(self, request: web.Request) -> web.Response:
        return error_response(404, f"the proxy does not forward POST {request.path}: it is neither a generation route "
                                   "nor one it knows how to broadcast to every replica")


def _counts_tokens(request: web.Request, upstream) -> bool:
    """A completion answered as one JSON body (not a stream, a tokenization): it says the tokens it generated."""
    return request.path in COMPLETION_PATHS and upstream.content_type == "application/json"

