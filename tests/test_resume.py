"""Where a stopped run resumes: only an unfinished run, from a checkpoint that exists, saying exactly from where.

Each case lays out a run folder the way trainers write it, with a real local job as the run's trainer."""

import json
import os

import pytest

from backend.executors.local import LocalExecutor
from backend.plan.jobspec import JobSpec, VolumeSpec
from backend.plan.spec import RunSpec
from backend.runs.launch import LaunchError
from backend.runs.registry import RunRegistry
from backend.runs.resume import resume_plan
from backend.runtime.layout import FragmentWriter
from backend.runtime.records import write_event
from backend.storage.store import FolderStore

pytestmark = pytest.mark.integration

BUCKET = "local/grpo-runs"


@pytest.fixture
def executor(tmp_path):
    ex = LocalExecutor(str(tmp_path / "home"), grace_s=2)
    yield ex
    ex.cancel_all()


def _run(ex: LocalExecutor, command: list[str], **spec) -> tuple[RunRegistry, str, str]:
    """A run whose trainer job runs `command`; returns (registry, run id, run folder)."""
    spec = RunSpec(bucket=BUCKET, **spec)
    run_dir = os.path.join(ex.bucket_root(BUCKET), "runs", spec.run_id)
    os.makedirs(run_dir)
    with open(os.path.join(run_dir, "spec.json"), "w") as f:
        f.write(spec.to_json())
    job = JobSpec(run_id=spec.run_id, role="trainer", image="local", command=command, flavor="local", timeout_s=60,
                  volumes=(VolumeSpec(BUCKET, "/bucket"),))
    job_id = ex.submit(job)
    if command[0] != "sleep":
        ex.wait(job_id, 30)
    return RunRegistry(ex, lambda b: FolderStore(ex.bucket_root(b))), spec.run_id, run_dir


def _version(run_dir: str, n: int, step: int, files=("adapter_config.json", "adapter_model.safetensors")) -> None:
    folder = os.path.join(run_dir, "adapters", f"trl-policy-v{n}")
    os.makedirs(folder)
    for name in files:
        with open(os.path.join(folder, name), "w") as f:
            f.write("{}")
    with open(os.path.join(folder, "version.json"), "w") as f:
        json.dump({"version": n, "step": step}, f)


def _checkpoint(run_dir: str, step: int, complete: bool = True) -> None:
    folder = os.path.join(run_dir, "checkpoints", f"checkpoint-{step}")
    os.makedirs(folder)
    if complete:
        with open(os.path.join(folder, "trainer_state.json"), "w") as f:
            json.dump({"global_step": step}, f)


def _plan(registry: RunRegistry, run_id: str):
    view = registry.view(run_id)
    view.refresh()
    return resume_plan(view)


def test_a_run_that_is_still_running_is_not_resumed(executor):
    registry, run_id, _ = _run(executor, ["sleep", "60"])
    with pytest.raises(LaunchError, match=r"still has running jobs \(trainer: RUNNING\); cancel it before resuming"):
        _plan(registry, run_id)


def test_a_finished_run_is_not_resumed(executor):
    registry, run_id, run_dir = _run(executor, ["true"], max_steps=20)
    _checkpoint(run_dir, 20)
    write_event(run_dir, "trainer", "started", step=0)
    write_event(run_dir, "trainer", "finished", step=20)
    with pytest.raises(LaunchError, match="finished .* there is nothing to resume"):
        _plan(registry, run_id)


def test_a_run_without_a_checkpoint_says_it_would_start_from_step_0_and_is_resumed_only_when_asked(executor):
    registry, run_id, run_dir = _run(executor, ["false"], max_steps=20, checkpoint_every=50)   # a crashed trainer
    FragmentWriter(os.path.join(run_dir, "metrics"), "trainer").write([{"step": s, "reward": 0.1} for s in (1, 2, 3)])
    _version(run_dir, 1, step=1)
    _checkpoint(run_dir, 50, complete=False)      # cut off while saving: not a checkpoint
    plan = _plan(registry, run_id)
    assert (plan.checkpoint_step, plan.next_version, plan.superseded) == (None, 2, ("trl-policy-v1",))
    assert plan.message == (f"run {run_id} has no complete checkpoint (one is saved every 50 steps; it reached "
                            "step 3): resuming starts again from step 0; adapter versions continue at trl-policy-v2; "
                            "1 version(s) published after step 0 (trl-policy-v1) will be marked superseded.")
    jobs_before = executor.list_jobs()
    with pytest.raises(LaunchError, match="Nothing was resumed: confirm starting from step 0"):
        registry.resume(run_id)
    assert executor.list_jobs() == jobs_before


def test_a_run_resumes_from_its_newest_complete_checkpoint_and_numbers_past_every_published_version(executor):
    registry, run_id, run_dir = _run(executor, ["false"], max_steps=20, checkpoint_every=3)
    for n, step in ((1, 2), (2, 4), (3, 6), (4, 8)):
        _version(run_dir, n, step)
    _version(run_dir, 99, step=10, files=("adapter_config.json",))        # half-written: counts for nothing
    write_event(run_dir, "trainer", "adapter_published", name="trl-policy-v5", version=5, step=9,
                path=".vllm_lora/trl-policy-v5")                           # its files deleted since
    _checkpoint(run_dir, 3)
    _checkpoint(run_dir, 6)
    _checkpoint(run_dir, 9, complete=False)
    plan = _plan(registry, run_id)
    assert (plan.checkpoint_step, plan.next_version) == (6, 6)
    assert plan.superseded == ("trl-policy-v4", "trl-policy-v5")
    assert plan.message.startswith(f"run {run_id} resumes from checkpoint-6 (step 6 of 20); adapter versions "
                                   "continue at trl-policy-v6; 2 version(s) published after step 6")


def test_a_run_whose_last_checkpoint_is_its_last_step_has_nothing_left_to_train(executor):
    registry, run_id, run_dir = _run(executor, ["false"], max_steps=20)
    _checkpoint(run_dir, 20)
    with pytest.raises(LaunchError, match=r"last checkpoint is at its last step \(20 of 20\)"):
        _plan(registry, run_id)


def test_a_distributed_runs_preview_discards_what_its_trainer_will_also_a_version_no_event_recorded(executor):
    from types import SimpleNamespace

    from backend.runtime.trainer.train_async import continue_numbering
    from backend.runtime.versions import superseded_names

    registry, run_id, run_dir = _run(executor, ["false"], mode="distributed", max_steps=20, checkpoint_every=3)
    for n in range(1, 6):
        write_event(run_dir, "trainer", "adapter_published", name=f"trl-policy-v{n}", version=n, step=n - 1,
                    path=f".vllm_lora/trl-policy-v{n}")
    # TRL's serving copy of v6, complete but never recorded: the trainer was killed between the rename and the event.
    serving = os.path.join(run_dir, ".vllm_lora", "trl-policy-v6")
    os.makedirs(serving)
    for name in ("adapter_config.json", "adapter_model.safetensors"):
        with open(os.path.join(serving, name), "w") as f:
            f.write("{}")
    _checkpoint(run_dir, 3)
    with open(os.path.join(run_dir, "checkpoints", "checkpoint-3", "rollout_state.json"), "w") as f:
        json.dump({"model_version": 4}, f)            # trained to v4: v5 and v6 came after it
    _checkpoint(run_dir, 6, complete=False)
    plan = _plan(registry, run_id)
    assert (plan.checkpoint_step, plan.next_version) == (3, 7)
    assert plan.superseded == ("trl-policy-v5", "trl-policy-v6")
    # The resumed trainer's own numbering marks exactly the versions the preview named.
    continue_numbering(SimpleNamespace(), run_dir, os.path.join(run_dir, "checkpoints", "checkpoint-3"))
    assert superseded_names(run_dir) == set(plan.superseded)
