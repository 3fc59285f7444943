"""What the job wrapper (`backend/runtime/job/job_wrapper.py`) leaves in a job's folder, as an executor reads it: its
record of how the job ended, its resource samples from a cursor, a file's tail. Every executor whose jobs run under
the wrapper (local processes, Ray jobs) reads them through these, so a job tells the same story on each."""

import json
import os
from collections.abc import Callable, Iterator

from backend.executors.base import ResourceSample
from backend.plan.jobspec import TERMINAL_STAGES, JobStatus

SAMPLE_BYTES = 128        # about one resources.jsonl line, to turn a number of samples into bytes to read


def ended_status(ended: dict | None, redact: Callable[[str], str]) -> JobStatus | None:
    """The job's final status from the wrapper's exit record (its message masked by `redact`), or None while it
    has none."""
    if not ended or ended.get("stage") not in TERMINAL_STAGES:
        return None
    return JobStatus(ended["stage"], redact(str(ended.get("message") or "")), timed_out=ended.get("timed_out") is True)


def read_samples(path: str, cursor: int, limit: int | None = None,
                 skipped: Callable[[int], None] = lambda offset: None) -> tuple[list[ResourceSample], int]:
    """The resource samples of resources.jsonl after `cursor` (at most about `limit`), and the next cursor; a line
    that is not a sample is left out and its offset handed to `skipped`."""
    data = read_complete_lines(path, cursor, None if limit is None else limit * SAMPLE_BYTES)
    lines = [line for line in data.splitlines() if line.strip()]
    try:    # one parse for the whole chunk (a day of 1 Hz samples on a first look); line by line if one is bad
        decoded = json.loads(b"[" + b",".join(lines) + b"]")
        samples = [sample_of(d) for d in decoded]
        if len(samples) == len(lines) and all(samples):
            return samples, cursor + len(data)
    except ValueError:
        pass
    samples, offset = [], cursor
    for line in data.splitlines(keepends=True):
        if line.strip():
            sample = _sample(line)
            if sample is None:
                skipped(offset)
            else:
                samples.append(sample)
        offset += len(line)
    return samples, cursor + len(data)


def tail_offset(path: str, lines: int, line_bytes: int) -> int:
    """The offset of the line start `lines` lines before the file's end (0 for a shorter file), reading back from
    the end a block of about `lines * line_bytes` bytes, doubled until it holds them."""
    try:
        with open(path, "rb") as f:
            size = f.seek(0, os.SEEK_END)
            block = min(size, lines * line_bytes)
            while True:
                f.seek(size - block)
                data = f.read(block)
                # The last line may still lack its newline: count the ones before it.
                end = len(data) - 1
                for _ in range(lines):
                    end = data.rfind(b"\n", 0, end)
                    if end < 0:
                        break
                if end >= 0:
                    return size - block + end + 1
                if block == size:
                    return 0
                block = min(size, block * 2)
    except OSError:
        return 0


def read_complete_lines(path: str, cursor: int, max_bytes: int | None = None) -> bytes:
    """Bytes after `cursor` (at most about `max_bytes`) up to the last newline: a line still being written waits
    for the next read."""
    try:
        with open(path, "rb") as f:
            f.seek(cursor)
            data = f.read(-1 if max_bytes is None else max_bytes)
    except FileNotFoundError:
        return b""
    end = data.rfind(b"\n")
    return data[: end + 1] if end >= 0 else b""


LOG_CHUNK_BYTES = 1 << 20      # a whole log is read this much at a time (a download of a 1 GB log stays small)


def log_text(path: str, mask, chunk_bytes: int = LOG_CHUNK_BYTES) -> Iterator[str]:
    """The log at `path` as pieces of whole lines (each ends with a newline), masked by `mask`, read a chunk at a
    time: memory bounded by a chunk (and one line), whatever the log's length. A token never spans lines, so a piece
    is masked as its lines would be, at a fraction of the cost of a call per line. A last line without its newline
    is given too (a download wants all)."""
    try:
        f = open(path, "rb")
    except FileNotFoundError:
        return
    with f:
        rest = b""
        while chunk := f.read(chunk_bytes):
            data = rest + chunk
            end = data.rfind(b"\n") + 1
            rest = data[end:]
            if end:
                yield mask(data[:end].decode("utf-8", errors="replace"))
        if rest:
            yield mask(rest.decode("utf-8", errors="replace")) + "\n"


def _sample(line: bytes) -> ResourceSample | None:
    """One resources.jsonl line as a sample, or None if it is not one."""
    try:
        return sample_of(json.loads(line))
    except ValueError:
        return None


def sample_of(d) -> ResourceSample | None:
    """One decoded resources.jsonl record as a sample, or None if it is not one."""
    try:
        t, cpu, ram = d["time"], d.get("cpu_percent"), d.get("ram_bytes")
        if len(d) == 3 and type(t) is float and type(cpu) is float and type(ram) is int:
            return ResourceSample(t, cpu, ram)      # a CPU-only sample as the sampler writes it: nothing to convert
        return ResourceSample(
            float(d["time"]), None if cpu is None else float(cpu), None if ram is None else int(ram),
            tuple(map(float, d.get("gpu_util", ()))), tuple(map(int, d.get("gpu_mem_bytes", ()))),
            tuple(map(int, d.get("gpu_mem_total_bytes", ()))), tuple(map(int, d.get("gpu_index", ()))))
    except (ValueError, TypeError, KeyError, AttributeError):
        return None
