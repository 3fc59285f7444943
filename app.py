"""GRPO + LoRA control panel: launch GRPO runs with LoRA adapters and watch them live.

    python app.py            # http://127.0.0.1:7860, local executor, "Tiny demo (CPU)" preset

Environment: GRPO_PANEL_HOME (where local runs and buckets live, default ./data), PORT / GRADIO_SERVER_PORT,
HF_TOKEN (or `hf auth login`) to launch on Hugging Face Jobs, SPACE_ID (set by Spaces: OAuth sign-in),
GRPO_PANEL_BUCKET_MOUNT=namespace/name:/path (a bucket mounted into the Space, read as a folder),
GRPO_PANEL_DATASETS_SERVER (the Hub's dataset viewer API, default https://datasets-server.huggingface.co).
"""

import atexit
import os

from panel.actions import Panel
from panel.ui import build_ui


def main() -> None:
    panel = Panel()
    atexit.register(panel.shutdown)
    demo = build_ui(panel)
    port = int(os.environ.get("PORT") or os.environ.get("GRADIO_SERVER_PORT") or 7860)
    host = os.environ.get("GRADIO_SERVER_NAME") or ("0.0.0.0" if panel.settings.on_space else "127.0.0.1")
    demo.queue(default_concurrency_limit=4).launch(server_name=host, server_port=port, show_error=True)


if __name__ == "__main__":
    main()
