"""Serving proof: after each adapter load (and every `canary_interval_s` for the newest), every replica answers
one short completion with the new adapter and with its base model; their logprobs differ when the adapter is really
applied. Token ids, so any tokenizer takes it. Each proof is recorded as a write-once fragment for the dashboard.
"""

import asyncio
import json
import time
from collections.abc import Awaitable, Callable

from ..layout import CANARY_WRITER, FragmentWriter
from .replicas import Replica, Reply

CANARY_PROMPT = [72, 101, 108, 108, 111, 44, 32, 50, 43, 50, 61]     # below 256: valid in any vocabulary
CANARY_TIMEOUT_S = 30.0
# A replica applying an adapter answers the canary differently from its base model; on the same machine the same
# request is deterministic, so a distance this small means the adapter is not applied. (A trained adapter's first
# version moves the logprobs by far more; GPU non-determinism only makes a wrong "differs", never a false alarm.)
SERVING_TOLERANCE = 1e-4


class ServingProof:
    """Proves which replicas serve an adapter. `call(replica, method, path, json_body=..., timeout=...)` is the
    proxy's call to one replica."""

    def __init__(self, call: Callable[..., Awaitable[Reply]], folder: str | None):
        self._call = call
        self._writer = FragmentWriter(folder, CANARY_WRITER) if folder else None
        self.proofs: dict[str, dict] = {}     # replica url -> its latest serving proof
        self._base: dict[str, tuple[str, dict]] = {}   # replica url -> (base model id, its canary logprobs)

    async def prove(self, replicas: list[Replica], name: str) -> dict:
        """Ask every replica for the canary with adapter `name` and with its base model; record per replica
        whether it lists `name`, which model answered, and how far its logprobs are from the base model's."""
        replicas = [r for r in replicas if r.healthy]
        proofs = await asyncio.gather(*(self._prove_on(r, name) for r in replicas), return_exceptions=True)
        record = {"version": name, "replicas": []}
        for replica, proof in zip(replicas, proofs):
            if isinstance(proof, BaseException):
                proof = {"url": replica.url, "error": f"{type(proof).__name__}: {proof}"[:300]}
            record["replicas"].append(proof)
            self.proofs[replica.url] = proof
        for replica, (problem, missed) in zip(replicas, canary_problems(record)):
            replica.canary_missed += missed     # its own count: neither a restart nor a disconnect
        if self._writer:
            self._writer.write([{"time": time.time(), "canary": record}])
        return record

    async def _prove_on(self, replica: Replica, name: str) -> dict:
        models = json.loads((await self._call(replica, "GET", "/v1/models", timeout=CANARY_TIMEOUT_S)).text)
        ids = [m["id"] for m in models.get("data", [])]
        base = next((m["id"] for m in models.get("data", []) if not m.get("parent")), None)
        if replica.url not in self._base and base:
            self._base[replica.url] = (base, await self._canary_logprobs(replica, base))
        served, logprobs = await self._canary_answer(replica, name)
        _, base_logprobs = self._base.get(replica.url, (None, {}))
        return {"url": replica.url, "listed": name in ids, "served": served,
                "delta_base": _logprob_distance(logprobs, base_logprobs)}

    async def _canary_answer(self, replica: Replica, model: str) -> tuple[str | None, dict]:
        body = {"model": model, "prompt": CANARY_PROMPT, "max_tokens": 1, "temperature": 1.0, "logprobs": 5,
                "seed": 0}
        reply = await self._call(replica, "POST", "/v1/completions", json_body=body, timeout=CANARY_TIMEOUT_S)
        if reply.status != 200:
            return None, {}
        answer = json.loads(reply.text)
        top = ((answer["choices"][0].get("logprobs") or {}).get("top_logprobs") or [{}])[0] or {}
        return answer.get("model"), {str(k): float(v) for k, v in top.items()}

    async def _canary_logprobs(self, replica: Replica, model: str) -> dict:
        return (await self._canary_answer(replica, model))[1]


def canary_problems(record: dict) -> list[tuple[str | None, bool]]:
    """Per replica of a serving proof: what is wrong (None when nothing), and whether it is a miss (the replica
    answered, without the version asked for: not listed, another model, or exactly its base model while another
    replica applies it) rather than no answer at all."""
    version, replicas = record.get("version"), record.get("replicas") or []
    differs = [r for r in replicas if (r.get("delta_base") or 0) > SERVING_TOLERANCE]
    out = []
    for r in replicas:
        if r.get("error"):
            out.append((f"did not answer the canary: {r['error']}", False))
        elif not r.get("listed"):
            out.append((f"does not list {version} (/v1/models), though the trainer loaded it", True))
        elif r.get("served") != version:
            out.append((f"answered the canary for {version} as {r.get('served')!r}", True))
        elif differs and r not in differs:
            out.append((f"answers {version} exactly like its base model, while other replicas apply it", True))
        else:
            out.append((None, False))
    return out


def _logprob_distance(a: dict, b: dict) -> float | None:
    """How far two top-logprob answers are apart: the largest difference over the tokens both list, or inf
    when their top tokens differ; None when either is missing."""
    if not a or not b:
        return None
    if set(a) != set(b):
        return float("inf")
    return max(abs(a[t] - b[t]) for t in a)
