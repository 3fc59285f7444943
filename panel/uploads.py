"""What a visitor may upload: a size limit everywhere, a quota per visitor, and on a Space nothing at all before
signing in.

Gradio accepts files at `/gradio_api/upload` (and, for components that take recordings or files,
`/gradio_api/process_recording` and multipart `/gradio_api/component_server`) from anyone who reaches the app, and
keeps them in its cache. On a Space that is anyone on the internet, so `SignedInUploadsOnly` answers 401 there to a
request without a signed-in session (Gradio's OAuth session cookie, still valid), before a byte is stored. The size
limit is Gradio's own (`launch(max_file_size=...)`, a 413), set from `GRPO_PANEL_MAX_UPLOAD_MB`; the cache is
emptied of old files by Gradio's `delete_cache` (panel/ui.py).

`UploadQuota` bounds what one visitor keeps there at once (`GRPO_PANEL_UPLOAD_QUOTA_FILES` files and
`GRPO_PANEL_UPLOAD_QUOTA_MB` megabytes; a file counts until Gradio's cache drops it): a signed-in visitor by their
name, any other by the address they come from (`panel/client_address.py`). An upload that would go over is refused
with 413 naming the quota, before its body is read where its length says so; a request that stored more files than
the quota leaves has them deleted before the answer goes out. Nothing of a refused upload is kept.
"""

import json
import os
import shutil
import threading
import time

from starlette.responses import PlainTextResponse

from panel.client_address import scope_address

UPLOAD_ROUTES = ("/gradio_api/upload", "/gradio_api/process_recording")
COMPONENT_SERVER = "/gradio_api/component_server"
SIGN_IN_TO_UPLOAD = "Sign in with Hugging Face (button at the top) to upload files to this Space."


class SignedInUploadsOnly:
    """ASGI middleware: an upload from a visitor who is not signed in is refused with 401. It must run inside
    the session middleware Gradio adds for OAuth (pass it to the app's constructor: `middleware=[...]`), which
    reads the session cookie into `scope["session"]`."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and is_upload(scope) and not signed_in(scope):
            await PlainTextResponse(SIGN_IN_TO_UPLOAD, status_code=401)(scope, receive, send)
            return
        await self.app(scope, receive, send)


def is_upload(scope) -> bool:
    """Whether the request could store a file: a POST to an upload route, or a multipart one to the component
    server (under any root path the app is mounted at)."""
    if scope.get("method") != "POST":
        return False
    path = scope.get("path", "").rstrip("/")
    if path.endswith(UPLOAD_ROUTES):
        return True
    content_type = dict(scope.get("headers") or []).get(b"content-type", b"")
    return path.endswith(COMPONENT_SERVER) and content_type.lower().startswith(b"multipart/")


def signed_in(scope) -> bool:
    """Whether the request's session holds an OAuth sign-in that has not expired (as Gradio itself reads it)."""
    session = scope.get("session") if "session" in scope else None
    info = session.get("oauth_info") if isinstance(session, dict) else None
    if not isinstance(info, dict) or not info.get("access_token"):
        return False
    expires_at = info.get("expires_at")
    return not isinstance(expires_at, (int, float)) or expires_at > time.time()


def max_upload_bytes(megabytes: float) -> int:
    """Gradio's `max_file_size` for a limit in MB (MiB)."""
    return int(megabytes * 2**20)


class UploadQuota:
    """ASGI middleware: at most `files` files and `megabytes` MB kept in Gradio's cache per visitor (see the module's
    docstring). Inside the session middleware, as `SignedInUploadsOnly`."""

    def __init__(self, app, files: int, megabytes: float, on_space: bool):
        self.app, self.files, self.megabytes, self.on_space = app, int(files), float(megabytes), on_space
        self.max_bytes = max_upload_bytes(megabytes)
        self._kept: dict[str, list[str]] = {}     # visitor -> paths of the files they uploaded
        self._lock = threading.Lock()

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or not is_upload(scope):
            await self.app(scope, receive, send)
            return
        who = self.visitor(scope)
        files, size = self.used(who)
        length = _content_length(scope)
        if length is None:
            await _refuse(scope, receive, send, 411, "Upload refused: send it with its length (Content-Length). "
                                                     "Nothing was kept.")
            return
        if files >= self.files or size + length > self.max_bytes:
            await _refuse(scope, receive, send, 413, self.refusal(files, size))
            return
        held: list = []

        async def hold(message):     # the answer waits until the files it stored are counted
            held.append(message)
            if message["type"] == "http.response.body" and not message.get("more_body"):
                await self._answer(who, held, scope, receive, send)

        await self.app(scope, receive, hold)

    def visitor(self, scope) -> str:
        """Whom an upload counts against: a signed-in visitor's name, else the address the request came from."""
        session = scope.get("session") if "session" in scope else None
        info = session.get("oauth_info") if isinstance(session, dict) and signed_in(scope) else None
        name = ((info or {}).get("userinfo") or {}).get("preferred_username")
        return f"user:{name}" if name else f"address:{scope_address(scope, self.on_space)}"

    def used(self, who: str) -> tuple[int, int]:
        """(files, bytes) the visitor keeps in the cache now (files Gradio dropped no longer count)."""
        with self._lock:
            kept = [path for path in self._kept.get(who, []) if os.path.isfile(path)]
            self._kept[who] = kept
            return len(kept), sum(_size(path) for path in kept)

    def refusal(self, files: int, size: int) -> str:
        return (f"Upload refused: the upload quota is {self.files} file(s) and {self.megabytes:g} MB kept at once "
                f"per visitor (GRPO_PANEL_UPLOAD_QUOTA_FILES, GRPO_PANEL_UPLOAD_QUOTA_MB); you keep {files} file(s), "
                f"{size / 2**20:.1f} MB, and this upload would go over it. Uploads are dropped two hours after they "
                "came; nothing of this upload was kept.")

    async def _answer(self, who: str, held: list, scope, receive, send) -> None:
        """Count what the upload stored; over the quota, delete it and refuse instead of Gradio's answer."""
        start = held[0] if held and held[0]["type"] == "http.response.start" else {}
        stored = _stored_paths(b"".join(m.get("body", b"") for m in held if m["type"] == "http.response.body"))
        if start.get("status") == 200 and stored:
            with self._lock:
                kept = self._kept.setdefault(who, [])
                over = (len(kept) + len(stored) > self.files
                        or sum(_size(p) for p in kept + stored) > self.max_bytes)
                if not over:
                    kept.extend(stored)
            if over:
                files, size = self.used(who)
                for path in stored:
                    _remove_upload(path)
                await _refuse(scope, receive, send, 413, self.refusal(files, size))
                return
        for message in held:
            await send(message)


def _content_length(scope) -> int | None:
    value = dict(scope.get("headers") or []).get(b"content-length")
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def _stored_paths(body: bytes) -> list[str]:
    """The files Gradio's upload route stored (its answer: a JSON list of their paths), or none."""
    try:
        paths = json.loads(body)
    except ValueError:
        return []
    return [p for p in paths if isinstance(p, str)] if isinstance(paths, list) else []


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def _remove_upload(path: str) -> None:
    """Delete a stored upload and the folder Gradio made for it (a folder of its own, named by a hash)."""
    try:
        os.remove(path)
        folder = os.path.dirname(path)
        if not os.listdir(folder):
            shutil.rmtree(folder, ignore_errors=True)
    except OSError:
        pass


async def _refuse(scope, receive, send, status: int, text: str) -> None:
    await PlainTextResponse(text, status_code=status)(scope, receive, send)
