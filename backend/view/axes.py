"""Where the charts' wall-time axis starts, one definition for the dashboard and Compare.

Wall time is minutes since the run's start, and a run starts when its spec was created (`RunSpec.created_at`, at
launch): the minutes include queueing, the model's download and vLLM's start-up, what the user waited, so runs
overlaid in Compare line up by it too. A spec.json without `created_at` (none this panel writes) starts at its first
logged step. Resource samples, which have no step, use the same start.
"""


def run_start(view) -> float:
    """The epoch second a run's wall-time axis counts from (0.0 while nothing says when it started)."""
    created = (view.spec or {}).get("created_at")
    if isinstance(created, (int, float)) and not isinstance(created, bool) and created > 0:
        return float(created)
    table = getattr(view, "table", None)
    times = table.times[:1] if table is not None else [r["time"] for r in view.metrics[:1] if "time" in r]
    return float(times[0]) if len(times) else 0.0


def wall_minutes(t: float, start: float) -> float:
    """Epoch second `t` on the wall-time axis of a run that started at `start`."""
    return round((t - start) / 60, 3)
