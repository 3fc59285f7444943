"""Where a run stands while it starts, before its first logged step: the header says it in words, with how long it
has been at it, instead of a bare "step 0/N" for the minute or more a run takes to start.

Read from what the run already records, in the order a trainer job goes through them (`backend/plan/recipe.py`):
its job's stage (a machine not yet given: SCHEDULING), the `attempt` event (the job's command has begun; HF Jobs
then installs the runtime), the builtin model's "<name> ready at" log line (`runtime.tiny_model`), the `engine` event
(data and model read; what remains is importing TRL and building the trainer, and with a held-out set the base model's
evaluation), the `started` event (training has begun: the first step is being computed). A distributed run's trainer
waits for its vLLM replicas before its `engine` event. The newest of those events wins, so a retried attempt starts
over. A run that logged a step, ended, or resumed past its first step has no start-up stage.
"""

import itertools
from dataclasses import dataclass

from backend.plan.engines import known_engine
from backend.plan.jobspec import RUNNING, TERMINAL_STAGES
from backend.runtime import layout, records
from backend.runtime.tiny_model import BUILTIN_MODELS

MODEL_READY = " ready at "        # runtime.tiny_model's last line: "<name> ready at <folder> (<s> s)"
STEPS = (records.ATTEMPT, records.ENGINE, records.STARTED)
LOG_LINES_READ = 500              # the newest trainer log lines looked at for the model's line


@dataclass(frozen=True)
class StartUp:
    """The stage in words, and when it began (epoch seconds; None where nothing recorded it)."""

    stage: str
    since: float | None
    mark: str | None = None     # the trainer's newest start-up event (records.ATTEMPT, ENGINE, STARTED), if any


def start_up(view) -> StartUp | None:
    """The run's start-up stage (see the module), or None once it logged a step, or when it is not starting."""
    trainer = view.current_jobs.get("trainer")
    if trainer is None or trainer.status.stage in TERMINAL_STAGES or len(view.table) or view.launch_failure:
        return None
    if trainer.status.stage != RUNNING:
        return StartUp(f"waiting for a machine ({trainer.status.stage.lower()})", None)
    newest = next((e for e in reversed(view.events) if e.get("event") in STEPS
                   and str(e.get("writer", "")).startswith(layout.TRAINER_WRITER)), None)
    if newest is None:
        return StartUp("starting the trainer job", None)
    since = newest.get("time") if isinstance(newest.get("time"), (int, float)) else None
    kind = newest["event"]
    if kind == records.STARTED:
        return StartUp("training the first step", since, kind)
    if kind == records.ENGINE:
        held_out = (view.spec or {}).get("eval_source", "none") != "none"
        return StartUp("importing TRL and building the trainer" + (
            ", then scoring the base model on the held-out set" if held_out else ""), since, kind)
    return StartUp(_before_engine(view, trainer), since, kind)


def _before_engine(view, trainer) -> str:
    """What an attempt does before its `engine` event: install (HF Jobs), build a builtin model, wait for the vLLM
    replicas (distributed), read the data and the model."""
    spec = view.spec or {}
    engine = known_engine(spec.get("executor"))
    installs = engine is not None and engine.installs_runtime
    replicas = [job for role, job in view.current_jobs.items() if role.startswith("vllm-")]
    if spec.get("model") in BUILTIN_MODELS and not any(
            MODEL_READY in line for line in itertools.islice(reversed(trainer.logs), LOG_LINES_READ)):
        return "installing the runtime, then building the model" if installs else "building the model"
    if replicas:
        up = sum(job.status.stage == RUNNING for job in replicas)
        return f"waiting for the vLLM replicas ({up}/{len(replicas)} replica jobs running)"
    return "installing the runtime and loading the model" if installs else "loading the data and the model"
