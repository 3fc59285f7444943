"""The replicas table of the dashboard: each vLLM server of a distributed run (named by its replica job), its health,
load, adapters, the canary's proof that it serves the newest version, its throughput, CPU and history."""


from backend.runtime.redact import redact_tokens
from backend.runtime.serving.canary import SERVING_TOLERANCE
from backend.view.runview import replica_counts
from backend.view.servers import latest_servers, server_name, server_role, view_servers_per_job


def _replicas(view) -> list[tuple[str, dict, str | None]]:
    """The proxy's latest snapshot of each vLLM server, named by its replica job (server i of the proxy's list runs
    in job `vllm-i`, or with several servers a job, in `vllm-<i // per job>`), with why it is down when its job has
    ended."""
    servers = latest_servers(view)
    if not servers:
        return []
    jobs = view.current_jobs
    per_job = view_servers_per_job(view)
    out = []
    for i, r in enumerate(servers):
        job = jobs.get(server_role(i, per_job))
        if job is None or not job.status.done:
            out.append((server_name(i, per_job), r, None))
            continue
        # A replica stops by itself when the trainer has finished: that is no fault, so it is not DOWN.
        out.append((server_name(i, per_job), r,
                    f"{'stopped' if job.status.stage == 'COMPLETED' else 'DOWN'} (job {job.status.stage})"))
    return out


def registered_adapters(view) -> dict[str, list[str]]:
    # A replica that is down serves nothing, whatever its last snapshot held.
    return {name: r.get("adapters", []) if r.get("healthy") and not down else []
            for name, r, down in _replicas(view)}


def replica_rows(view) -> list[list]:
    """One row per vLLM server: its name, health, load, adapters, the proof that it serves the newest version (the
    proxy's canary: listed and answering for vN, with logprobs that differ from the base model's), its generated
    tokens a second and its API process's CPU (a core's worth bounds a server), its history over the run
    (restarts, disconnects, canary misses: each what it is), its URL."""
    proofs = {p.get("url"): p for p in (view.serving or {}).get("replicas", [])}
    version = (view.serving or {}).get("version")
    rows = []
    for name, r, down in _replicas(view):
        healthy = r.get("healthy") and not down
        rows.append([name, "up" if healthy else (down or "DOWN"), r.get("in_flight"), r.get("served"),
                     r.get("errors"), ", ".join(r.get("adapters", [])) if healthy else "",
                     proof_cell(version, proofs.get(r.get("url"))), _rate(r.get("gen_tok_s"), healthy),
                     _rate(r.get("api_cpu"), healthy), history_cell(r), r.get("url")])
    return rows


def history_cell(r: dict) -> str:
    """'restarted 1x · came back 2x · missed the canary 3x', or '-': each kind of trouble counted as itself."""
    restarted, reconnected, missed = replica_counts(r)
    parts = [f"{label} {n}x" for label, n in (("restarted", restarted), ("came back", reconnected),
                                                ("missed the canary", missed)) if n]
    return " · ".join(parts) or "-"


def _rate(value, healthy: bool):
    return value if healthy and isinstance(value, (int, float)) else "-"


def proof_cell(version: str | None, proof: dict | None) -> str:
    """'serves trl-policy-v17: yes · differs from base: yes', or what the canary found instead."""
    if not version or proof is None:
        return "-"
    if proof.get("error"):
        return f"canary failed: {redact_tokens(str(proof['error']))}"
    serves = proof.get("listed") and proof.get("served") == version
    differs = (proof.get("delta_base") or 0) > SERVING_TOLERANCE
    return f"serves {version}: {'yes' if serves else 'NO'} · differs from base: {'yes' if differs else 'NO'}"
