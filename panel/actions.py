"""What the panel's buttons and timer do, as plain functions over the backend (no Gradio objects here).

`Panel` holds the registries (one per executor) and the deployment settings; every handler in
`panel/ui.py` is a thin wrapper over one of its methods, so tests can drive the panel without a browser.
"""

import logging
import os
import threading
from dataclasses import dataclass, field

from backend import recipe
from backend.executors.local import LocalExecutor
from backend.launch import LaunchError
from backend.redact import redact_tokens
from backend.runs import RunRegistry
from backend.runtime.layout import atomic_write_bytes
from backend.runview import RunView
from backend.spec import RunSpec, SpecError
from backend.store import FolderStore

log = logging.getLogger(__name__)


@dataclass
class Settings:
    home: str = field(default_factory=lambda: os.environ.get("GRPO_PANEL_HOME", os.path.abspath("data")))
    on_space: bool = field(default_factory=lambda: bool(os.environ.get("SPACE_ID")))
    bucket_mount: str | None = field(default_factory=lambda: os.environ.get("GRPO_PANEL_BUCKET_MOUNT"))
    # A visitor's Hub registry (its log readers, views and caches) is dropped after this long unused, so a
    # long-lived Space does not grow with every visitor and every refreshed OAuth token; it is rebuilt on demand.
    registry_idle_s: float = 3600.0


class Refused(Exception):
    """The visitor may not do this (anonymous on a Space, or a namespace they do not own)."""


class Panel:
    def __init__(self, settings: Settings | None = None):
        self.settings = settings or Settings()
        self.local = LocalExecutor(self.settings.home)
        self.local_runs = RunRegistry(self.local, lambda bucket: FolderStore(self.local.bucket_root(bucket)))
        self._hub_registries: dict[str, RunRegistry] = {}
        self._hub_used: dict[str, float] = {}        # registry key -> monotonic time of its last use
        self._hub_lock = threading.Lock()
        self._run_registry: dict[str, RunRegistry] = {}
        self._flavors: tuple[float, list] = (0.0, [])
        self._final_zips: dict[str, str] = {}
        # Files built for download (final adapters, full logs) live here under stable names, one per run (and
        # role), replaced on each build: a long-lived Space does not collect a temp folder per click.
        self.downloads = os.path.join(self.settings.home, "downloads")

    # ---- registries and permissions
    def _token(self, oauth_token: str | None) -> str | None:
        from backend.hub_auth import resolve_token

        return resolve_token(oauth_token, self.settings.on_space)

    def hub_registry(self, token: str, namespace: str) -> RunRegistry:
        import time as _time

        key = f"{namespace}:{hash(token)}"
        with self._hub_lock:      # handlers run in threads: one registry (and one set of log readers) per key
            now = _time.monotonic()
            self._hub_used[key] = now
            self._evict_idle(now)
            if key not in self._hub_registries:
                from backend.executors.hf_jobs import HfJobsExecutor
                from backend.hub_store import open_store

                executor = HfJobsExecutor(token, namespace)
                self._hub_registries[key] = RunRegistry(
                    executor, lambda bucket: open_store(bucket, token, self.settings.bucket_mount), list_every_s=15.0)
            return self._hub_registries[key]

    def _evict_idle(self, now: float) -> None:
        """Drop Hub registries unused for `registry_idle_s`: stop their log readers and forget their runs."""
        for key in [k for k, used in self._hub_used.items() if now - used > self.settings.registry_idle_s]:
            del self._hub_used[key]
            registry = self._hub_registries.pop(key, None)
            if registry is None:
                continue
            registry.executor.stop(timeout=0)
            for run_id in [r for r, reg in list(self._run_registry.items()) if reg is registry]:
                self._run_registry.pop(run_id, None)    # rebuilt from the Hub's job list when asked for again
            log.info("dropped an idle Hugging Face Jobs registry (%s runs)", key.split(":", 1)[0])

    def _check_control(self, executor: str, namespace: str | None, oauth_token: str | None) -> str | None:
        """The token to act with; raises Refused with a reason the visitor can act on."""
        if executor == "local" and not local_runtime_installed():
            raise Refused("This deployment has no local training runtime (requirements-runtime.txt): "
                          "choose 'hf_jobs' to run on Hugging Face Jobs.")
        if executor == "local":
            if self.settings.on_space and not oauth_token:
                raise Refused("Sign in with Hugging Face (button at the top) to launch or cancel runs on this Space.")
            return None
        token = self._token(oauth_token)
        from backend.hub_auth import can_control

        allowed, reason = can_control(namespace or "", token, self.settings.on_space)
        if not allowed:
            raise Refused(reason)
        return token

    # ---- launch form
    def build_spec(self, values: dict) -> RunSpec:
        """A validated RunSpec from form values; raises SpecError listing every bad field."""
        return RunSpec.from_dict(values).check()

    def preview(self, values: dict) -> str:
        """Markdown: the problems to fix, or the jobs as `hf jobs run` commands with an estimated cost."""
        try:
            spec = self.build_spec(values)
        except SpecError as exc:
            return _errors_markdown(exc)
        jobs = recipe.preview_jobs(spec)
        lines = [(f"**{len(jobs)} job(s)**, image `{spec.image}`, TRL {recipe.TRL_VERSION}, "
                  f"PEFT {recipe.PEFT_VERSION}. Engine: {engine_label(spec)}.")]
        if spec.executor == "hf_jobs":
            lines.append(self._cost_line(jobs))
        else:
            lines.append("Runs here as local processes; the bucket is the folder "
                         f"`{self.local.bucket_root(spec.bucket)}`.")
        for job in jobs:
            command = job.cli_preview() if spec.executor == "hf_jobs" else job.local_preview()
            lines.append(f"```bash\n# {job.role}\n{redact_tokens(command)}\n```")
        return "\n\n".join(lines)

    def flavors(self, oauth_token: str | None = None) -> list:
        """HF Jobs hardware with prices (the Hub's list, or the built-in one), asked at most every 10 minutes."""
        import time as _time

        from backend.hardware import list_flavors

        asked_at, flavors = self._flavors
        if not flavors or _time.time() - asked_at > 600:
            flavors = list_flavors(self._token(oauth_token))
            self._flavors = (_time.time(), flavors)
        return flavors

    def _cost_line(self, jobs) -> str:
        from backend.hardware import estimate_cost

        flavors = self.flavors()
        try:
            cost = estimate_cost(jobs, flavors)
        except ValueError as exc:
            return f"**Cannot estimate the cost:** {exc}"
        per_job = ", ".join(f"{j.role} on {j.flavor}" for j in jobs)
        note = " (built-in price list: the Hub could not be asked)" if any(f.fallback for f in flavors) else ""
        return (f"Estimated cost at most **${cost:.2f}**{note}: price per hour x timeout "
                f"({jobs[0].timeout_s // 60} min) for each job: {per_job}.")

    def launch(self, values: dict, oauth_token: str | None = None, confirmed: bool = False) -> tuple[str, str | None]:
        """(message, run_id or None). Nothing is launched unless the spec validates and the visitor may.

        A run on HF Jobs costs money: it is launched only once the visitor has `confirmed` the preview."""
        try:
            spec = self.build_spec(values)
            if spec.executor == "hf_jobs":
                problem = self._flavor_problem(spec)
                if problem:
                    return f"**Not launched.** {problem}", None
                if not confirmed:
                    return ("**Not launched yet.** Review the jobs and the cost, then tick *I reviewed the jobs "
                            "and the estimated cost* and press Launch again.\n\n" + self.preview(values)), None
            token = self._check_control(spec.executor, spec.bucket_namespace, oauth_token)
            if spec.executor == "local":
                registry, secrets = self.local_runs, {}
            else:
                registry, secrets = self.hub_registry(token, spec.bucket_namespace), {recipe.TOKEN_SECRET: token}
            launched = registry.launch(spec, secrets)
        except SpecError as exc:
            return _errors_markdown(exc), None
        except (Refused, LaunchError) as exc:
            return f"**Not launched.** {redact_tokens(str(exc))}", None
        self._run_registry[spec.run_id] = registry
        jobs = ", ".join(f"{role} `{job_id}`" for role, job_id in launched.job_ids.items())
        return f"Launched run **{spec.run_id}** ({spec.mode}, {engine_label(spec)}): {jobs}", spec.run_id

    def _flavor_problem(self, spec: RunSpec) -> str | None:
        flavors = {f.name: f for f in self.flavors()}
        wanted = {"flavor": spec.flavor, **({"vllm_flavor": spec.vllm_flavor} if spec.mode == "distributed" else {})}
        bad = [f"{field} {value!r}" for field, value in wanted.items() if value not in flavors]
        if bad:
            return f"Unknown hardware: {', '.join(bad)}; choose one of {', '.join(sorted(flavors))}."
        gpus = flavors[spec.flavor].gpus
        if spec.mode == "colocated" and spec.num_processes > max(gpus, 1):
            return (f"flavor {spec.flavor!r} has {gpus} GPU(s) but the run asks for {spec.num_processes} "
                    "data-parallel processes (one per GPU); pick a larger flavor or fewer processes.")
        if spec.mode == "colocated" and spec.use_vllm and spec.num_processes % spec.vllm_tensor_parallel_size:
            # Colocated vLLM shards over groups of the training processes: TP must divide their number.
            return (f"vllm_tensor_parallel_size {spec.vllm_tensor_parallel_size} must divide the number of "
                    f"processes ({spec.num_processes}).")
        return None

    # ---- runs
    def registries(self, oauth_token: str | None = None) -> list[RunRegistry]:
        """Local runs, plus the HF Jobs runs of every namespace the acting token belongs to."""
        regs = [self.local_runs]
        token = self._token(oauth_token)
        if token:
            from backend.hub_auth import whoami_namespaces

            try:
                regs += [self.hub_registry(token, ns) for ns in sorted(whoami_namespaces(token))]
            except Exception as exc:  # the Hub unreachable must not take the local runs down with it
                log.warning("cannot list Hugging Face Jobs runs: %s", redact_tokens(str(exc), (token,)))
        return regs

    def runs_table(self, oauth_token: str | None = None) -> list[list]:
        """Rows: run id, executor, stage per job, created."""
        import time as _time

        rows = []
        for registry in self.registries(oauth_token):
            for run in registry.list_runs():
                self._run_registry.setdefault(run.run_id, registry)
                stages = ", ".join(f"{role}: {stage}" for role, stage in sorted(run.stages.items()))
                created = _time.strftime("%Y-%m-%d %H:%M:%S", _time.localtime(run.created_at))
                rows.append([run.run_id, registry.executor.name, stages, created])
        return rows

    def view(self, run_id: str, oauth_token: str | None = None) -> RunView:
        """A run's view, only if the acting visitor may see it (local runs, or their own namespaces' runs)."""
        allowed = self.registries(oauth_token)
        if self._run_registry.get(run_id) not in allowed:
            self.runs_table(oauth_token)
        registry = self._run_registry.get(run_id)
        if registry not in allowed:
            raise KeyError(f"no run {run_id!r} that you can see")
        return registry.view(run_id)

    def cancel(self, run_id: str, oauth_token: str | None = None) -> str:
        try:
            view = self.view(run_id, oauth_token)
            self._check_control(self._run_registry[run_id].executor.name,
                                view.spec.get("bucket", "").split("/")[0], oauth_token)
            stopped = self._run_registry[run_id].cancel(run_id)
        except (Refused, KeyError) as exc:
            return f"**Not cancelled.** {exc}"
        return f"Cancel requested for {len(stopped)} job(s) of run {run_id}."

    def resume(self, run_id: str, oauth_token: str | None = None) -> str:
        """Relaunch a stopped run's jobs; its trainer resumes from the last checkpoint in the bucket."""
        try:
            view = self.view(run_id, oauth_token)
            registry = self._run_registry[run_id]
            token = self._check_control(registry.executor.name, view.spec.get("bucket", "").split("/")[0], oauth_token)
            secrets = {recipe.TOKEN_SECRET: token} if token else {}
            launched = registry.resume(run_id, secrets)
            self._final_zips.pop(run_id, None)    # the resumed trainer writes a new final adapter
        except (Refused, KeyError, LaunchError, SpecError) as exc:
            return f"**Not resumed.** {redact_tokens(str(exc))}"
        return f"Resumed with {len(launched.job_ids)} new job(s): {launched.note}"

    def final_adapter(self, run_id: str) -> str | None:
        """The final adapter as a zip, built once per run (the bucket's final/ is written once)."""
        if run_id not in self._final_zips:
            registry = self._run_registry.get(run_id)
            path = registry.final_adapter_zip(run_id, self.downloads) if registry else None
            if path is None:
                return None
            self._final_zips[run_id] = path
        return self._final_zips[run_id]

    def shutdown(self) -> None:
        """The panel is exiting: stop reading from the Hub. Local runs keep running (each job has its own wrapper
        process) and the next panel over the same home finds them, with their true status."""
        for registry in self._hub_registries.values():
            registry.executor.stop(timeout=0)


def local_runtime_installed() -> bool:
    import importlib.util

    return all(importlib.util.find_spec(m) is not None for m in ("torch", "trl", "peft"))


def engine_label(spec: RunSpec) -> str:
    if spec.mode == "distributed":
        return f"vLLM server x{spec.replicas} behind the proxy (async GRPO)"
    if spec.use_vllm and spec.executor == "hf_jobs":
        sleep = "on" if spec.vllm_enable_sleep_mode else "off"
        return f"vLLM colocated (gpu_memory_utilization={spec.vllm_gpu_memory_utilization}, sleep mode {sleep})"
    if spec.use_vllm:
        return "vLLM colocated if the machine has a GPU, else transformers"
    return "transformers generate() (no vLLM)"


def _errors_markdown(exc: SpecError) -> str:
    items = "\n".join(f"- **{e.field}**: {e.message}" for e in exc.errors)
    return f"**Fix these fields before launching (nothing was launched):**\n{items}"


def full_log_file(panel: Panel, run_id: str, role: str, oauth_token: str | None = None) -> str | None:
    """The whole log of one job (redacted, like everything shown) as a file to download."""
    view = panel.view(run_id, oauth_token)
    job = view.jobs.get(role)
    if job is None:
        return None
    lines, _ = view.executor.read_logs(job.job_id, 0)
    path = os.path.join(panel.downloads, f"{run_id}-{role}.log")
    atomic_write_bytes(path, ("\n".join(lines) + "\n").encode())
    return path
