"""The pre-launch check of a run's task, in processes of its own, never in the panel's.

    python -m runtime.check.check_task                     # the harness: the request as JSON on stdin (a local check)
    python -m runtime.check.check_task --request FILE     # the same, the request from a file (the check job)

The harness reads a few rows of the dataset (given in the request, or from a file, or a builtin set), shapes them
as the trainer does (task.py), renders the first prompt with the model's chat template and counts prompt tokens.
Then a worker process of its own (`--worker`) calls every reward function exactly as TRL would, with the loader
the trainer uses (rewards.py), on sample completions: the visitor's code runs only there. The harness first
lowers its limits and drops privileges (`confine`, inherited by the worker), keeps the report channel to itself
(the worker never holds it), times each call, and relays only well-formed answers, framed with the check's
nonce (check_protocol.py). Whatever the code prints goes to stderr.

This module is the harness's command line and its two steps; the data report is check_data.py, the reward calls
check_rewards.py, the worker reward_worker.py, the confinement confinement.py.
"""

import json
import os
import sys

from ..records import CHECK_DATA, CHECK_DONE
from .check_data import check_data
from .check_protocol import NONCE_ENV, Channel
from .check_rewards import check_rewards
from .confinement import UNPRIVILEGED_UID, confine
from .reward_worker import worker


def harness(request: dict, nonce: str, protocol) -> None:
    confine(request.get("limits") or {}, request.get("drop_uid"))
    channel = Channel(protocol, nonce)
    report, tasks, tokenizer = check_data(request)
    channel.emit(event=CHECK_DATA, **report)
    if not report["errors"]:
        check_rewards(request, tasks, tokenizer, channel, float(request.get("timeout_s") or 15.0))
    channel.emit(event=CHECK_DONE)


def main() -> None:
    if sys.argv[1:2] == ["--worker"]:
        worker()
        return
    protocol = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)             # nothing else this process (or a library) prints can land in the report
    sys.stdout = sys.stderr
    if sys.argv[1:2] == ["--request"]:
        path = sys.argv[2]
        with open(path) as f:
            request = json.load(f)
        for key in ("file", "eval_file"):
            if request.get(key):
                request[key] = os.path.join(os.path.dirname(os.path.abspath(path)), request[key])
        nonce = os.environ.pop(NONCE_ENV, "")
        if os.geteuid() == 0:
            # A job's container runs as root: the check drops to an unprivileged user there too, so the worker
            # cannot read the harness (its nonce, its channel) through /proc.
            work = os.getcwd()
            for name in [work, *(os.path.join(work, n) for n in os.listdir(work))]:
                os.chown(name, UNPRIVILEGED_UID, UNPRIVILEGED_UID)
            os.environ.update(HOME=work, HF_HOME=os.path.join(work, ".hf"))
            request["drop_uid"] = UNPRIVILEGED_UID
    else:
        request = json.load(sys.stdin)
        nonce = request.pop("nonce", "")
    harness(request, nonce, protocol)


if __name__ == "__main__":
    main()
