"""The Hugging Face Jobs engine: jobs billed per flavor and hour, in the bucket's namespace, with the visitor's
token."""

import re

from backend.plan import recipe
from backend.plan.engines.base import Engine
from backend.plan.hardware import FALLBACK_FLAVORS, Flavor, list_flavors
from backend.plan.jobspec import JobSpec
from backend.plan.spec import RunSpec


class HfJobsEngine(Engine):
    """Jobs on Hugging Face Jobs: billed per flavor and hour, in the bucket's namespace, with the visitor's token."""

    name = "hf_jobs"
    label = "Hugging Face Jobs"
    choice = "Hugging Face Jobs"
    billed = True
    needs_token = True
    installs_runtime = True
    bucket_on_hub = True
    chooses_hardware = True
    job_list_lags = True
    network_groups = True
    shared_fleet = True
    retry_gap_s = 600

    def flavors(self, token: str | None) -> list[Flavor]:
        return list_flavors(token)

    def job_fields(self, spec: RunSpec, flavor: str) -> dict:
        return dict(image=spec.image, flavor=flavor, namespace=spec.bucket_namespace,
                    resource_group_id=spec.resource_group_id or None)

    def replica_server(self, spec: RunSpec, gpus: list[str] | None) -> tuple[dict, list[str]]:
        share = spec.replica_gpu_memory_utilization
        return (dict(gpu_memory_utilization=share) if share != recipe.VLLM_DEFAULT_GPU_SHARE else {}), []

    def replica_gpus(self, spec: RunSpec) -> int:
        return max(next((f.gpus for f in FALLBACK_FLAVORS if f.name == spec.vllm_flavor), 1), 1)

    def replica_gpu_share(self, spec: RunSpec, gpus: list[str] | None) -> float | None:
        has_gpu = next((f.gpus for f in FALLBACK_FLAVORS if f.name == spec.vllm_flavor), 1) > 0
        return spec.replica_gpu_memory_utilization if has_gpu else None

    def replica_url(self, i: int, port) -> str:
        return recipe.placeholder_url(i, port)

    def preview_command(self, job: JobSpec, bucket_root) -> str:
        return job.cli_preview()

    def preview_note(self, spec: RunSpec, bucket_root) -> str | None:
        """How the jobs reach each other, how often a failed one is retried, and whose spending limits apply."""
        notes = []
        group = recipe.network_group(spec, fleet=bool(spec.fleet))
        servers = recipe.server_count(spec) // spec.replicas if spec.mode == "distributed" else 1
        if servers > 1:
            notes.append(f"Each replica job runs {servers} vLLM servers ({spec.servers_per_gpu} a GPU) on ports "
                         f"{recipe.REPLICA_PORT}-{recipe.REPLICA_PORT + servers - 1}, each a replica to the proxy.")
        if group and spec.fleet:
            notes.append(f"Private network: each member's trainer joins the sweep's fleet's network group `{group}` "
                         f"(as `{recipe.trainer_alias(spec, fleet=True)}`, ...) and its proxy reaches each fleet "
                         "replica at its alias (`vllm-0`, ...) with no port exposed and no token on rollout requests; "
                         f"only the proxy's port {recipe.PROXY_PORT} is exposed, for this panel, behind your token.")
        elif group:
            notes.append(f"Private network: the trainer and replicas join network group `{group}`; the trainer's proxy "
                         f"reaches each replica at its alias (`vllm-0`, ...) with no port exposed and no token on "
                         f"rollout requests; only the proxy's port {recipe.PROXY_PORT} is exposed, for this panel, "
                         "behind your token.")
        elif spec.mode == "distributed":
            whose = "each fleet replica's" if spec.fleet else "each replica's"
            notes.append(f"Exposed ports: {whose} port is reachable through the public Jobs proxy, and every "
                         "rollout request carries your token.")
        if spec.attempts > 1:
            notes.append(f"Retries: a failed job is started again, up to {spec.attempts} attempts in all; a retried "
                         "trainer resumes from the newest checkpoint, a retried replica rejoins the proxy, and a "
                         "failure a retry cannot fix (bad code or data) is not retried. Each attempt is billed.")
        if spec.resource_group_id:
            notes.append(f"Resource group `{spec.resource_group_id}` of `{spec.bucket_namespace}`: the jobs are "
                         "created in it, so the organisation's access rules and Jobs spending limits apply.")
        return " ".join(notes) or None


ENGINE = HfJobsEngine()

EXPOSED_URL = "https://{job_id}--{port}.hf.jobs"    # where a job's exposed port answers (the documented form)


def exposed_url(job_id: str, port) -> str:
    """The documented address of job `job_id`'s exposed `port` (callers send `Authorization: Bearer <token>`)."""
    return EXPOSED_URL.format(job_id=job_id, port=port)


def is_exposed_url(url: str, job_id: str) -> bool:
    """Whether `url` is, in the documented form, an exposed port of job `job_id`, and nothing else: a request sent
    there carries the visitor's token."""
    before, after = EXPOSED_URL.split("{port}")
    return re.match(rf"^{re.escape(before.format(job_id=job_id))}\d+{re.escape(after)}$", url) is not None


