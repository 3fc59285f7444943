"""Buckets: create, info, tree, paths-info over HTTP; their file bytes, which the real client moves over Xet, through
`install_bucket_transfers` (in the fake's process) or `install_remote_bucket_transfers` (a panel in another process)."""

import base64
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.fakehub.common import FakeUser, Reply, utc_stamp, write_local


@dataclass
class FakeObject:
    data: bytes
    mtime: str
    uploaded_at: str

    @property
    def xet_hash(self) -> str:
        return hashlib.sha256(self.data).hexdigest()


@dataclass
class FakeBucket:
    id: str
    private: bool
    created_at: str
    files: dict[str, FakeObject] = field(default_factory=dict)


_BUCKET = r"/api/buckets/(?P<ns>[^/]+)/(?P<name>[^/]+)"
ROUTES = [
    ("POST", _BUCKET, "create_bucket"),
    ("GET", _BUCKET, "bucket_info"),
    ("GET", _BUCKET + r"/tree(?:/(?P<prefix>.+))?", "bucket_tree"),
    ("POST", _BUCKET + "/paths-info", "paths_info"),
    # Test-only: bucket bytes for a panel running in another process (the real client moves them over Xet).
    ("POST", r"/_fake/bucket-files", "fake_put_files"),
    ("POST", r"/_fake/bucket-files/read", "fake_read_file"),
]


class BucketsMixin:
    """The Hub's buckets: state, routes (`ROUTES`) and the in-process transfer of their bytes."""

    def _init_buckets(self) -> None:
        self.buckets: dict[str, FakeBucket] = {}
        self.bucket_read_error: int | None = None     # answer bucket listings with this status (e.g. 500)

    def put_file(self, bucket_id: str, path: str, data: bytes) -> None:
        with self._cond:
            now = utc_stamp()
            self.buckets[bucket_id].files[path] = FakeObject(data, now, now)

    # ---- bucket bytes, faked at the method level (the real client moves them over Xet)
    def install_bucket_transfers(self, monkeypatch: Any) -> None:
        from huggingface_hub import HfApi

        hub = self

        def batch_bucket_files(api, bucket_id, *, add=None, copy=None, delete=None, token=None):
            hub._check_transfer_token(api, token, bucket_id)
            for source, dest in add or []:
                data = source if isinstance(source, bytes) else Path(source).read_bytes()
                hub.put_file(bucket_id, dest, data)
                hub.transfers.append(("upload", bucket_id, dest))
            for path in delete or []:
                with hub._cond:
                    hub.buckets[bucket_id].files.pop(path, None)
                hub.transfers.append(("delete", bucket_id, path))

        def download_bucket_files(api, bucket_id, files, *, raise_on_missing_files=False, token=None):
            hub._check_transfer_token(api, token, bucket_id)
            if hub.bucket_read_error:
                raise OSError(f"{hub.bucket_read_error}: bucket storage unavailable")
            for remote, local in files:
                path = remote if isinstance(remote, str) else remote.path
                stored = hub.buckets[bucket_id].files.get(path)
                if stored is None:
                    if raise_on_missing_files:
                        raise FileNotFoundError(f"{path} not in bucket {bucket_id}")
                    continue
                write_local(str(local), stored.data)
                hub.transfers.append(("download", bucket_id, path))

        monkeypatch.setattr(HfApi, "batch_bucket_files", batch_bucket_files)
        monkeypatch.setattr(HfApi, "download_bucket_files", download_bucket_files)

    def _check_transfer_token(self, api: Any, token: Any, bucket_id: str) -> None:
        user = self.users.get(token if isinstance(token, str) else api.token)
        if user is None or not self._may_read(user, bucket_id.split("/")[0]):
            raise PermissionError(f"401/403: token may not write to bucket {bucket_id}")
        if bucket_id not in self.buckets:
            raise FileNotFoundError(f"bucket {bucket_id} does not exist")

    def _create_bucket(self, user: FakeUser, ns: str, name: str, body: Any, **_: Any) -> Reply:
        bucket_id, url = f"{ns}/{name}", f"{self.url}/buckets/{ns}/{name}"
        if not self._may_write(user, ns):
            return Reply(403, {"error": f"You cannot create buckets in {ns}"})
        with self._cond:
            if bucket_id in self.buckets:
                return Reply(409, {"error": "You already created this bucket", "url": url})
            private = (body or {}).get("visibility") == "private"
            self.buckets[bucket_id] = FakeBucket(bucket_id, private, utc_stamp())
        return Reply(200, {"url": url, "name": name, "id": bucket_id})

    def _bucket_info(self, user: FakeUser, ns: str, name: str, **_: Any) -> Reply:
        bucket = self._find_bucket(user, ns, name)
        if isinstance(bucket, Reply):
            return bucket
        return Reply(200, {"id": bucket.id, "private": bucket.private, "createdAt": bucket.created_at,
                           "size": sum(len(f.data) for f in bucket.files.values()),
                           "totalFiles": len(bucket.files)})

    def _bucket_tree(self, user: FakeUser, ns: str, name: str, query: dict[str, list[str]],
                     prefix: str | None = None, **_: Any) -> Reply:
        if self.bucket_read_error:
            return Reply(self.bucket_read_error, {"error": "bucket storage unavailable"})
        bucket = self._find_bucket(user, ns, name)
        if isinstance(bucket, Reply):
            return bucket
        recursive = query.get("recursive", ["false"])[0].lower() == "true"
        items = _tree_items(bucket, prefix or "", recursive)
        path = f"/api/buckets/{ns}/{name}/tree" + (f"/{prefix}" if prefix else "")
        return self._page(path, query, items)

    def _paths_info(self, user: FakeUser, ns: str, name: str, body: Any, **_: Any) -> Reply:
        if self.bucket_read_error:
            return Reply(self.bucket_read_error, {"error": "bucket storage unavailable"})
        bucket = self._find_bucket(user, ns, name)
        if isinstance(bucket, Reply):
            return bucket
        with self._cond:
            wanted = [p for p in (body or {}).get("paths", []) if p in bucket.files]
            return Reply(200, [_file_json(p, bucket.files[p]) for p in wanted])

    def _fake_put_files(self, user: FakeUser, body: Any, **_: Any) -> Reply:
        bucket_id = body["bucket"]
        if bucket_id not in self.buckets or not self._may_write(user, bucket_id.split("/")[0]):
            return Reply(403, {"error": f"may not write to bucket {bucket_id}"})
        for path, data in body.get("add", {}).items():
            self.put_file(bucket_id, path, base64.b64decode(data))
            self.transfers.append(("upload", bucket_id, path))
        for path in body.get("delete", []):
            with self._cond:
                self.buckets[bucket_id].files.pop(path, None)
            self.transfers.append(("delete", bucket_id, path))
        return Reply(200, {})

    def _fake_read_file(self, user: FakeUser, body: Any, **_: Any) -> Reply:
        bucket_id, path = body["bucket"], body["path"]
        if self.bucket_read_error:
            return Reply(self.bucket_read_error, {"error": "bucket storage unavailable"})
        if bucket_id not in self.buckets or not self._may_read(user, bucket_id.split("/")[0]):
            return Reply(403, {"error": f"may not read bucket {bucket_id}"})
        stored = self.buckets[bucket_id].files.get(path)
        if stored is None:
            return Reply(404, {"error": f"{path} not in bucket {bucket_id}"})
        self.transfers.append(("download", bucket_id, path))
        return Reply(200, {"data": base64.b64encode(stored.data).decode()})

    def _find_bucket(self, user: FakeUser, ns: str, name: str) -> FakeBucket | Reply:
        bucket = self.buckets.get(f"{ns}/{name}")
        if bucket is None or not self._may_read(user, ns):
            return Reply(404, {"error": "Bucket not found"}, {"X-Error-Code": "RepoNotFound"})
        return bucket


def install_remote_bucket_transfers(hub_url: str) -> None:
    """In a process that is not the fake's (the panel started as a Space), move bucket bytes through the fake's
    test-only routes instead of Xet. `HfApi.batch_bucket_files` and `download_bucket_files` are replaced for good."""
    import urllib.error
    import urllib.request

    from huggingface_hub import HfApi

    def call(api, token, route: str, payload: dict) -> dict:
        request = urllib.request.Request(f"{hub_url}{route}", data=json.dumps(payload).encode(), method="POST",
                                         headers={"Content-Type": "application/json",
                                                  "Authorization": f"Bearer {token or api.token}"})
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return json.load(response)
        except urllib.error.HTTPError as err:
            raise OSError(f"{err.code}: {err.read().decode(errors='replace')}") from None

    def batch_bucket_files(api, bucket_id, *, add=None, copy=None, delete=None, token=None):
        files = {dest: base64.b64encode(src if isinstance(src, bytes) else Path(src).read_bytes()).decode()
                 for src, dest in add or []}
        call(api, token, "/_fake/bucket-files", {"bucket": bucket_id, "add": files, "delete": list(delete or [])})

    def download_bucket_files(api, bucket_id, files, *, raise_on_missing_files=False, token=None):
        for remote, local in files:
            path = remote if isinstance(remote, str) else remote.path
            try:
                data = call(api, token, "/_fake/bucket-files/read", {"bucket": bucket_id, "path": path})["data"]
            except OSError as err:
                if str(err).startswith("404") and not raise_on_missing_files:
                    continue
                raise
            write_local(str(local), base64.b64decode(data))

    HfApi.batch_bucket_files = batch_bucket_files
    HfApi.download_bucket_files = download_bucket_files


def _file_json(path: str, stored: FakeObject) -> dict[str, Any]:
    return {"type": "file", "path": path, "size": len(stored.data), "xetHash": stored.xet_hash,
            "mtime": stored.mtime, "uploadedAt": stored.uploaded_at}


def _tree_items(bucket: FakeBucket, prefix: str, recursive: bool) -> list[dict[str, Any]]:
    """Files whose path starts with `prefix`; without `recursive`, one level below it plus its folders."""
    items, folders = [], set()
    base = prefix.rstrip("/") + "/" if prefix else ""
    for path in sorted(bucket.files):
        if not path.startswith(prefix):
            continue
        rest = path[len(base):] if path.startswith(base) else path[len(prefix):]
        if not recursive and "/" in rest:
            folders.add(base + rest.split("/", 1)[0])
            continue
        items.append(_file_json(path, bucket.files[path]))
    items += [{"type": "directory", "path": f, "uploadedAt": bucket.created_at} for f in sorted(folders)]
    return items
