"""What the panel's buttons and timer do, as plain functions over the backend (no Gradio objects here).

`Panel` turns form values and a `Visitor` (who clicked) into backend calls: preview, launch, cancel, resume,
watch, download, and their answers into messages. Launch, resume and cancel, with who may and after which review,
are `backend.runs.operations`; which registry reaches a run, `backend.runs.directory`. The tabs' handlers
(`panel/launch_view.py`, `runs_view.py`, `dashboard_view.py`) call one method here each.

Its parts, one module each: the launch form (`launch_actions.py`, its preview text in `preview_text.py`), the runs
list's table (`runs_table.py`), acting on a launched run (`run_control.py`), a run's files to download
(`downloads.py`). Here: the state they share, who may do what, and finding a run.
"""

import os

from backend.executors.local import LocalExecutor
from backend.outcome.best_version import change_best_by
from backend.outcome.try_it import try_it
from backend.runs.access import Deployment, Visitor, acting_token, local_runs_problem, no_token_reason
from backend.runs.budget import SpendWatch
from backend.runs.directory import RunDirectory
from backend.runs.notes import RunNotes
from backend.runs.operations import Operations
from backend.runs.registry import RunRegistry
from backend.runs.run_ids import where_label
from backend.runs.watch import RunWatch
from backend.storage.store import FolderStore
from backend.task.sandbox import isolation_state
from backend.view.runview import RunView
from panel.downloads import Downloads, downloads_folder
from panel.launch_actions import LaunchActions
from panel.marks import mark
from panel.presets import TINY_DEMO, preset_values
from panel.run_control import RunControl
from panel.runs_table import KeptTable, RunsTable
from panel.sweep_rule import rules_in_background
from panel.visitors import as_visitor

Settings = Deployment      # the name the panel's tests and scripts know
LOCAL_LIST_EVERY_S = 1.0   # how old a listing of the local jobs may be (sessions ticking together share one)


class Panel(LaunchActions, RunsTable, RunControl, Downloads):
    """What the panel does for a visitor, one method per button or tick. The launch form (`LaunchActions`), the runs
    table (`RunsTable`), acting on a run (`RunControl`) and its downloads (`Downloads`) are its parts, each in its
    own module; here: the state they share, who may do what, finding a run, and what is left."""

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

    # ---- finding a run
    def run_notes(self, run_id: str, visitor: Visitor | str | None = None) -> RunNotes:
        """The notes and tags of a run this visitor may see."""
        registry = self.runs.find(run_id, as_visitor(visitor))
        bucket = registry.run_bucket(run_id)
        return self.operations.notes.read(registry.store_for(bucket), bucket, run_id)

    def run_title(self, run_id: str, visitor: Visitor | str | None, view: RunView | None = None) -> str:
        """The run's name as its header shows it: its display name, else the name it was launched with (a sweep's
        shared fleet: the one its fleet.json gives it, `<sweep name>-fleet`), "" where that is its id, which the
        header shows anyway."""
        view = view or self.view(run_id, visitor)
        launched = view.spec or getattr(view, "fleet", None) or {}
        name = self.run_notes(run_id, visitor).name or str(launched.get("name") or "")
        return "" if name == run_id else name

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

    # ---- its outcome
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

    def shutdown(self) -> None:
        """The panel is exiting: stop reading from the Hub. Local runs keep running (each job has its own wrapper
        process) and the next panel over the same home finds them, with their true status."""
        self.watch.stop()
        self.runs.shutdown()


def _uploaded(path: str) -> bool:
    """Whether a dataset path is a file a visitor uploaded through Gradio."""
    from gradio.utils import get_upload_folder  # noqa: PLC0415 gradio loads slowly: handlers do without it

    return os.path.realpath(path).startswith(os.path.realpath(get_upload_folder()) + os.sep)
