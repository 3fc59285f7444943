"""The distributed trainer's heartbeat in the bucket, and the watch a replica keeps on it.

A trainer that is SIGKILLed or OOM-killed writes no "finished" or "failed" event, yet its replicas must stop (on
HF Jobs they bill until their timeout). So the trainer rewrites `<run_dir>/heartbeat/trainer.json` every
`GRPO_HEARTBEAT_S` seconds (default 10; atomic rename), and a replica decides the trainer is gone when
- the heartbeat changed once since the replica started and then stood still for `GRPO_TRAINER_GONE_AFTER_S`
  (default 90: a bucket mount may show another machine's write late), or
- it never changed within `GRPO_TRAINER_FIRST_BEAT_S` (default 600). The trainer job is submitted seconds after its
  replicas and beats once it has installed its packages and imported torch, before it downloads or builds the model
  (a few minutes on HF Jobs, the install the longest part); 10 minutes leaves room for a slow install or a machine
  the trainer waits for, while a replica whose trainer was never submitted (a launch its panel left half done)
  stops within 10 minutes, not half an hour (an H200 replica bills about $0.80 of it, not $2.50).
A change is judged by the replica's own clock, so clocks of different machines need not agree.
"""

import json
import os
import threading
import time

from ..layout import HEARTBEAT_DIR, TRAINER_WRITER, atomic_write_bytes

FIRST_BEAT_S = 600.0     # GRPO_TRAINER_FIRST_BEAT_S's default: see the module docstring


def _env_seconds(name: str, default: float) -> float:
    return float(os.environ.get(name) or default)


def heartbeat_path(run_dir: str, writer: str = TRAINER_WRITER) -> str:
    return os.path.join(run_dir, HEARTBEAT_DIR, f"{writer}.json")


class Heartbeat:
    """A daemon thread that rewrites the heartbeat file until the process ends."""

    def __init__(self, run_dir: str, writer: str = TRAINER_WRITER, interval_s: float | None = None):
        self.path = heartbeat_path(run_dir, writer)
        self.interval_s = interval_s or _env_seconds("GRPO_HEARTBEAT_S", 10)
        self._stop = threading.Event()

    def start(self) -> "Heartbeat":
        threading.Thread(target=self._loop, name="heartbeat", daemon=True).start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _loop(self) -> None:
        beat, said = 0, False
        while not self._stop.is_set():
            beat += 1
            record = {"time": time.time(), "beat": beat, "pid": os.getpid()}
            try:
                atomic_write_bytes(self.path, json.dumps(record).encode())
            except OSError as error:     # the run's own writes will fail and say so; say it here once
                if not said:
                    print(f"heartbeat: cannot write {self.path}: {error}", flush=True)
                    said = True
            self._stop.wait(self.interval_s)


class HeartbeatWatch:
    """Tells a replica whether the trainer is gone, from how the heartbeat file changes over time."""

    def __init__(self, run_dir: str, writer: str = TRAINER_WRITER, gone_after_s: float | None = None,
                 first_beat_s: float | None = None, clock=time.monotonic):
        self.path = heartbeat_path(run_dir, writer)
        self.gone_after_s = gone_after_s or _env_seconds("GRPO_TRAINER_GONE_AFTER_S", 90)
        self.first_beat_s = first_beat_s or _env_seconds("GRPO_TRAINER_FIRST_BEAT_S", FIRST_BEAT_S)
        self.clock = clock
        self.started = clock()
        self.last = self._read()         # what an earlier attempt may have left: not a beat of this one
        self.changed_at: float | None = None

    def _read(self) -> bytes | None:
        try:
            with open(self.path, "rb") as f:
                return f.read()
        except OSError:
            return None

    def gone(self) -> str | None:
        """Why the trainer counts as gone, or None while it beats (or may still start)."""
        now, current = self.clock(), self._read()
        if current != self.last:
            self.last, self.changed_at = current, now
        if self.changed_at is None:
            if now - self.started > self.first_beat_s:
                return f"no trainer heartbeat within {self.first_beat_s:.0f} s"
            return None
        if now - self.changed_at > self.gone_after_s:
            return f"no trainer heartbeat for {now - self.changed_at:.0f} s"
        return None
