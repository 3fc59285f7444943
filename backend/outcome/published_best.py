"""A run's best version as the runs list shows it: from a view's held-out scores, or read cheaply from the
best.json the trainer (or the panel, on a change of rule) published."""

import json
from dataclasses import dataclass

from backend.outcome.held_out import HeldOut, finite_number, is_eval_record
from backend.runtime import layout
from backend.storage.store import BucketStore


@dataclass(frozen=True)
class PublishedBest:
    """A run's outcome as the runs list shows it: its best version and that version's held-out score under the run's
    rule, or that no version beats the base model (or neither: nothing evaluated yet)."""

    version: int | None = None
    score: float | None = None
    none_beats_base: bool = False

    @property
    def text(self) -> str:
        """'0.812 · v7', 'none beats base', or '' (no version evaluated yet)."""
        if self.version is not None:
            return (f"{self.score:.3f} · " if self.score is not None else "") + f"v{self.version}"
        return "none beats base" if self.none_beats_base else ""


def held_out_best(held: HeldOut) -> PublishedBest | None:
    """What a view's held-out scores say (None when it has read none): the ranking under the rule in force."""
    if not held.scores:
        return None
    best = held.best_version
    return PublishedBest(best, held.rule_score(best) if best is not None else None, held.none_beats_base)


def published_best(store: BucketStore, run_id: str) -> PublishedBest:
    """A run's best version as the trainer (or the panel, on a change of rule) published it, read cheaply: best.json
    (a few hundred bytes), whatever the number of versions evaluated. Without best/, either nothing beyond the base
    model was evaluated yet, or no version beats it (the trainer then publishes none and the panel removes it): told
    apart by whether the run's first evaluation fragment holds the base model (v0) and a later version was evaluated
    (in it, or a second fragment exists). Just after the first version that beats the base model is evaluated, until
    the trainer has republished best/ (a moment; a sync on HF Jobs), this says none does."""
    prefix = layout.run_prefix(run_id)
    try:
        best = json.loads(store.read_bytes(f"{prefix}/{layout.BEST_DIR}/{layout.BEST_FILE}"))
    except (OSError, ValueError, KeyError):
        best = None
    if isinstance(best, dict) and type(best.get("policy_version")) is int and best["policy_version"] >= 1:
        score = best.get("score")
        return PublishedBest(best["policy_version"], float(score) if finite_number(score) else None)
    first, second = (f"{prefix}/{layout.EVALS_DIR}/{layout.fragment_name(layout.TRAINER_WRITER, seq)}"
                     for seq in (0, 1))
    found = store.sizes([first, second])
    if first not in found:
        return PublishedBest()
    try:
        versions = [r["policy_version"] for r in layout.fragment_records(store.read_bytes(first))[0]
                    if r is not None and is_eval_record(r)]
    except (OSError, KeyError):
        return PublishedBest()
    later = second in found or any(v >= 1 for v in versions)
    return PublishedBest(none_beats_base=0 in versions and later)

