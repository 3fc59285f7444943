"""HubBucketStore: the BucketStore interface over a Hugging Face Storage Bucket (huggingface_hub 2.4).

Listing is one paginated tree call. Bytes move over Xet, so every read goes through a local cache keyed
by the file's content hash: bucket files are written once, so a file is downloaded once, and a tick that
re-reads old fragments costs nothing. `open_store` picks a FolderStore instead when the Space has the
bucket mounted as a volume.
"""

import os
import posixpath
import uuid

from huggingface_hub import HfApi

from backend.storage.store import BucketStore, FolderStore, StoredFile

_SKIP_DIRS = frozenset({"__pycache__"})
_SKIP_SUFFIXES = (".pyc",)
# The cache lives under the panel's home (`<home>/cache/bucket-files`), shared by every store of the process and
# across restarts: entries are named by content hash, so sharing is safe and a restarted panel does not download
# a run's history again. It is bounded: past this size the least recently used entries go.
CACHE_MAX_BYTES = 2 * 2**30


class HubBucketStore:
    """A run bucket on the Hub. `bucket_id` is "namespace/name"; paths are relative to the bucket root."""

    def __init__(self, bucket_id: str, token: str | None, cache_dir: str, private: bool = True,
                 cache_max_bytes: int = CACHE_MAX_BYTES):
        self.bucket_id = bucket_id
        self.private = private
        self._api = HfApi(token=token)
        self._cache_dir = cache_dir
        self._cache_max_bytes = cache_max_bytes
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

    def sizes(self, paths: list[str]) -> dict[str, int]:
        if not paths:
            return {}
        found = list(self._api.get_bucket_paths_info(self.bucket_id, paths))    # a generator: read it once
        self._remote.update((f.path, f) for f in found)
        return {f.path: f.size for f in found if getattr(f, "type", "file") == "file"}

    def read_bytes(self, path: str, start: int = 0) -> bytes:
        with open(self._cached([path])[path], "rb") as f:
            f.seek(start)
            return f.read()

    def prefetch(self, paths: list[str]) -> None:
        """Download in one call what of `paths` is not cached yet (a first look at a run reads hundreds of
        fragments: one request for them all, not one each)."""
        known = [p for p in paths if p in self._remote]      # listed: the rest waits for its own read
        if known:
            self._cached(known)

    def write_bytes(self, path: str, data: bytes) -> None:
        self._api.batch_bucket_files(self.bucket_id, add=[(data, path)])

    def upload_folder(self, local_dir: str, prefix: str) -> None:
        adds = [(full, f"{prefix.strip('/')}/{rel}") for full, rel in _local_files(local_dir)]
        if adds:
            self._api.batch_bucket_files(self.bucket_id, add=adds)

    def delete_folder(self, prefix: str) -> None:
        folder = posixpath.normpath(prefix.strip("/") or ".")
        if folder in (".", "..") or folder.startswith("../"):
            raise ValueError("refusing to delete the whole bucket")
        paths = [f.path for f in self.list_files(folder)]
        for start in range(0, len(paths), 1000):
            self._api.batch_bucket_files(self.bucket_id, delete=paths[start:start + 1000])
        for path in paths:
            self._remote.pop(path, None)

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
        for target in set(local.values()) - set(todo):
            _touch(target)      # a hit: recently used, so kept when the cache is trimmed
        if todo:
            os.makedirs(self._cache_dir, exist_ok=True)
            part = f".{uuid.uuid4().hex}.part"   # two stores may fetch the same content at once
            pairs = [(remote, target + part) for target, remote in todo.items()]
            self._api.download_bucket_files(self.bucket_id, pairs, raise_on_missing_files=True)
            for target in todo:
                os.replace(target + part, target)   # a cache entry is whole or absent
            trim_cache(self._cache_dir, self._cache_max_bytes, keep=set(local.values()))
        return local


def trim_cache(folder: str, max_bytes: int, keep: set[str] = frozenset()) -> None:
    """Delete the least recently used entries until the cache holds at most `max_bytes` (`keep` stays)."""
    entries = []
    for entry in os.scandir(folder):
        if entry.is_file() and not entry.name.startswith("."):
            st = entry.stat()
            entries.append((st.st_mtime, st.st_size, entry.path))
    total = sum(size for _, size, _ in entries)
    for _, size, path in sorted(entries):
        if total <= max_bytes:
            return
        if path not in keep:
            try:
                os.remove(path)
            except FileNotFoundError:
                pass
            total -= size


def _touch(path: str) -> None:
    try:
        os.utime(path)
    except FileNotFoundError:
        pass


def parse_mount(value: str | None) -> tuple[str, str] | None:
    """`namespace/name:/mount/path` (the `-v hf://buckets/...` form without the scheme) -> (bucket, path)."""
    if not value or ":" not in value:
        return None
    bucket, path = value.split(":", 1)
    return bucket.strip(), path.strip()


def open_store(bucket: str, token: str | None, mount: str | None, cache_dir: str) -> BucketStore:
    """The run bucket: the mounted folder when the Space has *this* bucket as a volume, else the Hub API."""
    mounted = parse_mount(mount)
    if mounted and mounted[0] == bucket and os.path.isdir(mounted[1]):
        return FolderStore(mounted[1])
    return HubBucketStore(bucket, token, cache_dir)


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
