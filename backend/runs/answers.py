"""What launch, resume and sweep operations answer (`backend/runs/operations.py`): previews with their cost, the
review a launch still needs, what was launched; the launch form's sweep as given."""

from dataclasses import dataclass

from backend.plan.jobspec import JobSpec
from backend.plan.spec import RunSpec
from backend.plan.sweep import FleetSize, SweepSpec
from backend.runs.access import Refused
from backend.runs.launch import LaunchedRun
from backend.runs.resume import ResumePlan


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
