"""Where a stopped run would resume: which checkpoint, which adapter version next, what it discards.

`resume_plan` is a pure reading of a RunView (refreshed by the caller) and the bucket: it starts nothing, so the
panel can show it before the user confirms. A run that is still running, or that finished, is not resumable.
"""

import json
import posixpath
import re
from dataclasses import dataclass

from backend.plan.spec import RunSpec
from backend.runs.launch import LaunchError
from backend.runtime import layout, records
from backend.storage.adapters import list_adapter_versions
from backend.storage.store import BucketStore

CHECKPOINT_RE = re.compile(r"^checkpoint-(\d+)$")
TRAINER_STATE = "trainer_state.json"    # transformers writes it last: a checkpoint without it was cut off


@dataclass(frozen=True)
class ResumePlan:
    checkpoint_step: int | None    # the step training continues after; None: no checkpoint, it starts at step 0
    next_version: int              # the first adapter version the resumed trainer publishes
    superseded: tuple[str, ...]    # versions published after the checkpoint: a branch the resume discards
    message: str
    spec: RunSpec                  # what the resumed jobs run (the run's spec.json)

    def fingerprint(self) -> str:
        """What a reviewed resume is bound to: the spec's settings and where training continues."""
        return f"{self.spec.fingerprint()}-{self.checkpoint_step}-{self.next_version}"


def latest_checkpoint_step(store: BucketStore, run_id: str) -> int | None:
    """The step of the newest complete checkpoint in the bucket (the one the trainer will pick), or None."""
    prefix = f"{layout.run_prefix(run_id)}/{layout.CHECKPOINTS_DIR}"
    states = {}
    for f in store.list_files(prefix):
        folder, name = posixpath.split(posixpath.relpath(f.path, prefix))
        match = CHECKPOINT_RE.match(folder)
        if match and name == TRAINER_STATE:
            states[int(match.group(1))] = f.path
    # Newest first, reading one small file each (on the Hub, a download each) until one is whole.
    return next((step for step in sorted(states, reverse=True) if _readable_json(store, states[step])), None)


def _readable_json(store: BucketStore, path: str) -> bool:
    try:
        json.loads(store.read_bytes(path))
        return True
    except (OSError, ValueError, KeyError):
        return False


def _discarded_by(view, step: int | None):
    """Which versions resuming from checkpoint `step` discards, by the rule the resumed trainer applies: the async
    trainer's are those past its checkpoint's policy version (also a version whose step nobody recorded, as a
    folder TRL wrote without its event); a colocated trainer's those published after the step."""
    if view.spec.get("mode") != "distributed":
        return lambda v: v.step is not None and v.step > (step or 0)
    resumed = 0     # no checkpoint, or an unreadable one: the trainer starts from version 0 too
    if step is not None:
        checkpoint = f"{layout.run_prefix(view.run_id)}/{layout.CHECKPOINTS_DIR}/checkpoint-{step}"
        path = f"{checkpoint}/{layout.ROLLOUT_STATE_FILE}"
        try:
            resumed = layout.rollout_state_version(view.store.read_bytes(path))
        except (OSError, KeyError):
            pass
    return lambda v: v.version > resumed


def finished(view) -> bool:
    """The run's last trainer attempt completed: its job did, or its newest start/end event is 'finished'."""
    trainer = view.current_jobs.get("trainer")
    if trainer is not None and trainer.status.stage == "COMPLETED":
        return True
    ends = [e["event"] for e in view.events if e.get("writer") == layout.TRAINER_WRITER
            and e.get("event") in records.TRAINER_STAGES]
    return bool(ends) and ends[-1] == records.FINISHED


def resume_plan(view) -> ResumePlan:
    """What resuming `view`'s run would do; raises LaunchError saying why when it cannot be resumed."""
    run = f"run {view.run_id}"
    if not view.spec:
        raise LaunchError(f"{run} has no spec.json in its bucket; it cannot be resumed")
    if not view.done:
        running = ", ".join(f"{role}: {job.status.stage}" for role, job in sorted(view.current_jobs.items())
                            if not job.status.done)
        raise LaunchError(f"{run} still has running jobs ({running}); cancel it before resuming")
    max_steps = view.spec.get("max_steps")
    if finished(view):
        raise LaunchError(f"{run} finished (all {max_steps} steps, final adapter written): there is nothing to resume")
    step = latest_checkpoint_step(view.store, view.run_id)
    if step is not None and isinstance(max_steps, int) and step >= max_steps:
        raise LaunchError(f"{run}'s last checkpoint is at its last step ({step} of {max_steps}): nothing is left to "
                          "train")
    # Resuming is rare and a version name must never be reused: every folder counts here, not only the versions
    # the view learnt from events (a trainer that crashed between publishing and recording leaves only a folder).
    versions = {**list_adapter_versions(view.store, view.run_id, known=set(view.adapters)), **view.adapters}
    next_version = max(versions, default=0) + 1
    after = step or 0
    discarded = _discarded_by(view, step)
    superseded = tuple(v.name for v in sorted(versions.values(), key=lambda v: v.version)
                       if discarded(v) and v.name not in view.superseded)
    continue_at = f"adapter versions continue at {layout.run_adapter_name(view.spec, next_version)}"
    discards = (f"; {len(superseded)} version(s) published after step {after} ({', '.join(superseded)}) will be "
                "marked superseded" if superseded else "")
    if step is None:
        reached = max((r["step"] for r in view.metrics), default=0)
        message = (f"{run} has no complete checkpoint (one is saved every {view.spec.get('checkpoint_every')} "
                   f"steps; it reached step {reached}): resuming starts again from step 0; {continue_at}{discards}.")
    else:
        message = (f"{run} resumes from checkpoint-{step} (step {step} of {max_steps}); {continue_at}{discards}.")
    return ResumePlan(step, next_version, superseded, message, RunSpec.from_dict(view.spec))
