"""What *Download full log* costs for a long log: the panel's peak memory and the time to build the file.

    python benchmarks/log_download.py [--mb 1024] [--repeats 3]

Writes a trainer log of `--mb` MB (lines as a trainer prints them, one in 50 quoting a token the mask must hide)
as a local job's log, then builds the download in a fresh process each time, the old way (every line read into a
list, masked, joined: what `LocalExecutor.all_logs` and `Panel.full_log_file` did) and the new one (the lines
streamed through the mask into the file: `panel.downloads.write_log` over `LocalExecutor.all_logs`), interleaved.
Prints each way's seconds and peak RSS (min / median), and the process's RSS after its imports. Asserts nothing.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOKEN = "hf_" + "a1B2c3D4e5" * 3

CHILD = r"""
import json, os, resource, sys, time
sys.path[:0] = [{root!r}]
from backend.executors.local import LocalExecutor
from backend.runtime.layout import atomic_write_bytes
from backend.runtime.redact import redact_tokens
from panel.downloads import write_log
home, job_id, out, way = sys.argv[1:5]
executor = LocalExecutor(home)
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
began = time.perf_counter()
if way == "old":
    lines = executor.read_logs(job_id, 0)[0]
    atomic_write_bytes(out, ("\n".join(redact_tokens(line) for line in lines) + "\n").encode())
else:
    write_log(out, executor.all_logs(job_id))
seconds = time.perf_counter() - began
print(json.dumps({{"seconds": seconds, "peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "base_mib": base / 1024}}))
"""


def write_log(path: str, megabytes: int) -> None:
    line = "step {step}/100000  reward 0.512  kl 0.0031  loss 0.0297  grad_norm 0.81  lr 5.0e-03  {t:.1f}s  " \
           "tokens 14.2k/s\n"
    secret = f"HfHubHTTPError: 401 for https://huggingface.co/api/whoami (token {TOKEN})\n"
    target, written, step = megabytes * 1024 * 1024, 0, 0
    with open(path, "w") as f:
        while written < target:
            block = "".join(secret if (step + i) % 50 == 0 else line.format(step=step + i, t=(step + i) * 0.7)
                            for i in range(10_000))
            f.write(block)
            written += len(block)
            step += 10_000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    home = tempfile.mkdtemp(prefix="log-download-")
    try:
        job_id = "bench--trainer--000000"
        job_dir = os.path.join(home, "jobs", job_id)
        os.makedirs(job_dir)
        with open(os.path.join(job_dir, "job.json"), "w") as f:
            json.dump({"job_id": job_id, "spec": {"run_id": "bench", "role": "trainer"}, "created_at": time.time()},
                      f)
        began = time.perf_counter()
        write_log(os.path.join(job_dir, "log.txt"), args.mb)
        size = os.path.getsize(os.path.join(job_dir, "log.txt"))
        print(f"log: {size / 2**20:.0f} MiB written in {time.perf_counter() - began:.1f} s", flush=True)
        results = {"old": [], "new": []}
        for i in range(args.repeats):
            for way in ("old", "new"):
                out = os.path.join(home, f"{way}.log")
                done = subprocess.run([sys.executable, "-c", CHILD.format(root=ROOT), home, job_id, out, way],
                                      capture_output=True, text=True)
                if done.returncode:
                    print(f"{way} #{i + 1}: failed ({done.returncode}): {done.stderr.strip()[-500:]}", flush=True)
                    continue
                result = json.loads(done.stdout.strip().splitlines()[-1])
                masked = TOKEN not in open(out).read(4 << 20)
                results[way].append(result)
                print(f"{way} #{i + 1}: {result['seconds']:.1f} s, peak RSS {result['peak_mib']:.0f} MiB "
                      f"(after imports {result['base_mib']:.0f} MiB), token masked: {masked}", flush=True)
                os.unlink(out)
        for way, runs in results.items():
            if runs:
                secs, peaks = [r["seconds"] for r in runs], [r["peak_mib"] for r in runs]
                print(f"{way}: seconds min {min(secs):.1f} median {statistics.median(secs):.1f}; peak RSS MiB min "
                      f"{min(peaks):.0f} median {statistics.median(peaks):.0f}")
        if results["old"] and results["new"]:
            ratio = statistics.median(r["peak_mib"] for r in results["old"]) / \
                statistics.median(r["peak_mib"] for r in results["new"])
            print(f"peak RSS old / new (median): {ratio:.1f}x")
    finally:
        shutil.rmtree(home, ignore_errors=True)


if __name__ == "__main__":
    main()
