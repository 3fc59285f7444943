"""Which evaluated version is "best": the rule the user chose (`best_by`), applied the same way by the trainer (which
republishes `best/`) and by the panel (which shows the star, the header and the card).

A rule is a weighting of held-out rewards, `{name: weight}`, over the rewards' held-out means of an evaluation
record (runtime/trainer/evaluate.py). Any held-out reward can be named: a trained one or a monitor-only one (weight 0 in
training). The empty rule is the default: the trained rewards' weighted score, the record's own `score`.

The base model is version 0: evaluated before training, it is the baseline, never a candidate. The best version is
the highest-scoring version >= 1 under the rule, and it must beat version 0 where version 0 was evaluated; a tie
goes to the earliest version (the one with the fewest training steps behind it): `TIE_RULE`.

The rule in force is the launch spec's `best_by` until the user changes it on the run: the panel records each change
as a `best_by_changed` event (records.py), and the newest one wins. The trainer reads it back at each evaluation, so
a running trainer keeps `best/` under the rule the user chose last.

Standard library only: it runs in jobs.
"""

import json
import math
import os
import re

from .layout import EVENTS_DIR, FRAGMENT_RE, PANEL_WRITER
from .records import BEST_BY_CHANGED

BEST_BY_WRITER = f"{PANEL_WRITER}-best-by"     # the panel's writers of best_by_changed events: BEST_BY_WRITER.<hex>
EPSILON = 1e-9                                  # scores closer than this are equal (a tie)
TIE_RULE = "equal scores: the earliest version wins"
DEFAULT_RULE = "the trained rewards' weighted score"


def rule_text(best_by: dict[str, float]) -> str:
    """The rule in words: 'right_answer', '1 x right_answer + 0.5 x varied', or the default's description."""
    if not best_by:
        return DEFAULT_RULE
    if len(best_by) == 1 and next(iter(best_by.values())) == 1:
        return f"held-out {next(iter(best_by))}"
    return "held-out " + " + ".join(f"{w:g} x {n}" for n, w in best_by.items())


def parse_best_by(text: str) -> dict[str, float]:
    """'right_answer' or 'right_answer=1, varied=0.5' (a bare name weighs 1); '' is the default. ValueError says why."""
    out: dict[str, float] = {}
    for part in (p.strip() for p in str(text or "").replace("\n", ",").split(",")):
        if not part:
            continue
        name, _, weight = part.partition("=")
        name = name.strip()
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.-]{0,127}", name):
            raise ValueError(f"{part[:60]!r} is not a reward name (write e.g. right_answer or right_answer=1, "
                             "varied=0.5)")
        try:
            value = float(weight) if weight.strip() else 1.0
        except ValueError:
            raise ValueError(f"the weight of {name} is not a number: {weight.strip()[:30]!r}") from None
        if not math.isfinite(value):
            raise ValueError(f"the weight of {name} must be a finite number")
        out[name] = value
    return out


def best_by_problem(best_by: dict[str, float], held_out_rewards: list[str]) -> str | None:
    """Why `best_by` cannot rank this run's versions (None when it can): it must name held-out rewards only, and
    not weigh them all zero. The empty rule (the default) is always fine."""
    if not best_by:
        return None
    unknown = [n for n in best_by if n not in held_out_rewards]
    if unknown:
        known = ", ".join(held_out_rewards) or "none: the run has no held-out set"
        return f"no held-out reward named {', '.join(unknown)}; the held-out rewards are {known}"
    if all(w == 0 for w in best_by.values()):
        return "the weights are all zero: give at least one reward a non-zero weight"
    return None


def rule_score(record: dict, best_by: dict[str, float]) -> float | None:
    """A record's score under the rule: its own `score` for the default, else the weighted held-out means (None
    where a named reward was not scored, or gave no number)."""
    if not best_by:
        score = record.get("score")
        return float(score) if isinstance(score, (int, float)) and math.isfinite(score) else None
    rewards = record.get("rewards") if isinstance(record.get("rewards"), dict) else {}
    total = 0.0
    for name, weight in best_by.items():
        mean = (rewards.get(name) or {}).get("mean") if isinstance(rewards.get(name), dict) else None
        if not isinstance(mean, (int, float)) or not math.isfinite(mean):
            return None
        total += weight * mean
    return total


def pick_best(records: dict[int, dict], best_by: dict[str, float]) -> tuple[int | None, float | None]:
    """(the best version >= 1 under the rule, or None when none beats the base model / none was scored; version
    0's score under the rule, None when the base model was not evaluated). Ties: the earliest version."""
    return best_of({v: rule_score(r, best_by) for v, r in records.items()})


def best_of(scored: dict[int, float | None]) -> tuple[int | None, float | None]:
    """`pick_best` over versions already scored under the rule (version -> its score, None: not scored)."""
    baseline = scored.get(0)
    candidates = [(s, v) for v, s in scored.items() if v >= 1 and s is not None]
    if not candidates:
        return None, baseline
    top = max(s for s, _ in candidates)
    best = min(v for s, v in candidates if s >= top - EPSILON)
    if baseline is not None and top <= baseline + EPSILON:
        return None, baseline
    return best, baseline


def newest_best_by(run_dir: str) -> dict[str, float] | None:
    """The rule of the newest best_by_changed event in the run folder (None when the user never changed it)."""
    folder = os.path.join(run_dir, EVENTS_DIR)
    newest, rule = -math.inf, None
    try:
        names = [n for n in os.listdir(folder)
                 if (m := FRAGMENT_RE.match(n)) and m["writer"].startswith(BEST_BY_WRITER + ".")]
    except OSError:
        return None
    for name in names:
        try:
            with open(os.path.join(folder, name)) as f:
                lines = f.read().splitlines()
        except OSError:
            continue
        for line in lines:
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if (isinstance(event, dict) and event.get("event") == BEST_BY_CHANGED
                    and isinstance(event.get("best_by"), dict) and isinstance(event.get("time"), (int, float))
                    and event["time"] >= newest):
                newest, rule = event["time"], {str(k): float(v) for k, v in event["best_by"].items()
                                               if isinstance(v, (int, float))}
    return rule


def why_text(rule: dict, evaluated: int, baseline: float | None, metric: str) -> str:
    """'highest held-out right_answer of 6 evaluated versions (equal scores: the earliest version wins), above the
    base model's 0.125'."""
    label = rule_text(rule) if rule else f"held-out score ({metric})"
    why = f"highest {label} of {evaluated} evaluated versions ({TIE_RULE})"
    return why + (f", above the base model's {baseline:.3f}" if baseline is not None else "")


def best_json(record: dict, rule: dict, baseline: float | None, evaluated: int, metric: str) -> dict:
    """best.json: which version, its score under the rule, the rule, the base model's score, and why in words."""
    return {"policy_version": record["policy_version"], "step": record["step"], "score": rule_score(record, rule),
            "best_by": rule, "baseline": baseline, "why": why_text(rule, evaluated, baseline, metric)}
