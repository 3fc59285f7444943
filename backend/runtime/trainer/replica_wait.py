"""The distributed trainer's first wait: for its vLLM replicas, behind its proxy, until the start deadline; or until
every replica job has ended for good (`ReplicasEndedError`), where none will ever serve."""

import json
import os
import sys
import time
import urllib.error
import urllib.request

from ..records import TRAINER_ENDS
from ..serving.proxy_env import REPLICAS_ENV, expand_replica_url
from ..serving.run_ends import replicas_ended
from ..versions import trainer_events


def replica_urls(cli_urls: list[str] | None) -> list[str]:
    """The replicas' URLs; on the run's network group `${HF_NETWORK_GROUP_PREFIX}<alias>` as this job names them."""
    urls = cli_urls or [u.strip() for u in os.environ.get(REPLICAS_ENV, "").split(",") if u.strip()]
    if not urls:
        sys.exit(f"no vLLM replicas: pass --replica URL (repeatable) or set {REPLICAS_ENV}")
    try:
        return [expand_replica_url(u) for u in urls]
    except ValueError as error:
        sys.exit(str(error))


class ReplicasEndedError(RuntimeError):
    """Every replica job of the run ended for good before any served: nothing will ever generate, and another
    attempt of the trainer would find the same (runtime/job/attempt.py's PERMANENT)."""


def wait_for_replicas(proxy_url: str, timeout_s: float, gone=lambda: None) -> int:
    """Wait until every replica is healthy, or at least one once `timeout_s` has passed; return how many are.
    `gone()` says why no replica will ever come (every replica job has ended for good), or None."""
    deadline = time.monotonic() + timeout_s
    while True:
        healthy, total = _proxy_health(proxy_url)
        if healthy == total or (healthy and time.monotonic() >= deadline):
            return healthy
        reason = None if healthy else gone()
        if reason:
            raise ReplicasEndedError(f"every vLLM replica job has ended, none will serve: {reason}")
        if time.monotonic() >= deadline:
            raise TimeoutError(f"none of the {total} vLLM replicas became healthy within {timeout_s:.0f}s")
        time.sleep(2)


def replicas_gone(run_dir: str, jobs: int, replica_dir: str | None = None):
    """`wait_for_replicas`' `gone`: why all `jobs` replica jobs of this launch have ended for good, or None. This
    launch's: ends recorded after the trainer's newest end (a resumed run's earlier replicas ended before it).
    `replica_dir`: where the replicas record their ends (a sweep's shared fleet's folder), else the run's."""
    ends = [e.get("time", 0) for e in trainer_events(run_dir) if e.get("event") in TRAINER_ENDS]
    since = max(ends, default=0.0)

    def gone() -> str | None:
        ended = replicas_ended(replica_dir or run_dir, since)
        if not jobs or len(ended) < jobs:
            return None
        return "; ".join(f"{role}: its vLLM server exited with code {e.get('code')} on attempt {e.get('attempt')} "
                         f"of {e.get('attempts')} (its log says why)" for role, e in sorted(ended.items()))
    return gone


def _proxy_health(proxy_url: str) -> tuple[int, int]:
    try:
        with urllib.request.urlopen(f"{proxy_url}/health", timeout=10) as response:
            body = json.load(response)
    except urllib.error.HTTPError as error:  # 503 still carries the counts
        body = json.load(error)
    return body["healthy"], body["replicas"]
