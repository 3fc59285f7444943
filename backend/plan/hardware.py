"""Job hardware: the flavors a run can ask for, their hourly prices, and what a run can cost at most."""

import logging
import re
import threading
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

from huggingface_hub import HfApi

from backend.plan.jobspec import JobSpec
from backend.plan.servers import memory_problem
from backend.plan.spec_fields import FieldError

logger = logging.getLogger(__name__)

LOCAL_FLAVOR = "local"           # the recipe's flavor for local runs: free
_UNITS_PER_HOUR = {"second": 3600.0, "minute": 60.0, "hour": 1.0}


@dataclass(frozen=True)
class Flavor:
    name: str
    pretty: str
    gpus: int
    price_per_hour_usd: float
    fallback: bool = False           # from the built-in list below: prices may be out of date
    gpu_memory_gb: float | None = None   # each GPU's memory (GB, as the Hub writes it); None: not known


def _fallback(name: str, pretty: str, gpus: int, price: float, gpu_gb: float | None = None) -> Flavor:
    return Flavor(name, pretty, gpus, price, fallback=True, gpu_memory_gb=gpu_gb)


# Used when the Hub cannot be asked (offline, refused): names follow huggingface_hub's JobHardware enum,
# prices are approximate list prices per hour, GPU memory (GB per GPU) the vendors' figures as the Hub lists them.
FALLBACK_FLAVORS: tuple[Flavor, ...] = (
    _fallback("cpu-basic", "CPU Basic", 0, 0.01),
    _fallback("cpu-upgrade", "CPU Upgrade", 0, 0.03),
    _fallback("t4-small", "Nvidia T4 - small", 1, 0.40, 16),
    _fallback("t4-medium", "Nvidia T4 - medium", 1, 0.60, 16),
    _fallback("l4x1", "Nvidia 1xL4", 1, 0.80, 24),
    _fallback("l4x4", "Nvidia 4xL4", 4, 3.80, 24),
    _fallback("l40sx1", "Nvidia 1xL40S", 1, 1.80, 48),
    _fallback("l40sx4", "Nvidia 4xL40S", 4, 8.30, 48),
    _fallback("l40sx8", "Nvidia 8xL40S", 8, 23.50, 48),
    _fallback("a10g-small", "Nvidia A10G - small", 1, 1.00, 24),
    _fallback("a10g-large", "Nvidia A10G - large", 1, 1.50, 24),
    _fallback("a10g-largex2", "2x Nvidia A10G - large", 2, 3.00, 24),
    _fallback("a10g-largex4", "4x Nvidia A10G - large", 4, 5.00, 24),
    _fallback("a100-large", "Nvidia A100 - large", 1, 2.50, 80),
    _fallback("a100x4", "4x Nvidia A100", 4, 10.00, 80),
    _fallback("a100x8", "8x Nvidia A100", 8, 20.00, 80),
    _fallback("h200", "Nvidia H200", 1, 5.00, 141),
    _fallback("h200x2", "2x Nvidia H200", 2, 10.00, 141),
    _fallback("h200x4", "4x Nvidia H200", 4, 20.00, 141),
    _fallback("h200x8", "8x Nvidia H200", 8, 40.00, 141),
)


def list_flavors(api_or_token: HfApi | str | None = None) -> list[Flavor]:
    """The Hub's Jobs hardware with hourly prices; the built-in list (marked `fallback`) if the Hub fails."""
    api = api_or_token if isinstance(api_or_token, HfApi) else HfApi(token=api_or_token)
    try:
        hardware = api.list_jobs_hardware()
    except Exception as err:
        logger.warning("Could not list Jobs hardware (%s); using the built-in flavor list.", type(err).__name__)
        return list(FALLBACK_FLAVORS)
    flavors = [f for f in (_from_hub(h) for h in hardware) if f is not None]
    return flavors or list(FALLBACK_FLAVORS)


FLAVORS_TTL_S = 600.0     # the Hub's hardware and price list, asked at most this often per key


class FlavorCache:
    """The one cache of the Hub's hardware and prices: the launch form's list and the spend's prices, each asked
    at most every FLAVORS_TTL_S per key (whose token asks: the panel's, or an executor's namespace)."""

    def __init__(self, ttl_s: float = FLAVORS_TTL_S):
        self.ttl_s = ttl_s
        self._asked: dict[Hashable, tuple[float, list[Flavor]]] = {}
        self._lock = threading.Lock()

    def get(self, key: Hashable, ask: Callable[[], list[Flavor]]) -> list[Flavor]:
        """The flavors under `key`, asked again through `ask` once they are older than the TTL (or empty)."""
        with self._lock:
            asked_at, flavors = self._asked.get(key, (float("-inf"), []))
        if flavors and time.monotonic() - asked_at < self.ttl_s:
            return flavors
        flavors = ask()
        with self._lock:
            self._asked[key] = (time.monotonic(), flavors)
        return flavors


def estimate_cost(jobs: list[JobSpec], flavors: list[Flavor]) -> float:
    """Most a run can cost, in USD: each job's hourly price times its timeout, for each of its attempts (a retried job
    can run its whole timeout again; billing stops earlier if it ends)."""
    prices = {f.name: f.price_per_hour_usd for f in flavors} | {LOCAL_FLAVOR: 0.0}
    unknown = sorted({job.flavor for job in jobs} - prices.keys())
    if unknown:
        raise ValueError(f"No price known for flavor {', '.join(unknown)}; "
                         f"choose one of: {', '.join(sorted(prices))}.")
    return sum(prices[job.flavor] * job.timeout_s * job.attempts / 3600.0 for job in jobs)


BILLED_MINIMUM_S = 60.0    # the Hub bills a job by the minute: one that starts at all is billed at least this


def launch_floor_usd(jobs: list[JobSpec], flavors: list[Flavor]) -> float | None:
    """The least launching these jobs can cost, in USD: each job billed its first minute (None where a flavor's price
    is unknown: not knowable). A budget cap below it would cancel everything at the first check."""
    prices = {f.name: f.price_per_hour_usd for f in flavors} | {LOCAL_FLAVOR: 0.0}
    if any(job.flavor not in prices for job in jobs):
        return None
    return sum(prices[job.flavor] * BILLED_MINIMUM_S / 3600.0 for job in jobs)


def hardware_problems(spec, flavors: list[Flavor]) -> list[FieldError]:
    """What the chosen hardware cannot do for this spec (HF Jobs): unknown flavors, more data-parallel processes
    than GPUs. (A tensor-parallel size that does not divide the processes is the spec's own error, local runs too.)"""
    known = {f.name: f for f in flavors}
    wanted = {"flavor": spec.flavor, **({"vllm_flavor": spec.vllm_flavor} if spec.mode == "distributed" else {})}
    errors = [FieldError(name, f"unknown hardware {value!r}; choose one of {', '.join(sorted(known))}")
              for name, value in wanted.items() if value not in known]
    if errors:
        return errors
    if spec.mode == "distributed":
        return servers_problems(spec, known[spec.vllm_flavor])
    gpus = known[spec.flavor].gpus
    if spec.num_processes > max(gpus, 1):
        errors.append(FieldError("num_processes", f"flavor {spec.flavor!r} has {gpus} GPU(s) but the run asks for "
                                                  f"{spec.num_processes} data-parallel processes (one per GPU); pick a "
                                                  "larger flavor or fewer processes"))
    return errors


def gpu_memory_gb(name: str, flavors: list[Flavor] = FALLBACK_FLAVORS) -> float | None:
    """Each GPU's memory (GB) of flavor `name`, from `flavors` (the Hub's list, or the built-in one)."""
    return next((f.gpu_memory_gb for f in flavors if f.name == name), None)


def _per_gpu_gb(accelerator: Any) -> float | None:
    """The Hub writes a flavor's VRAM for all its GPUs together ("96 GB" for 4xL4)."""
    match = re.fullmatch(r"\s*([\d.]+)\s*GB\s*", str(getattr(accelerator, "vram", "") or ""))
    try:
        gpus = int(accelerator.quantity)
        return round(float(match.group(1)) / gpus, 1) if match and gpus > 0 else None
    except (TypeError, ValueError):
        return None


def servers_problems(spec, flavor: Flavor) -> list[FieldError]:
    """Several vLLM servers a GPU that the replica flavor's GPU memory cannot hold for the run's model and context."""
    if spec.servers_per_gpu <= 1 or not flavor.gpus or not flavor.gpu_memory_gb:
        return []
    problem = memory_problem(spec, flavor.gpu_memory_gb * 1e9, spec.replica_gpu_memory_utilization,
                             spec.servers_per_gpu, f"one {flavor.name} GPU")
    return [FieldError("servers_per_gpu", problem)] if problem else []


def _from_hub(hardware: Any) -> Flavor | None:
    per_hour = _UNITS_PER_HOUR.get(hardware.unit_label)
    if per_hour is None:
        logger.warning("Skipping flavor %s: unknown price unit %r.", hardware.name, hardware.unit_label)
        return None
    accelerator = hardware.accelerator
    return Flavor(
        name=hardware.name,
        pretty=hardware.pretty_name,
        gpus=int(accelerator.quantity) if accelerator else 0,
        price_per_hour_usd=round(hardware.unit_cost_usd * per_hour, 4),
        gpu_memory_gb=_per_gpu_gb(accelerator) if accelerator else None,
    )

