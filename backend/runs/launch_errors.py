"""What a failed launch raises, and how a full disk is said in it (one sentence, not a copy's list of failed files)."""

import errno
import shutil


class LaunchError(RuntimeError):
    """A launch failed; `canceled` lists the job ids that were submitted and then cancelled."""

    def __init__(self, message: str, canceled: list[str] | None = None):
        self.canceled = canceled or []
        super().__init__(message)


class SubmitFailed(LaunchError):
    """A job of the run could not be submitted (after its files were written); what was submitted is cancelled."""


class RunIdTaken(LaunchError):
    """A run with this id already has files in the bucket: launching again would mix two runs."""


class LaunchUnderWay(LaunchError):
    """Another request is launching this run id (or sweep) right now: a retry sent while the first still runs."""


def space_or(exc: BaseException, otherwise: str) -> str:
    """'the disk is full (...)' when `exc` (or, for a copy of many files, any of its errors) says the disk is
    full, else `otherwise`: a full disk is said in one sentence, not as the copy's list of failed files."""
    if _no_space(exc):
        where = getattr(exc, "filename", None)
        return ("the disk is full (No space left on device" + (f" writing {where}" if isinstance(where, str) else "")
                + "): free some space and launch again")
    return otherwise


def _no_space(exc: BaseException) -> bool:
    if getattr(exc, "errno", None) == errno.ENOSPC:
        return True
    if isinstance(exc, shutil.Error):       # copytree: a list of (source, destination, why)
        return any("No space left on device" in str(item) for item in (exc.args[0] if exc.args else []))
    cause = exc.__cause__ or exc.__context__
    return cause is not None and cause is not exc and _no_space(cause)
