"""Resource samples for a job: GPU utilisation and memory through NVML when GPUs exist, CPU and RAM always.

    python -m runtime.job.sampler --pid PID --out samples.jsonl [--interval 1] [--gpus 0,1]

The same `ResourceSampler` runs in each local job's wrapper (`job_wrapper.py`, one thread) and stands alone for
jobs. NVML sees every GPU of the machine whatever CUDA_VISIBLE_DEVICES says: a job pinned to some of them samples
only those (`gpu_indices`), and each sample names them (`gpu_index`), so two jobs on two GPUs of one machine
do not both report both GPUs.
"""

import argparse
import json
import os
import threading
import time

import psutil


class _Nvml:
    """Per-GPU utilisation and memory of the GPUs `indices` (default: all), or nothing where NVML (a GPU driver)
    is absent."""

    def __init__(self, indices: list[int] | None = None):
        self.handles, self.indices = [], []
        try:
            import pynvml  # noqa: PLC0415 optional in a job's image

            pynvml.nvmlInit()
            self.nvml = pynvml
            count = pynvml.nvmlDeviceGetCount()
            self.indices = [i for i in (range(count) if indices is None else indices) if 0 <= i < count]
            self.handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in self.indices]
        except Exception:  # no driver, no library, no device: CPU-only sampling
            self.handles, self.indices = [], []

    def sample(self) -> dict:
        if not self.handles:
            return {}
        util, used, total = [], [], []
        for h in self.handles:
            util.append(float(self.nvml.nvmlDeviceGetUtilizationRates(h).gpu))
            mem = self.nvml.nvmlDeviceGetMemoryInfo(h)
            used.append(int(mem.used))
            total.append(int(mem.total))
        return {"gpu_util": util, "gpu_mem_bytes": used, "gpu_mem_total_bytes": total, "gpu_index": self.indices}


def _process_tree(pid: int) -> list[psutil.Process]:
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


class ResourceSampler:
    """Samples a process tree (CPU %, RSS) and the GPUs every `interval` seconds into a JSONL file."""

    def __init__(self, pid: int, out_path: str, interval: float = 1.0, gpu_indices: list[int] | None = None):
        self.pid, self.out_path, self.interval = pid, out_path, interval
        self._stop = threading.Event()
        self._nvml = _Nvml(gpu_indices)
        self._known: dict[int, psutil.Process] = {}
        self._thread = threading.Thread(target=self._loop, name=f"sampler-{pid}", daemon=True)

    def start(self) -> "ResourceSampler":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    def sample(self) -> dict:
        cpu, rss = 0.0, 0
        procs = _process_tree(self.pid)
        for p in procs:
            # cpu_percent() needs the same Process object across calls to measure an interval.
            known = self._known.setdefault(p.pid, p)
            try:
                cpu += known.cpu_percent(None)
                rss += known.memory_info().rss
            except psutil.Error:
                self._known.pop(p.pid, None)
        return {"time": time.time(), "cpu_percent": cpu, "ram_bytes": rss, **self._nvml.sample()}

    def _loop(self) -> None:
        self.sample()  # primes cpu_percent
        with open(self.out_path, "a", buffering=1) as f:
            while not self._stop.wait(self.interval):
                if not _process_tree(self.pid):
                    break
                f.write(json.dumps(self.sample()) + "\n")


def visible_gpu_indices(env: dict) -> list[int] | None:
    """The GPUs a process with environment `env` may use, as NVML indices; None: all of them (also where
    CUDA_VISIBLE_DEVICES names GPUs by UUID, which is not mapped here)."""
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is None or visible.strip().startswith(("GPU-", "MIG-")):
        return None
    indices = []
    for item in visible.split(","):
        if not item.strip().isdigit():
            break   # CUDA reads up to the first id that is not a device number ("-1" hides every GPU)
        indices.append(int(item))
    return indices


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pid", type=int, default=os.getppid())
    parser.add_argument("--out", required=True)
    parser.add_argument("--interval", type=float, default=1.0)
    parser.add_argument("--gpus", default=None, help="NVML indices to sample, e.g. 0,1 (default: CUDA_VISIBLE_DEVICES)")
    args = parser.parse_args()
    gpus = [int(g) for g in args.gpus.split(",")] if args.gpus else visible_gpu_indices(dict(os.environ))
    sampler = ResourceSampler(args.pid, args.out, args.interval, gpus)
    sampler._loop()


if __name__ == "__main__":
    main()
