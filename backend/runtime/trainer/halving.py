"""Successive halving, the sweep's stated early-stop rule, as a pure decision over its members.

    stop = Halving(after_versions=2).decide(members, done_rungs=0)    # None, or who to stop and why

Once every member still training has K·r held-out versions evaluated (r = 1, 2, ...: the rung), the worse half of them
(⌊n/2⌋ of n) by best held-out score is stopped, until one is left. A rung waits for a member still training without
enough versions (it may yet catch up); a member that ended (failed, cancelled, completed, or already told to stop)
takes no part. Members tied at the cut are all kept: the rule stops fewer rather than choose between equal scores by
chance, and the rung is tried again as versions come.

Here, not in the panel, because the members' trainers carry it out with no page open (`sweep_stops.py`); the panel's
Sweep tab shows the same decision (`backend/view/sweep.py`). A member is anything with `tag`, `live`, `versions`,
`best_score` and `order` (its place in the sweep). Standard library only: it runs in jobs.
"""

import math
from dataclasses import dataclass

HALVING = "successive halving"


def rank(members: list) -> list:
    """Best first: by best held-out score (higher is better), members without a score yet after those with one,
    ties by more versions evaluated, then by the member's place in the sweep."""
    return sorted(members, key=lambda m: (m.best_score is None, -(m.best_score or 0.0), -m.versions, m.order))


def scores_of(members: list) -> dict:
    return {m.tag: m.best_score for m in members}


@dataclass(frozen=True)
class Stop:
    """A decision to stop members, with what decided it (each stopped member's stop order and `sweep_stop` event)."""

    rule: str                       # the rule in words
    rung: int | None                # the halving's rung; None by hand
    stopped: tuple[str, ...]        # the members' tags
    scores: dict                    # every member's best held-out score then (None: none yet), by tag


@dataclass(frozen=True)
class Halving:
    """Successive halving on the best held-out score, a rung every `after_versions` versions (see the module)."""

    after_versions: int

    def text(self) -> str:
        return (f"{HALVING}: once every member still training has {self.after_versions} more held-out version(s) "
                "evaluated, the worse half of them by best held-out score is stopped (ties at the cut are kept), "
                "until one is left")

    def waiting(self, members: list, done_rungs: int) -> str:
        """What the next rung waits for, in words ("" when it is due or no rung is left)."""
        live = [m for m in members if m.live]
        if len(live) < 2:
            return ""
        need = self.after_versions * (done_rungs + 1)
        behind = [f"{m.tag} ({m.versions}/{need})" for m in live if m.versions < need]
        return f"rung {done_rungs + 1} waits for {need} versions each: " + ", ".join(behind) if behind else ""

    def decide(self, members: list, done_rungs: int) -> Stop | None:
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
