"""Executors run JobSpecs: `LocalExecutor` as local processes, `HfJobsExecutor` on Hugging Face Jobs.

The registry below names every executor the panel offers. Each module holds the executor class and its `ENGINE`
(a `base.Engine`: billed or not, token needed, runtime installed in the job, how its commands are previewed, where
its jobs' ports, cores and GPUs come from, its flavors and prices). Code outside this package asks `engine(name)`
those questions instead of comparing names.

Adding an executor (Ray, say) is one file and one line: write `backend/executors/ray.py` with a `RayExecutor` (the
`base.Executor` interface, `name = "ray"`) and `ENGINE = RayEngine()` (a `base.Engine` subclass), then add
`"ray": "backend.executors.ray"` to `_MODULES`. The spec's choices, the form and the panel follow from it.

The registry names modules rather than importing them: an engine's module imports its client library
(huggingface_hub; Ray's would import ray) and the RunSpec it plans jobs for, while the RunSpec asks engines while it
validates. Imported on first use, no engine's library loads before a run uses it, and no import circle forms.
"""

import importlib

from backend.executors.base import Engine

_MODULES = {
    "local": "backend.executors.local",
    "hf_jobs": "backend.executors.hf_jobs",
    "ray": "backend.executors.ray",
}
EXECUTORS = tuple(_MODULES)    # the RunSpec's choices, in the form's order


def engine(name: str) -> Engine:
    """The engine of executor `name`; KeyError naming the choices for a name that is none of them."""
    if name not in _MODULES:
        raise KeyError(f"no executor {name!r}; choose one of {', '.join(EXECUTORS)}")
    return importlib.import_module(_MODULES[name]).ENGINE


def known_engine(name: object) -> Engine | None:
    """The engine of `name`, or None where a spec names no executor this panel knows (its own error says so)."""
    return engine(name) if isinstance(name, str) and name in _MODULES else None


def engines() -> list[Engine]:
    return [engine(name) for name in EXECUTORS]


def billed(name: str) -> bool:
    """Whether runs on executor `name` cost money (an unknown name is the spec's own error: treated as billed)."""
    where = known_engine(name)
    return where is None or where.billed


def reaches_hub(name: str) -> bool:
    """Whether the jobs of executor `name` can download models and datasets from the Hub."""
    where = known_engine(name)
    return where is None or where.reaches_hub
