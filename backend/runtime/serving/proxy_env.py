"""The trainer job's environment variables that say where its proxy listens and whether rollout requests carry the
job's token (the recipe sets them; the trainer and the proxy read them). Standard library only."""

import os

PROXY_HOST_ENV = "GRPO_PROXY_HOST"        # where the proxy listens (default loopback; 0.0.0.0 to expose it)
PROXY_PORT_ENV = "GRPO_PROXY_PORT"        # its port (default: a free one)
REPLICA_AUTH_ENV = "GRPO_REPLICA_AUTH"    # "none": replicas on the run's private network get no token
NETWORK_PREFIX_ENV = "HF_NETWORK_GROUP_PREFIX"
REPLICA_KEY_ENV = "GRPO_REPLICA_KEY"      # the run's replica key, where its replicas demand one (replica_key.py)
REPLICAS_ENV = "VLLM_REPLICA_URLS"        # the replicas' URLs, comma-separated (or --replica URL each)


def replica_token() -> str | None:
    """The token rollout requests carry: the run's replica key where it has one (replicas on a Ray cluster's nodes,
    replica_key.py), else the job's HF_TOKEN (exposed Jobs ports want it), none on a private network."""
    if os.environ.get(REPLICA_KEY_ENV):
        return os.environ[REPLICA_KEY_ENV]
    if os.environ.get(REPLICA_AUTH_ENV) == "none":
        return None
    return os.environ.get("HF_TOKEN") or None


def expand_replica_url(url: str) -> str:
    """A replica URL as the recipe wrote it, with `${HF_NETWORK_GROUP_PREFIX}` replaced by the job's own value; a
    ValueError that says so when the job is in no network group."""
    marker = "${" + NETWORK_PREFIX_ENV + "}"
    if marker not in url:
        return url
    prefix = os.environ.get(NETWORK_PREFIX_ENV)
    if prefix is None:
        raise ValueError(f"replica URL {url} names {marker}, but this job is in no network group "
                         f"({NETWORK_PREFIX_ENV} is not set): launch it with --network-group")
    return url.replace(marker, prefix)
