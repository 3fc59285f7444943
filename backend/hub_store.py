"""HubBucketStore: the BucketStore interface over a Hugging Face Storage Bucket (huggingface_hub 2.4).

Listing is one paginated tree call. Bytes move over Xet, so every read goes through a local cache keyed
by the file's content hash: bucket files are written once, so a file is downloaded once, and a tick that
re-reads old fragments costs nothing. `open_store` picks a FolderStore instead when the Space has the
bucket mounted as a volume.
"""

import os
import shutil
import uuid

from huggingface_hub import HfApi

from backend.store import BucketStore, FolderStore, StoredFile

_SKIP_DIRS = frozenset({"__pycache__"})
_SKIP_SUFFIXES = (".pyc",)
# Shared by every store of the process and across restarts: entries are named by content hash, so
# sharing is safe and a restarted panel does not download a run's history again.
DEFAULT_CACHE_DIR = os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"),
                                 "grpo-panel", "bucket-files")


class HubBucketStore:
    """A run bucket on the Hub. `bucket_id` is "namespace/name"; paths are relative to the bucket root."""

    def __init__(self, bucket_id: str, token: str | None, cache_dir: str | None = None, private: bool = True):
        self.bucket_id = bucket_id
        self.private = private
        self._api = HfApi(token=token)
        self._cache_dir = cache_dir or DEFAULT_CACHE_DIR
        self._remote: dict = {}   # path -> BucketFile from the last listing (size, xet hash)

    def ensure_bucket(self) -> None:
        """Create the bucket if it does not exist yet (private by default: it holds a user's runs)."""
        self._api.create_bucket(self.bucket_id, private=self.private, exist_ok=True)

    def list_files(self, prefix: str) -> list[StoredFile]:
        folder = prefix.strip("/")
        entries = self._api.list_bucket_tree(self.bucket_id, prefix=folder or None, recursive=True)
        files = [e for e in entries if e.type == "file" and _under(e.path, folder)]
        self._remote.update((f.path, f) for f in files)
        return sorted((StoredFile(f.path, f.size, f.mtime.timestamp() if f.mtime else 0.0) for f in files),
                      key=lambda f: f.path)

    def read_bytes(self, path: str, start: int = 0) -> bytes:
        with open(self._cached([path])[path], "rb") as f:
            f.seek(start)
            return f.read()

    def write_bytes(self, path: str, data: bytes) -> None:
        self._api.batch_bucket_files(self.bucket_id, add=[(data, path)])

    def upload_folder(self, local_dir: str, prefix: str) -> None:
        adds = [(full, f"{prefix.strip('/')}/{rel}") for full, rel in _local_files(local_dir)]
        if adds:
            self._api.batch_bucket_files(self.bucket_id, add=adds)

    def download_folder(self, prefix: str, local_dir: str) -> list[str]:
        files = self.list_files(prefix)
        cached = self._cached([f.path for f in files])
        written = []
        for f in files:
            target = os.path.join(local_dir, os.path.relpath(f.path, prefix.strip("/") or "."))
            os.makedirs(os.path.dirname(target), exist_ok=True)
            shutil.copyfile(cached[f.path], target)
            written.append(target)
        return written

    def _cached(self, paths: list[str]) -> dict[str, str]:
        """Local copies of `paths`, downloading (in one call) only those whose content is not cached yet."""
        unknown = [p for p in paths if p not in self._remote]
        if unknown:
            self._remote.update((f.path, f) for f in self._api.get_bucket_paths_info(self.bucket_id, unknown))
        missing = [p for p in paths if p not in self._remote]
        if missing:
            raise FileNotFoundError(f"not in bucket {self.bucket_id}: {', '.join(missing)}")
        local = {p: os.path.join(self._cache_dir, self._remote[p].xet_hash) for p in paths}
        # Keyed by content hash: two paths with the same bytes download once.
        todo = {local[p]: self._remote[p] for p in paths if not os.path.exists(local[p])}
        if todo:
            os.makedirs(self._cache_dir, exist_ok=True)
            part = f".{uuid.uuid4().hex}.part"   # two stores may fetch the same content at once
            pairs = [(remote, target + part) for target, remote in todo.items()]
            self._api.download_bucket_files(self.bucket_id, pairs, raise_on_missing_files=True)
            for target in todo:
                os.replace(target + part, target)   # a cache entry is whole or absent
        return local


def parse_mount(value: str | None) -> tuple[str, str] | None:
    """`namespace/name:/mount/path` (the `-v hf://buckets/...` form without the scheme) -> (bucket, path)."""
    if not value or ":" not in value:
        return None
    bucket, path = value.split(":", 1)
    return bucket.strip(), path.strip()


def open_store(bucket: str, token: str | None, mount: str | None) -> BucketStore:
    """The run bucket: the mounted folder when the Space has *this* bucket as a volume, else the Hub API."""
    mounted = parse_mount(mount)
    if mounted and mounted[0] == bucket and os.path.isdir(mounted[1]):
        return FolderStore(mounted[1])
    return HubBucketStore(bucket, token)


def _under(path: str, folder: str) -> bool:
    # The tree endpoint filters by string prefix; "runs/a" must not match "runs/ab/...".
    return not folder or path == folder or path.startswith(folder + "/")


def _local_files(local_dir: str) -> list[tuple[str, str]]:
    """(absolute path, "/"-relative path) of every file to upload, skipping Python caches like FolderStore."""
    out = []
    for folder, dirs, names in os.walk(local_dir):
        dirs[:] = sorted(d for d in dirs if d not in _SKIP_DIRS)
        for name in sorted(names):
            if not name.endswith(_SKIP_SUFFIXES):
                full = os.path.join(folder, name)
                out.append((full, os.path.relpath(full, local_dir).replace(os.sep, "/")))
    return out
