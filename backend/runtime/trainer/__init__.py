"""Code of the trainer's process: the GRPO entry points (colocated and async), metrics, held-out
evaluation, sweep stops."""
