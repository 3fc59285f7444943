"""Watching a sweep: its members ranked by their best held-out score, and the early-stop rule that stops the worst.

    members = [member_of(tag, run_id, view) for tag, run_id in record["members"].items()]
    ranked = rank(members)                          # best first; members without a score yet last
    stop = Halving(after_versions=2).decide(members, done_rungs=0)    # None, or who to stop and why

The rule itself (successive halving, `early_stop_after` K > 0) is `backend/runtime/trainer/halving.py`, shared with the
members' trainers, which carry it out with no page open (`backend/runtime/trainer/sweep_stops.py`); its names are
re-exported here for the panel. Pure: the panel reads the members and shows the decision (`panel/sweep_view.py`).
"""

import re
from dataclasses import dataclass, field

from backend.plan.jobspec import TERMINAL_STAGES
from backend.runtime.best_rule import rule_text
from backend.runtime.records import SWEEP_STOP
from backend.runtime.trainer.halving import HALVING, Halving, Stop, rank, scores_of
from backend.view.runview import reading

# The rule's names (backend/runtime/trainer/halving.py) are the panel's too: re-exported with this module's own.
__all__ = ["BY_HAND", "HALVING", "RANK_HEADERS", "Halving", "Member", "Stop", "best_member", "done_rungs", "member_of",
           "rank", "rank_rows", "scores_of", "worst_live"]
BY_HAND = "by hand"
RANK_HEADERS = ["rank", "member", "run", "settings", "state", "steps", "best version", "best held-out score",
                "versions evaluated", "best by"]


@dataclass(frozen=True)
class Member:
    """One member as the ranking reads it."""

    tag: str                            # m0, m1, ...
    run_id: str
    stage: str = ""                     # the run's stage (RUNNING, COMPLETED, ERROR, ...); "" unknown yet
    steps: int | None = None            # the newest logged step
    max_steps: int | None = None
    versions: int = 0                   # held-out versions evaluated beyond the base model (v0)
    best_version: int | None = None     # its best version by its own rule (the highest even where none beats base)
    best_score: float | None = None     # that version's held-out score under the rule
    beats_base: bool = False            # whether that version beats the base model (the run's own best)
    rule: str = ""                      # the rule in words
    settings: dict = field(default_factory=dict)
    ordered: bool = False               # a stop order stands for it (its trainer ends at its next step)

    @property
    def live(self) -> bool:
        """Still training (or starting) with no stop order standing: the members a rule may stop."""
        return self.stage not in TERMINAL_STAGES and not self.ordered

    @property
    def order(self) -> int:
        """The member's place in the sweep (m3 -> 3): the last tie-break of the ranking."""
        found = re.fullmatch(r"m(\d+)", self.tag)
        return int(found.group(1)) if found else 10**6


def member_of(tag: str, run_id: str, view, settings: dict | None = None) -> Member:
    """A member's state from its RunView: its stage, steps, and its best held-out version by its own best-by rule
    (the run's chosen best where one beats the base model, else its highest-scoring version, ties to the earliest)."""
    with reading(view):
        held = getattr(view, "held_out", None)
        latest = view.latest or {}
        versions, best, score, beats = 0, None, None, False
        rule = ""
        if held is not None:
            rule = rule_text(held.rule)
            scored = {v: s for v in held.scores if v >= 1 and (s := held.rule_score(v)) is not None}
            versions = len(scored)
            if held.best_version is not None and held.best_version in scored:
                best, beats = held.best_version, True
            elif scored:
                best = min(scored, key=lambda v: (-scored[v], v))
            score = scored.get(best) if best is not None else None
        step = latest.get("step")
        max_steps = (view.spec or {}).get("max_steps")
        return Member(tag, run_id, view.stage, step if isinstance(step, int) else None,
                      max_steps if isinstance(max_steps, int) else None, versions, best, score, beats, rule,
                      dict(settings or {}))


def rank_rows(members: list[Member]) -> list[list[str]]:
    """The ranking table (RANK_HEADERS), best first."""
    rows = []
    for i, m in enumerate(rank(members), 1):
        steps = "-" if m.steps is None else (f"{m.steps}/{m.max_steps}" if m.max_steps else str(m.steps))
        version = "-" if m.best_version is None else f"v{m.best_version}" + ("" if m.beats_base else
                                                                              " (below base)")
        rows.append([str(i), m.tag, m.run_id, ", ".join(f"{k}={v}" for k, v in m.settings.items()),
                     (m.stage or "-").lower(), steps, version, "-" if m.best_score is None else f"{m.best_score:.3f}",
                     str(m.versions), m.rule or "-"])
    return rows


def best_member(members: list[Member]) -> Member | None:
    """The member whose best version ranks first (any state: a stopped member's versions stay downloadable)."""
    scored = [m for m in members if m.best_score is not None]
    return rank(scored)[0] if scored else None


def worst_live(members: list[Member]) -> Member | None:
    """The member still training that ranks last: the one "stop the worst" picks."""
    live = [m for m in members if m.live]
    return rank(live)[-1] if live else None


def done_rungs(events: list[dict]) -> int:
    """The highest halving rung already carried out, from the members' `sweep_stop` events."""
    rungs = [e["rung"] for e in events if e.get("event") == SWEEP_STOP and isinstance(e.get("rung"), int)]
    return max(rungs, default=0)
