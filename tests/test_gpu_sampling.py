"""Jobs pinned to some GPUs of a machine sample only those, named by the machine's index: NVML sees every GPU
whatever CUDA_VISIBLE_DEVICES says, and two pinned jobs on two H200s each reported both GPUs."""

import sys
import time

import pytest

from backend.executors.base import ResourceSample
from backend.executors.local import LocalExecutor
from backend.plan.jobspec import JobSpec
from backend.runtime.job.sampler import visible_gpu_indices
from backend.view.job_view import ResourceUsage
from panel import chart_parts, resource_charts

pytestmark = pytest.mark.integration

FAKE_NVML = '''"""NVML as a machine with two GPUs reports it (this machine has none): GPU 0 busy, GPU 1 idle."""
from types import SimpleNamespace as _NS

_HANDLES = [_NS(util=90, used=40 * 2**30), _NS(util=5, used=1 * 2**30)]


def nvmlInit():
    pass


def nvmlDeviceGetCount():
    return 2


def nvmlDeviceGetHandleByIndex(i):
    return _HANDLES[i]


def nvmlDeviceGetUtilizationRates(h):
    return _NS(gpu=h.util)


def nvmlDeviceGetMemoryInfo(h):
    return _NS(used=h.used, total=141 * 2**30)
'''


@pytest.fixture
def two_gpus(tmp_path):
    """A folder holding a fake `pynvml`: a job's wrapper process, which samples its resources, imports it."""
    folder = tmp_path / "fake-nvml"
    folder.mkdir()
    (folder / "pynvml.py").write_text(FAKE_NVML)
    return str(folder)


def test_cuda_visible_devices_becomes_the_gpus_to_sample():
    assert visible_gpu_indices({}) is None, "not pinned: every GPU"
    assert visible_gpu_indices({"CUDA_VISIBLE_DEVICES": "1"}) == [1]
    assert visible_gpu_indices({"CUDA_VISIBLE_DEVICES": "1,0"}) == [1, 0]
    assert visible_gpu_indices({"CUDA_VISIBLE_DEVICES": ""}) == [] and visible_gpu_indices(
        {"CUDA_VISIBLE_DEVICES": "-1"}) == [], "no GPU at all"
    assert visible_gpu_indices({"CUDA_VISIBLE_DEVICES": "0,-1,1"}) == [0], "CUDA stops at the first invalid id"
    assert visible_gpu_indices({"CUDA_VISIBLE_DEVICES": "GPU-5b1e1b2c-0000"}) is None, "UUIDs: every GPU"


def test_a_local_job_pinned_to_gpu_1_samples_gpu_1_alone(two_gpus, tmp_path):
    executor = LocalExecutor(str(tmp_path))
    sleep = [sys.executable, "-c", "import time; time.sleep(3)"]
    job = JobSpec(run_id="r1", role="vllm-0", image="local", command=sleep, flavor="local", timeout_s=30,
                  env={"CUDA_VISIBLE_DEVICES": "1", "PYTHONPATH": two_gpus})
    job_id = executor.submit(job)
    assert executor.wait(job_id, timeout=30).stage == "COMPLETED"
    time.sleep(0.2)
    samples, _ = executor.read_resources(job_id, 0)
    assert samples and all(s.gpu_index == (1,) and s.gpu_util == (5.0,) for s in samples)
    assert samples[0].gpu_mem_bytes == (2**30,)


def test_charts_name_each_jobs_gpu_by_the_machines_index():
    trainer, replica = ResourceUsage(), ResourceUsage()
    trainer.add([ResourceSample(time=t, gpu_util=(60.0,), gpu_mem_bytes=(2**30,), gpu_index=(0,)) for t in range(3)])
    replica.add([ResourceSample(time=t, gpu_util=(90.0,), gpu_mem_bytes=(2**31,), gpu_index=(1,)) for t in range(3)])
    usages, options = {"trainer": trainer, "vllm-0": replica}, chart_parts.ChartOptions()
    assert ([t["name"] for t in resource_charts.utilisation_figure(usages, options)["data"]]
            == ["trainer GPU0", "vllm-0 GPU1"])
    assert ([t["name"] for t in resource_charts.memory_figure(usages, options)["data"]]
            == ["trainer GPU0", "vllm-0 GPU1"])
