"""The async trainer keeps its rollout worker (TRL's child process) on a short leash: a child that dies is noticed
in about a second, the run ends with the child's own cause, and nothing ever blocks on a dead or frozen child.

Why this exists (TRL 1.16, reproduced in docs/upstream/trl-async-hang.md):
- `AsyncRolloutWorker.stop()` calls `set()` on a multiprocessing Event whose Condition a thread of the child sleeps
  on. When that child died (SIGKILL, OOM) or is frozen (SIGSTOP), `set()` -> `notify_all()` waits for the sleeper to
  acknowledge, forever (CPython issue #75158). TRL calls `stop()` in `_inner_training_loop`'s `finally`, our SIGTERM
  path called it too: the trainer hung at its last step until the job's timeout, billing and shown RUNNING.
- A SIGKILLed child sets no failure flag: TRL notices it only when its heartbeat is `heartbeat_stale_after_s` old
  (300 s by default), and only while the trainer waits on an empty queue.

So a watch thread polls the child's liveness every `POLL_S`; when it died (or said it failed), the watch makes the
stop safe (a fresh Event in place of the one a dead thread may sleep on) and raises `RolloutWorkerDied` in the main
thread, which ends the run through the trainer's own path (a `failed` event with the cause, the proxy stopped).
Every stop of the child checks it first: a dead or frozen child is killed and its Event replaced, and the stop
itself runs with a deadline.

`heartbeat_stale_after_s` (TRL's config) is set to `STALE_AFTER_S` (GRPO_ROLLOUT_STALE_AFTER_S): the child ticks
its heartbeat every 0.5 s while idle and between scoring groups, so 180 s means frozen (SIGSTOP, a deadlock, a
reward function stuck for minutes), and it comes after the panel's stall alert (60 s at least, backend/view/
diagnose.py) so the page says "stalled" before the run ends on it.
"""

import os
import signal
import threading
import time

POLL_S = 1.0
STALE_AFTER_S = 180.0
STOP_DEADLINE_S = 30.0       # TRL's stop() waits 15 s for the child, then 5 s after SIGTERM
STALE_ENV = "GRPO_ROLLOUT_STALE_AFTER_S"


def stale_after_s() -> float:
    """The `heartbeat_stale_after_s` the trainer runs with (see the module docstring)."""
    return float(os.environ.get(STALE_ENV) or STALE_AFTER_S)


class RolloutWorkerDied(BaseException):
    """The rollout worker child ended while training needed it; the message says how (its error or signal). Not an
    `Exception`: raised asynchronously in the main thread, it must not be swallowed by a library's `except
    Exception` on its way out."""


def exit_cause(exitcode: int | None) -> str:
    """'killed by SIGKILL' or 'exited with code 3' for a child's exit code."""
    if exitcode is None:
        return "is not running"
    if exitcode < 0:
        try:
            return f"killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"killed by signal {-exitcode}"
    return f"exited with code {exitcode}"


def _child_error(worker) -> str | None:
    """The child's own last error ('ValueError: ...'), if it reported one before ending."""
    failed = getattr(worker, "_failed_event", None)
    if failed is None or not failed.is_set():
        return None
    try:
        type_name, message, _traceback = worker._exception_info_queue.get(timeout=1.0)
    except Exception:    # queue.Empty, or a queue the dead child left half-written
        return "it reported a failure (its log has the traceback)"
    # Put back for TRL's own check_health, which chains it to its error.
    try:
        worker._exception_info_queue.put_nowait((type_name, message, _traceback))
    except Exception:
        pass
    first = str(message).splitlines()[0] if message else ""
    return f"{type_name}: {first}"


def _heartbeat_age(worker) -> float:
    value = getattr(worker, "_heartbeat_value", None)
    return time.time() - value.value if value is not None else 0.0


def _release_stop_event(worker) -> None:
    """A fresh stop Event: the old one's Condition may wait for a dead or frozen sleeper forever (module docstring).
    Only a child that is gone or about to be killed may lose its Event this way."""
    worker._stop_event_mp = worker._mp_ctx.Event()


class RolloutWatch:
    """Watches one `AsyncRolloutWorker` (TRL 1.16) for the life of a training run; see the module docstring."""

    def __init__(self, worker, on_death=None, poll_s: float = POLL_S):
        """`on_death(cause)` is called once, from the watch thread, when the child died unasked (default: raise
        `RolloutWorkerDied(cause)` in the main thread)."""
        self.worker = worker
        self.poll_s = poll_s
        self.cause: str | None = None
        self.stopping = False
        self._on_death = on_death or _raise_in_main_thread
        self._original_stop = worker.stop
        worker.stop = self.stop            # TRL's own `finally` and our SIGTERM path both come here
        self._done = threading.Event()
        self._stop_lock = threading.Lock()     # SIGTERM's early stop and TRL's own may come at once

    def start(self) -> "RolloutWatch":
        _install_main_thread_handler(self)
        threading.Thread(target=self._loop, name="rollout-watch", daemon=True).start()
        return self

    def _loop(self) -> None:
        while not self._done.wait(self.poll_s):
            process = getattr(self.worker, "_process", None)
            if self.stopping or process is None or process._popen is None:
                continue      # not started yet, or being stopped on purpose
            error = _child_error(self.worker)
            if process.is_alive() and error is None:
                continue
            if process.is_alive():     # it failed and is on its way out: give it a moment, then make sure
                process.join(5.0)
                if process.is_alive():
                    process.kill()
                    process.join(5.0)
            _release_stop_event(self.worker)
            how = exit_cause(process.exitcode)
            self.cause = f"rollout worker died: {error or how}"
            print(f"{self.cause} (its process {how}); ending the run", flush=True)
            self._done.set()
            self._on_death(self.cause)

    def stop(self) -> None:
        """TRL's `stop()`, made safe: a dead child's Event is replaced, a frozen child is killed first, and the stop
        returns within STOP_DEADLINE_S whatever happens inside it."""
        self.stopping = True
        self._done.set()
        if not self._stop_lock.acquire(timeout=STOP_DEADLINE_S + 10):
            return None
        try:
            return self._stop()
        finally:
            self._stop_lock.release()

    def _stop(self) -> None:
        process = getattr(self.worker, "_process", None)
        if process is None or process._popen is None:
            return self._original_stop()
        if not process.is_alive():
            _release_stop_event(self.worker)
        elif _heartbeat_age(self.worker) > min(stale_after_s(), 30.0):
            print(f"rollout worker is frozen (no heartbeat for {_heartbeat_age(self.worker):.0f} s): killing it",
                  flush=True)
            process.kill()
            process.join(5.0)
            _release_stop_event(self.worker)
        stopper = threading.Thread(target=self._original_stop, name="stop-rollouts", daemon=True)
        stopper.start()
        stopper.join(STOP_DEADLINE_S)
        if stopper.is_alive():     # a child that died during the stop itself: nothing may wait on it any more
            print(f"rollout worker did not stop within {STOP_DEADLINE_S:.0f} s: killed", flush=True)
            if process.is_alive():
                process.kill()
            self.worker._process = None
        return None


_watch: RolloutWatch | None = None


def _on_signal(_signum, _frame):
    if _watch is not None and _watch.cause:
        raise RolloutWorkerDied(_watch.cause)


def _install_main_thread_handler(watch: RolloutWatch) -> None:
    global _watch
    _watch = watch
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGUSR1, _on_signal)


def _raise_in_main_thread(_cause: str) -> None:
    """Wake the main thread (a real signal interrupts a blocking wait) so that `RolloutWorkerDied` is raised there."""
    signal.pthread_kill(threading.main_thread().ident, signal.SIGUSR1)


def watch_rollout_worker(trainer) -> RolloutWatch | None:
    """Watch the rollout worker of TRL's async `trainer` (rank 0 holds one); None where it has none."""
    worker = getattr(trainer, "rollout_worker", None)
    if worker is None or not hasattr(worker, "_process"):
        return None
    return RolloutWatch(worker).start()
