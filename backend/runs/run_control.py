"""One run's control, by who may cancel it (on a Space, its owner): cancel, notes and tags, rename, resume (its
preview, its review where it costs money or starts again from step 0)."""


from backend.runs.access import Visitor
from backend.runs.answers import ResumePreview, ReviewNeeded
from backend.runs.launch import LaunchedRun, LaunchError, preview_jobs
from backend.runs.notes import RunNotes, checked_name, checked_notes
from backend.runs.offers import job_secrets
from backend.runs.registry import RunRegistry
from backend.runs.resume import ResumePlan


class RunControl:
    """Part of `Operations` (`operations.py`), whose state and other parts it uses: `runs`, `spend`, `notes`; the
    token and cost (`Offers`)."""

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
        return registry.resume(run_id, job_secrets(token), from_step_0=plan.checkpoint_step is None)
