"""What the run view makes of one record it reads: which metric records it keeps, the reward band drawn beside the
reward, an event's time, and the trainer's 'started' events counted as they are read."""

from backend.runtime import records

STARTED_NONE: tuple[int, float | None] = (0, None)


def note_started(known: tuple[int, float | None], event: dict) -> tuple[int, float | None]:
    """(how many 'started' events, the newest one's time) with `event` counted: each attempt's trainer writes one
    as training begins (the alerts' start-up allowance). Kept as events are read: a tick never walks them all."""
    when = event.get("time")
    if event.get("event") != records.STARTED or not isinstance(when, (int, float)):
        return known
    count, newest = known
    return count + 1, when if newest is None else max(newest, when)


def _with_band(record: dict) -> dict:
    """The record (just read, ours to change) with `reward` +- `reward_std` as series of their own, so the band
    is drawn bounded too."""
    reward, std = record.get("reward"), record.get("reward_std")
    if _is_number(reward) and _is_number(std):
        record["reward_upper"], record["reward_lower"] = reward + std, reward - std
    return record


def _is_step_record(record: dict) -> bool:
    return not {"replicas", "canary", "adapter_load"} & set(record)


def _is_number(value) -> bool:
    return type(value) in (int, float)      # exactly: a bool is not a metric


def _is_metric_record(record: dict) -> bool:
    """A trainer's metric record (an integer step and numbers), a proxy's replica snapshot (a list of replicas),
    its serving proof (a canary record) or an adapter load's timings (a list of replicas)."""
    if "replicas" in record:
        return isinstance(record["replicas"], list) and all(isinstance(r, dict) for r in record["replicas"])
    if "canary" in record:
        canary = record["canary"]
        return isinstance(canary, dict) and isinstance(canary.get("replicas"), list)
    if "adapter_load" in record:
        load = record["adapter_load"]
        return (isinstance(load, dict) and isinstance(load.get("version"), str) and _is_number(record.get("time"))
                and isinstance(load.get("replicas"), list) and all(isinstance(r, dict) for r in load["replicas"]))
    step = record.get("step")
    return type(step) is int and step >= 0 and {type(v) for v in record.values()} <= {int, float}


def _event_time(record: dict) -> float:
    when = record.get("time")
    return float(when) if isinstance(when, (int, float)) and not isinstance(when, bool) else 0.0
