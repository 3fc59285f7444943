"""A rollout worker that dies or freezes never hangs the trainer: TRL 1.16's own `AsyncRolloutWorker` with a
stand-in child (tests/rollout_standin.py), watched by runtime/trainer/rollout_watch.py. The real trainer's end is in
tests/test_rollout_death.py; the CPython behaviour behind it is reproduced by docs/upstream/mp_event_dead_waiter.py."""

import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from backend.runtime.trainer import rollout_watch
from backend.runtime.trainer.rollout_watch import RolloutWatch, exit_cause

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pytestmark = [pytest.mark.integration, pytest.mark.full]


def _worker(**loop_kwargs):
    from accelerate.state import PartialState
    from trl.experimental.async_grpo.async_rollout_worker import AsyncRolloutWorker

    from tests.rollout_standin import StandInLoop

    PartialState()      # TRL's worker logs through accelerate, as it does inside a trainer
    worker = AsyncRolloutWorker(child_ready_timeout=120, **loop_kwargs)
    worker._loop_cls = StandInLoop
    return worker


@pytest.fixture
def watched():
    """(worker, watch, causes): a started worker whose watch records each death instead of raising."""
    made = []

    def make(**loop_kwargs):
        worker = _worker(**loop_kwargs)
        causes = []
        watch = RolloutWatch(worker, on_death=causes.append, poll_s=0.2)
        watch._loop_thread = threading.Thread(target=watch._loop, daemon=True)
        worker.start()
        watch._loop_thread.start()
        made.append(worker)
        return worker, watch, causes

    yield make
    for worker in made:
        process = worker._process
        if process is not None and process.is_alive():
            os.kill(process.pid, signal.SIGKILL)
            process.join(5)


def _within(seconds: float, condition) -> float | None:
    started = time.monotonic()
    while time.monotonic() - started < seconds:
        if condition():
            return time.monotonic() - started
        time.sleep(0.05)
    return None


def _stop_time(watch, limit_s: float = 40.0) -> float | None:
    stopper = threading.Thread(target=watch.stop, daemon=True)
    started = time.monotonic()
    stopper.start()
    stopper.join(limit_s)
    return None if stopper.is_alive() else time.monotonic() - started


def test_the_cpython_hang_behind_it_still_reproduces():
    """The upstream reproduction: when this stops failing, TRL's stop() may be safe again (and the watch's Event swap
    harmless)."""
    result = subprocess.run([sys.executable, os.path.join(ROOT, "docs/upstream/mp_event_dead_waiter.py")],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "fresh Event: returned" in result.stdout and "HUNG" in result.stdout


@pytest.mark.spine      # tier 1: a dead rollout worker noticed and its stop safe (~20 s)
def test_a_killed_rollout_worker_is_noticed_within_seconds_with_its_signal_and_stops_at_once(watched):
    worker, watch, causes = watched()
    os.kill(worker._process.pid, signal.SIGKILL)
    noticed = _within(10, lambda: causes)
    assert noticed is not None, "the watch never noticed the dead child"
    assert causes == ["rollout worker died: killed by SIGKILL"]
    took = _stop_time(watch)
    assert took is not None and took < 5, f"stop() after the child died took {took} s (None: it hung)"
    assert worker._process is None


def test_a_rollout_worker_whose_code_raised_is_reported_with_its_own_error(watched):
    worker, _watch, causes = watched(fail_after_s=0.5)
    assert _within(20, lambda: causes) is not None
    assert causes == ["rollout worker died: ValueError: reward function exploded"]
    assert not worker._process.is_alive()


def test_a_frozen_rollout_worker_is_killed_by_the_stop_instead_of_waited_for(watched, monkeypatch):
    monkeypatch.setenv(rollout_watch.STALE_ENV, "1")
    worker, watch, causes = watched()
    process = worker._process
    os.kill(process.pid, signal.SIGSTOP)
    time.sleep(2.5)                     # its heartbeat is older than the 1 s it may be
    assert process.is_alive() and not causes, "a frozen child is alive: the watch leaves it to the stop"
    took = _stop_time(watch)
    assert took is not None and took < 15, f"stop() of a frozen child took {took} s (None: it hung)"
    assert not process.is_alive() and exit_cause(process.exitcode) == "killed by SIGKILL"
    assert causes == [], "a stop asked for is no death"


def test_a_stop_asked_for_is_not_reported_as_a_death(watched):
    worker, watch, causes = watched()
    took = _stop_time(watch)
    assert took is not None and took < 20
    time.sleep(1.0)
    assert causes == [] and worker._process is None


def test_the_death_is_raised_in_the_main_thread_even_while_it_sleeps():
    """The default `on_death`: a real signal wakes the main thread out of a blocking wait, and the error carries the
    cause (a script, so the signal handler is installed in a main thread of its own)."""
    script = (
        "import os, signal, sys, time\n"
        f"sys.path[:0] = [{ROOT!r}]\n"
        "from tests.test_rollout_watch import _worker\n"
        "from backend.runtime.trainer.rollout_watch import RolloutWatch, RolloutWorkerDied\n"
        "worker = _worker()\n"
        "watch = RolloutWatch(worker, poll_s=0.2).start()\n"
        "worker.start()\n"
        "os.kill(worker._process.pid, signal.SIGKILL)\n"
        "started = time.monotonic()\n"
        "try:\n"
        "    time.sleep(120)\n"
        "except RolloutWorkerDied as error:\n"
        "    print(f'raised after {time.monotonic() - started:.1f} s: {error}', flush=True)\n"
        "    worker.stop()\n"
        "    print('stopped', flush=True)\n")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    line = next(x for x in result.stdout.splitlines() if x.startswith("raised after"))
    assert line.endswith("rollout worker died: killed by SIGKILL") and float(line.split()[2]) < 10, line
    assert "stopped" in result.stdout
