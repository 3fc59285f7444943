"""A replica that others can reach demands its run's key on every route but `/health`.

vLLM's own `--api-key` guards only `/v1/...`: the dev-mode routes TRL's async trainer needs (`/pause`, `/resume`,
`/reset_prefix_cache`, `/collective_rpc`, ...) and the LoRA routes under `/v1` differ in this. On a Ray cluster the
replicas listen on every interface of their node, so a run gets a key of its own at launch (a job secret of its
replicas and its trainer, `GRPO_REPLICA_KEY`): `serve_replica` adds this middleware to `vllm serve`, and the
trainer's proxy sends the key as its bearer token (`proxy_env.replica_token`). Standard library only: vLLM's API
server imports it.
"""

import hashlib
import hmac
import json
import os

from .proxy_env import REPLICA_KEY_ENV

MIDDLEWARE = f"{__package__}.replica_key.RequireReplicaKey"
OPEN_PATHS = ("/health",)      # the proxy's and the job's health checks, which reveal nothing


class RequireReplicaKey:
    """Pure ASGI middleware: a request without `Authorization: Bearer <the run's key>` gets 401, on any path but
    /health. The key is read from the environment once; a server started without one refuses to start."""

    def __init__(self, app):
        key = os.environ.get(REPLICA_KEY_ENV)
        if not key:
            raise RuntimeError(f"{REPLICA_KEY_ENV} is not set: a replica that demands its run's key needs one")
        self.app = app
        self.digest = hashlib.sha256(key.encode()).digest()

    def _allowed(self, scope) -> bool:
        for name, value in scope.get("headers") or []:
            if name == b"authorization":
                scheme, _, given = value.decode("latin-1").partition(" ")
                return scheme.lower() == "bearer" and hmac.compare_digest(
                    hashlib.sha256(given.encode()).digest(), self.digest)
        return False

    async def __call__(self, scope, receive, send):
        if scope["type"] not in ("http", "websocket") or scope.get("path") in OPEN_PATHS or self._allowed(scope):
            return await self.app(scope, receive, send)
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
            return
        body = json.dumps({"error": "this replica answers only its run's trainer"}).encode()
        await send({"type": "http.response.start", "status": 401,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})
