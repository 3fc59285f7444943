"""What the panel's buttons and timer do, as plain functions over the backend (no Gradio objects here).

`Panel` turns form values and a `Visitor` (who clicked) into backend calls: preview, launch, cancel, resume,
watch, download. Who may do what is decided in `backend.access`; which registry reaches a run, in
`backend.run_directory`. Every handler in `panel/ui.py` is a thin wrapper over one method here.
"""

import hashlib
import importlib.util
import json
import logging
import os
import stat
import tempfile
import threading
import time
from dataclasses import dataclass, replace

from backend import recipe
from backend.access import (
    ANONYMOUS,
    Deployment,
    Refused,
    Visitor,
    acting_token,
    local_runs_problem,
    no_token_reason,
    token_lifetime_problem,
)
from backend.alerts import webhook_problem
from backend.budget import SpendWatch
from backend.check_job import CHECK_FLAVOR, check_in_job
from backend.executors.local import LocalExecutor
from backend.hardware import Flavor, estimate_cost, hardware_problems, list_flavors
from backend.hub_auth import bucket_problem, can_control, whoami_name
from backend.jobspec import run_stage
from backend.launch import LaunchError, preview_jobs
from backend.run_directory import RunDirectory
from backend.runs import RunRegistry
from backend.runtime.layout import atomic_write_bytes
from backend.runtime.redact import redact_tokens
from backend.runtime.task import is_local_file
from backend.runtime.tiny_model import benchmark_note
from backend.runview import RunView
from backend.spec import FieldError, RunSpec, SpecError
from backend.store import FolderStore
from backend.task_check import TASK_FIELDS, TaskReport, check_task, task_field_errors
from backend.watch import RunWatch
from panel.markdown import plain
from panel.presets import TINY_DEMO, preset_values
from panel.runs_list import RUN_FILTERS, progress_bar, run_badge
from panel.spend_view import budget_line, cost_cell

log = logging.getLogger(__name__)

Settings = Deployment      # the name the panel's tests and scripts know
RUNS_PAGE = 50             # the runs list shows the newest runs; older ones are opened by id
CHECK_REUSE_S = 3600.0     # a check job's result stands this long for the same task and visitor
CHECKS_KEPT = 256
CHECK_SIGN_IN = ("Sign in with Hugging Face (button at the top) to check your task: this panel never runs anyone's "
                 "code on its own machine, so the reward functions run in a short CPU job in your own account.")


@dataclass(frozen=True)
class Preview:
    """What the launch form shows before a launch: the jobs and their cost, or what to fix."""

    markdown: str
    fingerprint: str | None = None     # of the previewed spec; a launch on HF Jobs must quote it
    run_id: str | None = None          # the id the previewed jobs carry; the launch uses the same one
    fields: tuple[str, ...] = ()       # the form fields to fix (the form opens and marks them)


@dataclass(frozen=True)
class LaunchResult:
    message: str
    run_id: str | None = None
    preview: Preview | None = None     # when the launch asks for a (new) review instead
    fields: tuple[str, ...] = ()       # the form fields to fix, when the launch was refused for them

    def __iter__(self):
        """Unpacks as `message, run_id`, the two things a script wants to know."""
        return iter((self.message, self.run_id))


def as_visitor(visitor: Visitor | str | None) -> Visitor:
    """A Visitor from what a caller holds: a Visitor, a bare token (scripts and tests), or nothing."""
    if isinstance(visitor, Visitor):
        return visitor
    return Visitor(token=visitor) if visitor else ANONYMOUS


class Panel:
    def __init__(self, settings: Deployment | None = None, local: LocalExecutor | None = None):
        self.settings = settings or Deployment()
        self.local = local or LocalExecutor(self.settings.home)
        local_runs = RunRegistry(self.local, lambda bucket: FolderStore(self.local.bucket_root(bucket)))
        self.runs = RunDirectory(self.settings, local_runs,
                                 cache_dir=os.path.join(self.settings.home, "cache", "bucket-files"))
        self.spend = SpendWatch()
        # Budget caps and alerts of every live run, checked in the background whether anyone watches or not.
        self.watch = RunWatch(self.runs, self.spend, self.settings.home, self.settings.budget_check_s)
        self._final_zips: dict[str, str] = {}
        # Check-job results by (task, visitor): Launch reuses the check the visitor just waited for.
        self._checks: dict[str, tuple[float, TaskReport]] = {}
        self._checks_lock = threading.Lock()
        # The launch form's labels (set by the UI that builds the form): messages name a field as it is shown.
        self.field_labels: dict[str, str] = {}
        self.downloads = downloads_folder(self.settings.home)

    @property
    def local_runs(self) -> RunRegistry:
        return self.runs.local

    # ---- who may do what
    def control_token(self, registry_or_executor: str, namespace: str | None, visitor: Visitor) -> str | None:
        """The token to act with on `namespace`; raises Refused with a reason the visitor can act on."""
        if registry_or_executor == "local":
            if not local_runtime_installed():
                raise Refused("This deployment has no local training runtime (requirements-runtime.txt): "
                              "choose 'hf_jobs' to run on Hugging Face Jobs.")
            problem = local_runs_problem(visitor, self.settings)
            if problem:
                raise Refused(problem)
            return None
        token = acting_token(visitor, self.settings)
        if not token:
            raise Refused(no_token_reason(self.settings))
        allowed, reason = can_control(namespace or "", token, self.settings.on_space)
        if not allowed:
            raise Refused(reason)
        return token

    def default_bucket(self, visitor: Visitor | str | None, executor: str) -> str:
        """The bucket a preset starts with: the visitor's own `<name>/grpo-runs` for HF Jobs, created on first
        launch (private); '' when nobody is signed in, so the form asks for one."""
        if executor != "hf_jobs":
            return RunSpec.bucket
        visitor = as_visitor(visitor)
        if visitor.username:
            return f"{visitor.username}/grpo-runs"
        token = acting_token(visitor, self.settings)
        if token:
            try:
                return f"{whoami_name(token)}/grpo-runs"
            except Exception:   # the Hub unreachable: the visitor types the bucket
                return ""
        return ""

    # ---- launch form
    def check_task(self, values: dict, visitor: Visitor | str | None = None, spec: RunSpec | None = None,
                   progress=None) -> TaskReport:
        """The task check and preview (a TaskReport): dataset rows, the prompt as the model sees it, sample scores.
        The code is read here and run elsewhere: in the sandbox on a local panel, in the visitor's own check job
        on a panel that serves others (`progress`, if given, gets a line as that job goes)."""
        try:
            spec = spec or RunSpec.from_dict(values)
        except SpecError as exc:
            return TaskReport(errors=exc.errors)
        problems = task_field_errors(spec)
        if problems:
            return TaskReport(errors=problems)
        if self.settings.on_space and is_local_file(spec.dataset) and not _uploaded(spec.dataset):
            return TaskReport(errors=[FieldError("dataset", "on a Space, upload your file (Upload .jsonl / .parquet): "
                                                            "the Space's own files cannot be read")])
        visitor = as_visitor(visitor)
        if not self.settings.serves_others:
            token = acting_token(visitor, self.settings) if spec.executor == "hf_jobs" else None
            return check_task(spec, token, self.settings.datasets_server, self.settings.task_check_timeout_s)
        return self._check_in_job(spec, visitor, progress)

    def _check_in_job(self, spec: RunSpec, visitor: Visitor, progress) -> TaskReport:
        token = acting_token(visitor, self.settings)
        if not token:
            why = CHECK_SIGN_IN if self.settings.on_space else (
                f"{no_token_reason(self.settings)} A panel that others reach checks a task in a job of the visitor's "
                "own account, never on its own machine.")
            return TaskReport(errors=[FieldError("account", why)])
        if spec.executor != "hf_jobs" or not spec.bucket.strip():
            spec = replace(spec, executor="hf_jobs", bucket=self.default_bucket(visitor, "hf_jobs") or spec.bucket)
        key = _check_key(spec, token)
        with self._checks_lock:
            cached = self._checks.get(key)
        if cached and time.time() - cached[0] < CHECK_REUSE_S:
            return cached[1]
        allowed, reason = can_control(spec.bucket_namespace, token, self.settings.on_space)
        if not allowed:
            return TaskReport(errors=[FieldError("bucket", f"the check job runs in the bucket's namespace: {reason}")])
        registry = self.runs.hub_registry(token, spec.bucket_namespace)
        price = next((f.price_per_hour_usd for f in self.flavors(visitor) if f.name == CHECK_FLAVOR), None)
        report = check_in_job(spec, token, self.settings.datasets_server, registry.executor,
                              registry.store_for(spec.bucket), price, self.settings.task_check_timeout_s, progress)
        with self._checks_lock:
            self._checks[key] = (time.time(), report)
            while len(self._checks) > CHECKS_KEPT:
                self._checks.pop(next(iter(self._checks)))
        return report

    def build_spec(self, values: dict, run_id: str | None = None, visitor: Visitor | None = None) -> RunSpec:
        """A validated RunSpec from form values; raises SpecError listing every bad field. An HF Jobs run with no
        bucket goes to the visitor's own `<name>/grpo-runs`."""
        values = {**values, **({"run_id": run_id} if run_id else {})}
        if values.get("executor") == "hf_jobs" and not str(values.get("bucket") or "").strip() and visitor:
            values["bucket"] = self.default_bucket(visitor, "hf_jobs")
        spec = RunSpec.from_dict(values).check()
        if spec.executor == "hf_jobs":
            problems = hardware_problems(spec, self.flavors())
            token = acting_token(as_visitor(visitor), self.settings)
            bucket = bucket_problem(spec.bucket_namespace, token) if token else None
            if bucket:     # refused here, so Preview says so (naming the field) before it shows a cost
                problems = [*problems, FieldError("bucket", bucket)]
            if problems:
                raise SpecError(problems)
        return spec

    def preview(self, values: dict, visitor: Visitor | str | None = None, run_id: str | None = None) -> Preview:
        """The problems to fix, or the jobs as they will be submitted with an estimated cost and a fingerprint."""
        visitor = as_visitor(visitor)
        try:
            spec = self.build_spec(values, run_id, visitor)
        except SpecError as exc:
            hint = "" if acting_token(visitor, self.settings) or values.get("executor") != "hf_jobs" else (
                f"\n\n{no_token_reason(self.settings)}")
            return Preview(_errors_markdown(exc, self.field_labels) + hint, fields=_fields(exc))
        jobs = preview_jobs(spec)
        lines = [(f"**{len(jobs)} job(s)** of run `{spec.run_id}`, image `{spec.image}`, TRL {recipe.TRL_VERSION}, "
                  f"PEFT {recipe.PEFT_VERSION}. Engine: {engine_label(spec)}.")]
        if spec.executor == "hf_jobs":
            lines.append(self._cost_line(jobs, visitor) + f" Review code **`{spec.fingerprint()}`**.")
            if spec.budget_usd:
                lines.append(budget_line(spec))
            expiry = token_lifetime_problem(visitor, spec.timeout_minutes * 60)
            if expiry:
                lines.append(f"⚠️ Not launchable as it is: {expiry}")
        else:
            lines.append("Runs here as local processes, each under a wrapper that enforces its timeout; the bucket "
                         f"is the folder `{self.local.bucket_root(spec.bucket)}`; `FREE_PORT_i` is a free port "
                         "picked at launch.")
        for job in jobs:
            command = job.cli_preview() if spec.executor == "hf_jobs" else self.local.as_run(job).local_preview()
            lines.append(f"```bash\n# {job.role}\n{command}\n```")
        return Preview(redact_tokens("\n\n".join(lines)), spec.fingerprint(), spec.run_id)

    def flavors(self, visitor: Visitor | str | None = None) -> list[Flavor]:
        """HF Jobs hardware with prices (the Hub's list asked with the visitor's token, or the built-in one),
        asked at most every 10 minutes."""
        token = acting_token(as_visitor(visitor), self.settings)
        return self.spend.flavor_cache.get(("signed in", bool(token)), lambda: list_flavors(token))

    def _cost_line(self, jobs, visitor: Visitor) -> str:
        flavors = self.flavors(visitor)
        try:
            cost = estimate_cost(jobs, flavors)
        except ValueError as exc:
            return f"**Cannot estimate the cost:** {exc}"
        per_job = ", ".join(f"{j.role} on {j.flavor}" for j in jobs)
        note = " (built-in price list: the Hub could not be asked)" if any(f.fallback for f in flavors) else ""
        return (f"Estimated cost at most **${cost:.2f}**{note}: price per hour x timeout "
                f"({jobs[0].timeout_s // 60} min) for each job: {per_job}.")

    def launch(self, values: dict, visitor: Visitor | str | None = None, confirmed: str | None = None,
               run_id: str | None = None, webhook: str = "") -> LaunchResult:
        """Launch the form's run. Nothing is launched unless the spec validates and the visitor may.

        A run on HF Jobs costs money: it is launched only when `confirmed` is the fingerprint of the preview the
        visitor reviewed and that fingerprint is still the form's; otherwise the answer carries a fresh preview.
        `webhook`, if given, receives the run's alerts; it is kept encrypted, never shown or written to the bucket."""
        visitor = as_visitor(visitor)
        webhook = (webhook or "").strip()
        if webhook and webhook_problem(webhook):
            return LaunchResult(f"**Not launched.** Alert webhook: {webhook_problem(webhook)}.")
        if values.get("executor") == "hf_jobs" and not acting_token(visitor, self.settings):
            return LaunchResult(f"**Not launched.** {no_token_reason(self.settings)}")
        try:
            spec = self.build_spec(values, run_id, visitor)
            token = self.control_token(spec.executor, spec.bucket_namespace, visitor)
            if spec.executor == "hf_jobs":
                expiry = token_lifetime_problem(visitor, spec.timeout_minutes * 60)
                if expiry:
                    raise Refused(f"Not launched: {expiry}")
                if confirmed != spec.fingerprint():
                    preview = self.preview(values, visitor, run_id=spec.run_id)
                    why = ("the form changed since the reviewed preview" if confirmed else
                           "it has not been reviewed")
                    return LaunchResult(
                        f"**Not launched yet:** {why}. Check the jobs and the cost below (review code "
                        f"`{spec.fingerprint()}`), tick *I reviewed the jobs and the estimated cost* and press "
                        f"Launch again.\n\n{preview.markdown}", None, preview)
            task = self.check_task(values, visitor, spec)
            if task.errors:
                raise SpecError(task.errors)
            if spec.executor == "local":
                registry, secrets = self.runs.local, {}
            else:
                registry = self.runs.hub_registry(token, spec.bucket_namespace)
                secrets = {recipe.TOKEN_SECRET: token}
            launched = registry.launch(spec, secrets)
            if webhook:
                self.watch.webhooks.put(spec.run_id, webhook)
            self.runs.relist(spec.bucket_namespace)
        except SpecError as exc:
            return LaunchResult(_errors_markdown(exc, self.field_labels), fields=_fields(exc))
        except (Refused, LaunchError) as exc:
            text = str(exc)
            return LaunchResult(redact_tokens(text if text.startswith("Not launched") else f"**Not launched.** {text}"))
        jobs = ", ".join(f"{role} `{job_id}`" for role, job_id in launched.job_ids.items())
        notes = "".join(f"\n\n⚠️ {w}" for w in task.warnings)
        return LaunchResult(f"Launched run **{spec.run_id}** ({spec.mode}, {engine_label(spec)}): {jobs}{notes}",
                            spec.run_id)

    # ---- runs
    def runs_table(self, visitor: Visitor | str | None = None, with_cost: bool = True,
                   limit: int = RUNS_PAGE, query: str = "", status: str = "all") -> list[list]:
        """The newest `limit` runs (RUNS_HEADERS), optionally only those whose id or name contains `query` and
        whose status is `status` (a RUN_FILTERS key)."""
        runs = [(run, registry) for registry in self.runs.registries(as_visitor(visitor))
                for run in registry.list_runs()]
        wanted = RUN_FILTERS.get(status) or ()
        q = (query or "").strip().lower()
        rows = []
        for run, registry in sorted(runs, key=lambda pair: pair[0].created_at, reverse=True):
            stage = run_stage(run.stages)
            if wanted and stage not in wanted:
                continue
            spec, cost = {}, ""
            if with_cost:
                try:
                    run_cost, spec = self.spend.cost(registry, run.run_id)
                    cost = cost_cell(run_cost, float(spec.get("budget_usd") or 0.0))
                except Exception as exc:   # a failing price list or bucket must not break the runs list
                    log.debug("no cost for run %s: %s", run.run_id, exc)
                    cost = "-"
            name = str(spec.get("name") or "")
            if q and q not in run.run_id.lower() and q not in name.lower():
                continue
            latest = self.spend.latest(registry, run.run_id, registry.open_view(run.run_id)) if with_cost else {}
            reward = latest.get("reward")
            created = time.strftime("%Y-%m-%d %H:%M", time.localtime(run.created_at))
            rows.append([run.run_id, name, run_badge(run), progress_bar(latest.get("step"), spec.get("max_steps")),
                         f"{reward:.3f}" if isinstance(reward, (int, float)) else "", cost,
                         str(spec.get("mode") or ""), registry.executor.name, created])
            if len(rows) == limit:
                break
        return rows

    def runs_hint(self, visitor: Visitor | str | None = None) -> str:
        """A line above the runs list when the visitor can see no Hub runs, saying why."""
        if acting_token(as_visitor(visitor), self.settings):
            return ""
        return no_token_reason(self.settings)

    def view(self, run_id: str, visitor: Visitor | str | None = None) -> RunView:
        """A run's view, only if this visitor reaches the run (local runs they may use, or their namespaces')."""
        return self.runs.find(run_id, as_visitor(visitor)).view(run_id)

    def form_from_run(self, run_id: str, visitor: Visitor | str | None = None,
                      change: dict | None = None) -> tuple[dict, str]:
        """The launch form's values for a new run like `run_id` (its spec.json, with `change` applied), and a line
        saying what was filled. Fields an older spec lacks take their defaults."""
        view = self.view(run_id, as_visitor(visitor))
        if not view.spec:
            view.refresh()
        if not view.spec:
            raise KeyError(f"Run {run_id} has no spec.json yet.")
        values = preset_values(TINY_DEMO)
        values.update({k: v for k, v in view.spec.items() if k in values})
        changed = {k: v for k, v in (change or {}).items() if k in values}
        line = f"Filled from run `{run_id}`"
        if changed:
            line += " with " + ", ".join(f"`{k}` {values[k]!r} → {v!r}" for k, v in changed.items())
            values.update(changed)
        return values, line + ". Review the preview, then launch."

    def _registry_for_control(self, run_id: str, visitor: Visitor) -> tuple[RunRegistry, str | None]:
        registry = self.runs.find(run_id, visitor)
        namespace = getattr(registry.executor, "namespace", None)
        return registry, self.control_token(registry.executor.name, namespace, visitor)

    def cancel(self, run_id: str, visitor: Visitor | str | None = None) -> str:
        """Cancel every job of the run, found through the executor (its labels), not the bucket."""
        try:
            registry, _ = self._registry_for_control(run_id, as_visitor(visitor))
            stopped = registry.cancel(run_id)
            self.runs.relist(getattr(registry.executor, "namespace", ""))
        except (Refused, KeyError) as exc:
            return f"**Not cancelled.** {_reason(exc)}"
        except Exception as exc:   # the Hub refusing or failing: say so, the jobs may still bill
            return f"**Not cancelled:** {redact_tokens(str(exc))}. Try again, or cancel the jobs on the Hub."
        if not stopped:
            return f"Run {run_id} has no running job to cancel."
        return f"Cancel requested for {len(stopped)} job(s) of run {run_id}: {', '.join(stopped)}."

    def resume_preview(self, run_id: str, visitor: Visitor | str | None = None) -> Preview:
        """What Resume would submit, from where the trainer continues, and (on HF Jobs) what it can cost."""
        visitor = as_visitor(visitor)
        try:
            registry, _ = self._registry_for_control(run_id, visitor)
            plan = self._resume_plan(registry, run_id)
        except (Refused, KeyError, LaunchError, SpecError) as exc:
            return Preview(f"**Cannot resume.** {_reason(exc)}")
        jobs = preview_jobs(plan.spec)
        lines = [f"**Resume run `{run_id}`:** {plan.message} It submits {len(jobs)} new job(s): "
                 + ", ".join(f"{j.role} on {j.flavor}" for j in jobs) + "."]
        if plan.spec.executor == "hf_jobs":
            lines.append(self._cost_line(jobs, visitor) + f" Review code **`{plan.fingerprint()}`**.")
        return Preview(redact_tokens("\n\n".join(lines)), plan.fingerprint(), run_id)

    def _resume_plan(self, registry: RunRegistry, run_id: str):
        plan = registry.resume_plan(run_id)
        problem = self.spend.resume_problem(registry, run_id, plan.spec.budget_usd)
        if problem:
            raise LaunchError(problem)
        return plan

    def resume(self, run_id: str, visitor: Visitor | str | None = None, confirmed: str | None = None) -> str:
        """Relaunch a stopped run's jobs. A resume that costs money (HF Jobs) or starts again from step 0 (no
        checkpoint) goes ahead only once the visitor reviewed exactly this resume (`confirmed` is its code)."""
        visitor = as_visitor(visitor)
        try:
            registry, token = self._registry_for_control(run_id, visitor)
            plan = self._resume_plan(registry, run_id)
            if plan.spec.executor == "hf_jobs":
                expiry = token_lifetime_problem(visitor, plan.spec.timeout_minutes * 60)
                if expiry:
                    raise Refused(expiry)
            if (plan.spec.executor == "hf_jobs" or plan.checkpoint_step is None) and confirmed != plan.fingerprint():
                return ("**Not resumed yet:** review what Resume submits, from where the trainer continues and what "
                        "it can cost, tick *I reviewed the resume* and press Resume again.\n\n"
                        + self.resume_preview(run_id, visitor).markdown)
            secrets = {recipe.TOKEN_SECRET: token} if token else {}
            launched = registry.resume(run_id, secrets, from_step_0=plan.checkpoint_step is None)
            self._final_zips.pop(run_id, None)    # the resumed trainer writes a new final adapter
        except (Refused, KeyError, LaunchError, SpecError) as exc:
            return f"**Not resumed.** {_reason(exc)}"
        return f"Resumed run {run_id} with {len(launched.job_ids)} new job(s): {launched.note}"

    def final_adapter(self, run_id: str, visitor: Visitor | str | None = None) -> str | None:
        """The final adapter as a zip, built once per run (the bucket's final/ is written once)."""
        registry = self.runs.find(run_id, as_visitor(visitor))
        if run_id not in self._final_zips:
            path = registry.final_adapter_zip(run_id, private_folder(self.downloads))
            if path is None:
                return None
            self._final_zips[run_id] = path
        return self._final_zips[run_id]

    def full_log_file(self, run_id: str, role: str, visitor: Visitor | str | None = None) -> str | None:
        """The whole log of one job (masked, like everything shown) as a file to download."""
        view = self.view(run_id, visitor)
        job = view.jobs.get(role)
        if job is None:
            return None
        lines = view.executor.all_logs(job.job_id)
        path = os.path.join(private_folder(self.downloads), f"{run_id}-{role}.log")
        atomic_write_bytes(path, ("\n".join(redact_tokens(line) for line in lines) + "\n").encode())
        return path

    def shutdown(self) -> None:
        """The panel is exiting: stop reading from the Hub. Local runs keep running (each job has its own wrapper
        process) and the next panel over the same home finds them, with their true status."""
        self.watch.stop()
        self.runs.shutdown()


def downloads_folder(home: str) -> str:
    """Where files built for download (final adapters, full logs) live: under stable names, one per run (and role),
    replaced on each build, so a long-lived Space does not collect a file per click.

    A folder of the system's temp dir, private to this user and one per panel home. Gradio hands a visitor only
    files under its working folder or the temp dir (it copies them into its cache first), and the home is neither
    on a Space (app in /home/user/app, data in /home/user/data). Allowing a folder (`launch(allowed_paths=...)`)
    instead would also serve every file in it by its path to anyone, other visitors' adapters and logs included."""
    digest = hashlib.sha256(os.path.abspath(home).encode()).hexdigest()[:12]
    return os.path.join(tempfile.gettempdir(), f"grpo-panel-downloads-{os.getuid()}-{digest}")


def private_folder(folder: str) -> str:
    """`folder`, made if need be, readable by this user only."""
    os.makedirs(folder, mode=0o700, exist_ok=True)
    found = os.lstat(folder)
    if found.st_uid != os.getuid() or not stat.S_ISDIR(found.st_mode):    # a shared temp dir: someone else's name
        raise RuntimeError(f"{folder} is not a folder of this user's: remove it, or set TMPDIR")
    return folder


def local_runtime_installed() -> bool:
    return all(importlib.util.find_spec(m) is not None for m in ("torch", "trl", "peft"))


def _check_key(spec: RunSpec, token: str) -> str:
    """What a check result depends on: the task's fields, the dataset file's bytes, the bucket and the visitor."""
    task = {name: getattr(spec, name) for name in TASK_FIELDS}
    digest = hashlib.sha256(json.dumps([task, spec.bucket, spec.image, spec.mode], sort_keys=True,
                                       default=str).encode())
    if is_local_file(spec.dataset) and os.path.isfile(spec.dataset):
        with open(spec.dataset, "rb") as f:
            for block in iter(lambda: f.read(2**20), b""):
                digest.update(block)
    digest.update(hashlib.sha256(token.encode()).digest())
    return digest.hexdigest()


def _uploaded(path: str) -> bool:
    """Whether a dataset path is a file a visitor uploaded through Gradio."""
    from gradio.utils import get_upload_folder  # noqa: PLC0415 gradio loads slowly: handlers do without it

    return os.path.realpath(path).startswith(os.path.realpath(get_upload_folder()) + os.sep)


def engine_label(spec: RunSpec) -> str:
    note = benchmark_note(spec.model)
    return _engine(spec) + (f"; model {note}" if note else "")


def _engine(spec: RunSpec) -> str:
    if spec.mode == "distributed":
        return f"vLLM server x{spec.replicas} behind the proxy (async GRPO)"
    if spec.use_vllm and spec.executor == "hf_jobs":
        sleep = "on" if spec.vllm_enable_sleep_mode else "off"
        return f"vLLM colocated (gpu_memory_utilization={spec.vllm_gpu_memory_utilization}, sleep mode {sleep})"
    if spec.use_vllm:
        return "vLLM colocated if the machine has a GPU, else transformers"
    return "transformers generate() (no vLLM)"


def _reason(exc: Exception) -> str:
    text = exc.args[0] if isinstance(exc, KeyError) and exc.args else str(exc)
    return redact_tokens(str(text))


def _fields(exc: SpecError) -> tuple[str, ...]:
    return tuple(dict.fromkeys(e.field for e in exc.errors))


def _errors_markdown(exc: SpecError, labels: dict[str, str] | None = None) -> str:
    """Each bad field by its form label (its spec name beside it, as the preview and spec.json call it)."""
    labels = labels or {}
    items = "\n".join(f"- **{plain(labels[e.field])}** (`{e.field}`): {plain(redact_tokens(e.message))}"
                      if e.field in labels else f"- **{plain(e.field)}**: {plain(redact_tokens(e.message))}"
                      for e in exc.errors)
    return f"**Fix these fields before launching (nothing was launched):**\n{items}"

