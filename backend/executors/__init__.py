"""Executors run JobSpecs: `LocalExecutor` as local processes, `HfJobsExecutor` on Hugging Face Jobs, `RayExecutor`
as Ray jobs. Each implements `base.Executor`; what it answers before it runs anything is its engine
(`backend/plan/engines/`), registered under the same name."""

import importlib


def shared_executor(name: str, home: str):
    """The executor of engine `name`'s runs that every permitted visitor of this deployment shares (a cluster's), or
    None: local runs are the panel's own registry, Hub runs are reached per token. An executor module offers one by
    defining `shared_executor(home)`; imported on first use, so a panel without Ray never loads it."""
    module = importlib.import_module(f"backend.executors.{name}")
    make = getattr(module, "shared_executor", None)
    return make(home) if make else None
