"""The check's confinement: lowered limits, an unprivileged user, no way for a child to read this process."""

import ctypes
import os
import resource

_LIMITS = {"address_space_bytes": resource.RLIMIT_AS, "cpu_seconds": resource.RLIMIT_CPU,
           "processes": resource.RLIMIT_NPROC, "file_bytes": resource.RLIMIT_FSIZE,
           "open_files": resource.RLIMIT_NOFILE}
PR_SET_DUMPABLE, PR_SET_NO_NEW_PRIVS = 4, 38
UNPRIVILEGED_UID = 65534      # "nobody"


def confine(limits: dict, drop_uid: int | None) -> None:
    """Lower this process's limits (its children inherit them), become `drop_uid` if root, and make this process
    unreadable to its children (no ptrace, no /proc/<pid>/mem or environ): the worker cannot reach the channel."""
    for name, value in limits.items():
        resource.setrlimit(_LIMITS[name], (int(value), int(value)))
    if drop_uid is not None and os.geteuid() == 0:
        os.setgroups([])
        os.setresgid(drop_uid, drop_uid, drop_uid)
        os.setresuid(drop_uid, drop_uid, drop_uid)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
