"""Attempts of a job: what each start of a job records, and which failures a retry cannot fix.

    python -m runtime.job.attempt --run-dir DIR --role trainer

The first step of a trainer job's command, before anything is installed. It records an `attempt` event (so the
panel shows each retry, local or on HF Jobs, whose `attempts` start the same command again), and it refuses to
start again, exiting NO_RETRY_EXIT within a second, when the trainer's last attempt failed for a reason a retry cannot
fix (its `failed` event says `"retry": false`): bad reward code, an import error, bad data, no replica left. The
local job wrapper stops retrying on that exit code; HF Jobs spends at most a container start per attempt left.

Standard library only: it runs before the job's pip install.
"""

import argparse
import os
import sys

from ..layout import TRAINER_WRITER
from ..records import ATTEMPT, FAILED, TRAINER_STAGES, write_event
from ..versions import trainer_events

NO_RETRY_EXIT = 3
ATTEMPT_ENV = "GRPO_ATTEMPT"     # the local job wrapper numbers its attempts; HF Jobs does not say
# Failures of the run's own code or data: the same inputs fail the same way on every attempt. Named rather than
# imported, so this module needs neither TRL nor the task's readers.
PERMANENT = frozenset({"ImportError", "ModuleNotFoundError", "SyntaxError", "IndentationError", "TaskDataError",
                       "RewardFunctionError", "ReplicasEndedError"})


def retry_helps(error: BaseException) -> bool:
    """False when `error`, or what caused it, is a failure a retry cannot fix (PERMANENT)."""
    seen, depth = error, 0
    while seen is not None and depth < 20:
        if any(cls.__name__ in PERMANENT for cls in type(seen).__mro__):
            return False
        seen, depth = seen.__cause__ or seen.__context__, depth + 1
    return True


def refused_retry(events: list[dict]) -> str | None:
    """The error of the trainer's last attempt when it said a retry cannot fix it, else None."""
    ends = [e for e in events if e.get("event") in TRAINER_STAGES]
    if ends and ends[-1]["event"] == FAILED and ends[-1].get("retry") is False:
        return str(ends[-1].get("error") or "a failure a retry cannot fix")
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run-dir", required=True)
    parser.add_argument("--role", default="trainer")
    args = parser.parse_args()
    run_dir = os.path.abspath(args.run_dir)
    refused = refused_retry(trainer_events(run_dir))
    if refused:
        print(f"[attempt] not starting again: the last attempt failed for a reason a retry cannot fix: {refused}",
              flush=True)
        sys.exit(NO_RETRY_EXIT)
    number = os.environ.get(ATTEMPT_ENV)
    write_event(run_dir, TRAINER_WRITER, ATTEMPT, role=args.role,
                **({"attempt": int(number)} if number and number.isdigit() else {}))


if __name__ == "__main__":
    main()
