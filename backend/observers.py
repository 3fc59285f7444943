"""Incremental readers of what jobs write into the bucket. Each refresh reads only what is new.

Fragments are write-once JSONL files: a fully read fragment is never read again, and a fragment whose last
line is torn (a writer that appends, or a copy in progress) is re-read from the end of its last complete
line on the next refresh. A complete line that is not a record (not JSON, not an object, or refused by the
caller's check) is skipped and counted per fragment. Adapter folders are listed only once both adapter files
are present.
"""

import json
import posixpath
from collections.abc import Callable
from dataclasses import dataclass, field

from backend.runtime import layout
from backend.store import BucketStore, StoredFile


@dataclass
class FragmentCursor:
    """Which fragment files are done, and how far into each unfinished one we have read."""

    offsets: dict[str, int] = field(default_factory=dict)
    done: set[str] = field(default_factory=set)
    bad: dict[str, int] = field(default_factory=dict)     # fragment path -> lines skipped as unreadable


def read_new_records(store: BucketStore, folder: str, cursor: FragmentCursor,
                     check: Callable[[dict], bool] | None = None) -> list[tuple[str, dict]]:
    """(writer, record) pairs added under `folder` since `cursor`, in fragment order. A line that is not a JSON
    object, or that `check` refuses, is skipped and counted in `cursor.bad`."""
    out = []
    for f in store.list_files(folder):
        name = posixpath.basename(f.path)
        match = layout.FRAGMENT_RE.match(name)
        if not match or f.path in cursor.done:
            continue
        start = cursor.offsets.get(f.path, 0)
        if start >= f.size:
            continue
        data = store.read_bytes(f.path, start)
        end = data.rfind(b"\n") + 1
        for line in data[:end].splitlines():
            if not line.strip():
                continue
            record = _json_object(line)
            if record is None or (check is not None and not check(record)):
                cursor.bad[f.path] = cursor.bad.get(f.path, 0) + 1   # skipped, never fatal to the dashboard
                continue
            out.append((match.group("writer"), record))
        cursor.offsets[f.path] = start + end
        if start + end == f.size and end > 0:
            cursor.done.add(f.path)
            cursor.offsets.pop(f.path, None)
    return out


def _json_object(line: bytes) -> dict | None:
    try:
        record = json.loads(line)
    except ValueError:
        return None
    return record if isinstance(record, dict) else None


@dataclass(frozen=True)
class AdapterVersion:
    version: int
    name: str
    path: str              # relative to the bucket root
    step: int | None
    time: float
    size_bytes: int


def list_adapter_versions(store: BucketStore, run_id: str,
                          known: set[int] | frozenset = frozenset()) -> dict[int, AdapterVersion]:
    """Complete adapter versions in the run's `adapters/` and `.vllm_lora/` folders, by version number.

    Versions in `known` are skipped without reading their metadata again."""
    found: dict[int, AdapterVersion] = {}
    prefix = layout.run_prefix(run_id)
    for sub in (layout.ADAPTERS_DIR, layout.VLLM_LORA_DIR):
        for folder, files in _group_by_folder(store.list_files(f"{prefix}/{sub}")).items():
            match = layout.ADAPTER_NAME_RE.match(posixpath.basename(folder))
            names = {posixpath.basename(f.path) for f in files}
            if not match or not all(n in names for n in layout.ADAPTER_FILES):
                continue  # a temporary or half-written folder
            version = int(match.group(1))
            if version in found or version in known:
                continue
            found[version] = _adapter_version(store, folder, version, files)
    return found


def _adapter_version(store: BucketStore, folder: str, version: int, files: list[StoredFile]) -> AdapterVersion:
    meta = {}
    if any(f.path.endswith("/" + layout.ADAPTER_META_FILE) for f in files):
        try:
            meta = json.loads(store.read_bytes(f"{folder}/{layout.ADAPTER_META_FILE}"))
        except (OSError, ValueError):
            meta = {}
    size = sum(f.size for f in files if posixpath.basename(f.path) in layout.ADAPTER_FILES)
    return AdapterVersion(version=version, name=layout.adapter_name(version), path=folder, step=meta.get("step"),
                          time=meta.get("time") or max(f.mtime for f in files), size_bytes=size)


def _group_by_folder(files: list[StoredFile]) -> dict[str, list[StoredFile]]:
    groups: dict[str, list[StoredFile]] = {}
    for f in files:
        groups.setdefault(posixpath.dirname(f.path), []).append(f)
    return groups


def final_adapter_files(store: BucketStore, run_id: str) -> list[StoredFile]:
    """The final adapter's files, or [] until both adapter files are there."""
    files = store.list_files(f"{layout.run_prefix(run_id)}/{layout.FINAL_DIR}")
    names = {posixpath.basename(f.path) for f in files}
    return files if all(n in names for n in layout.ADAPTER_FILES) else []
