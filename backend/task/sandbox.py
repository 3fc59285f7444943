"""Where the task check runs a visitor's code on this machine: a bubblewrap sandbox that reaches nothing of the panel.

The check process sees a read-only Python installation, its runtime code, a scratch folder of its own and a
private /tmp, /proc and HOME; it has its own PID, mount, network, IPC and UTS namespaces, so the panel's
processes, memory, files, environment and loopback services do not exist for it, and every process it starts
(also a `setsid` or double-forked one) ends with it. Inside, the check's own harness lowers its resource limits
(memory, CPU time, processes, file size, open files) and, when the panel runs as root, becomes an unprivileged
user before it runs anything of the visitor's (`runtime.check.confinement.confine`). *Try it*'s CPU worker runs in the
same sandbox.

Python is bound by the paths it was started with as well as by their real paths (a venv reached through a linked
folder, a venv under /tmp, pyenv, conda and uv installations alike), after the private /tmp is mounted, so the
interpreter the panel names exists inside. `local_sandbox()` probes the machine once and tells apart bubblewrap
missing, the OS refusing its namespaces, binds of ours that are wrong, and a `bwrap` that does not isolate, each with
its fix: the probe runs a small command inside the sandbox and calls it isolated only when the answer carries the nonce
it was given and shows the namespaces asked for (its own PID, network, IPC, UTS and mount namespaces by their
/proc/self/ns ids, a handful of processes, only loopback). A `bwrap` that exits 0 having run nothing, or one that runs
the command unconfined, leaves no sandbox.

Fail closed: where no sandbox can be made, `Sandbox.refusal()` says why and how to fix it, and the callers run no
code, unless the operator opted in with GRPO_PANEL_ALLOW_UNSANDBOXED=1 (then the code runs with what is left and
every answer, and the page, says what is missing). A panel that serves other people never runs a task check here
at all: its checks run in the visitor's own Hugging Face job (`backend.task.check_job`).
"""

import functools
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field

from backend.runtime import RUNTIME_DIR
from backend.runtime.check.confinement import UNPRIVILEGED_UID  # "nobody": what a root panel's check becomes

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


ALLOW_UNSANDBOXED_ENV = "GRPO_PANEL_ALLOW_UNSANDBOXED"      # the operator's opt-in to run code without a sandbox
# Why there is no sandbox (Sandbox.problem), each with what fixes it.
NOT_INSTALLED, REFUSED, BAD_BINDS, NOT_ISOLATING = ("not installed", "namespaces refused", "binds wrong",
                                                  "not isolating")
FIXES = {
    NOT_INSTALLED: "install bubblewrap (Debian/Ubuntu: `apt-get install bubblewrap`; Fedora: `dnf install "
                   "bubblewrap`) and restart the panel",
    REFUSED: "allow user namespaces, then restart the panel: `sysctl -w kernel.unprivileged_userns_clone=1` "
             "(Debian), `sysctl -w kernel.apparmor_restrict_unprivileged_userns=0` (Ubuntu 23.10+), "
             "`sysctl -w user.max_user_namespaces=15000` where it is 0; in a container, run it with user "
             "namespaces allowed (Docker: `--security-opt seccomp=unconfined --security-opt apparmor=unconfined`)",
    BAD_BINDS: "this is a bug of the panel's sandbox (it could not start this Python inside bubblewrap, which works "
               "here): please report it with this message",
    NOT_ISOLATING: "make the `bwrap` the panel finds first on its PATH the real bubblewrap (Debian/Ubuntu: "
                   "`apt-get install bubblewrap`, which puts it at /usr/bin/bwrap; remove or rename the other one, or "
                   "start the panel with a PATH that finds /usr/bin first) and restart the panel",
}
# The namespaces the sandbox asks for, as /proc/self/ns names them: each must differ inside from the panel's own.
PROBED_NAMESPACES = ("pid", "net", "ipc", "uts", "mnt")
MAX_PROBE_PROCESSES = 8     # what a fresh PID namespace shows: bubblewrap and the probe (a few, not the machine's)
# What the probe runs inside: it imports the runtime (the binds are right) and answers with the nonce it was given,
# what it sees of processes, network interfaces and its namespaces. A `bwrap` that runs nothing gives no answer; one
# that runs it unconfined answers with the panel's own namespaces.
PROBE = """import json, os, socket, sys
import runtime
ns = {n: os.readlink(f"/proc/self/ns/{n}") for n in NAMES}
procs = [p for p in os.listdir("/proc") if p.isdigit()]
print(json.dumps({"nonce": sys.argv[1], "ns": ns, "processes": len(procs), "pid": os.getpid(),
                  "interfaces": sorted(name for _, name in socket.if_nameindex())}))
"""
# Where a bind of Python's installation must not go: the system's own folders (bound whole, some of them links) and
# the sandbox's own mounts.
SYSTEM_TOPS = ("usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32")
NOT_BOUND = ("/", "/tmp", "/proc", "/dev", "/check", "/etc")


def unsandboxed_allowed() -> bool:
    """Whether the operator opted in to running code with no sandbox (GRPO_PANEL_ALLOW_UNSANDBOXED=1)."""
    return os.environ.get(ALLOW_UNSANDBOXED_ENV, "").strip().lower() in ("1", "true", "yes")


@dataclass(frozen=True)
class Sandbox:
    """How the check process is started here, and which isolation layers this machine refused."""

    bwrap: str | None
    missing: tuple[str, ...] = ()
    reason: str = ""          # why there is no sandbox, with its fix
    drop_uid: int | None = field(default=None)
    problem: str = ""         # NOT_INSTALLED, REFUSED or BAD_BINDS where there is no sandbox

    def refusal(self) -> str | None:
        """Why no code may run here (None: sandboxed, or the operator opted in to running it without one)."""
        if self.bwrap is not None or unsandboxed_allowed():
            return None
        return (f"No sandbox on this machine: {self.reason}. Nothing ran: this panel runs no task or adapter code "
                f"without one (set {ALLOW_UNSANDBOXED_ENV}=1 to run it anyway, with this machine's user's rights, "
                "on a panel only you reach)")

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
        args += machine_binds()
        for folder in ("/check", INSIDE_LIB):   # created by bwrap, with a mode that lets the dropped user in
            args += ["--perms", "0755", "--dir", folder]
        args += ["--ro-bind", RUNTIME_DIR, f"{INSIDE_LIB}/runtime", "--bind", scratch, INSIDE_WORK]
        for host, inside in ro_binds.items():
            args += ["--perms", "0755", "--dir", os.path.dirname(inside), "--ro-bind", host, inside]
        args += ["--perms", "0777", "--dir", INSIDE_HOME, "--chdir", INSIDE_WORK, "--clearenv"]
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


def machine_binds() -> list[str]:
    """bwrap's mounts of everything a confined Python needs, in the order that keeps each visible: the system's
    folders, a fresh /proc and /dev, the private /tmp, then Python's installation (which may live under /tmp)."""
    return [*system_binds(), "--proc", "/proc", "--dev", "/dev", "--perms", "1777", "--tmpfs", "/tmp",
            *python_binds()]


def system_binds() -> list[str]:
    """The system's libraries and tools, read-only; /etc only for the dynamic linker's cache."""
    args = []
    for top in SYSTEM_TOPS:
        path = f"/{top}"
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    for path in ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/localtime"):
        if os.path.exists(path):
            args += ["--ro-bind", path, path]
    return args


def python_paths() -> list[str]:
    """Where this Python and its packages are, as it was started (links kept) and as they really are: the venv and
    the installation it was made from, the real interpreter's installation, every site-packages on sys.path."""
    named = [sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix]
    named += [entry for entry in sys.path
              if entry and os.path.basename(os.path.realpath(entry)) in ("site-packages", "dist-packages")]
    paths = {os.path.dirname(os.path.dirname(os.path.realpath(sys.executable)))}
    for path in named:
        paths.update({os.path.abspath(path), os.path.realpath(path)})
    return sorted(p for p in paths if os.path.isdir(p))


def python_roots() -> list[str]:
    """The folders to bind (each from its real path, at this path inside): `python_paths()` without the system's
    own folders, the sandbox's mounts, and any folder inside another one."""
    roots = [p for p in python_paths() if p not in NOT_BOUND and not _in_system(p)]
    kept: list[str] = []
    for root in roots:      # sorted: a folder comes after the folders holding it
        # Inside a bound folder, a path resolves as it does here; where it goes through a link, the link's target
        # is one of the real paths, bound on its own.
        if not _inside(root, kept):
            kept.append(root)
    return kept


def interpreter_links(roots: list[str]) -> list[tuple[str, str]]:
    """(target, link) for each link on the way from the path Python was started with to its file that no bound
    folder holds (a `~/bin/python3` pointing into an installation): made again inside, targets absolute, so the
    interpreter starts by that path and finds its installation as it does here. Never the folders around them."""
    links, hop = [], os.path.abspath(sys.executable)
    for _ in range(40):
        if not os.path.islink(hop):
            break
        target = os.path.normpath(os.path.join(os.path.realpath(os.path.dirname(hop)), os.readlink(hop)))
        if not _inside(hop, roots) and not _in_system(hop):
            links.append((target, hop))
        hop = target
    return links


def python_binds() -> list[str]:
    """Read-only binds of Python's installation at the paths it has on this machine, links resolved at the source,
    and the interpreter's own links: bwrap creates the folders on the way (with a mode that lets the dropped user
    through)."""
    args, made = [], set()

    def parents(path: str) -> None:
        # bwrap copies a parent's mode when it creates it (/root is 0700): make every parent traversable.
        parts = path.strip("/").split("/")[:-1]
        for i in range(len(parts)):
            parent = "/" + "/".join(parts[:i + 1])
            if parent not in made and parent not in NOT_BOUND:
                made.add(parent)
                args.extend(["--perms", "0755", "--dir", parent])

    roots = python_roots()
    for root in roots:
        parents(root)
        args += ["--ro-bind", os.path.realpath(root), root]
    for target, link in interpreter_links(roots):
        parents(link)
        args += ["--symlink", target, link]
    return args


def _inside(path: str, folders: list[str]) -> bool:
    return any(path.startswith(folder + os.sep) for folder in folders)


def _in_system(path: str) -> bool:
    """Whether `path` is under one of the system's own folders, bound whole (or made links) by `system_binds`."""
    return path.strip("/").split("/")[0] in SYSTEM_TOPS


def isolation_state(serves_others: bool, box: "Sandbox | None" = None) -> str:
    """The panel's isolation, in one Markdown line for the page (and the start-up log): where *Check task* and
    *Try it* run code, or why they run none and how to fix it."""
    box = box or local_sandbox()
    what, run, them = (("*Try it* on CPU", "runs", "it") if serves_others
                       else ("*Check task* and *Try it*", "run", "them"))
    if box.bwrap is not None:
        line = (f"🔒 **Isolation:** {what} {run} code in a bubblewrap sandbox on this machine (its own PID, mount, "
                "network and IPC namespaces, a read-only Python, resource limits).")
    elif unsandboxed_allowed():
        line = (f"⚠️ **No sandbox** ({box.reason}): {what} {run} code **unsandboxed** ({ALLOW_UNSANDBOXED_ENV}=1), "
                "with this machine's user's rights: its files, processes and network.")
    else:
        line = (f"⛔ **No sandbox** ({box.reason}): {what} {run} no code on this machine"
                + ("" if serves_others else ", and a launch (which checks its task first) is refused")
                + f"; {ALLOW_UNSANDBOXED_ENV}=1 would run {them} unsandboxed.")
    if serves_others:
        line += " *Check task* runs your code in a `cpu-basic` job of your own account, never here."
    return line


@functools.lru_cache(maxsize=1)
def local_sandbox() -> Sandbox:
    """This machine's sandbox, probed once: bubblewrap with every namespace, or why there is none (bubblewrap
    missing, the OS refusing its namespaces, or our binds wrong), with the fix."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        return no_sandbox(NOT_INSTALLED, "bubblewrap is not installed")
    probe = Sandbox(bwrap, drop_uid=UNPRIVILEGED_UID if os.geteuid() == 0 else None)
    user = [] if os.geteuid() == 0 else ["--unshare-user"]
    # First the namespaces alone, with the whole file system in view: this fails only where the OS refuses them.
    bare = [bwrap, *NAMESPACES, *user, "--die-with-parent", "--ro-bind", "/", "/", "--proc", "/proc",
            "--dev", "/dev", sys.executable, "-c", "pass"]
    why = _fails(bare, {"PATH": "/usr/bin:/bin"})      # nothing of the panel's environment, here either
    if why is not None:
        return no_sandbox(REFUSED, f"this machine refused bubblewrap's namespaces ({why})")
    nonce = secrets.token_hex(8)
    with tempfile.TemporaryDirectory(prefix="grpo-sandbox-probe-") as scratch:
        code = PROBE.replace("NAMES", repr(_own_namespaces(user)))
        argv, env, cwd = probe.command([sys.executable, "-c", code, nonce], scratch, {})
        answer: list[str] = []
        why = _fails(argv, env, cwd, answer)
    if why is not None:
        return no_sandbox(BAD_BINDS, f"bubblewrap works here, but {sys.executable} did not start in the sandbox "
                                     f"({why})")
    why = isolation_problem("".join(answer), nonce, user)
    if why is not None:
        return no_sandbox(NOT_ISOLATING, f"{bwrap} does not isolate: {why}")
    return probe


def _own_namespaces(user: list[str]) -> tuple[str, ...]:
    """The namespaces the probe reports: those the sandbox asks for, and the user one where it asks for it."""
    return (*PROBED_NAMESPACES, *(("user",) if user else ()))


def isolation_problem(output: str, nonce: str, user: list[str]) -> str | None:
    """Why the probe's answer shows no sandbox (no answer, not ours, the panel's own namespaces, the machine's
    processes or network), or None when every namespace asked for is there."""
    try:
        answer = json.loads(output.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return "the probe ran nothing or gave no answer inside it (no output)"
    if not isinstance(answer, dict) or answer.get("nonce") != nonce:
        return "the probe's answer is not the one it was asked for"
    seen = answer.get("ns") if isinstance(answer.get("ns"), dict) else {}
    shared = []
    for name in _own_namespaces(user):
        try:
            own = os.readlink(f"/proc/self/ns/{name}")
        except OSError:
            return f"this machine does not show the panel's own {name} namespace (/proc/self/ns), so none can be told"
        if seen.get(name) in (None, own):
            shared.append(name)
    if shared:
        return "the code inside shares the panel's " + ", ".join(shared) + " namespace(s)"
    if not isinstance(answer.get("processes"), int) or answer["processes"] > MAX_PROBE_PROCESSES:
        return (f"the code inside sees {answer.get('processes')} processes (the machine's, not a PID namespace of "
                "its own)")
    if answer.get("interfaces") != ["lo"]:
        return f"the code inside sees the network interfaces {answer.get('interfaces')} (only loopback is its own)"
    return None


def no_sandbox(problem: str, why: str) -> Sandbox:
    """No sandbox: every layer missing, the reason with its fix."""
    return Sandbox(None, LAYERS, f"{why}; fix: {FIXES[problem]}", problem=problem)


def _fails(argv: list[str], env: dict, cwd: str | None = None, output: list[str] | None = None) -> str | None:
    """What went wrong running `argv` (its last line of stderr), or None when it exited 0 (its standard output then
    added to `output`)."""
    try:
        done = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=60,
                              stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{type(exc).__name__}: {exc}"
    if done.returncode == 0:
        if output is not None:
            output.append(done.stdout)
        return None
    return (done.stderr.strip().splitlines() or [f"exit status {done.returncode}, no output"])[-1]
