"""What the panel's buttons and timer do, as plain functions over the backend (no Gradio objects here).

`Panel` turns form values and a `Visitor` (who clicked) into backend calls: preview, launch, cancel, resume,
watch, download, and their answers into messages. Launch, resume and cancel, with who may and after which review,
are `backend.runs.operations`; which registry reaches a run, `backend.runs.directory`. The tabs' handlers
(`panel/launch_view.py`, `runs_view.py`, `dashboard_view.py`) call one method here each.
"""

import csv
import hashlib
import heapq
import io
import logging
import os
import stat
import tempfile
import time
from dataclasses import dataclass

from backend.executors.local import LocalExecutor
from backend.outcome.best_version import ChoiceError, ChosenAdapter, change_best_by
from backend.outcome.publish import PublishError
from backend.outcome.try_it import try_it
from backend.plan import recipe
from backend.plan.cost import format_usd
from backend.plan.hardware import Flavor
from backend.plan.jobspec import TERMINAL_STAGES, JobSpec
from backend.plan.shared_gpu import measured_reason, slower_warning
from backend.plan.spec import RunSpec, SpecError
from backend.plan.task_spec import held_out_summary
from backend.runs.access import (
    ANONYMOUS,
    Deployment,
    Refused,
    Visitor,
    acting_token,
    local_runs_problem,
    no_token_reason,
)
from backend.runs.budget import SpendWatch
from backend.runs.directory import RunDirectory
from backend.runs.launch import LaunchError
from backend.runs.notes import NotesError, RunNotes
from backend.runs.operations import (
    CostEstimate,
    LaunchedSweep,
    Operations,
    ReviewNeeded,
    SweepForm,
    SweepPreview,
    TokenTooShort,
)
from backend.runs.registry import RunRegistry
from backend.runs.run_ids import where_label
from backend.runs.watch import RunWatch
from backend.runtime.best_rule import rule_text
from backend.runtime.layout import atomic_write_chunks
from backend.runtime.redact import redact_tokens
from backend.runtime.tiny_model import benchmark_note
from backend.storage.journal import LAUNCHING
from backend.storage.store import FolderStore
from backend.task.check import TaskReport
from backend.task.sandbox import isolation_state
from backend.view.runview import RunView, reading
from backend.view.sweep import Halving
from panel.markdown import code_span, fenced, masked, plain
from panel.marks import mark
from panel.presets import TINY_DEMO, preset_values
from panel.publish_view import suggested_repo_id
from panel.runs_list import RUN_FILTERS, name_cell, progress_bar, run_badge
from panel.spend_view import budget_line, cost_cell
from panel.sweep_rule import rules_in_background

log = logging.getLogger(__name__)

Settings = Deployment      # the name the panel's tests and scripts know
ENDED_ROW_S = 60.0         # an ended run's row in the runs list is built again this often (its last steps may arrive)
RUNS_PAGE = 50             # the runs list shows the newest runs; older ones are opened by id
LOCAL_LIST_EVERY_S = 1.0   # how old a listing of the local jobs may be (sessions ticking together share one)
HELD_OUT_CSV_FIRST = ["version", "adapter", "step", "best_by", "held_out_score", "best", "trained_score",
                      "trained_score_std", "prompts"]
HISTORY_WAIT_S = 30.0      # how long a held-out download waits for a long run's older records
KEPT_TABLES = 64           # runs tables (by visitor's registries, filter and query) kept between listings


@dataclass(frozen=True)
class KeptTable:
    """A runs table as built from its registries' listings: while they are the same lists (a registry lists again
    every few seconds) and no kept row has expired, a tick rebuilds only the rows of live runs (None here)."""

    listings: tuple
    rows: list                  # (run, registry, row or None) in the order shown
    until: float                # time.monotonic() when the first kept row expires

    def serves(self, listings: tuple) -> bool:
        return (len(listings) == len(self.listings) and all(a is b for a, b in zip(listings, self.listings))
                and time.monotonic() < self.until)


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


def as_visitor(visitor: Visitor | str | None) -> Visitor:
    """A Visitor from what a caller holds: a Visitor, a bare token (scripts and tests), or nothing."""
    if isinstance(visitor, Visitor):
        return visitor
    return Visitor(token=visitor) if visitor else ANONYMOUS


class Panel:
    def __init__(self, settings: Deployment | None = None, local: LocalExecutor | None = None):
        self.settings = settings or Deployment()
        self.local = local or LocalExecutor(self.settings.home)
        # Sessions ticking together share one listing of the local jobs (each reads every job's record and asks
        # whether its process lives): at most one a second, like a run's view (launch and cancel list again).
        local_runs = RunRegistry(self.local, lambda bucket: FolderStore(self.local.bucket_root(bucket)),
                                 list_every_s=LOCAL_LIST_EVERY_S)
        self.runs = RunDirectory(self.settings, local_runs,
                                 cache_dir=os.path.join(self.settings.home, "cache", "bucket-files"))
        self.spend = SpendWatch()
        self._rows: dict[tuple, tuple] = {}     # (registry, run id, with cost) -> an ended run's row, for a while
        self._tables: dict[tuple, KeptTable] = {}   # (registries, with cost, limit, query, status) -> its rows
        # Budget caps and alerts of every live run, checked in the background whether anyone watches or not.
        self.watch = RunWatch(self.runs, self.spend, self.settings.home, self.settings.budget_check_s)
        # Launch, resume and cancel with their policy; this class turns their answers into messages.
        self.operations = Operations(self.settings, self.runs, self.spend, self.watch.webhooks, _uploaded)
        if not self.settings.serves_others:
            # A panel that serves no one else also orders its sweeps' due rungs with no page open (as the members'
            # trainers do themselves); on a Space (or exposed) it holds no visitor's sign-in to write with, and needs
            # none: the trainers decide (panel/sweep_rule.py).
            self.watch.also.append(lambda: rules_in_background(self))
        self._final_zips: dict[tuple, str] = {}     # (executor, namespace, bucket, run id) -> its final zip
        # The launch form's labels (set by the UI that builds the form): messages name a field as it is shown.
        self.field_labels: dict[str, str] = {}
        self.downloads = downloads_folder(self.settings.home)

    @property
    def local_runs(self) -> RunRegistry:
        return self.runs.local

    # ---- who may do what
    def control_token(self, registry: RunRegistry, visitor: Visitor) -> str | None:
        """The token to act with on `registry`'s runs; raises Refused with a reason the visitor can act on."""
        return self.operations.control_token(registry.engine, registry.namespace, visitor)

    def default_bucket(self, visitor: Visitor | str | None, executor: str) -> str:
        """The bucket a preset starts with: the visitor's own `<name>/grpo-runs` for HF Jobs, created on first
        launch (private); '' when nobody is signed in, so the form asks for one."""
        return self.operations.default_bucket(as_visitor(visitor), executor)

    def default_mount(self, executor: str, make: bool = False) -> str:
        """The form's mount path for runs on `executor` (`Operations.default_mount`)."""
        return self.operations.default_mount(executor, make)

    def offered_executors(self) -> list[str]:
        """The executors the form offers on this deployment."""
        return self.operations.offered_executors()

    def isolation(self) -> str:
        """Where *Check task* and *Try it* run code on this deployment, or why they run none here (Markdown)."""
        return isolation_state(self.settings.serves_others)

    # ---- launch form
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
            lines.append(_cost_line(jobs, shown.cost) + f" Review code **`{spec.fingerprint()}`**.")
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

    # ---- runs
    def runs_table(self, visitor: Visitor | str | None = None, with_cost: bool = True,
                   limit: int = RUNS_PAGE, query: str = "", status: str = "all") -> list[list]:
        """The newest `limit` runs (RUNS_HEADERS), optionally only those whose id or name contains `query` and
        whose status is `status` (a RUN_FILTERS key)."""
        visitor = as_visitor(visitor)
        registries = self.runs.registries(visitor)
        listings = self.runs.listings(visitor, registries)
        key = (tuple(id(r) for r in registries), with_cost, limit, (query or "").strip().lower(), status)
        kept = self._tables.get(key)
        if kept is not None and kept.serves(listings):
            # The same listings: the same runs are shown, and only the live ones' rows can have changed.
            return [self._run_row(run, registry, with_cost)[2] if row is None else row
                    for run, registry, row in kept.rows]
        shown = self._shown_runs(registries, listings, with_cost, limit, key[3], status)
        self._tables[key] = self._kept_table(listings, shown, with_cost)
        while len(self._tables) > KEPT_TABLES:      # visitors' queries must not grow it without end
            self._tables.pop(next(iter(self._tables)))
        return [row for _run, _registry, row in shown]

    def _shown_runs(self, registries, listings, with_cost: bool, limit: int, q: str, status: str) -> list[tuple]:
        """(run, registry, row) of the runs the table shows, newest first."""
        # Each registry lists its runs newest first: merged lazily, a listing reads the runs it shows (and those
        # the filter skips), not every run ever made.
        runs = heapq.merge(*(((run, registry) for run in listing) for registry, listing in zip(registries, listings)),
                           key=lambda pair: -pair[0].created_at)
        wanted = RUN_FILTERS.get(status) or ()
        shown, sweeps = [], []
        for run, registry in runs:
            if wanted and run.stage not in wanted:
                continue
            name, sweep, row = self._run_row(run, registry, with_cost)
            if q and q not in run.run_id.lower() and q not in name.lower():
                continue
            shown.append((run, registry, row))
            sweeps.append(sweep or f"run:{len(shown)}")
            if len(shown) == limit:
                break
        return grouped(shown, sweeps)

    def _kept_table(self, listings: tuple, shown: list[tuple], with_cost: bool) -> KeptTable:
        """`shown` kept for the next ticks: an ended run's row as built (until the first one expires), a live run's
        as None (built at each tick)."""
        until, rows = time.monotonic() + ENDED_ROW_S, []
        for run, registry, row in shown:
            kept = self._rows.get((id(registry), run.run_id, with_cost))
            rows.append((run, registry, row if kept is not None else None))
            if kept is not None:
                until = min(until, kept[1])
        return KeptTable(listings, rows, until)

    def _run_row(self, run, registry, with_cost: bool) -> tuple[str, str, list]:
        """(the run's name cell, the sweep it is a member of or "", its row). An ended run's row is kept for
        ENDED_ROW_S (its last steps and cost may still be read meanwhile): a tick builds the rows of live runs, not
        the same rows of every ended one again."""
        key = (id(registry), run.run_id, with_cost)
        signature = (tuple(sorted(run.stages.items())), run.timed_out, run.unreadable, run.launch_failed)
        kept = self._rows.get(key)
        if kept and kept[0] == signature and time.monotonic() < kept[1]:
            return kept[2]
        spec, cost = {}, ""
        if with_cost:
            try:
                # A view open or watched already supplies the steps: no second reader of the run's metrics.
                run_cost, spec = self.spend.cost(registry, run.run_id, registry.watched_view(run.run_id))
                cost = cost_cell(run_cost, float(spec.get("budget_usd") or 0.0))
            except Exception as exc:   # a failing price list or bucket must not break the runs list
                log.debug("no cost for run %s: %s", run.run_id, exc)
                cost = "-"
        sweep = str(spec.get("sweep_id") or "")
        notes = self._run_notes(registry, run)
        name = name_cell(notes.name or str(spec.get("name") or ""), notes.tags, sweep)
        glance = self.spend.glance(registry, run.run_id, registry.watched_view(run.run_id)) if with_cost else None
        latest, best = (glance.latest, glance.best.text) if glance is not None else ({}, "")
        reward = latest.get("reward")
        created = time.strftime("%Y-%m-%d %H:%M", time.localtime(run.created_at))
        row = [run.run_id, name, run_badge(run), progress_bar(latest.get("step"), spec.get("max_steps")),
               f"{reward:.3f}" if isinstance(reward, (int, float)) else "", best, cost,
               str(spec.get("mode") or ""), registry.executor.name, created]
        if run.stages and all(stage in TERMINAL_STAGES for stage in run.stages.values()):
            self._rows[key] = (signature, time.monotonic() + ENDED_ROW_S, (name, sweep, row))
        else:
            self._rows.pop(key, None)
        return name, sweep, row

    def _run_notes(self, registry, run) -> RunNotes:
        """The run's notes as kept in its folder (none where its bucket is unknown)."""
        if not run.bucket:
            return RunNotes()
        return self.operations.notes.read(registry.store_for(run.bucket), run.bucket, run.run_id)

    def run_notes(self, run_id: str, visitor: Visitor | str | None = None) -> RunNotes:
        """The notes and tags of a run this visitor may see."""
        registry = self.runs.find(run_id, as_visitor(visitor))
        bucket = registry.run_bucket(run_id)
        return self.operations.notes.read(registry.store_for(bucket), bucket, run_id)

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

    def run_title(self, run_id: str, visitor: Visitor | str | None, view: RunView | None = None) -> str:
        """The run's name as its header shows it: its display name, else the name it was launched with (a sweep's
        shared fleet: the one its fleet.json gives it, `<sweep name>-fleet`), "" where that is its id, which the
        header shows anyway."""
        view = view or self.view(run_id, visitor)
        launched = view.spec or getattr(view, "fleet", None) or {}
        name = self.run_notes(run_id, visitor).name or str(launched.get("name") or "")
        return "" if name == run_id else name

    def _forget_rows(self, run_id: str) -> None:
        """The runs list shows the run's new name and tags at its next tick, not its kept row."""
        for key in [k for k in self._rows if k[1] == run_id]:
            self._rows.pop(key, None)
        self._tables.clear()

    def runs_hint(self, visitor: Visitor | str | None = None) -> str:
        """A line above the runs list when the visitor's Hub runs could not be listed (what failed, what to do), or
        when they can see no Hub runs and have nothing else to see, saying why: on a Space (sign in), or on a panel
        that shows them no local runs. A local user without a Hub token sees
        their local runs and no notice: a token is needed only for HF Jobs, whose launch and push say so."""
        visitor = as_visitor(visitor)
        if acting_token(visitor, self.settings):
            problem = self.runs.listing_problem(visitor)
            return mark("warning", problem) if problem else ""     # our own words: no visitor's text in it
        if not self.settings.on_space and local_runs_problem(visitor, self.settings) is None:
            return ""
        return no_token_reason(self.settings)

    def run_named(self, run_id: str, visitor: Visitor | str | None = None) -> str:
        """Which run an action acted on, in words: 'run <id> (acme on Hugging Face Jobs)': one id names one run, in
        its owner's namespace."""
        try:
            return f"run {run_id} ({where_label(self.runs.find(run_id, as_visitor(visitor)))})"
        except KeyError:
            return f"run {run_id}"

    def owner_of(self, run_id: str, visitor: Visitor | str | None = None) -> dict:
        """The run's owner as an agent reads it: its namespace (None: this machine's) and where it runs."""
        registry = self.runs.find(run_id, as_visitor(visitor))
        return {"namespace": registry.namespace, "where": where_label(registry)}

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
        if "eval_source" not in view.spec:    # a run from before held-out evaluation had none: not the demo's
            values.update(eval_source="none", monitor_rewards=[], best_by="")
        values.update({k: v for k, v in view.spec.items() if k in values})
        changed = {k: v for k, v in (change or {}).items() if k in values}
        line = f"Filled from run `{run_id}`"
        if changed:
            line += " with " + ", ".join(f"`{k}` {values[k]!r} → {v!r}" for k, v in changed.items())
            values.update(changed)
        return values, line + ". Review the preview, then launch."

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
            lines.append(_cost_line(jobs, shown.cost) + f" Review code **`{plan.fingerprint()}`**.")
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

    def final_adapter(self, run_id: str, visitor: Visitor | str | None = None) -> str | None:
        """The final adapter as a zip, built once per run (the bucket's final/ is written once)."""
        registry = self.runs.find(run_id, as_visitor(visitor))
        key = owned_key(registry, run_id)      # two namespaces' runs under one id never share a zip
        if key not in self._final_zips:
            try:
                path = registry.final_adapter_zip(run_id, private_folder(self.downloads),
                                                  suggested_repo_id(self, run_id, as_visitor(visitor)))
            except (ChoiceError, PublishError):     # final/ incomplete: nothing to download yet
                path = None
            if path is None:
                return None
            self._final_zips[key] = path
        return self._final_zips[key]

    def adapter_version_zip(self, run_id: str, choice: str | None,
                            visitor: Visitor | str | None = None) -> tuple[str, ChosenAdapter]:
        """The adapter version `choice` names ("best", "final", "trl-policy-v<N>"; None: the best where an evaluation
        exists, else final/) as a zip with the card a push to the visitor's suggested repo writes, and what it is;
        raises ChoiceError or PublishError (or KeyError: not this visitor's run)."""
        visitor = as_visitor(visitor)
        registry = self.runs.find(run_id, visitor)
        return registry.adapter_zip(run_id, choice, private_folder(self.downloads),
                                    suggested_repo_id(self, run_id, visitor))

    def set_best_by(self, run_id: str, text: str, visitor: Visitor | str | None = None) -> str:
        """Change which held-out score decides the run's best version (`best_version.change_best_by`): only on a
        run this visitor may see (KeyError otherwise); BestByRefused / ChoiceError say why it cannot."""
        return change_best_by(self.view(run_id, as_visitor(visitor)), text)

    def try_it(self, run_id: str, visitor: Visitor | str | None, prompt: str, picks: list[str], max_tokens,
               session: str | None = None, address: str | None = None):
        """"Try it" on the run (a generator of `TryAnswers` as they come): only for a visitor who may see the run
        (KeyError otherwise), the request checked first (TryRefused names the field). The CPU line knows a signed-in
        visitor by their username (all their tabs are one visitor); one who is not signed in by the page's `session`,
        their places capped by the `address` they come from (`panel/client_address.py`)."""
        visitor = as_visitor(visitor)
        registry = self.runs.find(run_id, visitor)
        view = registry.view(run_id)
        if visitor.username:
            who, address = f"user:{visitor.username}", None
        else:
            who, address = (f"session:{session}" if session else None), address or "unknown"
        return try_it(view, registry.engine, acting_token(visitor, self.settings), prompt, picks,
                      max_tokens, who, address)

    def full_log_file(self, run_id: str, role: str, visitor: Visitor | str | None = None) -> str | None:
        """The whole log of one job (masked, like everything shown) as a file to download."""
        view = self.view(run_id, visitor)
        job = view.jobs.get(role)
        if job is None:
            return None
        path = os.path.join(private_folder(self.downloads), f"{owned_name(view, run_id)}-{role}.log")
        write_log(path, view.executor.all_logs(job.job_id))
        return path

    def metrics_csv(self, run_id: str, visitor: Visitor | str | None = None) -> str:
        """Every step the run logged to its bucket (its metrics) as a CSV file to download: a row a step, a column a
        metric (step and time first), an empty cell where a step did not log that metric."""
        view = self.view(run_id, visitor)
        path = os.path.join(private_folder(self.downloads), f"{owned_name(view, run_id)}-metrics.csv")
        atomic_write_chunks(path, csv_lines(view.metrics))
        return path

    def heldout_csv(self, run_id: str, visitor: Visitor | str | None = None) -> str:
        """The run's held-out evaluations (the adapters table's held-out columns, and more) as a CSV file to
        download: a row per evaluated version, the base model (version 0) first; its adapter, step, the run's
        best-by rule and the version's held-out score under it (the number the header, the table and the picker
        show), whether it is the best version, the trained score (under the run's weights) and its spread over
        prompts, prompts scored, then each held-out reward's mean, std, weight in training and weight in the rule.
        A long run's older records are waited for (at most HISTORY_WAIT_S)."""
        view = self.view(run_id, visitor)
        view.wait_for_history(HISTORY_WAIT_S)
        held = view.held_out
        with reading(view):
            scores = sorted(held.scores.values(), key=lambda s: s.version)
            best, rule = held.best_version, dict(held.rule)
            ruled = {s.version: held.rule_score(s.version) for s in scores}
        names = list(dict.fromkeys(name for s in scores for name in s.rewards))
        said = rule_text(rule)

        def rule_weight(score, name: str):
            # The default rule is the trained score: it weighs each reward as training did.
            return rule.get(name, 0.0) if rule else (score.rewards.get(name) or {}).get("weight")

        rows = [{"version": s.version, "adapter": "base model" if s.version == 0 else held.adapter_name(s.version),
                 "step": s.step, "best_by": said, "held_out_score": ruled[s.version],
                 "best": "yes" if s.version == best else "", "trained_score": s.score,
                 "trained_score_std": s.score_std, "prompts": s.n_prompts,
                 **{key: value for name in names for key, value in (
                     (f"{name} mean", (s.rewards.get(name) or {}).get("mean")),
                     (f"{name} std", (s.rewards.get(name) or {}).get("std")),
                     (f"{name} training weight", (s.rewards.get(name) or {}).get("weight")),
                     (f"{name} rule weight", rule_weight(s, name)))}} for s in scores]
        path = os.path.join(private_folder(self.downloads), f"{owned_name(view, run_id)}-held-out.csv")
        atomic_write_chunks(path, csv_lines(rows, HELD_OUT_CSV_FIRST))
        return path

    def shutdown(self) -> None:
        """The panel is exiting: stop reading from the Hub. Local runs keep running (each job has its own wrapper
        process) and the next panel over the same home finds them, with their true status."""
        self.watch.stop()
        self.runs.shutdown()


def owned_key(registry: RunRegistry, run_id: str) -> tuple:
    """A run by its owner and id: what a cache of things built for a run is keyed by."""
    return (registry.executor.name, registry.namespace, registry.run_bucket(run_id), run_id)


def owned_name(view: RunView, run_id: str) -> str:
    """A download's file name stem for the run: its id and its owner's namespace, so two runs under one id in two
    namespaces never write one file of the shared downloads folder."""
    namespace = getattr(view.executor, "namespace", None) or "local"
    return f"{namespace}-{run_id}"


def grouped(shown: list, groups: list[str]) -> list:
    """`shown` with the members of one sweep together, where its first (newest) member stands; each group's own
    order kept, and a lone run a group of its own."""
    order: dict[str, list] = {}
    for each, group in zip(shown, groups):
        order.setdefault(group, []).append(each)
    return [each for members in order.values() for each in members]


def csv_lines(rows: list[dict], first: list[str] | None = None):
    """`rows` as CSV, encoded, a line at a time: the `first` columns (step and time by default), then every other
    key, sorted."""
    first = first or ["step", "time"]
    header = [*first, *sorted({key for row in rows for key in row} - set(first))]
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(header)
    for row in rows:
        writer.writerow([row.get(key, "") for key in header])
        yield out.getvalue().encode()
        out.seek(0)
        out.truncate()
    yield out.getvalue().encode()


def write_log(path: str, pieces) -> None:
    """A log for download at `path` from an executor's `all_logs`, masked as it streams through
    (benchmarks/log_download.py: a 1 GB log in bounded memory)."""
    atomic_write_chunks(path, (redact_tokens(piece).encode() for piece in pieces))


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


def _uploaded(path: str) -> bool:
    """Whether a dataset path is a file a visitor uploaded through Gradio."""
    from gradio.utils import get_upload_folder  # noqa: PLC0415 gradio loads slowly: handlers do without it

    return os.path.realpath(path).startswith(os.path.realpath(get_upload_folder()) + os.sep)


def _cost_line(jobs: list[JobSpec], cost: CostEstimate) -> str:
    if cost.usd is None:
        return f"**Cannot estimate the cost:** {cost.problem}"
    per_job = ", ".join(f"{j.role} on {j.flavor}" for j in jobs)
    note = " (built-in price list: the Hub could not be asked)" if cost.fallback_prices else ""
    attempts = f" x {jobs[0].attempts} attempts (a retry can run its timeout again)" if jobs[0].attempts > 1 else ""
    return (f"Estimated cost at most **${cost.usd:.2f}**{note}: price per hour x timeout "
            f"({jobs[0].timeout_s // 60} min){attempts} for each job: {per_job}.")


def trackio_line(spec: RunSpec) -> str:
    """Where the run also logs to trackio, as the preview says it."""
    where = (f"the Space `{spec.trackio_space}` (created if need be)" if spec.trackio_space else
             f"the run's own folder `{spec.run_path}/trackio/` (`TRACKIO_DIR=<it> trackio show`)")
    return f"Also logs to trackio: project `{spec.trackio_project}`, run `{spec.name}`, in {where}."


FED_PER_SERVER = 64   # requests in flight a GPU server needs before a second one on its GPU pays (replica-scaling.md)


def distributed_engine(spec: RunSpec) -> str:
    """The replicas, their servers, and the requests in flight each server gets: more servers need more in flight."""
    servers = recipe.server_count(spec)
    per_job = servers // spec.replicas
    shape = (f"{spec.replicas} replica job(s) x {per_job} vLLM servers ({spec.servers_per_gpu} a GPU) = {servers}"
              if per_job > 1 else f"vLLM server x{spec.replicas}")
    per_server = spec.max_inflight_tasks / servers
    line = (f"{shape} behind the proxy (async GRPO); {spec.max_inflight_tasks} requests in flight "
            f"(max_inflight_tasks), {per_server:.0f} a server")
    if spec.servers_per_gpu > 1 and per_server < FED_PER_SERVER:
        line += (f" ⚠️ fewer than {FED_PER_SERVER} a server leave the added servers unfed: raise max_inflight_tasks "
                 f"to {FED_PER_SERVER * servers} or more")
    if spec.engine.replica_shares_trainer_gpu(spec):
        warning = slower_warning(spec)
        line += (f"; ⚠️ {warning}" if warning else
                 f"; the replicas share the trainer's GPU, so 1 server a GPU: {measured_reason()}")
    return line


def engine_label(spec: RunSpec) -> str:
    note = benchmark_note(spec.model)
    return _engine(spec) + (f"; model {note}" if note else "")


def _engine(spec: RunSpec) -> str:
    if spec.mode == "distributed":
        return distributed_engine(spec)
    if spec.use_vllm and spec.engine.chooses_hardware:
        sleep = "on" if spec.vllm_enable_sleep_mode else "off"
        return f"vLLM colocated (gpu_memory_utilization={spec.vllm_gpu_memory_utilization}, sleep mode {sleep})"
    if spec.use_vllm:
        return "vLLM colocated if the machine has a GPU, else transformers"
    return "transformers generate() (no vLLM)"


def sweep_markdown(shown: SweepPreview, labels: dict[str, str]) -> str:
    """A sweep's preview: its members (what sets each apart, its run id), the one fleet they need, what they can cost
    in all and the review code, then the first member's jobs (the others' differ only in their settings)."""
    base, sweep, fleet = shown.base, shown.sweep, shown.fleet
    swept = list(sweep.swept)
    heads = " | ".join(plain(labels.get(name, name)) + f" ({code_span(name)})" for name in swept)
    rows = "\n".join(f"| {p.spec.sweep_member} | `{p.spec.run_id}` | "
                     + " | ".join(masked(str(v)) for v in sweep.member_settings(p.spec).values()) + " |"
                     for p in shown.members)
    kind = "a grid of" if sweep.grid else "side by side,"
    head = (f"**Sweep `{sweep.sweep_id}`: {len(shown.members)} members** ({kind} {', '.join(swept)}), each an "
            f"ordinary distributed run (own folder, checkpoints, resume) of {len(shown.members[0].jobs)} job(s). "
            f"Engine: {engine_label(base)}.")
    table = f"| member | run id | {heads} |\n|---|---|{'---|' * len(swept)}\n{rows}"
    sizes = (f"`--max-loras {fleet.max_loras}` (each member's max_staleness + 2, summed), `--max-lora-rank "
             f"{fleet.max_lora_rank}` (the largest member's)")
    if shown.fleet_jobs:
        fleet_line = (f"**One fleet** for all members: {len(shown.fleet_jobs)} replica job(s) started once (run id "
                      f"`{shown.members[0].spec.fleet}`), each server with {sizes}; each member runs only its "
                      "trainer, whose proxy loads and serves only that member's adapter versions.")
    else:
        fleet_line = (f"**Fleet** all members need at once: {sizes}. Not shared on {engine_label(base)}: each "
                      f"member starts its own {base.replicas} replica(s).")
    lines = [head, table, fleet_line, *(f"⚠️ {note}" for note in fleet.notes), early_stop_line(sweep)]
    if shown.cost is not None:
        lines += [_sweep_cost_line(shown), sweep_budget_line(sweep, bool(shown.fleet_jobs))]
    first = shown.members[0]
    if first.expiry:
        lines.append(f"⚠️ Not launchable as it is: {first.expiry}")
    if first.note:
        lines.append(first.note)
    lines.append(held_out_summary(base))
    for job, command in zip(shown.fleet_jobs, shown.fleet_commands):
        lines.append(fenced(f"# fleet {job.role}\n{command}", "bash"))
    for job, command in zip(first.jobs, first.commands):
        lines.append(fenced(f"# m0 {job.role}\n{command}", "bash"))
    return "\n\n".join(line for line in lines if line)


def early_stop_line(sweep) -> str:
    """The sweep's stated early-stop rule, as its record keeps it and the Sweep tab carries it out."""
    if sweep.early_stop_after:
        return f"**Early stop:** {Halving(sweep.early_stop_after).text()}; each stop is recorded with the scores."
    return "**Early stop:** by hand only (the Sweep tab's *Stop this member*)."


def sweep_budget_line(sweep, fleet: bool) -> str:
    """What the preview says about the sweep's one budget cap (billed engines)."""
    over = "every member's jobs and the shared fleet's" if fleet else "every member's jobs"
    if not sweep.budget_usd:
        return (f"**Sweep budget cap:** none (give one to cap {over} together; each member's own *Budget cap* "
                "covers its own jobs only).")
    return (f"**Sweep budget cap {format_usd(sweep.budget_usd)}:** once the spend of {over} together reaches it, the "
            "panel cancels every member still running and then the fleet. Whichever panel process is running "
            "enforces it, as it does a run's cap (every 30 s by default, also after a restart); the job timeout stays "
            "the hard limit.")


def _sweep_cost_line(shown: SweepPreview) -> str:
    cost, n = shown.cost, len(shown.members)
    if cost.usd is None:
        return f"**Cannot estimate the cost:** {cost.problem}"
    note = " (built-in price list: the Hub could not be asked)" if cost.fallback_prices else ""
    return (f"Estimated cost of all {n} members at most **${cost.usd:.2f}**{note} (price per hour x timeout for each "
            f"member's jobs). Review code **`{shown.fingerprint}`**.")


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


def _reason(exc: Exception) -> str:
    """A refusal's own words for a Markdown message: masked and escaped."""
    return masked(exc.args[0] if isinstance(exc, KeyError) and exc.args else exc)


def _fields(exc: SpecError) -> tuple[str, ...]:
    return tuple(dict.fromkeys(e.field for e in exc.errors))


def _errors_markdown(exc: SpecError, labels: dict[str, str] | None = None) -> str:
    """Each bad field by its form label (its spec name beside it, as the preview and spec.json call it)."""
    labels = labels or {}
    items = "\n".join(f"- **{plain(labels[e.field])}** ({code_span(e.field)}): {masked(e.message)}"
                      if e.field in labels else f"- **{masked(e.field)}**: {masked(e.message)}"
                      for e in exc.errors)
    return f"**Fix these fields before launching (nothing was launched):**\n{items}"

