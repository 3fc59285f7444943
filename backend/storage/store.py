"""Bucket stores: list/read/write over a run bucket, either a local folder or the Hub bucket API.

Paths are always relative to the bucket root and use "/" (e.g. "runs/<run_id>/metrics/trainer-000000.jsonl").
Writers write each file once; readers list and keep their own cursors (see `backend.storage.observers`).
"""

import os
import shutil
from dataclasses import dataclass
from typing import Protocol

from backend.runtime.layout import atomic_write_bytes


@dataclass(frozen=True)
class StoredFile:
    path: str       # relative to the bucket root
    size: int
    mtime: float


class BucketStore(Protocol):
    def ensure_bucket(self) -> None:
        """Create the bucket if it does not exist yet."""

    def list_files(self, prefix: str) -> list[StoredFile]:
        """Every file under `prefix` (recursive), sorted by path."""

    def sizes(self, paths: list[str]) -> dict[str, int]:
        """The size of each of `paths` that exists (one call, whatever their number): a cheap "anything new?"."""

    def read_bytes(self, path: str, start: int = 0) -> bytes:
        """The file's bytes from offset `start`."""

    def prefetch(self, paths: list[str]) -> None:
        """Make the next reads of `paths` cheap: one batch download on the Hub (instead of one per file), nothing
        for a folder. A path that is not there is left for its read to report."""

    def write_bytes(self, path: str, data: bytes) -> None:
        """Write a whole file at once (atomic where the backend allows)."""

    def upload_folder(self, local_dir: str, prefix: str) -> None: ...

    def delete_folder(self, prefix: str) -> None:
        """Delete every file under the folder `prefix` (not the bucket root)."""


class FolderStore:
    """A bucket that is a local folder: local runs, or a bucket mounted into the Space as a volume."""

    def __init__(self, root: str):
        self.root = os.path.abspath(root)
        os.makedirs(self.root, exist_ok=True)

    def ensure_bucket(self) -> None:
        os.makedirs(self.root, exist_ok=True)

    def local_path(self, path: str) -> str:
        full = os.path.abspath(os.path.join(self.root, path))
        if full != self.root and not full.startswith(self.root + os.sep):
            raise ValueError(f"path {path!r} escapes the bucket")
        return full

    def list_files(self, prefix: str) -> list[StoredFile]:
        out: list[StoredFile] = []
        start = prefix.strip("/")
        self._walk(self.local_path(start), start, out)
        return sorted(out, key=lambda f: f.path)

    def _walk(self, folder: str, rel: str, out: list[StoredFile]) -> None:
        try:
            entries = list(os.scandir(folder))
        except (FileNotFoundError, NotADirectoryError):
            return
        for entry in entries:
            path = f"{rel}/{entry.name}" if rel else entry.name
            try:
                if entry.is_dir(follow_symlinks=False):
                    self._walk(entry.path, path, out)
                else:
                    st = entry.stat()
                    out.append(StoredFile(path, st.st_size, st.st_mtime))
            except FileNotFoundError:
                continue  # renamed or removed while we walked

    def sizes(self, paths: list[str]) -> dict[str, int]:
        out = {}
        for path in paths:
            try:
                out[path] = os.stat(self.local_path(path)).st_size
            except FileNotFoundError:
                continue
        return out

    def read_bytes(self, path: str, start: int = 0) -> bytes:
        with open(self.local_path(path), "rb") as f:
            f.seek(start)
            return f.read()

    def prefetch(self, paths: list[str]) -> None:
        pass    # reads are local already

    def write_bytes(self, path: str, data: bytes) -> None:
        atomic_write_bytes(self.local_path(path), data)

    def delete_folder(self, prefix: str) -> None:
        folder = self.local_path(prefix.strip("/") or ".")
        if folder == self.root:
            raise ValueError("refusing to delete the whole bucket")
        shutil.rmtree(folder, ignore_errors=True)

    def upload_folder(self, local_dir: str, prefix: str) -> None:
        dest = self.local_path(prefix)
        shutil.copytree(local_dir, dest, dirs_exist_ok=True,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
