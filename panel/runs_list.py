"""The runs list's cells: what a user scans for in a day of runs (name, status, progress, latest reward, best
held-out version)."""

from panel.marks import mark

# "best held-out": the best version's held-out score under the run's rule and its version, or "none beats base".
RUNS_HEADERS = ["run", "name", "status", "progress", "reward", "best held-out", "time · cost", "mode", "executor",
                "created"]
# Each run stage's mark (`panel.marks`): a symbol any font draws, before the stage in words.
BADGES = {"RUNNING": "running", "SCHEDULING": "scheduling", "COMPLETED": "completed", "ERROR": "failed",
          "CANCELED": "stopped", "DELETED": "stopped"}
# The status filter's choices: label -> the run stages it keeps (none: every run).
RUN_FILTERS = {"all": (), "running": ("RUNNING", "SCHEDULING"), "completed": ("COMPLETED",), "failed": ("ERROR",),
               "canceled": ("CANCELED", "DELETED")}
BAR_CELLS = 10


def status_badge(stage: str, timed_out: bool = False, unreadable: bool = False) -> str:
    """The status cell: the run's stage, 'timed out' for a run stopped at its timeout, and a mark on a run with a
    job record that cannot be read."""
    if timed_out and stage == "ERROR":
        text = mark("failed", "timed out")
    else:
        text = mark(BADGES.get(stage, "unknown"), stage.lower())
    return text + (" · " + mark("warning", "job record unreadable") if unreadable else "")


def run_badge(run) -> str:
    """`status_badge` of a RunSummary: timed out when the job its stage comes from timed out. A run of replicas
    alone (a sweep's fleet) that still serves while some of them ended says which serve and which ended."""
    stage = run.stage
    if "trainer" not in run.stages and stage == "RUNNING" and len(run.stages) > 1:
        serving = sorted(r for r, s in run.stages.items() if s == "RUNNING")
        ended = sorted(r for r, s in run.stages.items() if s != "RUNNING")
        if ended:
            said = ", ".join(f"{r} {BADGES.get(run.stages[r], run.stages[r].lower())}" for r in ended)
            return (mark("running", f"serving on {', '.join(serving)} ({len(serving)} of {len(run.stages)})")
                    + " · " + mark("warning", said)
                    + (" · " + mark("warning", "job record unreadable") if run.unreadable else ""))
    deciding = ["trainer"] if "trainer" in run.stages else [r for r, s in run.stages.items() if s == stage]
    return status_badge(stage, any(r in run.timed_out for r in deciding), bool(run.unreadable))


def name_cell(name: str, tags, sweep: str = "") -> str:
    """The run's name, the sweep it is a member of and its tags ('lr-m0 · sweep sweep-2026... · #baseline'): the
    list's filter matches any of them (a sweep's id lists its members)."""
    parts = (name, f"sweep {sweep}" if sweep else "", " ".join(f"#{tag}" for tag in tags))
    return " · ".join(part for part in parts if part)


def progress_bar(step, max_steps) -> str:
    """'███░░░░░░░ 30/100', or the step alone when the run's length is unknown."""
    if not isinstance(step, (int, float)):
        step = 0
    if not isinstance(max_steps, int) or max_steps <= 0:
        return str(int(step)) if step else ""
    filled = min(BAR_CELLS, int(BAR_CELLS * step / max_steps))
    return "█" * filled + "░" * (BAR_CELLS - filled) + f" {int(step)}/{max_steps}"
