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

from .layout import write_event

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
    kind = "canceled" if isinstance(error, Terminated) else "failed"
    _try(flush, "the last metrics")
    _try(lambda: write_event(run_dir, writer, kind, **fields), f"the '{kind}' event")
    return fields["error"]


def _try(write, what: str) -> None:
    try:
        write()
    except Exception as error:
        print(f"could not write {what} into the bucket: {describe(error)}", file=sys.stderr, flush=True)
