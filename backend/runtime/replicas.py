"""The proxy's replicas: what it knows of each (health, load, adapters), what one answered, and which one a
generation goes to: rendezvous hashing of (adapter name, prompt prefix), so the generations of one prompt share one
replica's prefix cache, spilling to the least-loaded replica when the preferred one has `spill_threshold` more
requests in flight than it.
"""

import hashlib
import json
from dataclasses import dataclass, field

PREFIX_CHARS = 1024  # of a prompt's JSON (~250 token ids) choose its replica


class ReplicaUnreachable(Exception):
    """The replica did not answer at the transport level: it is down, not merely refusing."""


@dataclass(eq=False)
class Replica:
    url: str
    healthy: bool = False
    in_flight: int = 0
    served: int = 0
    errors: int = 0
    failed_checks: int = 0
    adapters: set[str] = field(default_factory=set)
    last_error: str = ""
    joined: int = 0         # times it became healthy: more than once, it was down (restarted, retried) and taken back

    def snapshot(self) -> dict:
        return {"url": self.url, "healthy": self.healthy, "in_flight": self.in_flight, "served": self.served,
                "errors": self.errors, "adapters": sorted(self.adapters), "last_error": self.last_error,
                "joined": self.joined}


@dataclass
class Reply:
    status: int
    text: str

    @property
    def path_missing(self) -> bool:
        # vLLM's 404 for an adapter path it cannot read, not FastAPI's 404 for a route the server lacks.
        return self.status == 404 and '"NotFoundError"' in self.text


def affinity_key(body: bytes) -> str:
    """Adapter name plus the start of the prompt as JSON. Requests sharing both can reuse one replica's prefix
    cache: a GRPO group's generations (one prompt), and the turns of a conversation (a growing prompt)."""
    try:
        payload = json.loads(body)
    except ValueError:
        return ""
    if not isinstance(payload, dict):
        return ""
    prompt = payload.get("messages", payload.get("prompt", ""))
    return f"{payload.get('model')}|{json.dumps(prompt)[:PREFIX_CHARS]}"


def rendezvous_score(key: str, url: str) -> int:
    return int.from_bytes(hashlib.blake2b(f"{key}|{url}".encode(), digest_size=8).digest(), "big")


def pick(replicas: list[Replica], key: str, exclude: set[str], spill_threshold: int) -> Replica | None:
    """The healthy replica (not in `exclude`) a generation with affinity `key` goes to, or None."""
    live = [r for r in replicas if r.healthy and r.url not in exclude]
    if not live:
        return None
    preferred = max(live, key=lambda r: rendezvous_score(key, r.url))
    least = min(live, key=lambda r: r.in_flight)
    return least if preferred.in_flight >= least.in_flight + spill_threshold else preferred
