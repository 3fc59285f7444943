"""The wrapper around one job (local, or on a Ray cluster): starts its command, samples its resources, enforces its
timeout, and records how it ended, so that neither the job nor its record depends on the panel that launched it.

    python -m runtime.job.job_wrapper --job-dir DIR --timeout SECONDS [--grace SECONDS] [--tmpdir TMP] [--attempts N] \
        [--stop-with-wrapper] -- COMMAND...

`wrapper_command()` writes that line, for every executor that runs jobs under the wrapper (LocalExecutor, and the
Ray engine's entrypoint). LocalExecutor starts one wrapper per job, in a session of its own; the wrapper starts the
command in a process group of its own. In DIR it writes `process.json` (the command's pid, which is also its
process group id, and its start time: a pid alone may be recycled), `resources.jsonl` (CPU, RAM and GPU samples of
the command's process tree) and, once every process of the group is gone, `exit.json` (stage, exit code, message,
end time, and whether it timed out; on a full disk through blocks it reserved at the start, `.exit.reserve`, its
message led by that cause). With `--attempts N` a command that fails (not stopped, not exit code
NO_RETRY_EXIT, runtime/job/attempt.py) is started again, up to N runs in all, as HF Jobs retries a job: `process.json`
then names the newest attempt.

SIGTERM to the wrapper stops the job: SIGTERM to the command's main process, which stops its own children in
order, and SIGKILL to the whole group if it is still there after `--grace` seconds. (SIGTERM to the whole group
would kill TRL's rollout worker under the trainer, whose stop() then waits forever on an Event the dead worker
was sleeping on.) The reason is read from DIR/cancel.json (the executor writes it before signalling); the file
alone asks the same, for an executor that cannot reach this process with a signal (a Ray cluster's). When the
command's main process ends, for whatever reason, what is left of its group (a rollout worker, a resource
tracker) is stopped too: SIGTERM, then SIGKILL; then the shared memory its processes held and left in /dev/shm is
removed (noted in DIR/shm.json while they ran: runtime/job/shm.py). Then `--tmpdir` (the job's own TMPDIR) is removed.
"""

import argparse
import contextlib
import ctypes
import errno
import json
import os
import shutil
import signal
import subprocess
import time

import psutil

from ..layout import atomic_write_bytes
from .attempt import ATTEMPT_ENV, NO_RETRY_EXIT
from .cause import cause_line
from .sampler import ResourceSampler, visible_gpu_indices
from .shm import SHM_FILE, ShmTracker

PROCESS_FILE = "process.json"
EXIT_FILE = "exit.json"
CANCEL_FILE = "cancel.json"
RESOURCES_FILE = "resources.jsonl"
LOG_FILE = "log.txt"
EXIT_RESERVE_FILE = ".exit.reserve"    # blocks kept for the exit record (a dot name: readers skip it)
EXIT_RESERVE_BYTES = 4096
DISK_FULL = "the disk is full (No space left on device)"

DEFAULT_GRACE_S = 40.0       # above a vLLM replica's own 30 s drain (serve_replica.GRACE_S)
LEFTOVER_GRACE_S = 5.0       # for what outlives the main process: it has nobody left to wait for
POLL_S = 0.1
SHM_SCAN_S = 2.0             # how often the shared memory the job's processes hold is noted (shm.py)

COMPLETED, ERROR, CANCELED = "COMPLETED", "ERROR", "CANCELED"


def process_start_time(pid: int) -> float | None:
    """When process `pid` started (seconds since the epoch), or None if there is no such process."""
    try:
        return psutil.Process(pid).create_time()
    except psutil.Error:
        return None


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


def failure_line(job_dir: str, limit: int = 16384) -> str:
    """Where a failing job says why: the line of its log's tail that `cause_line` picks (its real error, not the
    noise printed while it was torn down), else its last non-empty line."""
    try:
        with open(os.path.join(job_dir, LOG_FILE), "rb") as f:
            f.seek(max(0, os.fstat(f.fileno()).st_size - limit))
            lines = f.read().decode("utf-8", errors="replace").splitlines()
    except OSError:
        return ""
    line = cause_line(lines) or next((line.strip() for line in reversed(lines) if line.strip()), "")
    return line[:500]


def exit_message(code: int, job_dir: str) -> tuple[str, str]:
    """(stage, message) for a command that ended by itself with `code` (negative: killed by that signal)."""
    if code == 0:
        return COMPLETED, ""
    if code < 0:
        name = signal.Signals(-code).name
        hint = " (out of memory, or killed from outside)" if name == "SIGKILL" else ""
        return ERROR, f"killed by {name}{hint}"
    line = failure_line(job_dir)
    return ERROR, f"exited with code {code}" + (f": {line}" if line else "; see the log")


def wrapper_command(python: str, job_dir: str, command: list[str], *, timeout_s: int, attempts: int,
                    grace_s: float = DEFAULT_GRACE_S, tmpdir: str | None = None,
                    stop_with_wrapper: bool = False) -> list[str]:
    """The wrapper around `command`, as `main()` reads it: the one writer of this command line, so each setting of a
    job (its timeout, its attempts) reaches the job whichever executor starts it."""
    return [python, "-m", "runtime.job.job_wrapper", "--job-dir", job_dir, "--timeout", str(timeout_s),
            "--grace", f"{grace_s:g}", *(("--tmpdir", tmpdir) if tmpdir else ()), "--attempts", str(attempts),
            *(("--stop-with-wrapper",) if stop_with_wrapper else ()), "--", *command]


class JobWrapper:
    def __init__(self, job_dir: str, command: list[str], timeout_s: float, grace_s: float, tmpdir: str | None = None,
                 stop_with_wrapper: bool = False, attempts: int = 1):
        self.job_dir, self.command, self.timeout_s, self.grace_s = job_dir, command, timeout_s, grace_s
        self.attempts = max(1, attempts)
        self.tmpdir = tmpdir
        self.stop_with_wrapper = stop_with_wrapper
        self.stop_reason: tuple[str, str] | None = None      # (stage, message) once the job is being stopped
        self.timed_out = False
        self.shm = ShmTracker(self._path(SHM_FILE))

    def _path(self, name: str) -> str:
        return os.path.join(self.job_dir, name)

    def _write(self, name: str, data: dict) -> None:
        atomic_write_bytes(self._path(name), json.dumps(data).encode())

    def _reserve_exit_record(self) -> None:
        """Blocks for the exit record, taken while there is room: a job that fills the disk still says how it
        ended (a new file needs space a full disk no longer has; rewriting these blocks does not)."""
        try:
            with open(self._path(EXIT_RESERVE_FILE), "wb") as f:
                f.write(b" " * EXIT_RESERVE_BYTES)
        except OSError:
            pass     # already full: the executor says so from the folder's free space

    def _write_exit(self, record: dict) -> None:
        """The exit record, through the reserved blocks when the disk is full; the cause leads its message then."""
        try:
            self._write(EXIT_FILE, record)
            with contextlib.suppress(OSError):
                os.remove(self._path(EXIT_RESERVE_FILE))
            return
        except OSError as error:
            if error.errno != errno.ENOSPC:
                raise
        message = f"{DISK_FULL}: {record.get('message') or 'the job ended'}"
        data = json.dumps({**record, "message": message, "disk_full": True}).encode()
        if len(data) > EXIT_RESERVE_BYTES:
            data = json.dumps({**record, "message": message[:EXIT_RESERVE_BYTES // 2], "disk_full": True}).encode()
        with open(self._path(EXIT_RESERVE_FILE), "r+b") as f:
            f.write(data.ljust(EXIT_RESERVE_BYTES))       # trailing spaces: still one JSON value
        os.replace(self._path(EXIT_RESERVE_FILE), self._path(EXIT_FILE))

    def _on_signal(self, signum, _frame) -> None:
        if self.stop_reason is None:
            self.stop_reason = (CANCELED, self._cancel_reason(signal.Signals(signum).name))

    def _cancel_reason(self, signal_name: str) -> str:
        try:
            with open(self._path(CANCEL_FILE)) as f:
                return str(json.load(f)["reason"])
        except (OSError, ValueError, KeyError, TypeError):
            return f"stopped by {signal_name}"

    def run(self) -> int:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, self._on_signal)
        try:
            return self._run()
        finally:
            if self.tmpdir:
                shutil.rmtree(self.tmpdir, ignore_errors=True)

    def _run(self) -> int:
        self._reserve_exit_record()
        attempt = 1
        while True:
            stage, code, message = self._attempt(attempt)
            if code is None:
                return 127
            if stage == COMPLETED or self.stop_reason or attempt >= self.attempts or code == NO_RETRY_EXIT:
                break
            # As HF Jobs' `attempts` do: the same command again (a trainer resumes from its newest checkpoint).
            print(f"[job wrapper] attempt {attempt} of {self.attempts} failed ({message}); starting attempt "
                  f"{attempt + 1}", flush=True)
            attempt += 1
        if attempt > 1:
            message = f"{message} (attempt {attempt} of {self.attempts})" if message else f"after {attempt} attempts"
        self._write_exit({"stage": stage, "code": code, "message": message, "time": time.time(),
                          "timed_out": self.timed_out, "attempts": attempt})
        return 0 if stage == COMPLETED else 1

    def _attempt(self, attempt: int) -> tuple[str, int | None, str]:
        """Run the command once; (stage, exit code, message), the code None if it could not start."""
        env = {**os.environ, ATTEMPT_ENV: str(attempt)}
        try:
            child = subprocess.Popen(self.command, cwd=self.job_dir, stdin=subprocess.DEVNULL, start_new_session=True,
                                     # no thread runs yet: the sampler starts after this
                                     preexec_fn=_die_with_parent if self.stop_with_wrapper else None,  # noqa: PLW1509
                                     env=env)
        except OSError as error:
            self._write_exit({"stage": ERROR, "code": None, "time": time.time(),
                              "message": f"could not start {self.command[0]!r}: {error}"})
            return ERROR, None, ""
        try:
            self._write(PROCESS_FILE, {"pid": child.pid, "started_at": process_start_time(child.pid),
                                       "attempt": attempt})
        except OSError as error:      # a full disk: the job runs on, and its end is still recorded
            print(f"[job wrapper] could not record the job's process: {error}", flush=True)
        # A job pinned to some GPUs samples only those (CUDA_VISIBLE_DEVICES in its environment is this one's).
        sampler = ResourceSampler(child.pid, self._path(RESOURCES_FILE),
                                  gpu_indices=visible_gpu_indices(os.environ)).start()
        code = self._wait(child)
        sampler.stop()
        stage, message = self.stop_reason or exit_message(code, self.job_dir)
        self._stop_leftovers(child.pid)
        removed = self.shm.remove_left()
        if removed:
            print(f"[job wrapper] removed {len(removed)} shared memory segment(s) the job left in /dev/shm: "
                  f"{', '.join(os.path.basename(p) for p in removed[:5])}", flush=True)
        return stage, code, message

    def _wait(self, child: subprocess.Popen) -> int:
        """Wait for the command to end; on a timeout or a stop request, SIGTERM it, then SIGKILL its group."""
        deadline = time.monotonic() + self.timeout_s    # per attempt, as on HF Jobs
        kill_at = None
        scan_at = 0.0
        while (code := child.poll()) is None:
            now = time.monotonic()
            if now >= scan_at:
                self.shm.scan(child.pid)
                scan_at = now + SHM_SCAN_S
            if self.stop_reason is None and os.path.exists(self._path(CANCEL_FILE)):
                # A stop request as a file, for an executor that cannot signal this process (a cluster's).
                self.stop_reason = (CANCELED, self._cancel_reason("a cancel request"))
            if self.stop_reason is None and now >= deadline:
                self.stop_reason = (ERROR, f"timed out after {self.timeout_s:g} s; the job was stopped")
                self.timed_out = True
            if self.stop_reason is not None and kill_at is None:
                print(f"[job wrapper] {self.stop_reason[1]}: sending SIGTERM", flush=True)
                child.send_signal(signal.SIGTERM)
                kill_at = now + self.grace_s
            elif kill_at is not None and now >= kill_at:
                print(f"[job wrapper] still running {self.grace_s:g} s after SIGTERM: sending SIGKILL", flush=True)
                signal_group(child.pid, signal.SIGKILL)
                kill_at = float("inf")
            time.sleep(POLL_S)
        return code

    def _stop_leftovers(self, pgid: int) -> None:
        """Whatever of the group outlived its main process is stopped: nothing else would ever stop it."""
        if not group_alive(pgid):
            return
        signal_group(pgid, signal.SIGTERM)
        deadline = time.monotonic() + LEFTOVER_GRACE_S
        while group_alive(pgid) and time.monotonic() < deadline:
            time.sleep(POLL_S)
        signal_group(pgid, signal.SIGKILL)


def _die_with_parent() -> None:
    """In the child, before it runs the command: SIGKILL when this wrapper dies (Linux's parent-death signal)."""
    ctypes.CDLL(None).prctl(1, signal.SIGKILL)   # PR_SET_PDEATHSIG


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The wrapper's command line (`wrapper_command()`'s, after `-m runtime.job.job_wrapper`);
    `command` without `--`."""
    parser = argparse.ArgumentParser(prog="runtime.job.job_wrapper", description=__doc__.splitlines()[0])
    parser.add_argument("--job-dir", required=True)
    parser.add_argument("--timeout", type=float, required=True, help="seconds before the job is stopped")
    parser.add_argument("--grace", type=float, default=DEFAULT_GRACE_S, help="seconds between SIGTERM and SIGKILL")
    parser.add_argument("--tmpdir", help="the job's own temp dir (its TMPDIR), removed when the job ends")
    parser.add_argument("--stop-with-wrapper", action="store_true",
                        help="the command is killed if this wrapper is: for a job host that kills only the wrapper's "
                             "process group (a Ray job supervisor that died)")
    parser.add_argument("--attempts", type=int, default=1,
                        help="runs of the command in all: one that fails is started again (not after exit code "
                             f"{NO_RETRY_EXIT}: a failure a retry cannot fix)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the job's command")
    args = parser.parse_args(argv)
    args.command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not args.command:
        parser.error("give the job's command after --")
    return args


def main() -> None:
    args = parse_args()
    raise SystemExit(JobWrapper(os.path.abspath(args.job_dir), args.command, args.timeout, args.grace, args.tmpdir,
                               stop_with_wrapper=args.stop_with_wrapper, attempts=args.attempts).run())


if __name__ == "__main__":
    main()
