"""Run control: cancel a run or its sweep, resume a stopped run (after its review), rename a run, save its notes;
each answered as a message saying what happened. Part of `Panel` (panel/actions.py)."""


from backend.plan.spec import SpecError
from backend.runs.access import Refused, Visitor
from backend.runs.launch import LaunchError
from backend.runs.notes import NotesError
from backend.runs.operations import ReviewNeeded
from backend.runtime.redact import redact_tokens
from panel.launch_actions import Preview
from panel.markdown import code_span, masked, plain
from panel.preview_text import jobs_cost_line
from panel.visitors import as_visitor


class RunControl:
    """Acting on a run once launched: cancel it (or its sweep), resume it, rename it, write its notes. Part of
    `Panel`: reads its `operations`; drops the kept rows (`RunsTable`) and zips (`Downloads`) a change outdates."""

    def save_notes(self, run_id: str, visitor: Visitor | str | None, text: str, tags: str) -> str:
        """Save a run's notes and tags (who may cancel the run may write them); a message saying what happened."""
        try:
            notes = self.operations.set_notes(run_id, as_visitor(visitor), text, tags)
        except (Refused, KeyError, NotesError) as exc:
            return f"**Notes not saved.** {_reason(exc)}"
        except Exception as exc:   # the bucket refusing or failing
            return f"**Notes not saved:** {masked(exc)}. Try again."
        self._forget_rows(run_id)
        shown = ", ".join(code_span(t) for t in notes.tags) or "none"
        return f"Notes saved in the folder of {plain(self.run_named(run_id, visitor))} (tags: {shown})."

    def rename_run(self, run_id: str, visitor: Visitor | str | None, name: str) -> str:
        """Give a run a display name (who may cancel the run may rename it; its id stays); a message saying what
        happened."""
        try:
            notes = self.operations.rename(run_id, as_visitor(visitor), name)
        except (Refused, KeyError, NotesError) as exc:
            return f"**Not renamed.** {_reason(exc)}"
        except Exception as exc:   # the bucket refusing or failing
            return f"**Not renamed:** {masked(exc)}. Try again."
        self._forget_rows(run_id)
        named = plain(self.run_named(run_id, visitor))
        if not notes.name:
            return f"{named[0].upper()}{named[1:]} shows the name it was launched with again (saved in its folder)."
        return (f"{named[0].upper()}{named[1:]} is now called {code_span(notes.name)} (saved in its folder; its id "
                f"stays {run_id}).")

    def cancel(self, run_id: str, visitor: Visitor | str | None = None) -> str:
        """Cancel every job of the run, found through the executor (its labels), not the bucket."""
        try:
            stopped = self.operations.cancel(run_id, as_visitor(visitor))
        except (Refused, KeyError) as exc:
            return f"**Not cancelled.** {_reason(exc)}"
        except Exception as exc:   # the Hub refusing or failing: say so, the jobs may still bill
            return f"**Not cancelled:** {masked(exc)}. Try again, or cancel the jobs on the Hub."
        named = plain(self.run_named(run_id, visitor))
        if not stopped:
            return f"{named[0].upper()}{named[1:]} has no running job to cancel."
        return f"Cancel requested for {len(stopped)} job(s) of {named}: {', '.join(stopped)}."

    def cancel_sweep(self, run_id: str, visitor: Visitor | str | None = None) -> str:
        """Cancel every member of the sweep the run `run_id` is a member of (each as Cancel run would)."""
        try:
            sweep_id, stopped, fleet = self.operations.cancel_sweep(run_id, as_visitor(visitor))
        except (Refused, KeyError) as exc:
            return f"**Sweep not cancelled.** {_reason(exc)}"
        except Exception as exc:   # the Hub refusing or failing: the members may still bill
            return f"**Sweep not cancelled:** {masked(exc)}. Try again, or cancel its members one by one."
        jobs = sum(len(ids) for ids in stopped.values()) + len(fleet[1] if fleet else ())
        members = ", ".join(f"{member} ({len(ids)} job(s))" for member, ids in stopped.items())
        shared = f"; its fleet {fleet[0]} ({len(fleet[1])} job(s))" if fleet else ""
        return (f"Cancel requested for sweep {sweep_id}: {jobs} job(s) of its {len(stopped)} members: "
                f"{members}{shared}.")

    def resume_preview(self, run_id: str, visitor: Visitor | str | None = None) -> Preview:
        """What Resume would submit, from where the trainer continues, and (on HF Jobs) what it can cost."""
        try:
            shown = self.operations.resume_preview(run_id, as_visitor(visitor))
        except (Refused, KeyError, LaunchError, SpecError) as exc:
            return Preview(f"**Cannot resume.** {_reason(exc)}")
        plan, jobs = shown.plan, shown.jobs
        lines = [f"**Resume run `{run_id}`:** {plan.message} It submits {len(jobs)} new job(s): "
                 + ", ".join(f"{j.role} on {j.flavor}" for j in jobs) + "."]
        if shown.cost is not None:
            lines.append(jobs_cost_line(jobs, shown.cost) + f" Review code **`{plan.fingerprint()}`**.")
        return Preview(redact_tokens("\n\n".join(lines)), plan.fingerprint(), run_id)

    def resume(self, run_id: str, visitor: Visitor | str | None = None, confirmed: str | None = None) -> str:
        """Relaunch a stopped run's jobs. A resume that costs money (HF Jobs) or starts again from step 0 (no
        checkpoint) goes ahead only once the visitor reviewed exactly this resume (`confirmed` is its code)."""
        visitor = as_visitor(visitor)
        try:
            answer = self.operations.resume(run_id, visitor, confirmed)
            if isinstance(answer, ReviewNeeded):
                return ("**Not resumed yet:** review what Resume submits, from where the trainer continues and what "
                        "it can cost, tick *I reviewed the resume* and press Resume again.\n\n"
                        + self.resume_preview(run_id, visitor).markdown)
            for key in [k for k in self._final_zips if k[-1] == run_id]:
                self._final_zips.pop(key, None)    # the resumed trainer writes a new final adapter
        except (Refused, KeyError, LaunchError, SpecError) as exc:
            return f"**Not resumed.** {_reason(exc)}"
        return f"Resumed {plain(self.run_named(run_id, visitor))} with {len(answer.job_ids)} new job(s): {answer.note}"


def _reason(exc: Exception) -> str:
    """A refusal's own words for a Markdown message: masked and escaped."""
    return masked(exc.args[0] if isinstance(exc, KeyError) and exc.args else exc)
