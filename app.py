"""GRPO + LoRA control panel: launch GRPO runs with LoRA adapters and watch them live.

    python app.py            # http://127.0.0.1:7860, local executor, "Tiny demo (CPU)" preset

Environment: GRPO_PANEL_HOME (where local runs and buckets live, default ./data), PORT / GRADIO_SERVER_PORT,
HF_TOKEN (or `hf auth login`) to launch on Hugging Face Jobs, SPACE_ID (set by Spaces: OAuth sign-in),
GRPO_PANEL_BUCKET_MOUNT=namespace/name:/path (a bucket mounted into the Space, read as a folder).
"""

import atexit
import os
import signal

from panel.actions import Panel
from panel.ui import build_ui


def main() -> None:
    panel = Panel()
    atexit.register(panel.shutdown)
    # A container stop or a Space restart sends SIGTERM, Ctrl-C sends SIGINT: both close the server the same way.
    # Local runs keep running either way (each job has its own wrapper process); the next panel finds them.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    demo = build_ui(panel)
    port = int(os.environ.get("PORT") or os.environ.get("GRADIO_SERVER_PORT") or 7860)
    host = os.environ.get("GRADIO_SERVER_NAME") or ("0.0.0.0" if panel.settings.on_space else "127.0.0.1")
    demo.queue(default_concurrency_limit=4).launch(server_name=host, server_port=port, show_error=True)


if __name__ == "__main__":
    main()
