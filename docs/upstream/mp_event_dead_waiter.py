"""Minimal reproduction: `multiprocessing.Event.set()` never returns once a process that waited on it has died.

    python3 docs/upstream/mp_event_dead_waiter.py        # prints what happened; exits 1 when set() hung

A spawned child waits on an Event in a thread (as TRL 1.16's rollout worker's stop-watcher does); the parent kills
the child with SIGKILL, then calls `set()` (as `AsyncRolloutWorker.stop()` does). `Condition.notify_all()` releases
the dead sleeper's semaphore and then waits for it to acknowledge, which a dead process never does (CPython issue
#75158). The same `set()` on a fresh Event returns at once: the workaround.
"""

import multiprocessing as mp
import os
import signal
import sys
import threading
import time

WAIT_S = 10.0


def child(event) -> None:
    threading.Thread(target=event.wait, daemon=True).start()    # TRL's _spawn_stop_watcher
    time.sleep(3600)


def timed_set(event) -> float | None:
    """Seconds `event.set()` took, or None if it had not returned after WAIT_S."""
    started = time.monotonic()
    setter = threading.Thread(target=event.set, daemon=True)
    setter.start()
    setter.join(WAIT_S)
    return None if setter.is_alive() else time.monotonic() - started


def main() -> int:
    ctx = mp.get_context("spawn")
    event = ctx.Event()
    process = ctx.Process(target=child, args=(event,), daemon=True)
    process.start()
    time.sleep(2.0)          # the child's thread is asleep on the Event's Condition
    os.kill(process.pid, signal.SIGKILL)
    process.join()
    print(f"child ended with exit code {process.exitcode}", flush=True)
    fresh = timed_set(ctx.Event())
    print("set() on a fresh Event: " + (f"returned in {fresh:.3f} s" if fresh is not None else "HUNG"), flush=True)
    took = timed_set(event)
    if took is None:
        print(f"set() on the Event the dead child waited on: HUNG (no return within {WAIT_S:.0f} s)", flush=True)
        os._exit(1)          # the hung thread holds the Condition's lock: a normal exit would wait for it
    print(f"set() on the Event the dead child waited on: returned in {took:.3f} s (not reproduced)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
