"""A sweep's preview and launch: N runs that differ in one to three fields (`backend/plan/sweep.py`), previewed,
reviewed and task-checked as one, launched all or none on their one fleet; a retry of a launch already made finds it."""

import json

from backend.plan import recipe
from backend.plan.cost import format_usd
from backend.plan.hardware import launch_floor_usd
from backend.plan.jobspec import JobSpec
from backend.plan.spec import FieldError, RunSpec, SpecError
from backend.plan.sweep import BUDGET_FIELD, SweepSpec, fleet_size, parse_budget, parse_swept
from backend.runs.access import Refused, Visitor
from backend.runs.answers import CostEstimate, Launched, LaunchedSweep, ReviewNeeded, SweepForm, SweepPreview
from backend.runs.launch import LaunchedRun, LaunchError
from backend.runs.offers import job_secrets
from backend.runs.registry import RunRegistry, cancel_jobs
from backend.runtime import layout
from backend.runtime.redact import redact_tokens
from backend.storage.journal import FAILED, LAUNCHED, LAUNCHING, UnderWay


class SweepLaunch:
    """Part of `Operations` (`operations.py`), whose state and other parts it uses: `deployment`, `runs`, `webhooks`,
    `local`; the token and cost (`Offers`), the task check, each member checked as the form's run (`LaunchForm`)."""

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
                                                  job_secrets(token))
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
                launched.append(Launched(registry.launch(spec, {**job_secrets(token), **fleet_secrets},
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
