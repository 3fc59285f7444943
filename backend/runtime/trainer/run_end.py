"""How a trainer records the end of its run, even when the bucket refuses every write.

A cancelled, timed-out or preempted job gets SIGTERM: the trainer records a `canceled` event. Any other error is a
`failed` event with a message a person can act on; a full or read-only bucket is named as such. When the bucket
cannot take the event either, the message still reaches the job's log (the panel shows it, and the local job
wrapper puts the log's last line into the job's status), and writing again must not raise over the first error.
"""

import errno
import os
import signal
import sys
import traceback

from ..job.attempt import NO_RETRY_EXIT, retry_helps
from ..records import CANCELED, FAILED, write_event

# Errors that mean the bucket (or whatever disk the trainer writes to) takes no more writes.
WRITE_ERRNOS = (errno.ENOSPC, errno.EROFS, errno.EDQUOT, errno.EFBIG)


class Terminated(SystemExit):
    """The job was asked to stop (SIGTERM): cancelled, timed out, or preempted."""


def stop_on_sigterm(first=lambda: None) -> None:
    """Turn SIGTERM into `Terminated` in the main thread, after calling `first()` (what must start at once)."""
    def stop(signum, _frame):
        first()
        raise Terminated(f"stopped by {signal.Signals(signum).name} (cancelled, timed out or preempted)")

    signal.signal(signal.SIGTERM, stop)


def describe(error: BaseException) -> str:
    """One line saying what went wrong, naming a bucket that takes no more writes as the cause."""
    if isinstance(error, SystemExit):
        return str(error)
    cause = _write_error(error)
    if cause:
        return f"cannot write to the bucket: {cause}"
    return f"{type(error).__name__}: {error}"


def _write_error(error: BaseException) -> str | None:
    """'No space left on device (path)' if `error`, or what caused it, is a refused write."""
    seen = error
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno in WRITE_ERRNOS:
            return os.strerror(seen.errno) + (f" ({seen.filename})" if seen.filename else "")
        seen = seen.__cause__ or seen.__context__
    text = str(error)
    # Some writers (safetensors, torch) report the OS error only in their message.
    return next((os.strerror(code) for code in WRITE_ERRNOS if os.strerror(code) in text), None)


class EndMessage(str):
    """The message `record_end` returns, knowing whether a retry of the job could help (`retry`)."""

    retry: bool = True


def leave(message: str) -> None:
    """Exit the failed trainer: NO_RETRY_EXIT where a retry cannot help (the job wrapper and the next attempt's
    `runtime.job.attempt` stop there), else an error exit that a job with attempts left is started again after."""
    if not getattr(message, "retry", True):
        print(f"training failed: {message} (a retry cannot fix this: not retried)", file=sys.stderr, flush=True)
        sys.exit(NO_RETRY_EXIT)
    sys.exit(f"training failed: {message}")


def record_end(run_dir: str, writer: str, error: BaseException, flush=lambda: None, details=None) -> str:
    """Flush what is pending, record a `canceled` or `failed` event, and return the message. Never raises:
    a write that fails here is said in the log instead. `details(error)` may add fields to a `failed` event
    (a traceback, the frames of the run's own code); its `error` line is used unless the bucket is the cause."""
    fields = {"error": describe(error)}
    if not isinstance(error, SystemExit):
        traceback.print_exception(error)
        if details is not None:
            try:
                extra = details(error)
            except Exception:    # describing the error must never hide it
                extra = {}
            bucket_cause = _write_error(error) is not None
            fields.update({k: v for k, v in extra.items() if k != "error" or not bucket_cause})
    kind = CANCELED if isinstance(error, Terminated) else FAILED
    if kind == FAILED and not retry_helps(error):
        fields["retry"] = False     # the next attempt, if any, stops at once (runtime.job.attempt)
    _try(flush, "the last metrics")
    _try(lambda: write_event(run_dir, writer, kind, **fields), f"the '{kind}' event")
    message = EndMessage(fields["error"])
    message.retry = fields.get("retry", True)
    return message


def _try(write, what: str) -> None:
    try:
        write()
    except Exception as error:
        print(f"could not write {what} into the bucket: {describe(error)}", file=sys.stderr, flush=True)
