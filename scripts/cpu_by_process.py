"""Where a command's CPU time goes, by kind of process: `python scripts/cpu_by_process.py [-o FILE] -- CMD ...`.

Runs CMD and samples every process on the machine twice a second (/proc: CPU time, command line), so processes
that CMD's children start in sessions of their own (jobs, vLLM servers, the browser) are counted too. At the end it
prints, for each kind (a vLLM API server, its engine and worker processes, a trainer, the panel, chromium, ...), how
many processes ran and the CPU seconds they used, and how busy the machine's cores were: the suite is CPU-bound on
a 2-core machine, so this says what a shorter run has to start less often. A process that lives under half a second
between two samples is missed; everything that ran before CMD started is left out. Exits with CMD's status.
"""

import argparse
import collections
import os
import subprocess
import sys
import threading
import time

HZ = os.sysconf("SC_CLK_TCK")
# (kind, what its command line holds): the first match names a process. Parts are specific enough not to match the
# paths a process is given (a test's tmp folder is under /tmp/pytest-of-<user>/, some name Ray).
KINDS = (
    ("chromium", "chromium"),
    ("spawned python (vLLM engine, worker)", "multiprocessing.spawn"),
    ("vllm API server", "vllm_cli serve"),
    ("vllm API server", "vllm serve"),
    ("replica job (serve_replica)", "runtime.serving.serve_replica"),
    ("trainer (async)", "runtime.trainer.train_async"),
    ("trainer", "runtime.job.attempt"),
    ("trainer", "runtime.trainer.train"),
    ("proxy", "runtime.serving.proxy"),
    ("job wrapper", "runtime.job.job_wrapper"),
    ("task check", "runtime.check.check_task"),
    ("panel (app.py)", "app.py"),
    ("ray", "ray::"),
    ("ray", "/ray/"),
    ("ray", "ray start"),
    ("pytest", "-m pytest"),
    ("pytest", "bin/pytest"),
    ("playwright driver", "playwright/driver"),
)


def _kind(cmdline: str) -> str:
    return next((kind for kind, part in KINDS if part in cmdline), cmdline.split(" ", 1)[0][-40:] or "?")


def _cpu_now() -> tuple[int, int]:
    """The machine's busy and idle clock ticks so far (/proc/stat's first line)."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    idle = fields[3] + fields[4]
    return sum(fields) - idle, idle


class Sampler:
    def __init__(self):
        self.seen: dict[tuple[str, str], list] = {}      # (pid, start time): [command line, first cpu, last cpu]
        self.stop = threading.Event()

    def sample(self) -> None:
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                with open(f"/proc/{pid}/stat") as f:
                    stat = f.read()
                rest = stat[stat.rfind(")") + 2:].split()
                cpu = (int(rest[11]) + int(rest[12])) / HZ
                key = (pid, rest[19])
                if key in self.seen:
                    self.seen[key][2] = cpu
                    continue
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    cmdline = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
                self.seen[key] = [cmdline or stat[stat.find("(") + 1:stat.rfind(")")], cpu, cpu]
            except (OSError, IndexError, ValueError):
                continue                                   # it ended meanwhile

    def run(self) -> None:
        while not self.stop.wait(0.5):
            self.sample()

    def report(self, started: set, wall_s: float, busy: int, idle: int) -> str:
        cpu = collections.Counter()
        count = collections.Counter()
        for key, (cmdline, first, last) in self.seen.items():
            used = last - first if key in started else last
            if used > 0 or key not in started:
                kind = _kind(cmdline)
                cpu[kind] += used
                count[kind] += key not in started
        total = sum(cpu.values())
        lines = [(f"wall {wall_s:.0f} s; cores busy {100 * busy / max(busy + idle, 1):.0f}%; "
                  f"CPU seen {total:.0f} s"), f"{'CPU s':>8} {'share':>6} {'started':>7}  kind"]
        lines += [f"{used:8.0f} {100 * used / max(total, 1e-9):5.0f}% {count[kind]:7d}  {kind}"
                  for kind, used in cpu.most_common(20)]
        return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-o", "--output", help="also write the table to this file")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- the command to run")
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command to run after --")
    sampler = Sampler()
    sampler.sample()
    started = set(sampler.seen)                            # what ran before: only its CPU from now on counts
    busy0, idle0 = _cpu_now()
    t0 = time.monotonic()
    thread = threading.Thread(target=sampler.run, daemon=True)
    thread.start()
    try:
        code = subprocess.call(command)
    except KeyboardInterrupt:
        code = 130
    sampler.stop.set()
    thread.join()
    sampler.sample()
    busy1, idle1 = _cpu_now()
    table = sampler.report(started, time.monotonic() - t0, busy1 - busy0, idle1 - idle0)
    print(table, flush=True)
    if args.output:
        with open(args.output, "w") as f:
            f.write(table + "\n")
    return code


if __name__ == "__main__":
    sys.exit(main())
