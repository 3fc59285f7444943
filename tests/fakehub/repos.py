"""Model repos: create, card metadata check, preupload, commit (the ndjson body `create_commit` sends) and model info;
the LFS/Xet bytes beside the commit through `install_repo_transfers` (in the fake's process) or
`install_remote_repo_transfers` (a panel in another process)."""

import base64
import hashlib
import json
import re
import time
from dataclasses import dataclass, field
from typing import Any

from tests.fakehub.common import FakeUser, Reply, bearer, hex_id, utc_stamp

# Paths the Hub's default .gitattributes stores with LFS (a subset that covers model weights and archives).
LFS_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".h5", ".msgpack", ".onnx", ".gguf", ".npy", ".npz",
                ".pkl", ".zip", ".gz", ".tar", ".parquet", ".arrow")


@dataclass
class FakeRepo:
    id: str
    type: str
    private: bool
    created_at: str
    files: dict[str, bytes] = field(default_factory=dict)
    lfs: set[str] = field(default_factory=set)          # paths committed as LFS pointers
    commits: list[dict[str, Any]] = field(default_factory=list)   # {"oid", "summary", "paths"} newest last

    @property
    def sha(self) -> str:
        return self.commits[-1]["oid"] if self.commits else "0" * 40

    def oid(self, path: str) -> str:
        """What the Hub's preupload answers for a file already there: sha256 for LFS, git's blob sha1 otherwise."""
        data = self.files[path]
        if path in self.lfs:
            return hashlib.sha256(data).hexdigest()
        return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


_MODEL = r"/api/models/(?P<ns>[^/]+)/(?P<name>[^/]+)"
ROUTES = [
    ("POST", r"/api/repos/create", "create_repo"),
    ("POST", r"/api/validate-yaml", "validate_yaml"),
    ("POST", _MODEL + r"/preupload/(?P<rev>[^/]+)", "preupload"),
    ("POST", _MODEL + r"/commit/(?P<rev>[^/]+)", "commit"),
    ("GET", _MODEL + r"(?:/revision/(?P<rev>[^/]+))?", "model_info"),
    ("POST", r"/_fake/lfs-objects", "fake_put_lfs"),
]


class ReposMixin:
    """The Hub's model repos: state, routes (`ROUTES`) and the in-process transfer of LFS bytes."""

    def _init_repos(self) -> None:
        self.repos: dict[str, FakeRepo] = {}
        self.lfs_objects: dict[tuple[str, str], bytes] = {}   # (repo id, sha256) -> bytes uploaded beside git

    # ---- LFS/Xet file bytes of repo commits, faked at the method level (the real client moves them over Xet or
    # LFS; the JSON endpoints around them, preupload and commit, stay HTTP)
    def install_repo_transfers(self, monkeypatch: Any) -> None:
        import huggingface_hub._commit_api as commit_api

        hub = self

        def upload_files(*, additions, repo_type, repo_id, headers, endpoint=None, num_threads=5, revision=None,
                         create_pr=None):
            user = hub.users.get(bearer(headers.get("authorization") or headers.get("Authorization") or ""))
            if user is None or not hub._may_write(user, repo_id.split("/")[0]):
                raise PermissionError(f"401/403: token may not upload to {repo_type} {repo_id}")
            for op in additions:
                with op.as_file() as f:
                    hub.put_lfs_object(repo_id, f.read())
                hub.transfers.append(("lfs-upload", repo_id, op.path_in_repo))

        monkeypatch.setattr(commit_api, "_upload_files", upload_files)

    def put_lfs_object(self, repo_id: str, data: bytes) -> None:
        with self._cond:
            self.lfs_objects[(repo_id, hashlib.sha256(data).hexdigest())] = data

    # ---- model repos: create, validate a card's metadata, preupload, commit, info
    def _create_repo(self, user: FakeUser, body: Any, **_: Any) -> Reply:
        body = body or {}
        ns, name = body.get("organization") or user.name, str(body.get("name") or "")
        repo_type, repo_id = body.get("type") or "model", f"{ns}/{name}"
        url = f"{self.url}/{repo_id}" if repo_type == "model" else f"{self.url}/{repo_type}s/{repo_id}"
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,95}", name) or "--" in name or ".." in name:
            return Reply(400, {"error": "Invalid repo name"})
        if not self._may_write(user, ns):
            message = f'You don\'t have the rights to create a {repo_type} under the namespace "{ns}"'
            return Reply(403, {"error": message})
        with self._cond:
            if repo_id in self.repos:
                return Reply(409, {"error": f"You already created this {repo_type} repo", "url": url})
            self.repos[repo_id] = FakeRepo(repo_id, repo_type, body.get("visibility") == "private", utc_stamp())
        return Reply(200, {"url": url, "name": repo_id, "id": hex_id(repo_id)})

    def _validate_yaml(self, body: Any, **_: Any) -> Reply:
        import yaml

        content = str((body or {}).get("content") or "")
        match = re.match(r"^---\n(.*?)\n---\n", content, re.DOTALL)
        try:
            meta = yaml.safe_load(match.group(1)) if match else {}
        except yaml.YAMLError as err:
            return Reply(400, {"errors": [{"message": f"Invalid YAML: {err}"}], "warnings": []})
        if match and not isinstance(meta, dict):
            return Reply(400, {"errors": [{"message": "metadata must be a YAML mapping"}], "warnings": []})
        warnings = [] if match else [{"message": "empty or missing yaml metadata in repo card"}]
        return Reply(200, {"errors": [], "warnings": warnings})

    def _writable_repo(self, user: FakeUser, ns: str, name: str) -> FakeRepo | Reply:
        repo = self.repos.get(f"{ns}/{name}")
        if repo is None or (repo.private and not self._may_read(user, ns)):
            return Reply(404, {"error": "Repository not found"}, {"X-Error-Code": "RepoNotFound"})
        if not self._may_write(user, ns):
            return Reply(403, {"error": f"You don't have the rights to write to {ns}/{name}"})
        return repo

    def _preupload(self, user: FakeUser, ns: str, name: str, body: Any, **_: Any) -> Reply:
        repo = self._writable_repo(user, ns, name)
        if isinstance(repo, Reply):
            return repo
        files = []
        for item in (body or {}).get("files", []):
            sample = base64.b64decode(item.get("sample") or "")
            lfs = item["path"].endswith(LFS_SUFFIXES) or b"\0" in sample or int(item.get("size") or 0) > 10 * 2**20
            files.append({"path": item["path"], "uploadMode": "lfs" if lfs else "regular", "shouldIgnore": False,
                          **({"oid": repo.oid(item["path"])} if item["path"] in repo.files else {})})
        return Reply(200, {"files": files, "commitOid": repo.sha})

    def _commit(self, user: FakeUser, ns: str, name: str, body: Any, **_: Any) -> Reply:
        repo = self._writable_repo(user, ns, name)
        if isinstance(repo, Reply):
            return repo
        lines = body if isinstance(body, list) else []
        header = next((line["value"] for line in lines if line.get("key") == "header"), None)
        if not header or not header.get("summary"):
            return Reply(400, {"error": "A commit needs a header with a summary"})
        added: dict[str, tuple[bytes, bool]] = {}
        deleted = []
        with self._cond:
            for line in lines:
                key, value = line.get("key"), line.get("value") or {}
                if key == "file":
                    added[value["path"]] = (base64.b64decode(value["content"]), False)
                elif key == "lfsFile":
                    data = self.lfs_objects.get((repo.id, value.get("oid")))
                    if data is None:
                        return Reply(422, {"error": f"Your push was rejected because an LFS pointer pointed to a file "
                                                    f"that does not exist ({value.get('path')})"})
                    added[value["path"]] = (data, True)
                elif key in ("deletedFile", "deletedFolder"):
                    deleted.append(value["path"])
            for path in deleted:
                repo.files.pop(path, None)
                repo.lfs.discard(path)
            for path, (data, lfs) in added.items():
                repo.files[path] = data
                (repo.lfs.add if lfs else repo.lfs.discard)(path)
            oid = hashlib.sha1(f"{repo.sha}{header['summary']}{sorted(added)}{time.time_ns()}".encode()).hexdigest()
            repo.commits.append({"oid": oid, "summary": header["summary"], "paths": sorted(added)})
        return Reply(200, {"success": True, "commitOid": oid, "commitUrl": f"{self.url}/{repo.id}/commit/{oid}",
                           "hookOutput": ""})

    def _model_info(self, user: FakeUser, ns: str, name: str, **_: Any) -> Reply:
        repo = self.repos.get(f"{ns}/{name}")
        if repo is None or (repo.private and not self._may_read(user, ns)):
            return Reply(404, {"error": "Repository not found"}, {"X-Error-Code": "RepoNotFound"})
        return Reply(200, {"id": repo.id, "author": ns, "sha": repo.sha, "private": repo.private,
                           "createdAt": repo.created_at, "lastModified": repo.created_at,
                           "siblings": [{"rfilename": path} for path in sorted(repo.files)]})

    def _fake_put_lfs(self, user: FakeUser, body: Any, **_: Any) -> Reply:
        repo_id = body["repo"]
        if repo_id not in self.repos or not self._may_write(user, repo_id.split("/")[0]):
            return Reply(403, {"error": f"may not upload to {repo_id}"})
        self.put_lfs_object(repo_id, base64.b64decode(body["data"]))
        self.transfers.append(("lfs-upload", repo_id, body.get("path", "")))
        return Reply(200, {})


def install_remote_repo_transfers(hub_url: str) -> None:
    """In a process that is not the fake's, move the LFS/Xet bytes of repo commits through the fake's test-only
    route. `huggingface_hub._commit_api._upload_files` is replaced for good; preupload and commit stay HTTP."""
    import urllib.request

    import huggingface_hub._commit_api as commit_api

    def upload_files(*, additions, repo_type, repo_id, headers, endpoint=None, num_threads=5, revision=None,
                     create_pr=None):
        auth = headers.get("authorization") or headers.get("Authorization") or ""
        for op in additions:
            with op.as_file() as f:
                payload = {"repo": repo_id, "path": op.path_in_repo, "data": base64.b64encode(f.read()).decode()}
            request = urllib.request.Request(f"{hub_url}/_fake/lfs-objects", data=json.dumps(payload).encode(),
                                             method="POST", headers={"Content-Type": "application/json",
                                                                     "Authorization": auth})
            with urllib.request.urlopen(request, timeout=30):
                pass

    commit_api._upload_files = upload_files
