"""The launch form's actions: the task check, the preview and the launch of a run or a sweep, and their answers as
messages (`Preview`, `LaunchResult`). Part of `Panel` (panel/actions.py)."""

from dataclasses import dataclass

from backend.plan import recipe
from backend.plan.hardware import Flavor
from backend.plan.spec import RunSpec, SpecError
from backend.plan.task_spec import held_out_summary
from backend.runs.access import Refused, Visitor
from backend.runs.launch import LaunchError
from backend.runs.operations import LaunchedSweep, ReviewNeeded, SweepForm, TokenTooShort
from backend.runtime.redact import redact_tokens
from backend.storage.journal import LAUNCHING
from backend.task.check import TaskReport
from panel.markdown import code_span, fenced, masked, plain
from panel.preview_text import engine_label, jobs_cost_line, sweep_markdown, trackio_line
from panel.spend_view import budget_line
from panel.visitors import as_visitor


@dataclass(frozen=True)
class Preview:
    """What the launch form shows before a launch: the jobs and their cost, or what to fix."""

    markdown: str
    fingerprint: str | None = None     # of the previewed spec; a launch on HF Jobs must quote it
    run_id: str | None = None          # the id the previewed jobs carry; the launch uses the same one
    fields: tuple[str, ...] = ()       # the form fields to fix (the form opens and marks them)
    sweep_id: str | None = None        # a sweep's: its id, and its members' run ids (m0 first), kept by the launch
    run_ids: tuple[str, ...] = ()


@dataclass(frozen=True)
class LaunchResult:
    message: str
    run_id: str | None = None
    preview: Preview | None = None     # when the launch asks for a (new) review instead
    fields: tuple[str, ...] = ()       # the form fields to fix, when the launch was refused for them
    run_ids: tuple[str, ...] = ()      # a sweep's members, m0 first (`run_id` is m0's)
    sweep_id: str | None = None        # the sweep launched
    already: bool = False              # a retry found this run or sweep launched already: nothing was submitted

    def __iter__(self):
        """Unpacks as `message, run_id`, the two things a script wants to know."""
        return iter((self.message, self.run_id))


class LaunchActions:
    """The launch form's part of `Panel`: check the task, preview, launch (a run or a sweep). Reads the panel's
    `operations` and `field_labels`."""

    def check_task(self, values: dict, visitor: Visitor | str | None = None, spec: RunSpec | None = None,
                   progress=None) -> TaskReport:
        """The task check and preview (a TaskReport): dataset rows, the prompt as the model sees it, sample scores.
        The code is read here and run elsewhere: in the sandbox on a local panel, in the visitor's own check job
        on a panel that serves others (`progress`, if given, gets a line as that job goes)."""
        return self.operations.check_task(values, as_visitor(visitor), spec, progress)

    def build_spec(self, values: dict, run_id: str | None = None, visitor: Visitor | None = None) -> RunSpec:
        """A validated RunSpec from form values; raises SpecError listing every bad field. An HF Jobs run with no
        bucket goes to the visitor's own `<name>/grpo-runs`."""
        return self.operations.build_spec(values, run_id, as_visitor(visitor) if visitor else None)

    def preview(self, values: dict, visitor: Visitor | str | None = None, run_id: str | None = None,
                webhook: str = "", sweep: SweepForm | None = None) -> Preview:
        """The problems to fix (the alert webhook's too, if given), or the jobs as they will be submitted with an
        estimated cost and a fingerprint; for a form that asks for a `sweep`, its members and their fleet."""
        visitor = as_visitor(visitor)
        if sweep is not None and sweep.wanted:
            return self._sweep_preview(values, visitor, webhook, sweep)
        try:
            shown = self.operations.preview(values, visitor, run_id, webhook)
        except SpecError as exc:
            return self._refused_preview(exc, values, visitor)
        spec, jobs = shown.spec, shown.jobs
        lines = [(f"**{len(jobs)} job(s)** of run `{spec.run_id}`, image `{spec.image}`, TRL {recipe.TRL_VERSION}, "
                  f"PEFT {recipe.PEFT_VERSION}. Engine: {engine_label(spec)}."), held_out_summary(spec)]
        if shown.cost is not None:
            lines.append(jobs_cost_line(jobs, shown.cost) + f" Review code **`{spec.fingerprint()}`**.")
            if spec.budget_usd:
                lines.append(budget_line(spec))
        if shown.expiry:
            lines.append(f"⚠️ Not launchable as it is: {shown.expiry}")
        if shown.note:
            lines.append(shown.note)
        if spec.trackio:
            lines.append(trackio_line(spec))
        for job, command in zip(jobs, shown.commands):
            lines.append(fenced(f"# {job.role}\n{command}", "bash"))
        return Preview(redact_tokens("\n\n".join(lines)), spec.fingerprint(), spec.run_id)

    def _refused_preview(self, exc: SpecError, values: dict, visitor: Visitor) -> Preview:
        """The fields to fix by their labels, and the token the executor needs if the visitor has none."""
        missing = self.operations.missing_token(values.get("executor"), visitor)
        hint = f"\n\n{missing}" if missing else ""
        return Preview(_errors_markdown(exc, self.field_labels) + hint, fields=_fields(exc))

    def _sweep_preview(self, values: dict, visitor: Visitor, webhook: str, sweep: SweepForm) -> Preview:
        try:
            shown = self.operations.preview_sweep(values, sweep, visitor, webhook)
        except SpecError as exc:
            return self._refused_preview(exc, values, visitor)
        ids = tuple(p.spec.run_id for p in shown.members)
        return Preview(redact_tokens(sweep_markdown(shown, self.field_labels)), shown.fingerprint, ids[0],
                       sweep_id=shown.sweep.sweep_id, run_ids=ids)

    def flavors(self, visitor: Visitor | str | None = None, executor: str | None = None) -> list[Flavor]:
        """The hardware `executor`'s runs choose from (None: every offered executor's), with prices (the Hub's list
        asked with the visitor's token, or the built-in one), asked at most every 10 minutes."""
        return self.operations.flavors(as_visitor(visitor), executor)

    def launch(self, values: dict, visitor: Visitor | str | None = None, confirmed: str | None = None,
               run_id: str | None = None, webhook: str = "", sweep: SweepForm | None = None) -> LaunchResult:
        """Launch the form's run, or its `sweep`'s members as one. Nothing is launched unless the spec validates and
        the visitor may.

        A run on HF Jobs costs money: it is launched only when `confirmed` is the fingerprint of the preview the
        visitor reviewed and that fingerprint is still the form's; otherwise the answer carries a fresh preview.
        `webhook`, if given, receives the run's alerts; it is kept encrypted, never shown or written to the bucket."""
        visitor = as_visitor(visitor)
        try:
            if sweep is not None and sweep.wanted:
                answer = self.operations.launch_sweep(values, sweep, visitor, confirmed, webhook)
            else:
                answer = self.operations.launch(values, visitor, confirmed, run_id, webhook)
        except SpecError as exc:
            return LaunchResult(_errors_markdown(exc, self.field_labels), fields=_fields(exc))
        except TokenTooShort as exc:
            return LaunchResult(f"Not launched: {masked(exc)}")
        except (Refused, LaunchError) as exc:
            return LaunchResult(f"**Not launched.** {masked(exc)}")
        if isinstance(answer, ReviewNeeded):
            spec = answer.spec
            preview = self.preview(values, visitor, run_id=spec.run_id, webhook=webhook, sweep=sweep)
            why = ("the form changed since the reviewed preview" if answer.reviewed_another else
                   "it has not been reviewed")
            return LaunchResult(
                f"**Not launched yet:** {why}. Check the jobs and the cost below (review code "
                f"`{preview.fingerprint}`), tick *I reviewed the jobs and the estimated cost* and press "
                f"Launch again.\n\n{preview.markdown}", None, preview)
        if isinstance(answer, LaunchedSweep):
            return _sweep_launched(answer)
        spec = answer.spec
        jobs = ", ".join(f"{role} `{job_id}`" for role, job_id in answer.run.job_ids.items())
        if answer.run.existing:
            return LaunchResult(f"Run **{spec.run_id}** {_already(answer.run.existing)}"
                                + (f" Its jobs: {jobs}." if jobs else ""), spec.run_id, already=True)
        notes = "".join(f"\n\n⚠️ {w}" for w in answer.warnings)
        return LaunchResult(f"Launched run **{spec.run_id}** ({spec.mode}, {engine_label(spec)}): {jobs}{notes}",
                            spec.run_id)


def _already(state: str) -> str:
    """What a retry of a launch says (`LaunchedRun.existing`, `LaunchedSweep.existing`)."""
    if state == LAUNCHING:
        return ("is being launched by an earlier request with the same settings: this one submitted nothing and "
                "cancelled nothing. Watch it in the runs list.")
    return ("was launched already, by an earlier request with the same settings: this one submitted nothing and "
            "cancelled nothing.")


def _sweep_launched(answer: LaunchedSweep) -> LaunchResult:
    members = answer.members
    if answer.existing:
        return LaunchResult(f"Sweep **{answer.sweep.sweep_id}** {_already(answer.existing)} Its members: "
                            + ", ".join(f"{m.spec.sweep_member} **{m.spec.run_id}**" for m in members) + ".",
                            members[0].spec.run_id, run_ids=tuple(m.spec.run_id for m in members),
                            sweep_id=answer.sweep.sweep_id, already=True)
    said = "; ".join(f"{m.spec.sweep_member} **{m.spec.run_id}** ("
                     + ", ".join(f"{k}={v}" for k, v in answer.sweep.member_settings(m.spec).items()) + ")"
                     for m in members)
    notes = "".join(f"\n\n⚠️ {w}" for w in members[0].warnings)
    fleet = (f" All on one replica fleet, run **{members[0].spec.fleet}** (its jobs and logs are in the runs list)."
             if members[0].spec.fleet else "")
    return LaunchResult(f"Launched sweep **{answer.sweep.sweep_id}**: {len(members)} member runs: "
                        f"{said}.{fleet}{notes}",
                        members[0].spec.run_id, run_ids=tuple(m.spec.run_id for m in members),
                        sweep_id=answer.sweep.sweep_id)


def _fields(exc: SpecError) -> tuple[str, ...]:
    return tuple(dict.fromkeys(e.field for e in exc.errors))


def _errors_markdown(exc: SpecError, labels: dict[str, str] | None = None) -> str:
    """Each bad field by its form label (its spec name beside it, as the preview and spec.json call it)."""
    labels = labels or {}
    items = "\n".join(f"- **{plain(labels[e.field])}** ({code_span(e.field)}): {masked(e.message)}"
                      if e.field in labels else f"- **{masked(e.field)}**: {masked(e.message)}"
                      for e in exc.errors)
    return f"**Fix these fields before launching (nothing was launched):**\n{items}"
