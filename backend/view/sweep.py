"""Watching a sweep: its members ranked by their best held-out score, and the early-stop rule that stops the worst.

    members = [member_of(tag, run_id, view) for tag, run_id in record["members"].items()]
    ranked = rank(members)                          # best first; members without a score yet last
    stop = Halving(after_versions=2).decide(members, done_rungs=0)    # None, or who to stop and why

Successive halving, as the sweep's record states it (`early_stop_after` K > 0): once every member still training has
K·r held-out versions evaluated (r = 1, 2, ...: the rung), the worse half of them (⌊n/2⌋ of n) by best held-out score
is stopped, until one is left. A rung waits for a member still training without enough versions (it may yet catch
up); a member that ended (failed, cancelled, completed) takes no part. Members tied at the cut are all kept: the rule
stops fewer rather than choose between equal scores by chance, and the rung is tried again as versions come. Pure:
the panel reads the members and carries the decision out (`panel/sweep_view.py`).
"""

import math
import re
from dataclasses import dataclass, field

from backend.plan.jobspec import TERMINAL_STAGES
from backend.runtime.best_rule import rule_text
from backend.runtime.records import SWEEP_STOP
from backend.view.runview import reading

BY_HAND = "by hand"
HALVING = "successive halving"
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

    @property
    def live(self) -> bool:
        """Still training (or starting): the members a rule may stop."""
        return self.stage not in TERMINAL_STAGES

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


def rank(members: list[Member]) -> list[Member]:
    """Best first: by best held-out score (higher is better), members without a score yet after those with one,
    ties by more versions evaluated, then by the member's place in the sweep."""
    return sorted(members, key=lambda m: (m.best_score is None, -(m.best_score or 0.0), -m.versions, m.order))


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


@dataclass(frozen=True)
class Stop:
    """A decision to stop members, with what decided it (recorded as each stopped member's `sweep_stop` event)."""

    rule: str                       # the rule in words
    rung: int | None                # the halving's rung; None by hand
    stopped: tuple[str, ...]        # the members' tags
    scores: dict                    # every member's best held-out score then (None: none yet), by tag


def scores_of(members: list[Member]) -> dict:
    return {m.tag: m.best_score for m in members}


@dataclass(frozen=True)
class Halving:
    """Successive halving on the best held-out score, a rung every `after_versions` versions (see the module)."""

    after_versions: int

    def text(self) -> str:
        return (f"{HALVING}: once every member still training has {self.after_versions} more held-out version(s) "
                "evaluated, the worse half of them by best held-out score is stopped (ties at the cut are kept), "
                "until one is left")

    def waiting(self, members: list[Member], done_rungs: int) -> str:
        """What the next rung waits for, in words ("" when it is due or no rung is left)."""
        live = [m for m in members if m.live]
        if len(live) < 2:
            return ""
        need = self.after_versions * (done_rungs + 1)
        behind = [f"{m.tag} ({m.versions}/{need})" for m in live if m.versions < need]
        return f"rung {done_rungs + 1} waits for {need} versions each: " + ", ".join(behind) if behind else ""

    def decide(self, members: list[Member], done_rungs: int) -> Stop | None:
        """The stop the next rung makes now, or None (fewer than two members training, one still short of the
        rung's versions, or the cut falls within a tie)."""
        live = [m for m in members if m.live]
        rung = done_rungs + 1
        if self.after_versions <= 0 or len(live) < 2:
            return None
        if any(m.versions < self.after_versions * rung or m.best_score is None for m in live):
            return None
        ranked = rank(live)
        keep = math.ceil(len(live) / 2)
        cut = ranked[keep - 1].best_score
        stopped = tuple(m.tag for m in ranked[keep:] if m.best_score < cut)
        if not stopped:
            return None
        rule = (f"{HALVING}, rung {rung}: {self.after_versions * rung} held-out versions each, the worse half of "
                f"{len(live)} members stopped")
        return Stop(rule, rung, stopped, scores_of(members))


def done_rungs(events: list[dict]) -> int:
    """The highest halving rung already carried out, from the members' `sweep_stop` events."""
    rungs = [e["rung"] for e in events if e.get("event") == SWEEP_STOP and isinstance(e.get("rung"), int)]
    return max(rungs, default=0)
