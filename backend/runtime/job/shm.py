"""Shared memory a job leaves behind. vLLM's processes (and torch's tensors shared between processes) keep segments in
/dev/shm that only the process that made them unlinks: a SIGKILLed replica left ~419 MB there, which nothing
freed until the machine restarted. The job wrapper notes every segment the job's processes hold (mapped or open),
in DIR/shm.json as soon as it sees one, and removes those still there once the job's processes are gone and no
other process holds them; an executor whose wrapper was killed removes them from the same file.

Standard library only (and psutil, which the wrapper already needs).
"""

import json
import os

import psutil

from ..layout import atomic_write_bytes

SHM_DIR = "/dev/shm"
SHM_FILE = "shm.json"


def held_segments(pids: list[int]) -> set[str]:
    """The /dev/shm files these processes map or hold open (not the ones already unlinked)."""
    held = set()
    for pid in pids:
        held |= _mapped(pid) | _open(pid)
    return held


def _mapped(pid: int) -> set[str]:
    try:
        with open(f"/proc/{pid}/maps") as f:
            lines = f.read().splitlines()
    except OSError:
        return set()
    paths = (line.split(maxsplit=5)[5] for line in lines if f" {SHM_DIR}/" in line)
    return {path for path in paths if path.startswith(f"{SHM_DIR}/") and not path.endswith(" (deleted)")}


def _open(pid: int) -> set[str]:
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return set()
    held = set()
    for fd in fds:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith(f"{SHM_DIR}/") and not target.endswith(" (deleted)"):
            held.add(target)
    return held


def process_tree(pid: int) -> list[int]:
    try:
        root = psutil.Process(pid)
        return [pid, *(child.pid for child in root.children(recursive=True))]
    except psutil.Error:
        return []


class ShmTracker:
    """The segments a job's processes were seen holding, kept in `record` (a JSON list) as they are found."""

    def __init__(self, record: str):
        self.record = record
        self.seen: set[str] = set(_read(record))

    def scan(self, pid: int) -> None:
        """Note what the process tree under `pid` holds now."""
        new = held_segments(process_tree(pid)) - self.seen
        if new:
            self.seen |= new
            atomic_write_bytes(self.record, json.dumps(sorted(self.seen)).encode())

    def remove_left(self) -> list[str]:
        """Remove the noted segments that outlived the job's processes; return them."""
        return remove_left(self.record)


def remove_left(record: str) -> list[str]:
    """Remove each segment named in `record` that is still there, is this user's, and no live process holds;
    return the ones removed. Call once the job's own processes are gone."""
    left = [path for path in _read(record) if _ours(path)]
    if not left:
        return []
    held = held_segments(psutil.pids())
    removed = []
    for path in left:
        if path in held:
            continue
        try:
            os.unlink(path)
            removed.append(path)
        except OSError:
            pass
    return removed


def _ours(path: str) -> bool:
    """A plain file directly in /dev/shm owned by this user (a record names nothing else to remove)."""
    if os.path.dirname(path) != SHM_DIR:
        return False
    try:
        stat = os.lstat(path)
    except OSError:
        return False
    return stat.st_uid == os.getuid() and os.path.isfile(path) and not os.path.islink(path)


def _read(record: str) -> list[str]:
    try:
        with open(record) as f:
            paths = json.load(f)
    except (OSError, ValueError):
        return []
    return [p for p in paths if isinstance(p, str)] if isinstance(paths, list) else []
