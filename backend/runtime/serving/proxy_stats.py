"""What the proxy records into the run's metrics folder for the dashboard: replica snapshots (health, load,
adapters) as write-once fragments, flushed at once on a change of health or adapters, and one record per broadcast
adapter load of how long each replica took (the Sync chart).
"""

import os
import time

from ..layout import FRAGMENT_RE, LOADS_WRITER, PROXY_WRITER, FragmentWriter, fragment_name, fragment_records
from .replicas import RUN_COUNTS, Replica


class StatsRecorder:
    """Turns changed replica snapshots into write-once fragments: buffered, and flushed at once when a
    replica's health or adapter set changes, since that is what the panel must show promptly."""

    def __init__(self, folder: str, interval_s: float, flush_s: float):
        self.writer = FragmentWriter(folder, PROXY_WRITER)
        self.interval_s = interval_s
        self.flush_s = flush_s
        self.pending: list[dict] = []
        self.last: list[dict] | None = None
        self.last_members: dict | None = None
        self.last_flush = time.monotonic()

    def sample(self, replicas: list[Replica], force: bool = False, members: dict | None = None) -> None:
        """`members`: a sweep member's proxy's traffic by member (proxy_members.py), recorded beside the replicas."""
        snapshot = [r.snapshot() for r in replicas]
        if snapshot != self.last or (members and members != self.last_members):
            structural = self.last is None or _structure(snapshot) != _structure(self.last)
            record = {"time": time.time(), "replicas": snapshot}
            self.pending.append({**record, "members": members} if members else record)
            self.last, self.last_members = snapshot, members
            force = force or structural
        if self.pending and (force or time.monotonic() - self.last_flush >= self.flush_s):
            self.writer.write(self.pending)
            self.pending = []
            self.last_flush = time.monotonic()


class LoadRecorder:
    """One record per broadcast load: each replica's seconds from sending the load to its answer (retries for a
    path not yet visible included), and that answer's status; a replica that did not answer has neither."""

    def __init__(self, folder: str):
        self.writer = FragmentWriter(folder, LOADS_WRITER)

    def record(self, name: str, replicas: list[Replica], live: list[Replica], timed: list) -> None:
        """`timed`: per replica of `live`, (its Reply, seconds) or the exception its load raised."""
        entries = []
        for replica, result in zip(live, timed):
            entry = {"index": replicas.index(replica), "url": replica.url}
            if not isinstance(result, BaseException):
                entry.update(seconds=round(result[1], 4), status=result[0].status)
            entries.append(entry)
        self.writer.write([{"time": time.time(), "adapter_load": {"version": name, "replicas": entries}}])


def _structure(snapshot: list[dict]) -> list:
    """What the panel must see at once: health, adapters, and the run's counts (a proxy killed before its next
    flush must not lose a restart or a canary miss: the next proxy carries the counts on from the last snapshot)."""
    return [(r["healthy"], r["adapters"], *(r.get(count) for count in RUN_COUNTS)) for r in snapshot]


def carry_counts(replicas: list[Replica], folder: str) -> None:
    """Go on from the run's counts in the last snapshot a proxy wrote to `folder` (the trainer ran before: a retry,
    a resume): each replica by its URL, else by its place when the replicas are as many (a resume's new jobs)."""
    last = last_snapshot(folder)
    by_url = {r.get("url"): r for r in last if isinstance(r, dict)}
    for i, replica in enumerate(replicas):
        before = by_url.get(replica.url) or (last[i] if len(last) == len(replicas) else None)
        for count in RUN_COUNTS if isinstance(before, dict) else ():
            if isinstance(before.get(count), int) and before[count] >= 0:
                setattr(replica, count, before[count])


def last_snapshot(folder: str) -> list:
    """The replicas of the newest snapshot in the proxy's fragments in `folder` ([] where there is none)."""
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    matches = [m for m in map(FRAGMENT_RE.match, names) if m and m.group("writer") == PROXY_WRITER]
    seqs = sorted((int(m.group("seq")) for m in matches), reverse=True)
    for seq in seqs:        # newest first; an unreadable fragment gives way to the one before it
        try:
            with open(os.path.join(folder, fragment_name(PROXY_WRITER, seq)), "rb") as f:
                records, _end = fragment_records(f.read())
        except OSError:
            continue
        for record in reversed(records):
            if record is not None and isinstance(record.get("replicas"), list):
                return record["replicas"]
    return []
