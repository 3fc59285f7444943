"""Which line of a failed job's log says why it failed.

A job's last lines are often not its cause: after a kill, aiohttp's "Unclosed connector" and its object dumps
come out of the garbage collector; a vLLM server logs every request, including a 404 for an adapter unloaded
after its replica died. The cause is the most telling line: an out-of-memory kill or a signal first, then the
final line of a traceback (the exception) or a shell's error, then any other error line; informational and
access-log lines, and known noise, never.

Runs inside jobs too (the local job wrapper quotes it in its exit status): the standard library only.
"""

import re

# 3: the process was killed or crashed: whatever it printed before matters less.
FATAL = re.compile(r"out of memory|OutOfMemory|\bOOM\b|oom-kill|\bKilled\b|killed by SIG|Segmentation fault|"
                   r"Bus error|core dumped|Fatal Python error|\bAborted\b|received signal|signal \d+ \(SIG")
# 2: an exception as a traceback ends (`ValueError: ...`, `torch.OutOfMemoryError: ...`), or a shell's error.
EXCEPTION = re.compile(r"^(?:[A-Za-z_][\w]*\.)*[A-Za-z_]\w*(?:Error|Exception|Exit|Interrupt|Warning)\b(?::|$)")
SHELL = re.compile(r"No such file or directory|command not found|Permission denied|No space left on device")
# 1: anything else that states a failure.
ERRORISH = re.compile(r"error|exception|not found|killed|denied|fatal|cannot |failed", re.IGNORECASE)

# A log record of a level below ERROR, in the formats the jobs here write (Python's logging, vLLM's
# `(APIServer pid=N) INFO 12-01 10:03:00 [...]`, uvicorn's `INFO:     127.0.0.1:... - "POST ..."`).
LEVEL = re.compile(r"\b(DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL|FATAL)\b")
QUIET_LEVELS = {"DEBUG", "INFO", "WARNING", "WARN"}
ACCESS_LOG = re.compile(r'"(?:GET|POST|PUT|PATCH|DELETE|HEAD|OPTIONS) \S+ HTTP/[\d.]+" \d{3}\b')
# What a process prints while it is torn down, whatever killed it.
NOISE = re.compile(r"Unclosed (?:connector|client session|connection|transport)|^connections: \[|^connector: <|"
                   r"^client_session: <|Task was destroyed but it is pending|leaked semaphore|"
                   r"resource_tracker: There appear to be|^Exception ignored in")
LEVEL_PREFIX = 80       # a level word this far into a line is its record's level, not part of its message


def _rank(line: str) -> int:
    if NOISE.search(line) or ACCESS_LOG.search(line):
        return 0
    level = LEVEL.search(line[:LEVEL_PREFIX])
    if level and level.group(1) in QUIET_LEVELS:
        return 0
    if FATAL.search(line):
        return 3
    if EXCEPTION.match(line) or SHELL.search(line):
        return 2
    return 1 if ERRORISH.search(line) else 0


def cause_line(lines) -> str:
    """The line of `lines` (a log's tail, oldest first) that best says why the job failed; '' if none does.
    The most telling kind wins; of one kind, the latest. The frames of a traceback printed while an exception was
    being ignored ("Exception ignored in: ...", at interpreter exit) are noise, its exception too."""
    best, best_rank, ignoring = "", 0, False
    for raw in lines:
        line = raw.strip()
        if not line or line.startswith("Traceback (most recent call last)"):
            continue
        if line.startswith("Exception ignored in"):
            ignoring = True
            continue
        if ignoring:
            ignoring = not EXCEPTION.match(line)   # the ignored exception's own line closes its block
            continue
        rank = _rank(line)
        if rank and rank >= best_rank:
            best, best_rank = line, rank
    return best
