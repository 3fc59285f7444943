"""A try's answers from a distributed run that is live: through its proxy (or one of its replicas), and only at an
address the run's own record names (the proxy of a local run on loopback, the trainer's exposed port on the run's
private network, or one of the run's own replica jobs' exposed ports), since the visitor's token goes with it."""

import json
import urllib.error
import urllib.request

from backend.plan.engines.hf_jobs import is_exposed_url
from backend.plan.engines.local import LOOPBACK_URL
from backend.plan.recipe import PROXY_PORT, on_private_network
from backend.runtime import records
from backend.runtime.redact import redact_tokens

THROUGH_PROXY = "live replicas (through the proxy)"
LIVE_TIMEOUT_S = 60.0                  # one answer through the proxy


def live_endpoint(view, engine) -> tuple[str, str | None, str] | None:
    """(URL, the job id whose exposed port it is or None for a proxy on this machine, the route's name) to ask, or
    None when the run is not live."""
    if view.spec.get("mode") != "distributed" or view.stage != "RUNNING" or view.done:
        return None
    if engine.on_panel_machine:
        url = str(view_engine_event(view).get("proxy_url") or "")
        return (url, None, THROUGH_PROXY) if LOOPBACK_URL.match(url) else None
    trainer = view.current_jobs.get("trainer")
    if on_private_network(view.spec.get("mode"), view.spec.get("network"), engine):
        # The replicas have no port of their own: the trainer's exposed port is the proxy, behind the visitor's token.
        if trainer is None or trainer.status.done or not view.replica_stats:
            return None
        return view.executor.exposed_url(trainer.job_id, PROXY_PORT).rstrip("/"), trainer.job_id, THROUGH_PROXY
    jobs = {job.job_id for role, job in view.current_jobs.items() if role.startswith("vllm-") and not job.status.done}
    for replica in (view.replica_stats[-1].get("replicas", []) if view.replica_stats else []):
        url = str(replica.get("url") or "")
        # Only a URL of one of this run's own replica jobs: the visitor's token goes with the request.
        job = next((j for j in jobs if is_exposed_url(url, j)), None)
        if replica.get("healthy") and job:
            return url, job, "live replica"
    return None


def view_engine_event(view) -> dict:
    return next((e for e in reversed(view.events) if e.get("event") == records.ENGINE), {})


def served_versions(view) -> set[str]:
    """The adapter names the healthy replicas held at the proxy's newest snapshot."""
    if not view.replica_stats:
        return set()
    return {str(name) for r in view.replica_stats[-1].get("replicas", []) if r.get("healthy")
            for name in r.get("adapters", [])}


def live_answer(live, model: str | None, messages: list[dict], tokens: int, token: str | None) -> str:
    """The answer of `model` (None: the base model, whose name the servers say) at `live` (`live_endpoint`), greedy;
    or why there is none, in parentheses. The visitor's token goes only to a job's exposed port."""
    url, job = live[:2]
    headers = {"Content-Type": "application/json"}
    if job and token:
        headers["Authorization"] = f"Bearer {token}"
    try:
        if model is None:
            models = _http_json(f"{url}/v1/models", None, headers)
            model = next((m["id"] for m in models.get("data", []) if not m.get("parent")), None)
            if model is None:
                return "(the replicas list no base model)"
        body = {"model": model, "messages": messages, "max_tokens": tokens, "temperature": 0.0}
        reply = _http_json(f"{url}/v1/chat/completions", body, headers)
        return str(reply["choices"][0]["message"]["content"])
    except urllib.error.HTTPError as exc:
        detail = exc.read(300).decode(errors="replace")
        return redact_tokens(f"(the replicas answered HTTP {exc.code}: {detail})")
    except (OSError, ValueError, KeyError, IndexError, TypeError) as exc:
        return redact_tokens(f"(the replicas could not be asked: {exc})")


def _http_json(url: str, body: dict | None, headers: dict) -> dict:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, headers=headers, method="POST" if data else "GET")
    with urllib.request.urlopen(request, timeout=LIVE_TIMEOUT_S) as response:
        return json.loads(response.read(1 << 20))
