"""A stand-in for TRL 1.16's rollout loop (`_AsyncRolloutLoop`): TRL's own `AsyncRolloutWorker` spawns it as its child,
with TRL's stop-watcher thread asleep on the stop Event, so the worker's lifecycle (start, stop, liveness) is TRL's
while the child generates nothing. Module level: the spawned child imports it by name."""

import asyncio
import time


class StandInLoop:
    """Ticks the heartbeat every 0.1 s until stopped; `fail_after_s`: raises ValueError then, as a failing reward
    function would (TRL's `run()` reports it to the parent before the child exits)."""

    def __init__(self, *, heartbeat_value, failed_event, exception_info_queue, fail_after_s=None, **_kwargs):
        self._heartbeat_value = heartbeat_value
        self._failed_event = failed_event
        self._exception_info_queue = exception_info_queue
        self.fail_after_s = fail_after_s
        self._loop = asyncio.new_event_loop()
        self._stop_event = asyncio.Event()

    def run(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_until_complete(self._tick())
        except BaseException as error:
            self._exception_info_queue.put_nowait((type(error).__name__, str(error), ""))
            self._failed_event.set()
            raise
        finally:
            self._loop.close()

    async def _tick(self) -> None:
        started = time.monotonic()
        while not self._stop_event.is_set():
            self._heartbeat_value.value = time.time()
            if self.fail_after_s is not None and time.monotonic() - started > self.fail_after_s:
                raise ValueError("reward function exploded")
            await asyncio.sleep(0.1)
