"""The ends a replica job reads and writes in its run's events: its trainers' (when it stops serving: an end event
newer than the replica's start, a heartbeat standing still, heartbeat.py) and its own (a server that exited by itself,
so that trainers waiting for replicas that will never come stop at once: `replicas_ended`).
"""

import json
import os

from ..job.attempt import ATTEMPT_ENV
from ..job.heartbeat import HeartbeatWatch
from ..layout import EVENTS_DIR, FRAGMENT_RE, REPLICA_WRITER, TRAINER_WRITER
from ..records import ATTEMPT, FAILED, REPLICA_ENDED, TRAINER_ENDS, write_event
from ..spec_file import read_fleet, read_spec


class TrainerEndWatch:
    """Reads the trainer's event fragments once each, and reports an end event newer than `since`."""

    def __init__(self, run_dir: str, since: float):
        self.folder = os.path.join(run_dir, EVENTS_DIR)
        self.since = since
        self.seen: set[str] = set()
        # A trainer job with attempts left starts again after a failure a retry may fix: then its heartbeat, not
        # its `failed` event, says whether it is gone. Its attempts since this replica started are counted.
        self.attempts = _attempts(run_dir)
        self.attempts_seen = 0

    def ended(self) -> str | None:
        try:
            names = sorted(os.listdir(self.folder))
        except FileNotFoundError:
            return None
        for name in names:
            match = FRAGMENT_RE.match(name)
            if not match or match.group("writer") != TRAINER_WRITER or name in self.seen:
                continue
            self.seen.add(name)
            with open(os.path.join(self.folder, name), "rb") as f:
                for line in f:
                    event = _event(line)
                    recent = event.get("time", 0) >= self.since
                    self.attempts_seen += recent and event.get("event") == ATTEMPT
                    if event.get("event") == FAILED and event.get("retry") is not False \
                            and 1 < self.attempts and self.attempts_seen < self.attempts:
                        continue
                    if event.get("event") in TRAINER_ENDS and event.get("time", 0) >= self.since:
                        return f"the trainer has {event['event']}"
        return None


class TrainersEndWatch:
    """Whether the trainers a replica serves have all ended: its run's one trainer, or every member's trainer of a
    sweep whose fleet it is (`--member-run-dir`). A member that ends (its end event, or its heartbeat standing still)
    leaves the fleet serving the others (`on_member_end(run_dir)` is called for it); the fleet stops once the last
    one has ended."""

    def __init__(self, run_dirs: list[str], since: float, on_member_end=lambda run_dir: None):
        self.watches = {run_dir: (TrainerEndWatch(run_dir, since), HeartbeatWatch(run_dir)) for run_dir in run_dirs}
        self.ended_why: dict[str, str] = {}
        self.on_member_end = on_member_end

    def ended(self) -> str | None:
        for run_dir, (events, heartbeat) in self.watches.items():
            if run_dir in self.ended_why:
                continue
            reason = events.ended() or heartbeat.gone()
            if reason:
                self.ended_why[run_dir] = reason
                serving = len(self.watches) - len(self.ended_why)
                if len(self.watches) > 1:
                    print(f"{os.path.basename(run_dir.rstrip('/'))}: {reason}; serving {serving} member(s) still",
                          flush=True)
                if len(self.watches) > 1 and serving:      # the last one's versions go with the servers
                    self.on_member_end(run_dir)
        if len(self.ended_why) < len(self.watches):
            return None
        if len(self.watches) == 1:
            return next(iter(self.ended_why.values()))
        return f"every member's trainer has ended ({len(self.watches)})"


def _attempts(run_dir: str) -> int:
    """The run's attempts per job (its spec.json's); a sweep's shared fleet has no spec.json, and its fleet.json says
    its replicas' (the members' setting): read as 1, a fleet replica's first failed end would read as its last, and
    every member would stop waiting for a replica about to be retried. 1 where neither can be read."""
    for read in (read_spec, read_fleet):
        try:
            attempts = read(run_dir).get("attempts", 1)
        except (OSError, ValueError):
            continue
        return attempts if isinstance(attempts, int) and not isinstance(attempts, bool) and attempts > 0 else 1
    return 1


def _event(line: bytes) -> dict:
    try:
        event = json.loads(line)
    except ValueError:
        return {}
    return event if isinstance(event, dict) and isinstance(event.get("time", 0), (int, float)) else {}


def record_own_end(run_dir: str, role: str, code: int, env=os.environ) -> None:
    """A server of this replica exited on its own: say so in the run's events, with whether the job has an attempt
    left (the local and Ray wrappers number their attempts; on HF Jobs this job's earlier ends are counted), so a
    trainer waiting for replicas that will never come stops at once (`replicas_ended`)."""
    writer = f"{REPLICA_WRITER}-{role}"
    number = env.get(ATTEMPT_ENV, "")
    attempt = int(number) if number.isdigit() else 1 + sum(e.get("role") == role for e in _replica_ends(run_dir))
    attempts = _attempts(run_dir)
    write_event(run_dir, writer, REPLICA_ENDED, role=role, code=code, attempt=attempt, attempts=attempts,
                last=attempt >= attempts)


def replicas_ended(run_dir: str, since: float = 0.0) -> dict[str, dict]:
    """Role -> the end event of each replica job that has ended for good (its last attempt's server exited on its
    own) since `since`."""
    return {e["role"]: e for e in _replica_ends(run_dir) if e.get("last") is True and e.get("time", 0) >= since}


def _replica_ends(run_dir: str) -> list[dict]:
    folder = os.path.join(run_dir, EVENTS_DIR)
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return []
    ends = []
    for name in names:
        match = FRAGMENT_RE.match(name)
        if not match or not match.group("writer").startswith(f"{REPLICA_WRITER}-"):
            continue
        try:
            with open(os.path.join(folder, name), "rb") as f:
                events = [_event(line) for line in f]
        except OSError:
            continue
        ends += [e for e in events if e.get("event") == REPLICA_ENDED and isinstance(e.get("role"), str)]
    return ends
