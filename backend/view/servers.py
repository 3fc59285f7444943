"""A distributed run's vLLM servers as the dashboard names them: the proxy lists every server of every replica job,
job by job (`servers_per_gpu` servers on each GPU of a job), and replica job `vllm-i` holds a run of them. Also what
the servers' load says: their generated tok/s, their API processes' CPU, and their replica jobs' GPU use.
"""

import statistics

GPU_WINDOW_S = 120.0     # the replica jobs' GPU samples the verdict reads


def listed_per_job(servers: int, jobs: int) -> int:
    """How many of the proxy's servers each replica job runs: its list's length over the replica jobs (1 where
    that does not divide: a list read before every job was known)."""
    return servers // jobs if jobs and servers >= jobs and servers % jobs == 0 else 1


def server_role(i: int, per_job: int) -> str:
    """The replica job of the proxy's server `i`: its job name everywhere (tables, logs, charts)."""
    return f"vllm-{i // max(per_job, 1)}"


def server_name(i: int, per_job: int) -> str:
    """Server `i` as the replicas table names it: its job (`vllm-0`), and with several a job, which one (`vllm-0/1`)."""
    return server_role(i, per_job) if per_job <= 1 else f"{server_role(i, per_job)}/{i % per_job}"


def latest_servers(view) -> list[dict]:
    """The proxy's newest snapshot of each server (empty before the first)."""
    return view.replica_stats[-1].get("replicas", []) if view.replica_stats else []


def view_servers_per_job(view) -> int:
    jobs = sum(1 for role in view.current_jobs if role.startswith("vllm-"))
    return listed_per_job(len(latest_servers(view)), jobs)


def replica_gpu_busy(view, now: float | None = None) -> float | None:
    """The replica jobs' GPU utilisation (%) over their newest GPU_WINDOW_S of samples (each sample's busiest GPU),
    or None where no replica job reports a GPU."""
    busy = []
    for role, job in view.current_jobs.items():
        if not role.startswith("vllm-"):
            continue
        samples = [s for s in job.resources if s.gpu_util]
        if samples:
            last = now if now is not None else samples[-1].time
            busy += [max(s.gpu_util) for s in samples if last - s.time <= GPU_WINDOW_S]
    return statistics.mean(busy) if busy else None
