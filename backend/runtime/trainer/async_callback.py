"""What the distributed trainer writes to its run folder as it trains (`AsyncRunFolderCallback`): metrics with the
policy version and its staleness, the final adapter, the `finished` event, a sweep member's stop obeyed; and what it
starts the moment SIGTERM arrives.
"""

import os
import queue
import threading
import time

from ..layout import FINAL_DIR, TRAINER_WRITER, adapter_name
from ..records import FINISHED, SWEEP_STOP, write_event
from .metrics_callback import RunFolderCallback, canonical_metrics, publish_adapter
from .sweep_stops import stop_event_fields


class AsyncRunFolderCallback(RunFolderCallback):
    """The colocated run-folder callback, for the async trainer: staleness is measured rather than 0, and no
    adapters/ versions are published, since TRL's synced .vllm_lora versions are the run's versions (with the
    numbers the replicas serve)."""

    def __init__(self, run_dir: str):
        super().__init__(run_dir, adapter_every=1)
        self.trainer = None  # set once the trainer exists: the policy version lives on it
        self.proxy = None    # set once the proxy runs
        self.final = {}      # the final adapter's metadata, once training has ended
        self.stops = None    # a sweep member's stop orders (sweep_stops.py); None for a lone run
        self.stopped = None  # the order it obeyed

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not logs or "train_runtime" in logs:
            return  # the end-of-training summary, not a step
        record = {**canonical_metrics(logs), "step": state.global_step, "time": time.time(),
                  "policy_version": self.trainer.model_version}
        self.pending.append(record)
        if time.time() - self.last_flush >= self.flush_every_s:
            self.flush()
        print(f"{self._progress_line(record, state.max_steps)}  staleness {record.get('staleness_mean', 0):.2f}"
              f"  policy v{self.trainer.model_version}", flush=True)

    def on_step_end(self, args, state, control, **kwargs):
        order = self.stops.check() if self.stops is not None and self.stopped is None else None
        if order is not None:
            self.obey(order, state, control)

    def obey(self, order: dict, state, control) -> None:
        """End training as at its last step, because the member's sweep ordered it (its rule, or its owner by
        hand): the versions stay published, the last are evaluated and the final adapter is written as for any
        end (on_train_end, `finished`); TRL is asked for a checkpoint too, for a Resume to train the member on."""
        self.stopped = order
        write_event(self.run_dir, TRAINER_WRITER, SWEEP_STOP, **stop_event_fields(order))
        print(f"stopping at step {state.global_step}: this sweep member's stop order says {order['rule']}",
              flush=True)
        control.should_training_stop = True
        control.should_save = True

    def on_train_end(self, args, state, control, model=None, **kwargs):
        self.flush()
        version = self.trainer.model_version
        self.final = publish_adapter(model, os.path.join(self.run_dir, FINAL_DIR),
                                     {"version": version, "name": adapter_name(version, self.trainer.member),
                                      "step": state.global_step})
        self.drain_rollouts()

    def finished(self) -> None:
        """The `finished` event, once nothing needs the replicas any more: they stop when they read it."""
        self.flush()
        # Dated now, not when the final adapter was written (the metadata's own time).
        write_event(self.run_dir, TRAINER_WRITER, FINISHED, **{**self.final, "final": FINAL_DIR, "time": time.time()})

    def stop_now(self) -> None:
        """What starts the moment SIGTERM arrives, so that a cancelled trainer is gone in seconds: drain the
        rollouts, stop the rollout worker, and close the proxy (a generation in flight through it keeps each
        replica's shutdown waiting for the proxy's connections to close)."""
        self.drain_rollouts()
        worker = getattr(self.trainer, "rollout_worker", None)
        if worker is not None:     # its stop is the watch's (runtime/trainer/rollout_watch.py): safe on a dead child
            threading.Thread(target=worker.stop, name="stop-rollouts", daemon=True).start()
        if self.proxy is not None:
            threading.Thread(target=self.proxy.stop, name="stop-proxy", daemon=True).start()

    def drain_rollouts(self) -> None:
        """TRL stops its rollout child when training ends (or is stopped). A process exits only once the samples it
        queued are flushed into the pipe, so with nobody reading it hangs until TRL kills it 15 s later."""
        if self.trainer is not None and getattr(self.trainer, "rollout_queue", None) is not None:
            threading.Thread(target=_drain, args=(self.trainer.rollout_queue,), daemon=True).start()


def _drain(rollouts) -> None:
    while True:
        try:
            rollouts.get(timeout=5)
        except queue.Empty:
            return
