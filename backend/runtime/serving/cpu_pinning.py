"""Each vLLM server of a replica job on CPU cores of its own, and the proxy on a core of its own.

Why: one server's throughput is bound by two single-threaded host processes, its API server and its engine core
(docs/replica-scaling.md, section 1); K servers on one GPU are 2K such processes, plus each one's helper threads,
which the scheduler otherwise moves between cores and packs onto the same ones. A study of several SGLang engines
on one GPU found them paying only when each was pinned to its own cores (sgl-project/sglang-omni PR #986). Measured
here at K = 4 with and without: docs/replica-scaling.md, section 7.

`GRPO_PIN_SERVER_CORES=0` turns pinning off (the benchmark measures both). Pinning is a performance choice, not a
protection: where it cannot be done (too few cores, a core the job may not use) the servers start unpinned and the
job's log says why; a job is never failed for it.
"""

import os

PIN_ENV = "GRPO_PIN_SERVER_CORES"       # "0": every server on all the job's cores
PROXY_CORE_ENV = "GRPO_PROXY_CORE"      # the core the trainer's proxy runs on (set where a core is kept for it)
MIN_CORES_PER_SERVER = 2                # a server's API process and engine core, each a busy thread


def pinning_wanted(env=os.environ) -> bool:
    return env.get(PIN_ENV, "1").strip() != "0"


def core_split(cores, servers: int, proxy: bool = False) -> tuple[list[list[int]] | None, int | None, str]:
    """(each server's cores, the proxy's core, "") from `cores`, the proxy's (`proxy`) the last one; or (None, None,
    why not) where each server would get fewer than MIN_CORES_PER_SERVER. Cores left over go one each to the first
    servers."""
    cores = sorted(set(cores))
    rest = cores[:-1] if proxy else cores
    if servers < 1 or len(rest) < MIN_CORES_PER_SERVER * servers:
        kept = " and one for the proxy" if proxy else ""
        return None, None, (f"{len(cores)} cores, fewer than {MIN_CORES_PER_SERVER} for each of {servers} "
                            f"server(s){kept}")
    size, extra = divmod(len(rest), servers)
    shares, first = [], 0
    for k in range(servers):
        count = size + (k < extra)
        shares.append(rest[first:first + count])
        first += count
    return shares, cores[-1] if proxy else None, ""


def parse_cores(text: str) -> list[int]:
    """"0,1,4-6" -> [0, 1, 4, 5, 6] (the list form VLLM_CPU_OMP_THREADS_BIND and taskset use)."""
    cores: list[int] = []
    for part in text.split(","):
        low, _, high = part.strip().partition("-")
        cores += range(int(low), int(high or low) + 1)
    return sorted(set(cores))


def server_cores(count: int, binds: list[str] | None, env=os.environ,
                 own=None) -> tuple[list[list[int]] | None, str]:
    """Each of a job's `count` servers' cores, or (None, why not): the engine's `binds` where it gave them (a local
    job shares its machine: the engine split its cores), else the job's own cores (`own`: its affinity) split."""
    if not pinning_wanted(env):
        return None, f"{PIN_ENV}=0"
    if count <= 1:
        return None, "one server"
    if binds:
        shares = [parse_cores(b) for b in binds]
        overlap = sum(map(len, shares)) != len({c for s in shares for c in s})
        if len(shares) != count or overlap or min(map(len, shares)) < MIN_CORES_PER_SERVER:
            return None, (f"the cores given ({' '.join(binds)}) are not {count} disjoint sets of at least "
                          f"{MIN_CORES_PER_SERVER}")
        return shares, ""
    shares, _, why = core_split(os.sched_getaffinity(0) if own is None else own, count)
    return shares, why


def pin_self(env=os.environ) -> str | None:
    """Pin this process to the core `GRPO_PROXY_CORE` names (the proxy, where a core was kept for it); what was
    done, in words, or None where nothing was asked."""
    core = env.get(PROXY_CORE_ENV, "").strip()
    if not core or not pinning_wanted(env):
        return None
    try:
        os.sched_setaffinity(0, parse_cores(core))
    except (OSError, ValueError) as error:      # a performance choice: the proxy runs unpinned
        return f"not pinned to core {core}: {error}"
    return f"pinned to core {core}"
