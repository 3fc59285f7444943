"""Launch, resume and cancel, with their policy: who may, with which token, after which review.

`Operations` runs the steps of each in order (the token, the spec with the alert webhook, the right to act on the
namespace, the token's lifetime, the review fingerprint, the task check, the registry, the job secrets) and answers
with what happened: a `LaunchPreview`, a `ReviewNeeded`, a `LaunchedRun`, or an exception (`Refused`, `SpecError`,
`LaunchError`). The panel turns clicks into these calls and the answers into messages. Which executor does what is
asked of its engine (`backend.executors.engine`), never of its name.
"""

import threading
from collections.abc import Callable

from backend.executors.local import LocalExecutor
from backend.runs.access import Deployment
from backend.runs.answers import (
    CostEstimate,
    Launched,
    LaunchedSweep,
    LaunchPreview,
    ResumePreview,
    ReviewNeeded,
    SweepForm,
    SweepPreview,
    TokenTooShort,
)
from backend.runs.budget import SpendWatch
from backend.runs.directory import RunDirectory
from backend.runs.launch_form import WEBHOOK_FIELD, LaunchForm
from backend.runs.notes import NotesBook
from backend.runs.offers import Offers
from backend.runs.run_control import RunControl
from backend.runs.sweep_control import SweepControl
from backend.runs.sweep_launch import SweepLaunch
from backend.runs.task_checks import TaskChecks
from backend.task.check import TaskReport

# Names other code imports from here: the answers (`answers.py`) and the webhook's field name.
__all__ = ["WEBHOOK_FIELD", "CostEstimate", "LaunchPreview", "Launched", "LaunchedSweep", "Operations",
           "ResumePreview", "ReviewNeeded", "SweepForm", "SweepPreview", "TokenTooShort"]


class Operations(Offers, TaskChecks, LaunchForm, SweepLaunch, SweepControl, RunControl):
    """Launch, resume and cancel for one deployment, over its run directory (local runs and Hub registries). Each
    part is a module of `backend/runs/`: what the deployment offers (`offers.py`), the task check
    (`task_checks.py`), the form's run (`launch_form.py`), a sweep's launch (`sweep_launch.py`) and control
    (`sweep_control.py`), a run's control (`run_control.py`)."""

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
