"""Who may do what with Hugging Face Jobs from the panel. Free of Gradio: handlers pass plain values.

A visitor launches or cancels only in their own namespace or an org they can write to; they see the runs of
every namespace their token belongs to (the deployment-wide rules are in `backend.runs.access`).
"""

import hashlib
import threading
import time
from typing import Any

from huggingface_hub import HfApi

WHOAMI_TTL_S = 300.0   # /whoami-v2 is rate-limited on purpose: ask once per token every few minutes
_cache: dict[tuple[str, str], tuple[float, dict[str, Any]]] = {}
_cache_lock = threading.Lock()


def whoami_namespaces(token: str) -> set[str]:
    """The token owner's user name and the names of their orgs."""
    info = _whoami(token)
    return {info["name"], *(org["name"] for org in info.get("orgs", []))}


def whoami_name(token: str) -> str:
    """The token owner's user name."""
    return _whoami(token)["name"]


def writable_namespaces(token: str) -> list[str]:
    """The namespaces this token may create repos and run jobs in: its user and the orgs it may write to."""
    info = _whoami(token)
    return sorted({info["name"], *(o["name"] for o in info.get("orgs", []) if o.get("roleInOrg") != "read")})


def can_control(namespace: str, token: str | None, on_space: bool) -> tuple[bool, str]:
    """Whether this token may launch or cancel runs in `namespace`, and if not, a reason a user can act on."""
    if token is None:
        if on_space:
            return False, "Sign in with Hugging Face to launch or cancel runs; anyone can watch them."
        return False, "No Hugging Face token found: run `hf auth login` or set HF_TOKEN."
    try:
        info = _whoami(token)
    except Exception as err:
        return False, f"Hugging Face did not accept the token ({type(err).__name__}); sign in again."
    problem = namespace_problem(info, namespace)
    return problem is None, problem or ""


def bucket_problem(namespace: str, token: str) -> str | None:
    """Why a run's bucket cannot be in `namespace` for this token (its jobs run, and are billed, there), or None;
    None also when the Hub cannot be asked (the launch asks again and refuses with the reason)."""
    try:
        info = _whoami(token)
    except Exception:
        return None
    problem = namespace_problem(info, namespace)
    return None if problem is None else (f"{problem} A run's jobs run, and are billed, in its bucket's namespace: "
                                         f"name a bucket such as {info['name']}/grpo-runs.")


def namespace_problem(info: dict[str, Any], namespace: str) -> str | None:
    """Why the owner of whoami-v2's answer `info` may not launch in `namespace` (None when they may): it is
    theirs, or an org whose `roleInOrg` is not "read"."""
    roles = {org["name"]: org.get("roleInOrg") for org in info.get("orgs", [])}
    if namespace == info["name"] or (namespace in roles and roles[namespace] != "read"):
        return None
    mine = ", ".join(sorted({info["name"], *(name for name, role in roles.items() if role != "read")}))
    if namespace in roles:
        return (f"You have read-only access to {namespace}; ask an admin for write access to run jobs there (you can "
                f"launch in: {mine}).")
    return f"Runs in {namespace} belong to someone else; you can control runs in: {mine}."


def _whoami(token: str) -> dict[str, Any]:
    api = HfApi(token=token)
    key = (api.endpoint, hashlib.sha256(token.encode()).hexdigest())   # never keep the token itself as a key
    with _cache_lock:
        hit = _cache.get(key)
        if hit and hit[0] > time.monotonic():
            return hit[1]
    info = api.whoami(token=token)
    with _cache_lock:
        _cache[key] = (time.monotonic() + WHOAMI_TTL_S, info)
    return info
