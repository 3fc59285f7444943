"""Code of the task check's process: the harness that runs a visitor's dataset and reward code once, and try-it."""
