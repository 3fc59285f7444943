"""The adapter versions and the final adapter of a run, as jobs write them into the bucket: a folder is listed only
once both adapter files are present, and a download or a push takes only the files it ships."""

import json
import posixpath
from dataclasses import dataclass

from backend.runtime import layout
from backend.storage.store import BucketStore, StoredFile


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
            version = layout.adapter_version(posixpath.basename(folder))
            names = {posixpath.basename(f.path) for f in files}
            if version is None or not all(n in names for n in layout.ADAPTER_FILES):
                continue  # a temporary or half-written folder
            if version in found or version in known:
                continue
            found[version] = _adapter_version(store, folder, version, files)
    return found


def find_adapter_version(store: BucketStore, run_id: str, version: int, member: str = "") -> AdapterVersion | None:
    """Version `version` from its own folder in `adapters/` or `.vllm_lora/` (None unless both adapter files are
    there): a `sizes` call, and a listing of that one small folder once they are. `member`: the run's sweep tag."""
    prefix, name = layout.run_prefix(run_id), layout.adapter_name(version, member)
    for sub in (layout.ADAPTERS_DIR, layout.VLLM_LORA_DIR):
        folder = f"{prefix}/{sub}/{name}"
        if len(store.sizes([f"{folder}/{n}" for n in layout.ADAPTER_FILES])) == len(layout.ADAPTER_FILES):
            return _adapter_version(store, folder, version, store.list_files(folder))
    return None


def _adapter_version(store: BucketStore, folder: str, version: int, files: list[StoredFile]) -> AdapterVersion:
    meta = {}
    if any(f.path.endswith("/" + layout.ADAPTER_META_FILE) for f in files):
        try:
            meta = json.loads(store.read_bytes(f"{folder}/{layout.ADAPTER_META_FILE}"))
        except (OSError, ValueError):
            meta = {}
    size = sum(f.size for f in files if posixpath.basename(f.path) in layout.ADAPTER_FILES)
    return AdapterVersion(version=version, name=posixpath.basename(folder), path=folder, step=meta.get("step"),
                          time=meta.get("time") or max(f.mtime for f in files), size_bytes=size)


def _group_by_folder(files: list[StoredFile]) -> dict[str, list[StoredFile]]:
    groups: dict[str, list[StoredFile]] = {}
    for f in files:
        groups.setdefault(posixpath.dirname(f.path), []).append(f)
    return groups


def shipped(files: list[StoredFile]) -> list[StoredFile]:
    """The files of an adapter a download or a push takes (`layout.SHIPPED_ADAPTER_FILES`), nothing else."""
    return [f for f in files if posixpath.basename(f.path) in layout.SHIPPED_ADAPTER_FILES]


def adapter_folder_files(store: BucketStore, folder: str) -> list[StoredFile]:
    """The adapter's own files directly in `folder` (regular files: the store follows no link), nothing else."""
    return shipped([f for f in store.list_files(folder) if posixpath.dirname(f.path) == folder.strip("/")])


def final_adapter_files(store: BucketStore, run_id: str) -> list[StoredFile]:
    """The final adapter's files, or [] until both adapter files are there (asked for by name first: one cheap
    call while the run trains, a listing of the small folder once they are)."""
    folder = f"{layout.run_prefix(run_id)}/{layout.FINAL_DIR}"
    if len(store.sizes([f"{folder}/{name}" for name in layout.ADAPTER_FILES])) < len(layout.ADAPTER_FILES):
        return []
    files = adapter_folder_files(store, folder)
    names = {posixpath.basename(f.path) for f in files}
    return files if all(n in names for n in layout.ADAPTER_FILES) else []
