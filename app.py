"""GRPO + LoRA control panel: launch GRPO runs with LoRA adapters and watch them live.

    python app.py            # http://127.0.0.1:7860, local executor, "Tiny demo (CPU)" preset

Environment: GRPO_PANEL_HOME (where local runs and buckets live, default ./data), PORT / GRADIO_SERVER_PORT,
GRADIO_SERVER_NAME (default 127.0.0.1; 0.0.0.0 on a Space), HF_TOKEN (or `hf auth login`) to launch on Hugging
Face Jobs, SPACE_ID (set by Spaces: OAuth sign-in, every visitor acts with their own token),
GRPO_PANEL_LOCAL_RUNS=on|off|owner (default: on here, off on a Space), GRPO_PANEL_AUTH=user:password (a panel
login), GRPO_PANEL_ALLOW_HOST_TOKEN=1 (let visitors of a panel reachable from other machines use this
machine's token), GRPO_PANEL_BUCKET_MOUNT=namespace/name:/path (a bucket mounted into the Space, read as a folder),
GRPO_PANEL_DATASETS_SERVER (the Hub's dataset viewer API, default https://datasets-server.huggingface.co),
GRPO_PANEL_BUDGET_CHECK_S (how often runs' budget caps are checked, default 30; 0: never),
GRPO_PANEL_ALLOW_UNSANDBOXED=1 (run *Check task* and *Try it* code without a sandbox where bubblewrap cannot make
one; by default they run none),
GRPO_PANEL_MAX_UPLOAD_MB (the largest file a visitor may upload, default 100), GRPO_PANEL_UPLOAD_QUOTA_FILES and
GRPO_PANEL_UPLOAD_QUOTA_MB (what one visitor may keep uploaded at once: default 10 files, 200 MB).
MCP tools for agents: http://127.0.0.1:7860/gradio_api/mcp/ (docs/mcp.md).
"""

import os

# Nothing leaves the panel but what it is asked to send: Gradio's usage analytics and huggingface_hub's telemetry
# (both posted to HF_ENDPOINT or Gradio's servers) are off. Set before either library is imported: huggingface_hub
# reads its setting once, at import; `telemetry_off()` covers an earlier import too.
os.environ["GRADIO_ANALYTICS_ENABLED"] = "False"
os.environ["HF_HUB_DISABLE_TELEMETRY"] = "1"

import atexit
import ctypes
import faulthandler
import logging
import signal
import sys
import threading
import time

import httpx
from gradio import networking
from huggingface_hub import constants as hub_constants
from starlette.middleware import Middleware

from backend.executors.local import LocalExecutor
from backend.runs.access import Deployment
from backend.runtime.redact import remember_env_secrets
from panel.actions import Panel
from panel.idle_frames import StopLeakedFrames
from panel.mcp_tools import mcp_lifespan
from panel.tick import StampRequests
from panel.ui import CSS, PAGE_JS, build_ui
from panel.uploads import SignedInUploadsOnly, UploadQuota, max_upload_bytes

log = logging.getLogger("grpo-panel")
PR_SET_DUMPABLE = 4
EXIT_GRACE_S = 20.0     # after the server closed, the most the process waits for anything else before it exits


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    telemetry_off()
    faulthandler.register(signal.SIGUSR1, all_threads=True)    # `kill -USR1 <pid>`: every thread's stack to stderr
    remember_env_secrets()    # the host's own token is masked in everything the panel shows
    unreadable_by_children()
    deployment = Deployment()
    problems = deployment.startup_problems()
    for problem in problems:
        log.error(problem)
    if problems:
        sys.exit(2)     # fail closed: nothing is served with a setting the panel cannot honour
    panel = Panel(deployment, LocalExecutor(deployment.home))
    atexit.register(panel.shutdown)
    for note in deployment.startup_notes():
        log.warning(note)
    log.warning(panel.isolation())    # where visitors' code runs, or why nowhere here (probes the sandbox once)
    # A container stop or a Space restart sends SIGTERM, Ctrl-C sends SIGINT: both close the server the same way.
    # Local runs keep running either way (each job has its own wrapper process); the next panel finds them.
    # SIGINT too: a panel started from a script in the background inherits SIGINT ignored, and would outlive a Ctrl-C.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, signal.default_int_handler)
    demo = build_ui(panel)
    patient_self_check()
    port = int(os.environ.get("PORT") or os.environ.get("GRADIO_SERVER_PORT") or 7860)
    demo.queue(default_concurrency_limit=4).launch(
        server_name=deployment.host, server_port=port, show_error=True, css=CSS, js=PAGE_JS,
        auth=[deployment.auth] if deployment.auth else None,
        # Gradio keeps each call's inputs in the browser's local storage by default: a webhook URL or reward code
        # typed into the form would stay there. Off, which also deletes what an earlier version left there.
        run_history=False,
        # Uploads (datasets) are bounded; on a Space only signed-in visitors upload at all (panel/uploads.py).
        max_file_size=max_upload_bytes(deployment.max_upload_mb),
        # The panel's actions as MCP tools for agents, at /gradio_api/mcp/ (panel/mcp_tools.py says why not
        # Gradio's own mcp_server=True).
        app_kwargs={"lifespan": mcp_lifespan(panel),
                    "middleware": [*([Middleware(SignedInUploadsOnly)] if deployment.on_space else []),
                                   Middleware(UploadQuota, files=deployment.upload_quota_files,
                                              megabytes=deployment.upload_quota_mb, on_space=deployment.on_space),
                                   # An idle page draws no frames (Gradio's status tracker leaks a frame loop).
                                   Middleware(StopLeakedFrames),
                                   # The idle check's stamp: a malformed call is a 400, not Gradio's 500 (panel/tick).
                                   Middleware(StampRequests)]})
    # launch() returns once the server is closed (SIGTERM, SIGINT). The exit handlers (the panel's shutdown among
    # them) run now, then the process ends without the interpreter's own teardown, which a thread some library
    # left busy can hang (seen: a panel still up 60 s after SIGTERM, its last words Gradio's "closing server"),
    # and a container stop would end in SIGKILL. The watchdog bounds the exit handlers too.
    exit_within(EXIT_GRACE_S)
    atexit._run_exitfuncs()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def telemetry_off() -> None:
    """Gradio's analytics and huggingface_hub's telemetry off, also where huggingface_hub was imported before
    this module set its environment variable (a wrapper script that imported it first)."""
    os.environ["GRADIO_ANALYTICS_ENABLED"] = "False"
    os.environ["HF_HUB_DISABLE_TELEMETRY"] = "1"
    hub_constants.HF_HUB_DISABLE_TELEMETRY = True


def unreadable_by_children() -> None:
    """No process this panel starts (a local run's jobs, a helper) may read the panel's memory or environment
    through /proc or ptrace, where visitors' tokens and the OAuth client secret live (Linux; elsewhere nothing)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    except (OSError, AttributeError):
        log.info("could not mark the panel process undumpable on this platform")


OWN_PAGE_WAIT_S = 120.0   # how long launch() waits for the panel's own page to answer before it gives up


def patient_self_check(wait_s: float = OWN_PAGE_WAIT_S) -> None:
    """Gradio's launch() asks its own page once it serves (`gradio.networking.url_ok`: 5 HEAD requests of 3 s each,
    a timeout ends them) and exits with "When localhost is not accessible, a shareable link must be created" when it
    gets no answer. On a loaded machine the first render of the page takes longer than 3 s (seen: load 13 on 2
    cores, while local runs trained), and the panel died at start. The same check, patient: each request may take
    30 s and they go on for `wait_s`; a localhost that refuses connections still fails it, after `wait_s`."""
    def url_ok(url: str) -> bool:
        deadline = time.monotonic() + wait_s
        while True:
            try:
                answer = httpx.head(url, timeout=min(30.0, wait_s), verify=False)
                if answer.status_code in (200, 401, 301, 302, 303, 307, 308):   # Gradio's own list (auth, redirects)
                    return True
            except httpx.HTTPError:
                pass
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.5)

    networking.url_ok = url_ok


def exit_within(seconds: float) -> None:
    """Exit with status 0 in `seconds` if the interpreter has not exited by then, naming what it waited for."""
    def force() -> None:
        time.sleep(seconds)
        busy = [t.name for t in threading.enumerate() if not t.daemon and t is not threading.main_thread()]
        log.warning("still exiting after %.0f s (waiting for threads: %s): exiting now", seconds,
                    ", ".join(busy) or "none")
        logging.shutdown()
        os._exit(0)

    threading.Thread(target=force, name="exit-watchdog", daemon=True).start()


if __name__ == "__main__":
    main()
