"""Bucket stores: list/read/write over a run bucket, either a local folder or the Hub bucket API.

Paths are always relative to the bucket root and use "/" (e.g. "runs/<run_id>/metrics/trainer-000000.jsonl").
Writers write each file once; readers list and keep their own cursors (see `backend.storage.observers`).
"""

import contextlib
import os
import secrets
import shutil
import stat
from dataclasses import dataclass
from typing import Protocol


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
    """A bucket that is a local folder: local runs, or a bucket mounted into the Space as a volume.

    A run's own jobs write this folder, so it may hold links they planted (to /etc/passwd, to another visitor's
    run, to the panel's secrets). The store never follows one below its root: every path is walked from the root
    one folder at a time with O_NOFOLLOW (a link, or a path that climbs out, is not there), only regular files are
    listed, read or sized, and writes and deletions go through real folders only. The root itself is the operator's
    to choose and may be a link."""

    def __init__(self, root: str):
        self.root = os.path.abspath(root)
        os.makedirs(self.root, exist_ok=True)

    def ensure_bucket(self) -> None:
        os.makedirs(self.root, exist_ok=True)

    def local_path(self, path: str) -> str:
        """The path on this machine (lexically inside the root; what it holds is read through the store)."""
        return os.path.join(self.root, *_parts(path))

    def list_files(self, prefix: str) -> list[StoredFile]:
        out: list[StoredFile] = []
        parts = _parts(prefix)
        try:
            fd = self._open_folder(parts)
        except OSError:
            return []     # not there, not a folder, or reached through a link
        try:
            self._walk(fd, "/".join(parts), out)
        finally:
            os.close(fd)
        return sorted(out, key=lambda f: f.path)

    def _walk(self, fd: int, rel: str, out: list[StoredFile]) -> None:
        with os.scandir(fd) as entries:
            for entry in entries:
                path = f"{rel}/{entry.name}" if rel else entry.name
                try:
                    st = entry.stat(follow_symlinks=False)
                    if stat.S_ISREG(st.st_mode):
                        out.append(StoredFile(path, st.st_size, st.st_mtime))
                    elif stat.S_ISDIR(st.st_mode):
                        sub = os.open(entry.name, _FOLDER, dir_fd=fd)
                        try:
                            self._walk(sub, path, out)
                        finally:
                            os.close(sub)
                except OSError:
                    continue  # renamed or removed while we walked, or swapped for a link
                # anything else (a link, a FIFO, a device) is not a file of the bucket

    def sizes(self, paths: list[str]) -> dict[str, int]:
        out, folders = {}, {}      # each folder opened once per call (a tick asks for many files of a few)
        try:
            for path in paths:
                *folder, name = _parts(path) or [""]
                key = tuple(folder)
                try:
                    if key not in folders:
                        folders[key] = None
                        folders[key] = self._open_folder(folder)
                    if folders[key] is None:
                        continue
                    st = os.stat(name, dir_fd=folders[key], follow_symlinks=False)
                except OSError:
                    continue
                if stat.S_ISREG(st.st_mode):
                    out[path] = st.st_size
        finally:
            for fd in folders.values():
                if fd is not None:
                    os.close(fd)
        return out

    def read_bytes(self, path: str, start: int = 0) -> bytes:
        with self._open_file(path) as f:
            f.seek(start)
            return f.read()

    def prefetch(self, paths: list[str]) -> None:
        pass    # reads are local already

    def write_bytes(self, path: str, data: bytes, mode: int = 0o600) -> None:
        """Write the whole file under a temporary name, then rename it into place (both in a real folder)."""
        *folder, name = _parts(path)
        fd = self._open_folder(folder, create=True)
        tmp = f"_tmp{secrets.token_hex(8)}"
        try:
            out = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                          dir_fd=fd)
            try:
                with os.fdopen(out, "wb") as f:
                    f.write(data)
                    os.fchmod(f.fileno(), mode)
                os.replace(tmp, name, src_dir_fd=fd, dst_dir_fd=fd)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp, dir_fd=fd)
                raise
        finally:
            os.close(fd)

    def delete_folder(self, prefix: str) -> None:
        *parent, name = _parts(prefix) or [""]
        if not name:
            raise ValueError("refusing to delete the whole bucket")
        try:
            fd = self._open_folder(parent)
        except OSError:
            return
        try:
            # rmtree with dir_fd removes a link itself (never what it points to) and walks real folders only.
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            if stat.S_ISDIR(st.st_mode):
                shutil.rmtree(name, dir_fd=fd, ignore_errors=True)
            else:
                os.unlink(name, dir_fd=fd)
        except FileNotFoundError:
            pass
        finally:
            os.close(fd)

    def upload_folder(self, local_dir: str, prefix: str) -> None:
        base = "/".join(_parts(prefix))
        for folder, dirs, files in os.walk(local_dir):
            dirs[:] = [d for d in dirs if d != "__pycache__"]
            rel = os.path.relpath(folder, local_dir)
            for name in files:
                if not name.endswith(".pyc"):
                    with open(os.path.join(folder, name), "rb") as f:     # the panel's own files: as they are
                        self.write_bytes("/".join(p for p in (base, rel, name) if p and p != "."), f.read(),
                                         stat.S_IMODE(os.fstat(f.fileno()).st_mode))

    # ---- walking from the root, one real folder at a time
    def _open_folder(self, parts: list[str], create: bool = False) -> int:
        """A descriptor of the folder `parts` below the root, each step a real folder (OSError otherwise)."""
        fd = os.open(self.root, _FOLDER & ~os.O_NOFOLLOW)
        try:
            for part in parts:
                if create:
                    with contextlib.suppress(FileExistsError):
                        os.mkdir(part, 0o755, dir_fd=fd)
                sub = os.open(part, _FOLDER, dir_fd=fd)
                os.close(fd)
                fd = sub
        except BaseException:
            os.close(fd)
            raise
        return fd

    def _open_file(self, path: str):
        """The regular file at `path`, opened for reading; FileNotFoundError for a link or anything else."""
        *folder, name = _parts(path) or [""]
        try:
            fd = self._open_folder(folder)
        except OSError as exc:
            raise FileNotFoundError(f"{path}: no such file in the bucket ({exc.strerror})") from None
        try:
            # O_NONBLOCK: a FIFO planted in its place must not hang the reader (no effect on a regular file).
            file_fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=fd)
        except OSError as exc:
            raise FileNotFoundError(f"{path}: no such file in the bucket ({exc.strerror})") from None
        finally:
            os.close(fd)
        if not stat.S_ISREG(os.fstat(file_fd).st_mode):
            os.close(file_fd)
            raise FileNotFoundError(f"{path}: not a regular file")
        os.set_blocking(file_fd, True)
        return os.fdopen(file_fd, "rb")


_FOLDER = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _parts(path: str) -> list[str]:
    """`path`'s names below the bucket root ("/" separated, relative to it); ValueError for one that climbs out."""
    parts = [p for p in str(path).split("/") if p not in ("", ".")]
    if ".." in parts:
        raise ValueError(f"path {path!r} escapes the bucket")
    return parts
