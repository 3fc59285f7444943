"""The launch form's one run: a RunSpec built and checked from its values (fields, hardware, bucket, run id, alert
webhook), its preview, and its launch (review, task check, registry, job secrets)."""

from dataclasses import replace

from backend.plan.engines import known_engine
from backend.plan.hardware import hardware_problems
from backend.plan.spec import FieldError, RunSpec, SpecError
from backend.runs.access import ANONYMOUS, Refused, Visitor, acting_token, token_lifetime_problem
from backend.runs.answers import Launched, LaunchPreview, ReviewNeeded
from backend.runs.hub_auth import bucket_problem
from backend.runs.launch import LaunchedRun, LaunchUnderWay, preview_jobs
from backend.runs.offers import job_secrets
from backend.runs.run_ids import RUN_ID_FIELD, id_taken_message
from backend.runtime import layout
from backend.storage.journal import LAUNCHING
from backend.view.webhook import webhook_problem

WEBHOOK_FIELD = "webhook"  # the alert webhook's name among the fields a refusal names


class LaunchForm:
    """Part of `Operations` (`operations.py`), whose state and other parts it uses: `deployment`, `runs`, `webhooks`,
    `local`; the token and cost (`Offers`), the task check (`TaskChecks`)."""

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
            launched = registry.launch(spec, job_secrets(token))
        except LaunchUnderWay:      # an earlier request holds the run id's lock: it is launching this very run
            return Launched(LaunchedRun(spec.run_id, {}, existing=LAUNCHING), spec)
        if webhook and not launched.existing:
            self.webhooks.put(spec.run_id, webhook)
        self.runs.relist(spec.bucket_namespace)
        return Launched(launched, spec, tuple(task.warnings))

    def _preview_of(self, spec: RunSpec, visitor: Visitor, on_fleet: bool = False) -> LaunchPreview:
        where = spec.engine
        jobs = preview_jobs(spec, on_fleet)
        return LaunchPreview(
            spec, jobs, [where.preview_command(job, self.local.bucket_root) for job in jobs],
            cost=self.estimate(jobs, visitor) if where.billed else None,
            expiry=token_lifetime_problem(visitor, spec.timeout_minutes * 60) if where.needs_token else None,
            # A member resumed after its fleet ended starts its own replicas: its note is a lone run's.
            note=where.preview_note(spec if on_fleet else replace(spec, fleet=""), self.local.bucket_root))
