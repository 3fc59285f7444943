"""What a visitor may upload: a size limit everywhere, and on a Space nothing at all before signing in.

Gradio accepts files at `/gradio_api/upload` (and, for components that take recordings or files,
`/gradio_api/process_recording` and multipart `/gradio_api/component_server`) from anyone who reaches the app, and
keeps them in its cache. On a Space that is anyone on the internet, so `SignedInUploadsOnly` answers 401 there to a
request without a signed-in session (Gradio's OAuth session cookie, still valid), before a byte is stored. The size
limit is Gradio's own (`launch(max_file_size=...)`, a 413), set from `GRPO_PANEL_MAX_UPLOAD_MB`; the cache is
emptied of old files by Gradio's `delete_cache` (panel/ui.py).
"""

import time

from starlette.responses import PlainTextResponse

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
