"""Engines: what each executor answers before it runs anything, registered by the executor's name.

An engine (`base.Engine`) says whether runs are billed, need a token, install their runtime in the job, how their
commands are previewed, where their jobs' ports, cores and GPUs come from, which flavors and prices exist. Code
outside `backend/plan/engines/` and `backend/executors/` asks `engine(name)` those questions instead of comparing
names.

Adding an executor (Ray, say) is two files and one line: its engine in `backend/plan/engines/ray.py` (a
`base.Engine` subclass, `ENGINE = RayEngine()`), its executor in `backend/executors/ray.py` (the
`backend.executors.base.Executor` interface, `name = "ray"`), and `"ray": "backend.plan.engines.ray"` in `_MODULES`.
The spec's choices, the form and the panel follow from it.

The registry names modules rather than importing them: an engine's module plans jobs for the RunSpec, while the
RunSpec asks engines while it validates. Imported on first use, no import circle forms.
"""

import importlib

from backend.plan.engines.base import Engine

_MODULES = {
    "local": "backend.plan.engines.local",
    "hf_jobs": "backend.plan.engines.hf_jobs",
    "ray": "backend.plan.engines.ray",
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
