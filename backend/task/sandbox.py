"""Where the task check runs a visitor's code on this machine: a bubblewrap sandbox that reaches nothing of the panel.

The check process sees a read-only Python installation, its runtime code, a scratch folder of its own and a
private /tmp, /proc and HOME; it has its own PID, mount, network, IPC and UTS namespaces, so the panel's
processes, memory, files, environment and loopback services do not exist for it, and every process it starts
(also a `setsid` or double-forked one) ends with it. Inside, the check's own harness lowers its resource limits
(memory, CPU time, processes, file size, open files) and, when the panel runs as root, becomes an unprivileged
user before it runs anything of the visitor's (`runtime.check_task.confine`).

Where the OS refuses a layer (no `bwrap`, no namespaces), `Sandbox.missing` names it: the check still runs on a
local single-user panel with what is left and says what is missing. A panel that serves other people never runs
visitor code here at all: its checks run in the visitor's own Hugging Face job (`backend.task.check_job`).
"""

import functools
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field

from backend.runtime import RUNTIME_DIR
from backend.runtime.check_task import UNPRIVILEGED_UID  # "nobody": what a root panel's check becomes

INSIDE_LIB = "/check/lib"         # PYTHONPATH inside: the runtime package is INSIDE_LIB/runtime
INSIDE_WORK = "/check/work"       # the scratch folder: the check's working directory, its only writable place
INSIDE_HOME = "/check/home"
# Per process of the check: enough for Python with transformers and TRL imported (~1 GB of address space).
LIMITS = {"address_space_bytes": 6 * 2**30, "cpu_seconds": 300, "processes": 64, "file_bytes": 64 * 2**20,
          "open_files": 256}
# The environment inside: nothing of the panel's but what numerics need to behave the same.
PASSED_ENV = ("LANG", "LC_ALL", "OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "OMP_NUM_THREADS", "MKL_NUM_THREADS")
NAMESPACES = ("--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try")
LAYERS = ("PID namespace", "mount namespace", "network namespace", "a user of its own")


@dataclass(frozen=True)
class Sandbox:
    """How the check process is started here, and which isolation layers this machine refused."""

    bwrap: str | None
    missing: tuple[str, ...] = ()
    reason: str = ""
    drop_uid: int | None = field(default=None)

    def command(self, argv: list[str], scratch: str, ro_binds: dict[str, str]) -> tuple[list[str], dict, str]:
        """(argv, env, working directory) that run `argv` confined; `ro_binds` maps host paths to inside paths."""
        env = {"HOME": INSIDE_HOME, "PATH": "/usr/local/bin:/usr/bin:/bin", "PYTHONPATH": INSIDE_LIB,
               "HF_HOME": f"{INSIDE_HOME}/hf", "HF_HUB_OFFLINE": "1", "HF_HUB_DISABLE_TELEMETRY": "1",
               "TOKENIZERS_PARALLELISM": "false", "PYTHONDONTWRITEBYTECODE": "1", "PYTHONUNBUFFERED": "1",
               "TMPDIR": "/tmp", **{k: os.environ[k] for k in PASSED_ENV if k in os.environ}}
        if self.bwrap is None:
            return self._unconfined(argv, scratch, env)
        args = [self.bwrap, *NAMESPACES, "--die-with-parent", "--new-session"]
        if os.geteuid() != 0:
            args.append("--unshare-user")
        args += system_binds() + python_binds()
        for folder in ("/check", INSIDE_LIB):   # created by bwrap, with a mode that lets the dropped user in
            args += ["--perms", "0755", "--dir", folder]
        args += ["--ro-bind", RUNTIME_DIR, f"{INSIDE_LIB}/runtime", "--bind", scratch, INSIDE_WORK]
        for host, inside in ro_binds.items():
            args += ["--perms", "0755", "--dir", os.path.dirname(inside), "--ro-bind", host, inside]
        args += ["--proc", "/proc", "--dev", "/dev", "--perms", "1777", "--tmpfs", "/tmp",
                 "--perms", "0777", "--dir", INSIDE_HOME, "--chdir", INSIDE_WORK, "--clearenv"]
        for k, v in env.items():
            args += ["--setenv", k, v]
        return [*args, *argv], env, scratch

    def _unconfined(self, argv, scratch, env) -> tuple[list[str], dict, str]:
        """No bubblewrap: the same process with the same clean environment, paths as they are on this machine."""
        home = os.path.join(scratch, ".home")
        os.makedirs(home, exist_ok=True)
        lib = os.path.join(scratch, ".lib")
        os.makedirs(lib, exist_ok=True)
        os.symlink(RUNTIME_DIR, os.path.join(lib, "runtime"))
        env = {**env, "HOME": home, "HF_HOME": os.path.join(home, "hf"), "PYTHONPATH": lib, "TMPDIR": scratch}
        return argv, env, scratch     # the request names host paths here (task_check._stage_files)


def system_binds() -> list[str]:
    """The system's libraries and tools, read-only; /etc only for the dynamic linker's cache."""
    args = []
    for top in ("usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        path = f"/{top}"
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    for path in ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/localtime"):
        if os.path.exists(path):
            args += ["--ro-bind", path, path]
    return args


def python_roots() -> list[str]:
    """The folders of this Python installation and its packages (a venv and the base it was made from)."""
    roots = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix)}
    roots.add(os.path.dirname(os.path.dirname(os.path.realpath(sys.executable))))
    for entry in sys.path:
        real = os.path.realpath(entry) if entry else ""
        if os.path.basename(real) in ("site-packages", "dist-packages") and os.path.isdir(real):
            roots.add(real)
    roots = sorted(r for r in roots if os.path.isdir(r) and r not in ("/", "/usr") and not r.startswith("/usr/"))
    return [r for r in roots if not any(r != o and r.startswith(o + os.sep) for o in roots)]


def python_binds() -> list[str]:
    args, made = [], set()
    for root in python_roots():
        # bwrap copies a parent's mode when it creates it (/root is 0700): make every parent traversable.
        parts = root.strip("/").split("/")[:-1]
        for i in range(len(parts)):
            parent = "/" + "/".join(parts[:i + 1])
            if parent not in made and not parent.startswith("/usr"):
                made.add(parent)
                args += ["--perms", "0755", "--dir", parent]
        args += ["--ro-bind", root, root]
    return args


@functools.lru_cache(maxsize=1)
def local_sandbox() -> Sandbox:
    """This machine's sandbox, probed once: bubblewrap with every namespace, or what is missing and why."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        return Sandbox(None, LAYERS, "bubblewrap is not installed (Debian/Ubuntu: apt-get install bubblewrap)")
    probe = Sandbox(bwrap, drop_uid=UNPRIVILEGED_UID if os.geteuid() == 0 else None)
    with tempfile.TemporaryDirectory(prefix="grpo-sandbox-probe-") as scratch:
        argv, env, cwd = probe.command([sys.executable, "-c", "import runtime"], scratch, {})
        try:
            done = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return Sandbox(None, LAYERS, f"bubblewrap could not start ({exc})")
    if done.returncode != 0:
        why = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return Sandbox(None, LAYERS, f"this machine refused bubblewrap's namespaces ({why})")
    return probe
