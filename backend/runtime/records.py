"""The vocabulary of a run's records: every kind of event, what each one carries, and who writes it.

An event is one JSON object a line in `runs/<run_id>/events/<writer>-<seq>.jsonl` (`layout.py`):
`{"time": <unix seconds>, "event": <kind>, ...its fields}`. The jobs write some (the trainer), the panel others
(launch, budget, alerts), and both sides read them: this module is the one place a kind is named. Writers build
records with `event_record`, which refuses a kind declared nowhere here; readers compare with the names below, never
with a bare string (`tests/test_records.py` scans the code for one).

The "try it" and task-check workers answer the panel over their own channel (stdout, `check_protocol.py`); their
message kinds are declared here too, apart from the run's events: they never reach the bucket.

Standard library only: it runs in jobs.
"""

import os
import time
from dataclasses import dataclass

from .layout import EVENTS_DIR, PANEL_WRITER, REPLICA_WRITER, TRAINER_WRITER, FragmentWriter
from .redact import redact_record


@dataclass(frozen=True)
class EventShape:
    """What an event of one kind carries besides `time` and `event`, and who writes it."""

    writer: str                        # TRAINER_WRITER (the trainer job), PANEL_WRITER (a panel-* writer) or
                                       # REPLICA_WRITER (a replica job's replica-<role> writer)
    fields: tuple[str, ...]            # always there
    optional: tuple[str, ...] = ()     # there where they apply (a distributed run, a resumed one, ...)
    about: str = ""


# The run's events.
STARTED = "started"
ENGINE = "engine"
ATTEMPT = "attempt"
ADAPTER_PUBLISHED = "adapter_published"
ADAPTERS_SUPERSEDED = "adapters_superseded"
FINISHED = "finished"
FAILED = "failed"
CANCELED = "canceled"
ALERT = "alert"
ALERT_CLEARED = "alert_cleared"
BUDGET_CAP = "budget_cap"
LAUNCH_FAILED = "launch_failed"
REPLICA_ENDED = "replica_ended"
BEST_BY_CHANGED = "best_by_changed"
SWEEP_STOP = "sweep_stop"

# What an adapter version's `version.json` holds; an event about a version carries it too.
VERSION_FIELDS = ("version", "step", "size_bytes")

EVENTS: dict[str, EventShape] = {
    ATTEMPT: EventShape(
        TRAINER_WRITER, ("role",), ("attempt",),
        "a trainer job's attempt begins (`attempt`: its number, where the executor counts them)"),
    STARTED: EventShape(
        TRAINER_WRITER, ("step", "max_steps"), (),
        "an attempt's training begins, at `step`"),
    ENGINE: EventShape(
        TRAINER_WRITER, ("engine",), ("replicas", "healthy", "proxy_url"),
        "what generates the rollouts, in words; a distributed run's replicas and the proxy's address"),
    ADAPTER_PUBLISHED: EventShape(
        TRAINER_WRITER, ("name", *VERSION_FIELDS), ("path",),
        "an adapter version was published (`path`: where, when not adapters/<name>)"),
    ADAPTERS_SUPERSEDED: EventShape(
        TRAINER_WRITER, ("names", "resumed_from_step"), (),
        "versions a resume discarded: published past the checkpoint it resumed from"),
    FINISHED: EventShape(
        TRAINER_WRITER, ("final", *VERSION_FIELDS), ("name",),
        "training ended; final/ holds the last adapter"),
    FAILED: EventShape(
        TRAINER_WRITER, ("error",), ("retry", "traceback", "code_traceback"),
        "training failed (`retry` False: a retry cannot fix it, the next attempt stops at once)"),
    CANCELED: EventShape(
        TRAINER_WRITER, ("error",), (),
        "the trainer was stopped by SIGTERM: cancelled, timed out or preempted"),
    ALERT: EventShape(
        PANEL_WRITER, ("kind", "key", "message"), (),
        "an alert condition began (`key` names it)"),
    ALERT_CLEARED: EventShape(
        PANEL_WRITER, ("key",), (),
        "the alert of `key` no longer holds"),
    BUDGET_CAP: EventShape(
        PANEL_WRITER, ("reason", "budget_usd", "spent_usd", "projected_usd", "cancelled"), (),
        "the budget cap stopped the run (`cancelled`: the job ids)"),
    LAUNCH_FAILED: EventShape(
        PANEL_WRITER, ("message", "known"), (),
        "a launch failed part way (`known`: the job ids it had started, cancelled since)"),
    REPLICA_ENDED: EventShape(
        REPLICA_WRITER, ("role", "code", "attempt", "attempts", "last"), (),
        "a replica job's vLLM server exited on its own (not stopped with the trainer); `last`: no attempt of the "
        "job is left, the replica has ended for good"),
    BEST_BY_CHANGED: EventShape(
        PANEL_WRITER, ("best_by", "previous", "version"), ("rule",),
        "the user changed which held-out score decides the best version (`best_by`: {reward: weight}, {} for the "
        "trained rewards' weighted score; `version`: the best under it, None when none beats the base model; "
        "best/ was republished)"),
    SWEEP_STOP: EventShape(
        TRAINER_WRITER, ("sweep_id", "member", "rule", "scores", "cancelled"), ("rung", "ordered_at"),
        "a sweep's member stopped early, by hand or by the sweep's stated rule: its trainer obeyed its stop order "
        "(runtime/trainer/sweep_stops.py; `ordered_at`: the order's time) and ends as at its last step, or (a panel's "
        "writer, before stop orders) its jobs were cancelled (`rule`: in words; `scores`: every member's best "
        "held-out score then, by tag; `rung`: the successive halving's step; `cancelled`: job ids, [] for an "
        "order obeyed)"),
}

# A trainer attempt's start and ends: the newest of them says where the trainer stands.
TRAINER_ENDS = (FINISHED, FAILED, CANCELED)
TRAINER_STAGES = (STARTED, *TRAINER_ENDS)

# The task check's messages (runtime/check/check_task.py -> backend/task/check.py).
CHECK_DATA = "data"
CHECK_SAMPLES = "samples"
CHECK_CALLING = "calling"
CHECK_IMPORTED = "imported"
CHECK_SCORES = "scores"
CHECK_SKIPPED = "skipped"
CHECK_FAILED = "failed"
CHECK_DONE = "done"
CHECK_MESSAGES = frozenset({CHECK_DATA, CHECK_SAMPLES, CHECK_CALLING, CHECK_IMPORTED, CHECK_SCORES, CHECK_SKIPPED,
                            CHECK_FAILED, CHECK_DONE})

# "Try it" on CPU's messages (runtime/check/try_adapter.py -> backend/outcome/try_it.py).
TRY_LOADING = "loading"
TRY_LOADED = "loaded"
TRY_ANSWER = "answer"
TRY_ERROR = "error"
TRY_DONE = "done"
TRY_MESSAGES = frozenset({TRY_LOADING, TRY_LOADED, TRY_ANSWER, TRY_ERROR, TRY_DONE})


class UndeclaredKind(ValueError):
    """An event of a kind this module does not declare: a writer's mistake, refused before anything is written."""


def event_record(kind: str, /, **fields) -> dict:
    """One event, ready to write: dated now unless `fields` carry a `time`, its text masked (an error message can
    quote a token). Refuses a kind not in EVENTS. The kind is positional only: an alert has a field named `kind`.
    (The writers' fields are held to each kind's shape by tests/test_records.py, not here: a trainer must not fail
    over a missing field of an event.)"""
    if kind not in EVENTS:
        raise UndeclaredKind(f"event kind {kind!r} is not declared in runtime/records.py (declared: "
                             f"{', '.join(sorted(EVENTS))})")
    return redact_record({"time": time.time(), "event": kind, **fields})


def write_event(run_dir: str, writer: str, kind: str, /, **fields) -> None:
    """One event as its own fragment of `run_dir`'s events (`event_record`)."""
    FragmentWriter(os.path.join(run_dir, EVENTS_DIR), writer).write([event_record(kind, **fields)])
