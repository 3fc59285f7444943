"""Code that runs inside a job, one sub-package per kind of process, and what they share at the top.

- `trainer/`: the trainer's process (GRPO colocated and async, metrics, held-out evaluation, sweep stops);
- `serving/`: a replica job's vLLM servers and the LoRA-aware proxy;
- `check/`: the task check's harness (and try-it), run in the sandbox or a check job;
- `job/`: the wrapper around every job (attempts, heartbeats, GPU sampler, shared memory, causes);
- top level: what several of them read and write (the bucket layout, records, the spec file, the task, rewards,
  redaction, the tiny model, the best-version rule). A sub-package imports the top and the sub-packages below it
  (trainer -> serving -> job); never the panel or the rest of `backend`.

It is uploaded into the bucket with each run (`runs/<run_id>/code/runtime/`) and started there with
`python -m runtime.<package>.<module>`.
"""

import os

# Where this package lies on the panel's machine: uploaded with every run, bound into the sandbox.
RUNTIME_DIR = os.path.dirname(os.path.abspath(__file__))
BACKEND_DIR = os.path.dirname(RUNTIME_DIR)   # `python -m runtime.<module>` runs from here
