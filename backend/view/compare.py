"""Compare runs: the same metric of several runs on one x-axis (step, wall time or dollars), and the settings
that differ between them. A view over several RunViews; every series is down-sampled to a bounded number of
points (the dashboard's `Sketch`), so comparing long runs costs what comparing short ones does.
"""

import dataclasses
import hashlib
import math
from collections.abc import Callable

from backend.plan.spec import RunSpec
from backend.runtime.best_rule import rule_text
from backend.storage.series import Sketch
from backend.view.axes import wall_minutes
from backend.view.runview import reading

X_AXES = ("step", "wall time", "dollars")
IDENTITY_FIELDS = ("run_id", "created_at")       # always differ; they name the runs, they are not settings
# What a comparison plots: a title and the metric keys to try, in order (the first one a run logged is used).
COMPARED = {
    "reward": ("Reward", ("reward",)),
    "staleness": ("Staleness (policy versions)", ("staleness_mean",)),
    "ratio": ("Importance ratio", ("ratio",)),
    "step_time": ("Step time (s)", ("step_time",)),
    "throughput": ("Throughput (tokens/s)", ("tokens_per_s", "gen_tokens_per_s", "train_tokens_per_s")),
}


def metric_points(view, key: str, x: str = "step") -> tuple[list[float], list[float]]:
    """One metric of a run, down-sampled: (x, y) with x the step, or the epoch time for the other axes."""
    by = "step" if x == "step" else "time"
    table = getattr(view, "table", None)
    if table is not None:
        with reading(view):
            sketch = table.sketch(key, by)
            return sketch.points() if sketch is not None else ([], [])
    sketch = Sketch()
    for record in view.metrics:
        xv, yv = record.get(by), record.get(key)
        if _number(xv) and _number(yv):
            sketch.append(float(xv), float(yv))
    return sketch.points()


HELD_OUT_TITLE = "Held-out score by version (each run's best-by rule; v0: the base model)"
BEST_HEADERS = ["run", "best by", "base model (v0)", "best version", "its held-out score", "versions evaluated"]


def held_out_points(view, x: str = "step") -> tuple[list[float], list[float]]:
    """Each evaluated version's held-out score under the run's own best-by rule, the base model (v0) first,
    down-sampled like every compared series: (x, y) with x the version's step, or its record's epoch time for
    the other axes. Empty for a run that was never evaluated."""
    held = getattr(view, "held_out", None)
    if held is None:
        return [], []
    sketch = Sketch()
    with reading(view):
        for version in sorted(held.scores):
            score = held.rule_score(version)
            xv = held.scores[version].step if x == "step" else held.records.get(version, {}).get("time")
            if score is not None and _number(xv):
                sketch.append(float(xv), float(score))
    return sketch.points()


def best_row(run_id: str, view) -> list[str] | None:
    """The run's outcome as the Compare tab lists it: its rule, the base model's score, its best version and
    score (or that none beats the base model); None for a run that was never evaluated."""
    held = getattr(view, "held_out", None)
    if held is None or not held.scores:
        return None
    with reading(view):
        best, baseline = held.best_version, held.baseline
        rule, evaluated = rule_text(held.rule), held.evaluated
        best_score = held.rule_score(best) if best is not None else None
    shown = f"v{best}" if best is not None else ("none beats the base model" if held.none_beats_base else "-")
    return [run_id, rule, _score(baseline), shown, _score(best_score), str(evaluated)]


def best_point(view, x: str = "step") -> tuple[float, float, int] | None:
    """(x, score, version) of the run's best version under its rule, None where none is chosen."""
    held = getattr(view, "held_out", None)
    if held is None:
        return None
    with reading(view):
        best = held.best_version
        if best is None or best not in held.scores:
            return None
        xv = held.scores[best].step if x == "step" else held.records.get(best, {}).get("time")
        score = held.rule_score(best)
    return (float(xv), float(score), best) if _number(xv) and score is not None else None


def _score(value) -> str:
    return "-" if value is None else f"{value:.3f}"


def first_key(view, keys: tuple[str, ...]) -> str | None:
    """The first of `keys` this run logged."""
    table = getattr(view, "table", None)
    logged = set(table.columns) if table is not None else {k for r in view.metrics[-5:] for k in r}
    return next((k for k in keys if k in logged), None)


def on_axis(xs: list[float], x: str, start: float, cost_at: Callable[[float], float] | None) -> list[float] | None:
    """Step or epoch-time x values on the chosen axis: the step, minutes since the run's start (`axes.run_start`),
    or the dollars the run had spent by then. None on the dollars axis for a run that costs nothing (a local run)."""
    if x == "step":
        return list(xs)
    if x == "wall time":
        return [wall_minutes(t, start) for t in xs]
    if cost_at is None:
        return None
    return [cost_at(t) for t in xs]


def config_diff(specs: dict[str, dict]) -> list[list[str]]:
    """Rows [field, value in run 1, value in run 2, ...] of the settings that differ, in RunSpec's order. A field a
    spec.json lacks (written by an older panel) counts as its default."""
    defaults = {f.name: _default(f) for f in dataclasses.fields(RunSpec)}
    fields = [name for name in defaults if name not in IDENTITY_FIELDS]
    fields += sorted({k for s in specs.values() for k in s} - set(defaults) - set(IDENTITY_FIELDS))
    rows = []
    for name in fields:
        values = [spec.get(name, defaults.get(name)) for spec in specs.values()]
        if any(v != values[0] for v in values[1:]):
            rows.append([name, *(_shown(v) for v in values)])
    return rows


def _default(f: dataclasses.Field):
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None


def _shown(value) -> str:
    if isinstance(value, str) and "\n" in value:
        digest = hashlib.sha256(value.encode()).hexdigest()[:8]
        return f"{len(value.splitlines())} lines (sha256 {digest})"
    if isinstance(value, list):
        return ", ".join(map(str, value))
    if isinstance(value, dict):
        return ", ".join(f"{k}={v}" for k, v in sorted(value.items()))
    return str(value)


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
