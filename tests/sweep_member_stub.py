"""A sweep member's trainer as its stop orders see it, for tests: the real `SweepStops` polled as the async trainer's
step callback polls it, and its real heartbeat, without a model. On an order of its own it ends as the trainer does
(its `sweep_stop` event, then `finished`) and records its jobs COMPLETED as the local job wrapper would (exit.json);
it exits by itself after `--deadline` seconds otherwise.

    python -m tests.sweep_member_stub --run-dir DIR --job-dir JOB [--job-dir JOB ...] [--obey-only] [--poll S]
"""

import argparse
import json
import os
import sys
import time

from backend.runtime.job.heartbeat import Heartbeat
from backend.runtime.layout import FINAL_DIR, TRAINER_WRITER, atomic_write_bytes
from backend.runtime.records import FINISHED, SWEEP_STOP, write_event
from backend.runtime.spec_file import read_spec
from backend.runtime.trainer.sweep_stops import SweepStops, stop_event_fields


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run-dir", required=True)
    parser.add_argument("--job-dir", action="append", default=[])
    parser.add_argument("--obey-only", action="store_true", help="obey orders, never decide the rule")
    parser.add_argument("--poll", type=float, default=0.5)
    parser.add_argument("--deadline", type=float, default=600.0)
    args = parser.parse_args()
    stops = SweepStops(args.run_dir, read_spec(args.run_dir), poll_s=args.poll, decide=not args.obey_only)
    beat = Heartbeat(args.run_dir, interval_s=1).start()
    deadline = time.monotonic() + args.deadline
    while time.monotonic() < deadline:
        order = stops.check()
        if order is not None:
            write_event(args.run_dir, TRAINER_WRITER, SWEEP_STOP, **stop_event_fields(order))
            write_event(args.run_dir, TRAINER_WRITER, FINISHED, final=FINAL_DIR, version=0, step=0, size_bytes=0)
            beat.stop()
            for job_dir in args.job_dir:
                atomic_write_bytes(os.path.join(job_dir, "exit.json"), json.dumps(
                    {"stage": "COMPLETED", "code": 0, "message": "stopped by its sweep", "time": time.time()}).encode())
            sys.exit(0)
        time.sleep(0.1)
    beat.stop()


if __name__ == "__main__":
    main()
