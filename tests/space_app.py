"""`app.py` started as a Hugging Face Space runs it, for the Space browser tests.

The environment says Space (SPACE_ID, SYSTEM=spaces, OAuth client variables) and points huggingface_hub at the
loopback fake Hub (HF_ENDPOINT). Bucket bytes and the LFS bytes of repo commits, which the real client moves over
Xet, go through the fake's test-only routes; everything else is the real client speaking the Hub's REST protocol.
"""

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from tests.fakehub import install_remote_bucket_transfers, install_remote_repo_transfers

if __name__ == "__main__":
    install_remote_bucket_transfers(os.environ["HF_ENDPOINT"])
    install_remote_repo_transfers(os.environ["HF_ENDPOINT"])
    import app

    app.main()
