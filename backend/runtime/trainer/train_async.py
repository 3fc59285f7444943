"""Distributed GRPO + LoRA trainer: TRL's async trainer against N vLLM replicas behind the LoRA-aware proxy.

    PYTHONPATH=<run_dir>/code python -m runtime.trainer.train_async --run-dir <run_dir> \
        --replica URL [--replica URL ...]

Replica URLs may also come from VLLM_REPLICA_URLS (comma-separated). The proxy runs as a child process
(its event loop free of the trainer's GIL) on a free local port, writing per-replica stats into
<run_dir>/metrics as `proxy-*` fragments. Each weight sync publishes the adapter as
<run_dir>/.vllm_lora/trl-policy-v<N> (a sweep member's trl-policy-<member>-v<N>; the bucket every replica
mounts) and loads it on every replica. Metrics go to <run_dir>/metrics as `trainer-*` fragments, checkpoints to
<run_dir>/checkpoints (a preempted run started again resumes from them), the last adapter to <run_dir>/final.

This module is the trainer's command line, TRL's async trainer as the run uses it, and the run from the proxy's start
to its end; the wait for the replicas is replica_wait.py, what training writes to the run folder async_callback.py.
"""

import argparse
import os
import time

from ..job.heartbeat import Heartbeat
from ..layout import (
    CHECKPOINTS_DIR,
    FLEET_DIR_ENV,
    METRICS_DIR,
    ROLLOUT_STATE_FILE,
    TRAINER_WRITER,
    VLLM_LORA_DIR,
    adapter_base,
    adapter_name,
    rollout_state_version,
    spec_member,
)
from ..records import ADAPTER_PUBLISHED, ENGINE, write_event
from ..redact import remember_env_secrets
from ..rewards import Weighted, run_rewards
from ..serving.proxy_env import PROXY_HOST_ENV, PROXY_PORT_ENV, REPLICAS_ENV
from ..serving.proxy_process import raise_open_files_limit, start_proxy_process
from ..serving.server_info import await_server_info
from ..spec_file import SpecFile, read_spec
from ..task import TaskDataError, load_task_dataset
from ..tiny_model import benchmark_note, no_progress_bars
from ..versions import highest_published, mark_superseded, published_versions
from .async_callback import AsyncRunFolderCallback
from .common import (
    checkpoint_step,
    failure_fields,
    latest_checkpoint,
    lora_config,
    resolve_model,
    say_vllm_version_warning_once,
    shared_trainer_args,
    skip_long_prompts,
    trackio_folder,
)
from .cpu_fallbacks import install_cpu_fallbacks
from .metrics_callback import folder_size
from .replica_wait import replica_urls, replicas_gone, wait_for_replicas
from .rollout_watch import stale_after_s, watch_rollout_worker
from .run_end import leave, record_end, stop_on_sigterm
from .samples import install_async_samples
from .sweep_stops import SweepStops


def async_config(spec: SpecFile, run_dir: str, proxy_url: str):
    from trl.experimental.async_grpo import AsyncGRPOConfig  # noqa: PLC0415 heavy: after the run's own inputs are read

    return AsyncGRPOConfig(
        # output_dir is the run folder so TRL's .vllm_lora/ lands in the bucket the replicas mount.
        output_dir=run_dir,
        vllm_server_base_url=proxy_url,
        # In a distributed run a published adapter version *is* a weight sync.
        weight_sync_steps=spec["adapter_every"],
        max_staleness=spec["max_staleness"],
        max_inflight_tasks=spec["max_inflight_tasks"],
        queue_maxsize=spec["queue_maxsize"],
        token_budget=spec["max_tokens_per_batch"],
        # A frozen rollout worker ends the run after this long
        # (runtime/trainer/rollout_watch.py says why 180 s, not 300).
        heartbeat_stale_after_s=stale_after_s(),
        **shared_trainer_args(spec),
    )


def trainer_class(member: str = ""):
    """TRL's async trainer for a run whose sweep member tag is `member` ("" for a lone run)."""
    from trl.experimental.async_grpo import AsyncGRPOTrainer  # noqa: PLC0415 heavy: after the run's own inputs are read

    class BucketAsyncGRPOTrainer(AsyncGRPOTrainer):
        """Checkpoints in <run_dir>/checkpoints (the bucket layout) while output_dir stays the run folder; version
        numbers past every version ever published; an `adapter_published` event per sync; versions named by
        `layout.adapter_name` (a sweep member's carry its tag, so members sharing replicas never share a name)."""

        version_floor = 0   # the highest version ever published in the run folder before this attempt
        held_out = None     # a BackgroundEvaluation (runtime/trainer/evaluate.py) when the run has a held-out set

        # TRL 1.16 assigns `self._lora_name = "trl-policy"` in __init__ and hands it to its rollout worker before
        # __init__ returns, then names every sync, load, unload and folder `f"{_lora_name}-v{N}"`: a property whose
        # setter ignores TRL's assignment is the one way to put the run's own name in all of them.
        _lora_name = property(lambda self: adapter_base(self.member), lambda self, _value: None)

        def _get_output_dir(self, trial):
            return os.path.join(self.args.output_dir, CHECKPOINTS_DIR)

        def _sync_weight_lora(self, t0):
            # TRL restarts numbering at the checkpoint's model_version, but versions past it were published by
            # the attempt that died: the same name with other weights would be served from vLLM's cache.
            self.model_version = max(self.model_version, self.version_floor)
            marks = super()._sync_weight_lora(t0)
            if self.accelerator.is_main_process:
                name = adapter_name(self.model_version, self.member)
                write_event(self.args.output_dir, TRAINER_WRITER, ADAPTER_PUBLISHED, name=name,
                            version=self.model_version, step=self.state.global_step, path=f"{VLLM_LORA_DIR}/{name}",
                            size_bytes=folder_size(os.path.join(self._lora_dir, name)))
                if self.held_out is not None:
                    self.held_out.published(self.model_version, self.state.global_step,
                                            os.path.join(self._lora_dir, name),
                                            last=self.state.global_step >= self.state.max_steps)
            return marks

    BucketAsyncGRPOTrainer.member = member
    return BucketAsyncGRPOTrainer


def checkpoint_version(checkpoint: str | None) -> int:
    """The policy version a checkpoint was trained to (TRL keeps it in rollout_state.json), 0 for none."""
    try:
        with open(os.path.join(checkpoint, ROLLOUT_STATE_FILE), "rb") as f:
            return rollout_state_version(f.read())
    except (TypeError, OSError):
        return 0


def continue_numbering(trainer, run_dir: str, checkpoint: str | None, member: str = "") -> None:
    """Number this attempt's versions past every version published before, and mark the discarded ones (`member`:
    the run's sweep member tag, part of the versions' names)."""
    trainer.version_floor = highest_published(run_dir)
    resumed = checkpoint_version(checkpoint)
    later = [v for v in published_versions(run_dir) if v > resumed]
    names = mark_superseded(run_dir, later, checkpoint_step(checkpoint))
    if names:
        print(f"superseded (published after the checkpoint, now discarded): {', '.join(names)}", flush=True)
    if trainer.version_floor:
        print(f"adapter versions continue at {adapter_name(trainer.version_floor + 1, member)}", flush=True)


def build_trainer(spec: SpecFile, run_dir: str, proxy_url: str, callback: AsyncRunFolderCallback):
    from transformers import PrinterCallback  # noqa: PLC0415 heavy: after the run's own inputs are read

    rewards, weights = run_rewards(spec)
    model = resolve_model(spec, run_dir)
    trainer = trainer_class(spec_member(spec))(
        model=model,
        reward_funcs=[r if w == 1.0 else Weighted(r, w) for r, w in zip(rewards, weights)],
        args=async_config(spec, run_dir, proxy_url),
        train_dataset=skip_long_prompts(spec, model, load_task_dataset(spec, run_dir)),
        peft_config=lora_config(spec),
        callbacks=[callback],
    )
    trainer.remove_callback(PrinterCallback)
    callback.trainer = trainer
    watch_rollout_worker(trainer)   # a dead rollout worker ends the run in seconds, with its cause
    install_async_samples(callback.samples, spec["max_completion_length"], lambda: trainer.state.global_step)
    if spec.get("eval_source", "none") != "none":
        trainer.held_out = held_out_evaluation(spec, run_dir, model, trainer, proxy_url)
        trainer.held_out.base()     # the base model, version 0, first: the replicas serve it from the start
    return trainer


def held_out_evaluation(spec: SpecFile, run_dir: str, model: str, trainer, proxy_url: str):
    """Each synced version evaluated on the replicas that serve it, through the proxy (`model="trl-policy-vN"`)."""
    from .evaluate import BackgroundEvaluation, HeldOutEvaluation, ReplicaGenerator  # noqa: PLC0415

    rows = list(skip_long_prompts(spec, model, load_task_dataset(spec, run_dir, held_out=True)))
    if not rows:
        raise TaskDataError("the held-out set has no rows (after skipping prompts over max_prompt_tokens)")
    tokenizer = trainer.processing_class
    generator = ReplicaGenerator(proxy_url, tokenizer, spec)
    print(f"held-out set: {len(rows)} prompts, evaluated on the replicas at each synced version, at most "
          f"{spec.get('eval_max_inflight', 4)} requests in flight", flush=True)
    return BackgroundEvaluation(HeldOutEvaluation(spec, run_dir, rows, tokenizer, generator), generator)


def member_proxy(spec: SpecFile) -> dict:
    """A sweep member's proxy options: its tag, and at most its rollouts' and held-out evaluation's own concurrency in
    flight, so it cannot take the batches of the replicas it shares with the other members. {} for a lone run."""
    member = spec_member(spec)
    if not member:
        return {}
    return {"member": member, "member_cap": spec["max_inflight_tasks"] + int(spec.get("eval_max_inflight") or 4)}


def member_stops(run_dir: str, spec: SpecFile) -> SweepStops | None:
    """A sweep member's stop orders, polled at each step (None for a lone run, or a run folder outside a bucket's
    runs/, which no order can reach: said in the log)."""
    if not (spec.get("sweep_id") and spec_member(spec)):
        return None
    try:
        return SweepStops(run_dir, spec)
    except ValueError as error:
        print(f"this sweep member cannot read its stop orders ({error}): only Cancel run stops it", flush=True)
        return None


def train(spec: SpecFile, run_dir: str, urls: list[str], replica_wait_s: float,
          callback: AsyncRunFolderCallback) -> str | None:
    """Train against the replicas; return None, or why training ended early (already recorded as an event)."""
    proxy = None
    deadline = time.monotonic() + replica_wait_s      # the start deadline: every first contact retries until it
    try:
        proxy = callback.proxy = start_proxy_process(
            urls, stats_dir=os.path.join(run_dir, METRICS_DIR), host=os.environ.get(PROXY_HOST_ENV, "127.0.0.1"),
            port=int(os.environ.get(PROXY_PORT_ENV) or 0), **member_proxy(spec))
        healthy = wait_for_replicas(proxy.url, replica_wait_s, replicas_gone(run_dir, spec.get("replicas", 2),
                                                                            os.environ.get(FLEET_DIR_ENV)))
        # TRL asks /server_info once, with no retry: asked here first, until the deadline, its answer is the proxy's.
        print(f"/server_info answered in {await_server_info(proxy.url, deadline):.1f} s", flush=True)
        patched = install_cpu_fallbacks()
        trainer = build_trainer(spec, run_dir, proxy.url, callback)
        if not trainer._lora_sync:
            raise RuntimeError(
                "TRL chose merged-weight sync (its warning above says why, e.g. an adapter on lm_head or "
                "embed_tokens); a distributed run can only sync LoRA adapters through the bucket, because the "
                "proxy cannot fan NCCL weight transfers out to several replicas. Use plain LoRA on linear layers.")
        engine = (f"vLLM replicas behind the LoRA-aware proxy ({healthy}/{len(urls)} healthy at start, "
                  f"adapter-only sync{', fallbacks: ' + ', '.join(patched) if patched else ''})")
        if benchmark_note(spec["model"]):
            engine += f" · model {benchmark_note(spec['model'])}"
        print(f"generation engine: {engine}", flush=True)
        # The proxy's address: a panel on this machine sends "try it" prompts through it while the run is live.
        write_event(run_dir, TRAINER_WRITER, ENGINE, engine=engine, replicas=len(urls), healthy=healthy,
                    proxy_url=proxy.url)
        checkpoint = latest_checkpoint(run_dir)
        if checkpoint:
            print(f"resuming from {checkpoint}", flush=True)
        continue_numbering(trainer, run_dir, checkpoint, spec_member(spec))
        trainer.train(resume_from_checkpoint=checkpoint)
        if trainer.held_out is not None:
            trainer.held_out.finish()      # the last versions, while the proxy and the replicas are still up
        callback.finished()
        return None
    except BaseException as error:
        # Recorded before the proxy stops: a cancelled job has a grace period, and its replicas stop on the event.
        return record_end(run_dir, TRAINER_WRITER, error, callback.flush, details=failure_fields)
    finally:
        if proxy is not None:
            proxy.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run-dir", required=True, help="the run's folder: holds spec.json, receives everything else")
    parser.add_argument("--replica", action="append", help=f"a vLLM replica's base URL (repeat; or {REPLICAS_ENV})")
    parser.add_argument("--replica-wait", type=float, default=900.0,
                        help="the start deadline: seconds to wait for every replica (then starting with those that "
                             "are up) and for their first answers (/server_info), retrying with backoff until then")
    args = parser.parse_args()
    run_dir = os.path.abspath(args.run_dir)
    spec = read_spec(run_dir)
    trackio_folder(spec, run_dir)
    callback = AsyncRunFolderCallback(run_dir)
    callback.stops = member_stops(run_dir, spec)
    stop_on_sigterm(first=callback.stop_now)
    remember_env_secrets()   # the job's token is masked in every event it writes
    raise_open_files_limit()    # TRL's rollout worker (a child) holds a socket for each generation in flight
    say_vllm_version_warning_once()
    no_progress_bars()
    Heartbeat(run_dir).start()    # the replicas stop when it stops, however this process ends
    try:
        message = train(spec, run_dir, replica_urls(args.replica), args.replica_wait, callback)
    except BaseException as error:     # stopping the proxy failed, or a second SIGTERM arrived meanwhile
        message = record_end(run_dir, TRAINER_WRITER, error, callback.flush, details=failure_fields)
    if message:
        leave(message)


if __name__ == "__main__":
    main()
