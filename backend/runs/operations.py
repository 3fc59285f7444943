"""Launch, resume and cancel, with their policy: who may, with which token, after which review.

`Operations` runs the steps of each in order (the token, the spec with the alert webhook, the right to act on the
namespace, the token's lifetime, the review fingerprint, the task check, the registry, the job secrets) and answers
with what happened: a `LaunchPreview`, a `ReviewNeeded`, a `LaunchedRun`, or an exception (`Refused`, `SpecError`,
`LaunchError`). The panel turns clicks into these calls and the answers into messages. Which executor does what is
asked of its engine (`backend.executors.engine`), never of its name.
"""

import hashlib
import json
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from backend.executors.hf_jobs import HfJobsExecutor
from backend.executors.local import LocalExecutor
from backend.plan import recipe
from backend.plan.cost import format_usd
from backend.plan.engines import engine, engines, known_engine
from backend.plan.engines.base import Engine
from backend.plan.hardware import Flavor, estimate_cost, hardware_problems, launch_floor_usd
from backend.plan.jobspec import JobSpec
from backend.plan.spec import TASK_FIELDS, FieldError, RunSpec, SpecError
from backend.plan.sweep import BUDGET_FIELD, FleetSize, SweepSpec, fleet_size, parse_budget, parse_swept
from backend.runs.access import (
    ANONYMOUS,
    Deployment,
    Refused,
    Visitor,
    acting_token,
    local_runs_problem,
    no_token_reason,
    token_lifetime_problem,
)
from backend.runs.budget import SpendWatch
from backend.runs.directory import RunDirectory
from backend.runs.hub_auth import bucket_problem, can_control, whoami_name
from backend.runs.launch import LaunchedRun, LaunchError, LaunchUnderWay, preview_jobs
from backend.runs.notes import NotesBook, RunNotes, checked_name, checked_notes
from backend.runs.registry import RunRegistry, cancel_jobs
from backend.runs.resume import ResumePlan
from backend.runs.run_ids import RUN_ID_FIELD, id_taken_message
from backend.runtime import layout, records
from backend.runtime.redact import redact_tokens
from backend.runtime.task import is_local_file
from backend.runtime.trainer import sweep_stops
from backend.storage.journal import FAILED, LAUNCHED, LAUNCHING, UnderWay
from backend.task.check import TaskReport, check_task, task_field_errors
from backend.task.check_job import CHECK_FLAVOR, check_in_job
from backend.view.webhook import webhook_problem

WEBHOOK_FIELD = "webhook"  # the alert webhook's name among the fields a refusal names
CHECK_REUSE_S = 3600.0     # a check job's result stands this long for the same task and visitor
CHECKS_KEPT = 256
CHECK_EXECUTOR = HfJobsExecutor.name   # a panel that serves others checks a task in the visitor's own HF Jobs account
CHECK_SIGN_IN = ("Sign in with Hugging Face (button at the top) to check your task: this panel never runs anyone's "
                 "code on its own machine, so the reward functions run in a short CPU job in your own account.")


class TokenTooShort(Refused):
    """The visitor's token expires before the jobs' timeout: they would fail half way."""


@dataclass(frozen=True)
class CostEstimate:
    """The most a run's jobs can cost (each job's hourly price times its timeout), or why it cannot be said."""

    usd: float | None
    problem: str | None = None
    fallback_prices: bool = False      # the built-in price list: the Hub could not be asked


@dataclass(frozen=True)
class LaunchPreview:
    """The jobs a launch would submit, each command as its engine shows it, and what stands before the launch."""

    spec: RunSpec
    jobs: list[JobSpec]
    commands: list[str]
    cost: CostEstimate | None          # billed engines: the launch must quote spec.fingerprint()
    expiry: str | None = None          # the token would expire before the jobs end
    note: str | None = None            # the engine's line about where the jobs run


@dataclass(frozen=True)
class ResumePreview:
    plan: ResumePlan
    jobs: list[JobSpec]
    cost: CostEstimate | None          # billed engines: the resume must quote plan.fingerprint()


@dataclass(frozen=True)
class ReviewNeeded:
    """Not launched (or resumed) yet: the visitor must review exactly this spec first."""

    spec: RunSpec
    reviewed_another: bool             # a review code was given, of another spec


@dataclass(frozen=True)
class Launched:
    run: LaunchedRun
    spec: RunSpec
    warnings: tuple[str, ...] = ()     # what the task check noticed without refusing


@dataclass(frozen=True)
class SweepForm:
    """The launch form's sweep: its rows (a field's name, its values as text; a row without either is unused),
    grid or side by side, and what the reviewed preview fixed, kept by the launch: the sweep's id and its members'
    run ids."""

    rows: tuple[tuple[str, str], ...] = ()
    grid: bool = True
    sweep_id: str = ""
    run_ids: tuple[str, ...] = ()
    early_stop_after: int = 0          # the stated early-stop rule's K (`SweepSpec.early_stop_after`)
    budget_usd: object = 0.0           # the sweep's cap as given (a number, or text of one: `parse_budget`)

    @property
    def wanted(self) -> bool:
        """Whether the form asks for a sweep at all (any row filled): otherwise the form launches one run."""
        return any(str(name or "").strip() or str(text or "").strip() for name, text in self.rows)


@dataclass(frozen=True)
class SweepPreview:
    """The sweep a launch would start: its members (each a run's whole preview), the fleet they need, what it can
    cost in all, and its review code."""

    sweep: SweepSpec
    members: list[LaunchPreview]
    fleet: FleetSize
    fingerprint: str
    cost: CostEstimate | None          # billed engines: every member's jobs, summed
    fleet_jobs: list[JobSpec] = ()     # the one fleet's replica jobs, where the engine shares one (else each
                                       # member's preview holds its own replicas)
    fleet_commands: list[str] = ()

    @property
    def base(self) -> RunSpec:
        return self.sweep.base


@dataclass(frozen=True)
class LaunchedSweep:
    sweep: SweepSpec
    members: list[Launched]
    # A retry of a sweep launch already made (the same sweep id and review code): its state as found (`launched`,
    # or `launching` while the first request still launches it). Nothing was submitted or cancelled by this call.
    existing: str = ""


class Operations:
    """Launch, resume and cancel for one deployment, over its run directory (local runs and Hub registries)."""

    def __init__(self, deployment: Deployment, runs: RunDirectory, spend: SpendWatch, webhooks,
                 uploaded: Callable[[str], bool]):
        self.deployment = deployment
        self.runs = runs
        self.spend = spend
        self.webhooks = webhooks          # each run's alert webhook, kept encrypted (`.put(run_id, url)`)
        self.uploaded = uploaded          # whether a dataset path is a file a visitor uploaded
        # Check-job results by (task, visitor): Launch reuses the check the visitor just waited for.
        self._checks: dict[str, tuple[float, TaskReport]] = {}
        self._checks_lock = threading.Lock()
        self.notes = NotesBook()          # runs' notes and tags, read for the runs list, written by `set_notes`

    @property
    def local(self) -> LocalExecutor:
        return self.runs.local.executor

    # ---- who may do what
    def offered_executors(self) -> list[str]:
        """The executors this deployment offers: those whose runtime it has, the panel's own machine only where
        local runs are on."""
        return [where.name for where in engines() if self._offers(where)]

    def _offers(self, where: Engine) -> bool:
        if where.runtime_problem():
            return False
        return not where.operators_machines or self.deployment.local_runs != "off"

    def control_token(self, where: Engine, namespace: str | None, visitor: Visitor) -> str | None:
        """The token to act with on `namespace` with engine `where`'s runs; raises Refused with a reason the visitor
        can act on."""
        problem = where.runtime_problem() or (
            local_runs_problem(visitor, self.deployment) if where.operators_machines else None)
        if problem:
            raise Refused(problem)
        if not where.needs_token:
            return None
        token = acting_token(visitor, self.deployment)
        if not token:
            raise Refused(no_token_reason(self.deployment))
        allowed, reason = can_control(namespace or "", token, self.deployment.on_space)
        if not allowed:
            raise Refused(reason)
        return token

    def missing_token(self, executor: object, visitor: Visitor) -> str | None:
        """Why a run on `executor` cannot start for this visitor yet (its engine needs a token they lack), or None."""
        where = known_engine(executor)
        if where is None or not where.needs_token or acting_token(visitor, self.deployment):
            return None
        return no_token_reason(self.deployment)

    def default_mount(self, executor: str, make: bool = False) -> str:
        """The form's mount path for runs on `executor`: its engine's, else the spec's. With `make`, an engine's
        folder (one of this panel's home) is made, as the form is about to offer it."""
        where = known_engine(executor)
        mount = where.default_mount(self.deployment.home) if where is not None else None
        if mount is None:
            return RunSpec.mount_path
        if mount and make:
            os.makedirs(mount, mode=0o700, exist_ok=True)
        return mount

    def default_bucket(self, visitor: Visitor, executor: str) -> str:
        """The bucket a preset starts with: the visitor's own `<name>/grpo-runs` on the Hub, created on first
        launch (private); '' when nobody is signed in, so the form asks for one."""
        where = known_engine(executor)
        if where is None or not where.bucket_on_hub:
            return RunSpec.bucket
        if visitor.username:
            return f"{visitor.username}/grpo-runs"
        token = acting_token(visitor, self.deployment)
        if token:
            try:
                return f"{whoami_name(token)}/grpo-runs"
            except Exception:   # the Hub unreachable: the visitor types the bucket
                return ""
        return ""

    # ---- hardware and cost
    def flavors(self, visitor: Visitor, executor: str | None = None) -> list[Flavor]:
        """The hardware of `executor`'s runs (None: of every executor this deployment offers whose runs choose it),
        with prices (the Hub's list asked with the visitor's token, or the built-in one), asked at most every 10
        minutes."""
        token = acting_token(visitor, self.deployment)
        chosen = [engine(executor)] if executor else [where for where in engines() if self._offers(where)]
        return [f for where in chosen if where.chooses_hardware
                for f in self.spend.flavor_cache.get((where.name, "signed in", bool(token)),
                                                     lambda where=where: where.flavors(token))]

    def estimate(self, jobs: list[JobSpec], visitor: Visitor) -> CostEstimate:
        flavors = self.flavors(visitor)
        fallback = any(f.fallback for f in flavors)
        try:
            return CostEstimate(estimate_cost(jobs, flavors), fallback_prices=fallback)
        except ValueError as exc:
            return CostEstimate(None, str(exc), fallback)

    # ---- the launch form
    def check_task(self, values: dict, visitor: Visitor, spec: RunSpec | None = None, progress=None) -> TaskReport:
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
        if self.deployment.on_space and is_local_file(spec.dataset) and not self.uploaded(spec.dataset):
            return TaskReport(errors=[FieldError("dataset", "on a Space, upload your file (Upload .jsonl / .parquet): "
                                                            "the Space's own files cannot be read")])
        if not self.deployment.serves_others:
            token = acting_token(visitor, self.deployment) if spec.engine.needs_token else None
            return check_task(spec, token, self.deployment.datasets_server, self.deployment.task_check_timeout_s)
        return self._check_in_job(spec, visitor, progress)

    def _check_in_job(self, spec: RunSpec, visitor: Visitor, progress) -> TaskReport:
        token = acting_token(visitor, self.deployment)
        if not token:
            why = CHECK_SIGN_IN if self.deployment.on_space else (
                f"{no_token_reason(self.deployment)} A panel that others reach checks a task in a job of the visitor's "
                "own account, never on its own machine.")
            return TaskReport(errors=[FieldError("account", why)])
        bucket = spec.bucket if spec.engine.bucket_on_hub and spec.bucket.strip() else ""
        spec = replace(spec, executor=CHECK_EXECUTOR,
                       bucket=bucket or self.default_bucket(visitor, CHECK_EXECUTOR) or spec.bucket)
        key = _check_key(spec, token)
        with self._checks_lock:
            cached = self._checks.get(key)
        if cached and time.time() - cached[0] < CHECK_REUSE_S:
            return cached[1]
        allowed, reason = can_control(spec.bucket_namespace, token, self.deployment.on_space)
        if not allowed:
            return TaskReport(errors=[FieldError("bucket", f"the check job runs in the bucket's namespace: {reason}")])
        registry = self.runs.hub_registry(token, spec.bucket_namespace)
        price = next((f.price_per_hour_usd for f in self.flavors(visitor, registry.executor.name)
                      if f.name == CHECK_FLAVOR), None)
        report = check_in_job(spec, token, self.deployment.datasets_server, registry.executor,
                              registry.store_for(spec.bucket), price, self.deployment.task_check_timeout_s, progress,
                              journal=self.runs.journal)
        with self._checks_lock:
            self._checks[key] = (time.time(), report)
            while len(self._checks) > CHECKS_KEPT:
                self._checks.pop(next(iter(self._checks)))
        return report

    def build_spec(self, values: dict, run_id: str | None, visitor: Visitor | None) -> RunSpec:
        """A validated RunSpec from form values; raises SpecError listing every bad field. A run whose bucket is on
        the Hub and left empty goes to the visitor's own `<name>/grpo-runs`."""
        values = {**values, **({"run_id": run_id} if run_id else {})}
        chosen = known_engine(values.get("executor"))
        if chosen is not None and chosen.bucket_on_hub and not str(values.get("bucket") or "").strip() and visitor:
            values["bucket"] = self.default_bucket(visitor, values["executor"])
        spec = RunSpec.from_dict(values).check()
        where = spec.engine
        # Only the executor's own hardware: another engine's flavor name would fail at submission, not here.
        accepted = [*self.flavors(ANONYMOUS, spec.executor), *where.other_accepted_flavors()]
        problems = hardware_problems(spec, accepted) if where.chooses_hardware else []
        token = acting_token(visitor or ANONYMOUS, self.deployment)
        bucket = bucket_problem(spec.bucket_namespace, token) if where.bucket_on_hub and token else None
        if bucket:     # refused here, so Preview says so (naming the field) before it shows a cost
            problems = [*problems, FieldError("bucket", bucket)]
        problems = [*problems, *(where.spec_problems(spec) if not problems else [])]
        if problems:
            raise SpecError(problems)
        return spec

    def checked_spec(self, values: dict, run_id: str | None, visitor: Visitor | None, webhook: str = "",
                     refuse_taken: bool = True) -> RunSpec:
        """`build_spec`, with the alert webhook checked beside the form's fields: one SpecError names them all.
        `refuse_taken` False: a run id in use is left to the caller (a launch answers a retry of itself first)."""
        hook = self.webhook_errors(webhook)
        try:
            spec = self.build_spec(values, run_id, visitor)
        except SpecError as exc:
            raise SpecError([*exc.errors, *hook]) from None
        taken = self.run_id_problems([spec.run_id], visitor or ANONYMOUS, supplied=bool(run_id), spec=spec) \
            if refuse_taken else []
        if hook or taken:
            raise SpecError([*taken, *hook])
        return spec

    def run_id_problems(self, run_ids: list[str], visitor: Visitor, supplied: bool, spec: RunSpec,
                        field_name: str = RUN_ID_FIELD) -> list[FieldError]:
        """Each id that names a run already, anywhere this panel serves (`RunDirectory.id_problem`), or whose folder
        is in the run's bucket: one run id names one run. A fresh id (none `supplied`) is only looked up in what the
        panel knows; a supplied one also in the visitor's namespaces listed afresh and in the bucket."""
        problems = []
        for run_id in run_ids:
            problem = self.runs.id_problem(run_id, visitor, look_around=supplied)
            if problem is None and supplied and self._in_bucket(spec, run_id, visitor):
                problem = id_taken_message(run_id)
            if problem:
                problems.append(FieldError(field_name, problem))
        return problems

    def _in_bucket(self, spec: RunSpec, run_id: str, visitor: Visitor) -> bool:
        """Whether the run's bucket holds a run folder of this id already (a bucket that cannot be read yet, one not
        made, holds none: the launch looks again before it writes)."""
        where = spec.engine
        token = acting_token(visitor, self.deployment) if where.needs_token else None
        try:
            store = self.runs.registry_for(where, token, spec.bucket_namespace).store_for(spec.bucket)
            return bool(store.list_files(layout.run_prefix(run_id)))
        except Exception:
            return False

    def webhook_errors(self, webhook: str) -> list[FieldError]:
        """Why the alert webhook cannot be used (empty: it can, or none was given). A panel that serves others
        sends only over https to public addresses; the URL is resolved and checked here, never requested."""
        webhook = (webhook or "").strip()
        problem = webhook and webhook_problem(webhook, self.deployment.serves_others)
        return [FieldError(WEBHOOK_FIELD, problem)] if problem else []

    def preview(self, values: dict, visitor: Visitor, run_id: str | None = None, webhook: str = "") -> LaunchPreview:
        """The jobs as they will be submitted, with what they can cost; raises SpecError with what to fix (the
        alert webhook among the fields)."""
        return self._preview_of(self.checked_spec(values, run_id, visitor, webhook), visitor)

    def launch(self, values: dict, visitor: Visitor, confirmed: str | None = None, run_id: str | None = None,
               webhook: str = "") -> Launched | ReviewNeeded:
        """Launch the form's run. Nothing is launched unless the spec validates and the visitor may.

        A billed run is launched only when `confirmed` is the fingerprint of the preview the visitor reviewed and
        that fingerprint is still the form's (else ReviewNeeded). `webhook`, if given, receives the run's alerts;
        it is kept encrypted, never shown or written to the bucket."""
        webhook = (webhook or "").strip()
        missing = self.missing_token(values.get("executor"), visitor)
        if missing:
            raise Refused(missing)
        spec = self.checked_spec(values, run_id, visitor, webhook, refuse_taken=False)
        where = spec.engine
        token = self.control_token(where, spec.bucket_namespace, visitor)
        self._check_token_lifetime(where, visitor, spec)
        registry = self.runs.registry_for(where, token, spec.bucket_namespace)
        # A retry of a launch already made (the run id a preview gave, with the same settings, so the same review
        # code, in the visitor's own namespace and bucket) answers with that run before anything else runs: the one
        # case where a run id already in use is not refused. Another run's id, anywhere, stays refused.
        existing = registry.existing_launch(spec) if run_id else None
        if existing is None:
            taken = self.run_id_problems([spec.run_id], visitor or ANONYMOUS, supplied=bool(run_id), spec=spec)
            if taken:
                raise SpecError(taken)
        if where.billed and confirmed != spec.fingerprint():
            return ReviewNeeded(spec, reviewed_another=bool(confirmed))
        if existing is not None:
            return Launched(existing, spec)
        task = self.check_task(values, visitor, spec)
        if task.errors:
            raise SpecError(task.errors)
        try:
            launched = registry.launch(spec, _secrets(token))
        except LaunchUnderWay:      # an earlier request holds the run id's lock: it is launching this very run
            return Launched(LaunchedRun(spec.run_id, {}, existing=LAUNCHING), spec)
        if webhook and not launched.existing:
            self.webhooks.put(spec.run_id, webhook)
        self.runs.relist(spec.bucket_namespace)
        return Launched(launched, spec, tuple(task.warnings))

    # ---- sweeps: N runs that differ in one to three fields, launched as one (backend/plan/sweep.py)
    def preview_sweep(self, values: dict, form: SweepForm, visitor: Visitor, webhook: str = "",
                      refuse_taken: bool = True) -> SweepPreview:
        """Every member of the sweep the form describes, each checked as a run of its own, and the one fleet they
        need; raises SpecError naming every field to fix (the form's and the sweep's alike). `refuse_taken` False:
        run ids in use are left to the caller (`sweep_ids_taken`: a launch answers a retry of itself first)."""
        errors, base, swept, budget = [], None, {}, 0.0
        try:
            base = self.checked_spec(values, None, visitor, webhook)
        except SpecError as exc:
            errors += exc.errors
        try:
            budget = parse_budget(form.budget_usd)
        except SpecError as exc:
            errors += exc.errors
        try:
            swept = parse_swept(list(form.rows))
            if errors:      # the base refused: say what is wrong with the swept fields too, at once
                errors += SweepSpec(RunSpec(), swept, form.grid, "sweep", early_stop_after=form.early_stop_after,
                                    budget_usd=budget).field_problems()
        except SpecError as exc:
            errors += exc.errors
        if errors:
            raise SpecError(errors)
        sweep = SweepSpec(base, swept, form.grid, form.sweep_id, form.run_ids, form.early_stop_after, budget)
        members = [self.build_spec(m.to_dict(), None, visitor) for m in sweep.members()]
        taken = self.sweep_ids_taken(members, form, visitor, base) if refuse_taken else []
        if taken:
            raise SpecError(taken)
        previews = [self._preview_of(m, visitor, on_fleet=bool(m.fleet)) for m in members]
        size = fleet_size(members)
        fleet = recipe.FleetJobs(tuple(members), size.max_loras, size.max_lora_rank,
                                 base.engine.placement(members[0], preview=True)).jobs() if members[0].fleet else []
        cost = None
        if base.engine.billed:
            each = [p.cost for p in previews] + ([self.estimate(fleet, visitor)] if fleet else [])
            known = [c.usd for c in each if c is not None and c.usd is not None]
            problem = next((c.problem for c in each if c is not None and c.usd is None), None)
            cost = CostEstimate(sum(known) if problem is None else None, problem,
                                any(c.fallback_prices for c in each if c is not None))
            floor = self._below_launch_floor(sweep.budget_usd, [*fleet, *(j for p in previews for j in p.jobs)],
                                             visitor)
            if floor:
                raise SpecError([floor])
        commands = [base.engine.preview_command(job, self.local.bucket_root) for job in fleet]
        return SweepPreview(sweep, previews, size, sweep.fingerprint(members), cost, fleet, commands)

    def _below_launch_floor(self, budget: float, jobs: list[JobSpec], visitor: Visitor) -> FieldError | None:
        """A sweep budget below what submitting its jobs alone costs (each billed its first minute), where the prices
        say it: it would cancel the whole sweep at the panel's first check."""
        floor = launch_floor_usd(jobs, self.flavors(visitor)) if budget else None
        if floor is None or budget >= floor:
            return None
        return FieldError(BUDGET_FIELD, f"{format_usd(budget)} is below what launching the sweep alone costs: its "
                                        f"{len(jobs)} jobs are each billed at least a minute, {format_usd(floor)} "
                                        f"together, so the cap would cancel every member and the fleet at once. Give "
                                        f"at least {format_usd(floor)} (a sweep that trains needs far more), or 0 "
                                        "for no cap")

    def sweep_ids_taken(self, members: list[RunSpec], form: SweepForm, visitor: Visitor,
                        base: RunSpec) -> list[FieldError]:
        """The members' run ids and the fleet's that name a run already (`run_id_problems`)."""
        ids = [m.run_id for m in members] + ([members[0].fleet] if members and members[0].fleet else [])
        return self.run_id_problems(ids, visitor, bool(form.run_ids or form.sweep_id), base, "run_ids")

    def launch_sweep(self, values: dict, form: SweepForm, visitor: Visitor, confirmed: str | None = None,
                     webhook: str = "") -> LaunchedSweep | ReviewNeeded:
        """Launch every member of the form's sweep, or none: one review (a billed sweep goes ahead only when
        `confirmed` is the review code of the preview the visitor saw, every member's settings in it), one task
        check, the sweep's record written into the bucket, then each member as an ordinary run. A member that fails
        to launch cancels what this launch started (the members launched before it and its fleet, by their job ids),
        nothing else.

        Idempotent: the launch holds the sweep id's lock in the launch journal and names the sweep (its record,
        `launching`, with its review code) before it submits anything. A retry with the same sweep id and review
        code finds it and answers with that sweep (`LaunchedSweep.existing`), changing nothing; a sweep id that holds
        other settings, or a launch that failed, is refused."""
        webhook = (webhook or "").strip()
        missing = self.missing_token(values.get("executor"), visitor)
        if missing:
            raise Refused(missing)
        shown = self.preview_sweep(values, form, visitor, webhook, refuse_taken=False)
        base, where = shown.base, shown.base.engine
        token = self.control_token(where, base.bucket_namespace, visitor)
        self._check_token_lifetime(where, visitor, base)
        if where.billed and confirmed != shown.fingerprint:
            return ReviewNeeded(base, reviewed_another=bool(confirmed))
        registry = self.runs.registry_for(where, token, base.bucket_namespace)
        store = registry.store_for(base.bucket)
        try:
            claim = self.runs.journal.claim(f"{shown.sweep.sweep_id}.sweep")
        except UnderWay:        # an earlier request is launching this very sweep (same id, same review code)
            return self._existing_sweep(registry, shown, LAUNCHING)
        try:
            if _sweep_found(store, shown) is not None:
                return self._existing_sweep(registry, shown, LAUNCHED)
            # Not a retry: a member's or the fleet's id that names a run already, anywhere, is refused.
            taken = self.sweep_ids_taken([p.spec for p in shown.members], form, visitor, base)
            if taken:
                raise SpecError(taken)
            return self._launch_sweep(values, shown, visitor, token, registry, store, webhook)
        finally:
            claim.close()

    def _launch_sweep(self, values: dict, shown: SweepPreview, visitor: Visitor, token: str | None,
                      registry: RunRegistry, store, webhook: str) -> LaunchedSweep:
        """The sweep's launch proper, under its lock (`launch_sweep`)."""
        base = shown.base
        task = self.check_task(values, visitor, base)
        if task.errors:
            raise SpecError(task.errors)
        members = [p.spec for p in shown.members]
        record = {**shown.sweep.record(members), "review_code": shown.fingerprint, "state": LAUNCHING}
        path = layout.sweep_record_path(shown.sweep.sweep_id)
        try:
            store.write_bytes(path, json.dumps(record).encode())
        except Exception as exc:
            raise LaunchError(f"could not write the sweep's record into bucket {base.bucket}: {exc}. "
                              "No job was submitted.") from exc
        fleet = None
        try:
            if members[0].fleet:    # the one fleet first; each member's trainer then uses its servers (and its key)
                try:
                    fleet = registry.launch_fleet(members, shown.fleet.max_loras, shown.fleet.max_lora_rank,
                                                  _secrets(token))
                except Exception as exc:
                    raise LaunchError(f"the sweep's fleet did not launch: {exc}. No member was launched.") from exc
            launched = self._launch_members(members, registry, token, fleet, tuple(task.warnings), webhook)
        except LaunchError as exc:
            _write_quietly(store, path, {**record, "state": FAILED, "why": redact_tokens(str(exc))})
            self.runs.relist(base.bucket_namespace)
            raise
        _write_quietly(store, path, {**record, "state": LAUNCHED})
        self.runs.relist(base.bucket_namespace)
        return LaunchedSweep(shown.sweep, launched)

    def _launch_members(self, members: list[RunSpec], registry: RunRegistry, token: str | None, fleet,
                        warnings: tuple[str, ...], webhook: str) -> list[Launched]:
        """Each member as an ordinary run on the sweep's fleet; one that fails cancels what this launch started."""
        fleet_urls, fleet_secrets = (fleet.urls, fleet.secrets) if fleet is not None else (None, {})
        launched: list[Launched] = []
        for spec in members:
            try:
                launched.append(Launched(registry.launch(spec, {**_secrets(token), **fleet_secrets},
                                                         fleet_urls=fleet_urls), spec, warnings))
            except Exception as exc:
                undone = _undo_own(registry, launched, fleet)
                raise LaunchError(f"member {spec.sweep_member} (run {spec.run_id}) did not launch: {exc}. "
                                  f"{undone}") from exc
            if webhook:
                self.webhooks.put(spec.run_id, webhook)
        return launched

    def _existing_sweep(self, registry: RunRegistry, shown: SweepPreview, state: str) -> LaunchedSweep:
        """The answer to a retry of the sweep's launch: its members as launched (each run's job ids as its launch
        recorded them; none yet while the first request still launches)."""
        members = []
        for preview in shown.members:
            spec = preview.spec
            jobs = (registry.recorded_launch(spec.run_id) or {}).get("jobs") or {}
            members.append(Launched(LaunchedRun(spec.run_id, dict(jobs), existing=state), spec))
        return LaunchedSweep(shown.sweep, members, existing=state)

    def sweep_members(self, run_id: str, visitor: Visitor) -> tuple[str, dict[str, str], str]:
        """The sweep `run_id` is a member of, its members' run ids by tag and its shared fleet's id ("" where each
        member started its own replicas), from the sweep's record in the bucket; KeyError where the run is not this
        visitor's or not a sweep member."""
        record = self.sweep_record(run_id, visitor)
        return record["sweep_id"], record["members"], record["fleet"]

    def sweep_record(self, run_id: str, visitor: Visitor) -> dict:
        """The record (`SweepSpec.record`) of the sweep `run_id` is a member of, its members as {tag: run id}; read
        only for a visitor who sees the run (KeyError otherwise, or where the run is not a sweep member)."""
        registry = self.runs.find(run_id, visitor)
        store = registry.store_for(registry.run_bucket(run_id))
        try:
            spec = json.loads(store.read_bytes(f"{layout.run_prefix(run_id)}/{layout.SPEC_FILE}"))
            sweep_id = spec.get("sweep_id") if isinstance(spec, dict) else None
        except Exception as exc:    # no spec.json yet, or unreadable
            raise KeyError(f"Run {run_id}'s spec.json cannot be read ({exc}): cancel its jobs with Cancel run.") \
                from None
        if not sweep_id:
            raise KeyError(f"Run {run_id} is not a member of a sweep: Cancel run stops it.")
        try:
            record = json.loads(store.read_bytes(layout.sweep_record_path(sweep_id)))
            members = {str(tag): str(member) for tag, member in record["members"].items()}
        except Exception as exc:
            raise KeyError(f"Sweep {sweep_id}'s record cannot be read ({exc}): cancel its members one by one.") \
                from None
        settings = record.get("settings") if isinstance(record.get("settings"), dict) else {}
        early = record.get("early_stop") if isinstance(record.get("early_stop"), dict) else {}
        after = early.get("after_versions")
        budget = record.get("budget_usd")
        return {"sweep_id": str(sweep_id), "members": members,
                "budget_usd": float(budget) if type(budget) in (int, float) and budget > 0 else 0.0,
                "fleet": record.get("fleet") if isinstance(record.get("fleet"), str) else "",
                "settings": {tag: s for tag, s in settings.items() if isinstance(s, dict)},
                "early_stop_after": after if isinstance(after, int) and not isinstance(after, bool) and after > 0
                else 0}

    def stop_member(self, run_id: str, visitor: Visitor, sweep_id: str, member: str, rule: str, scores: dict,
                    rung: int | None = None) -> bool:
        """Order one member of a sweep to stop (Cancel run's check: on a Space only the run's owner), as the sweep's
        own rule does with no page open: its stop order in the bucket (`runtime/trainer/sweep_stops.py`), which the
        member's
        trainer obeys at its next step, ending as at its last (versions published, final adapter written) and
        recording why as its `sweep_stop` event (the rule, every member's best held-out score then). Whether the
        order was written: False where one not yet obeyed stands (the first decision is kept). No job is cancelled
        and no token is written: Cancel run stops a member at once."""
        registry, _ = self._registry_for_control(run_id, visitor)
        record = self.sweep_record(run_id, visitor)
        if record["sweep_id"] != sweep_id or record["members"].get(member) != run_id:
            raise KeyError(f"Run {run_id} is not member {member} of sweep {sweep_id}.")
        store = registry.store_for(registry.run_bucket(run_id))
        path = sweep_stops.order_path(sweep_id, member)
        there = self.sweep_orders(run_id, visitor, record).get(member)
        if there is not None and not self._obeyed(store, run_id, there):
            return False        # one stands: the first decision is kept
        order = sweep_stops.stop_order(sweep_id, member, run_id, rule, scores, rung, by="panel")
        store.write_bytes(path, json.dumps(order).encode())
        return True

    def sweep_orders(self, run_id: str, visitor: Visitor, record: dict | None = None) -> dict[str, dict]:
        """The stop orders of the sweep `run_id` is a member of (obeyed or not), by member tag: only those at a
        member's own path naming that sweep, tag and run id (`sweep_stops.order_problem`)."""
        record = record or self.sweep_record(run_id, visitor)
        registry = self.runs.find(run_id, visitor)
        store = registry.store_for(registry.run_bucket(run_id))
        folder = sweep_stops.orders_dir(record["sweep_id"])
        there = {f.path.rsplit("/", 1)[-1] for f in store.list_files(folder + "/")}
        found = {}
        for tag, member_id in record["members"].items():
            if not layout.MEMBER_RE.match(tag) or f"{tag}.json" not in there:
                continue
            try:
                order = json.loads(store.read_bytes(f"{folder}/{tag}.json"))
            except ValueError:      # not JSON: not an order anyone obeys
                order = None
            if sweep_stops.order_problem(order, record["sweep_id"], tag, member_id) is None:
                found[tag] = order
        return found

    @staticmethod
    def _obeyed(store, run_id: str, order: dict) -> bool:
        """Whether the member's trainer recorded obeying `order` (a `sweep_stop` event naming its time)."""
        prefix = f"{layout.run_prefix(run_id)}/{layout.EVENTS_DIR}/"
        for stored in store.list_files(prefix):
            name = stored.path.rsplit("/", 1)[-1]
            match = layout.FRAGMENT_RE.match(name)
            if not match or match["writer"] != layout.TRAINER_WRITER:
                continue
            events, _ = layout.fragment_records(store.read_bytes(stored.path))
            if any(e and e.get("event") == records.SWEEP_STOP and e.get("ordered_at") == order.get("time")
                   for e in events):
                return True
        return False

    def cancel_sweep(self, run_id: str, visitor: Visitor) -> tuple[str, dict[str, list[str]], tuple | None]:
        """Cancel every member of the sweep `run_id` belongs to, each as Cancel run would (who may, which jobs), then
        its shared fleet (after its trainers, which record their end first): the sweep's id, the job ids stopped
        by member run id, and (the fleet's id, its job ids stopped) where the members shared one, else None."""
        sweep_id, members, fleet = self.sweep_members(run_id, visitor)
        stopped = {member: self.cancel(member, visitor) for member in members.values()}
        return sweep_id, stopped, ((fleet, self.cancel(fleet, visitor)) if fleet else None)

    def _preview_of(self, spec: RunSpec, visitor: Visitor, on_fleet: bool = False) -> LaunchPreview:
        where = spec.engine
        jobs = preview_jobs(spec, on_fleet)
        return LaunchPreview(
            spec, jobs, [where.preview_command(job, self.local.bucket_root) for job in jobs],
            cost=self.estimate(jobs, visitor) if where.billed else None,
            expiry=token_lifetime_problem(visitor, spec.timeout_minutes * 60) if where.needs_token else None,
            # A member resumed after its fleet ended starts its own replicas: its note is a lone run's.
            note=where.preview_note(spec if on_fleet else replace(spec, fleet=""), self.local.bucket_root))

    def _check_token_lifetime(self, where: Engine, visitor: Visitor, spec: RunSpec) -> None:
        expiry = token_lifetime_problem(visitor, spec.timeout_minutes * 60) if where.needs_token else None
        if expiry:
            raise TokenTooShort(expiry)

    # ---- runs
    def _registry_for_control(self, run_id: str, visitor: Visitor) -> tuple[RunRegistry, str | None]:
        registry = self.runs.find(run_id, visitor)
        return registry, self.control_token(registry.engine, registry.namespace, visitor)

    def cancel(self, run_id: str, visitor: Visitor) -> list[str]:
        """Cancel every job of the run, found through the executor (its labels), not the bucket; the ids stopped."""
        registry, _ = self._registry_for_control(run_id, visitor)
        stopped = registry.cancel(run_id)
        self.runs.relist(registry.namespace or "")
        return stopped

    def set_notes(self, run_id: str, visitor: Visitor, text: str, tags: str) -> RunNotes:
        """Save the run's notes and tags in its folder: who may cancel the run may write them (on a Space, the
        run's owner); raises Refused, KeyError or NotesError (what to change), writing nothing."""
        registry, _ = self._registry_for_control(run_id, visitor)
        notes = checked_notes(text, tags)
        bucket = registry.run_bucket(run_id)
        return self.notes.rewritten(registry.store_for(bucket), bucket, run_id, text=notes.text, tags=notes.tags)

    def rename(self, run_id: str, visitor: Visitor, name: str) -> RunNotes:
        """Give the run a display name (kept with its notes in its folder; "" goes back to the name it was launched
        with); its id stays its id. Who may cancel the run may rename it (on a Space, the run's owner); raises
        Refused, KeyError or NotesError (what to change), writing nothing."""
        registry, _ = self._registry_for_control(run_id, visitor)
        name = checked_name(name)
        bucket = registry.run_bucket(run_id)
        return self.notes.rewritten(registry.store_for(bucket), bucket, run_id, name=name)

    def _resume_plan(self, registry: RunRegistry, run_id: str) -> ResumePlan:
        plan = registry.resume_plan(run_id)
        problem = self.spend.resume_problem(registry, run_id, plan.spec.budget_usd)
        if problem:
            raise LaunchError(problem)
        return plan

    def resume_preview(self, run_id: str, visitor: Visitor) -> ResumePreview:
        """What Resume would submit, from where the trainer continues, and (billed engines) what it can cost."""
        registry, _ = self._registry_for_control(run_id, visitor)
        plan = self._resume_plan(registry, run_id)
        jobs = preview_jobs(plan.spec)
        return ResumePreview(plan, jobs, self.estimate(jobs, visitor) if plan.spec.engine.billed else None)

    def resume(self, run_id: str, visitor: Visitor, confirmed: str | None = None) -> LaunchedRun | ReviewNeeded:
        """Relaunch a stopped run's jobs. A resume that costs money or starts again from step 0 (no checkpoint)
        goes ahead only once the visitor reviewed exactly this resume (`confirmed` is its code)."""
        registry, token = self._registry_for_control(run_id, visitor)
        plan = self._resume_plan(registry, run_id)
        where = plan.spec.engine
        self._check_token_lifetime(where, visitor, plan.spec)
        if (where.billed or plan.checkpoint_step is None) and confirmed != plan.fingerprint():
            return ReviewNeeded(plan.spec, reviewed_another=bool(confirmed))
        return registry.resume(run_id, _secrets(token), from_step_0=plan.checkpoint_step is None)


def _secrets(token: str | None) -> dict[str, str]:
    """The job secrets a run gets: the acting token, where its engine needs one."""
    return {recipe.TOKEN_SECRET: token} if token else {}


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


def _sweep_found(store, shown: SweepPreview) -> dict | None:
    """The record of the sweep `shown` when its launch was made already (a retry: the same sweep id and review
    code); None when there is none (its bucket made if new: the launch goes on). Raises LaunchError when the sweep id
    holds other settings or a launch that failed or stopped, and when the bucket cannot say (a launch that went on
    would write over the record of a sweep it could not see)."""
    sweep_id = shown.sweep.sweep_id
    path = layout.sweep_record_path(sweep_id)
    try:
        store.ensure_bucket()       # a first launch creates the bucket (private), as a run's launch does
        if path not in store.sizes([path]):
            return None
        record = json.loads(store.read_bytes(path))
    except Exception as exc:
        raise LaunchError(f"could not read bucket {shown.base.bucket} to check sweep id {sweep_id}: "
                          f"{redact_tokens(str(exc))}. Nothing was launched.") from exc
    members = {p.spec.sweep_member: p.spec.run_id for p in shown.members}
    if not isinstance(record, dict) or record.get("review_code") != shown.fingerprint \
            or record.get("members") != members:
        raise LaunchError(f"sweep id {sweep_id} is already used in bucket {shown.base.bucket} by a sweep with other "
                          "settings: nothing was launched. Preview the sweep again for a new sweep id.")
    state = record.get("state")
    if state != LAUNCHED:
        said = "failed" if state == FAILED else "stopped part way"
        why = str(record.get("why") or "")
        raise LaunchError(f"sweep {sweep_id} was launched before and its launch {said}"
                          + (f" ({why})" if why else "") + ": nothing was launched now. Preview the sweep again for "
                          "a new sweep id (its members' rows in the runs list say what is left of it).")
    return record


def _undo_own(registry: RunRegistry, launched: list[Launched], fleet) -> str:
    """Cancel what a failed sweep launch started itself, by the job ids its submissions answered (never by label:
    a job of an earlier launch with the same labels is not this launch's to cancel): the members' trainers, then
    its fleet. A sentence saying so."""
    members = [m for m in launched if not m.run.existing]
    own = [job_id for m in members for job_id in m.run.job_ids.values()]
    replicas = list(fleet.job_ids.values()) if fleet is not None else []
    errors = cancel_jobs(registry.executor, own) + cancel_jobs(registry.executor, replicas)
    registry.forget_listing()
    said = []
    if members:
        said.append(f"the member(s) launched before it ({', '.join(m.spec.run_id for m in members)}: "
                    f"{len(own)} job(s))")
    if fleet is not None:
        said.append(f"its fleet {fleet.fleet_id} ({len(replicas)} job(s))")
    text = ("Cancelled what this launch had started: " + " and ".join(said) + "."
            if said else "No member was launched.")
    return text + (f" Could not cancel {'; '.join(errors)}: cancel them by hand." if errors else "")


def _write_quietly(store, path: str, record: dict) -> None:
    """The sweep's record, updated (its state): a failing bucket leaves it as it was, which a retry reads as a
    launch that stopped part way."""
    try:
        store.write_bytes(path, json.dumps(record).encode())
    except Exception:
        pass
