"""The proxy's replicas (each a vLLM server: a replica job may run several): what it knows of each (health, load,
adapters, what its /metrics says), what one answered, and which one a generation goes to: rendezvous hashing of
(adapter name, prompt prefix), so the generations of one prompt share one replica's prefix cache, spilling to the
least-loaded replica when the preferred one has `spill_threshold` more requests in flight than it.
"""

import hashlib
import json
from dataclasses import dataclass, field

PREFIX_CHARS = 1024  # of a prompt's JSON (~250 token ids) choose its replica
RUN_COUNTS = ("restarted", "reconnected", "canary_missed")     # per replica, for the whole run (not one proxy)


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
    joined: int = 0         # times it became healthy under this proxy: more than once, it was down and taken back
    # The run's totals (RUN_COUNTS), carried over from the proxy's last snapshot when a trainer starts it again:
    restarted: int = 0      # times it came back a new server (its adapters gone: its job ran again)
    reconnected: int = 0    # times it came back the same server (it stopped answering for a while: a disconnect)
    canary_missed: int = 0  # serving proofs it answered without the adapter asked for (not listed, another, none)
    held_when_down: bool = False    # it held adapters when it went down (a server still holding any did not restart)
    load: dict = field(default_factory=dict)    # what its /metrics said lately (ServerLoad.rates)

    def snapshot(self) -> dict:
        return {"url": self.url, "healthy": self.healthy, "in_flight": self.in_flight, "served": self.served,
                "errors": self.errors, "adapters": sorted(self.adapters), "last_error": self.last_error,
                "joined": self.joined, **{count: getattr(self, count) for count in RUN_COUNTS}, **self.load}


# A server's /metrics (Prometheus text) -> the counters and gauges its load is read from. process_cpu_seconds_total is
# its API server process's own (vLLM serves one API process's registry); its main thread bounds a server on a GPU.
LOAD_METRICS = {"vllm:generation_tokens_total": "tokens", "process_cpu_seconds_total": "cpu_s",
                "vllm:num_requests_running": "running", "vllm:num_requests_waiting": "waiting"}


def parse_load(text: str) -> dict[str, float]:
    """The LOAD_METRICS of a /metrics answer, summed over their label sets (per model, per adapter)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in LOAD_METRICS:
            try:
                out[LOAD_METRICS[name]] = out.get(LOAD_METRICS[name], 0.0) + float(line.rsplit(" ", 1)[1])
            except ValueError:
                continue
    return out


def load_rates(before: tuple[float, dict], after: tuple[float, dict]) -> dict:
    """A server's load between two readings (time, parse_load): generated tok/s, its API process's CPU (cores), and
    the requests running and waiting at the second."""
    seconds = after[0] - before[0]
    if seconds <= 0:
        return {}
    rates = {"running": after[1].get("running"), "waiting": after[1].get("waiting")}
    for key, name, digits in (("tokens", "gen_tok_s", 0), ("cpu_s", "api_cpu", 2)):
        if key in after[1] and key in before[1] and after[1][key] >= before[1][key]:
            rates[name] = round((after[1][key] - before[1][key]) / seconds, digits)
    return {k: v for k, v in rates.items() if v is not None}


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
    return request_route(body)[1]


def request_route(body: bytes) -> tuple[object, str]:
    """A generation request's model (the adapter version it names, or the base model; None if it names none) and
    its affinity key, from one parse of its body."""
    try:
        payload = json.loads(body)
    except ValueError:
        return None, ""
    if not isinstance(payload, dict):
        return None, ""
    prompt = payload.get("messages", payload.get("prompt", ""))
    return payload.get("model"), f"{payload.get('model')}|{json.dumps(prompt)[:PREFIX_CHARS]}"


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
