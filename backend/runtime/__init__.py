"""Code that runs inside a job: trainer entry point, LoRA-aware proxy, samplers, rewards, CPU fallbacks.

It imports nothing from the panel or the rest of `backend`: it is uploaded into the bucket with each run
(`runs/<run_id>/code/runtime/`) and started there with `python -m runtime.<module>`.
"""

import os

# Where this package lies on the panel's machine: uploaded with every run, bound into the sandbox.
RUNTIME_DIR = os.path.dirname(os.path.abspath(__file__))
BACKEND_DIR = os.path.dirname(RUNTIME_DIR)   # `python -m runtime.<module>` runs from here
