"""The recipe: RunSpec -> JobSpecs, pure and previewable."""

import shlex

from backend import recipe
from backend.jobspec import LABEL_APP, LABEL_ROLE, LABEL_RUN
from backend.spec import RunSpec


def test_colocated_local_run_is_one_trainer_job_with_the_bucket_mounted():
    spec = RunSpec()
    [job] = recipe.colocated_jobs(spec, python="/usr/bin/python3")
    assert job.role == "trainer"
    assert job.timeout_s == spec.timeout_minutes * 60
    assert job.labels == {LABEL_APP: "1", LABEL_RUN: spec.run_id, LABEL_ROLE: "trainer"}
    assert [(v.bucket, v.mount_path, v.read_only) for v in job.volumes] == [(spec.bucket, "/bucket", False)]
    script = job.command[2]
    assert "runtime.tiny_model" in script and f"runtime.train --run-dir {spec.run_path}" in script
    assert script.count("/usr/bin/python3") == 2 and recipe.PY not in script
    assert job.env["PYTHONPATH"] == f"{spec.run_path}/code"
    assert job.secrets == ()


def test_colocated_hf_job_installs_pinned_trl_and_takes_the_token_as_a_secret():
    spec = RunSpec(executor="hf_jobs", model="Qwen/Qwen2.5-0.5B-Instruct", bucket="alice/runs", use_vllm=True,
                   flavor="a10g-large", num_processes=2, per_device_batch_size=8, num_generations=8)
    [job] = recipe.colocated_jobs(spec)
    assert job.image == recipe.VLLM_IMAGE and job.flavor == "a10g-large" and job.namespace == "alice"
    assert job.secrets == ("HF_TOKEN",) and "HF_TOKEN" not in job.env
    assert f"pip install --quiet trl=={recipe.TRL_VERSION} peft=={recipe.PEFT_VERSION}" in job.command[2]
    assert "accelerate launch --num_processes 2 -m runtime.train" in job.command[2]
    assert "runtime.tiny_model" not in job.command[2]
    preview = job.cli_preview()
    assert "-s HF_TOKEN" in preview and "-v hf://buckets/alice/runs:/bucket" in preview
    assert shlex.split(preview)[:3] == ["hf", "jobs", "run"]


def test_distributed_run_mounts_the_bucket_at_the_same_path_everywhere_and_replicas_read_only():
    spec = RunSpec(mode="distributed", executor="hf_jobs", model="Qwen/Qwen2.5-0.5B-Instruct", bucket="alice/runs",
                   replicas=3, max_staleness=2, lora_r=24)
    jobs = recipe.preview_jobs(spec)
    assert [j.role for j in jobs] == ["vllm-0", "vllm-1", "vllm-2", "trainer"]
    assert {v.mount_path for j in jobs for v in j.volumes} == {spec.mount_path}
    assert all(j.volumes[0].read_only for j in jobs[:3]) and not jobs[3].volumes[0].read_only
    serve = jobs[0].command[2]
    assert "--max-loras 4" in serve and "--max-lora-rank 32" in serve and "--enable-lora" in serve
    assert jobs[0].expose == (recipe.REPLICA_PORT,)
    assert jobs[0].env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "1"
    assert jobs[3].env["VLLM_REPLICA_URLS"].count("<vllm-") == 3


def test_local_replicas_get_distinct_ports_and_wait_for_the_builtin_model():
    spec = RunSpec(mode="distributed", replicas=2)
    jobs = recipe.replica_jobs(spec, ports=[18001, 18002], python="python3")
    assert [j.expose for j in jobs] == [(18001,), (18002,)]
    assert "runtime.serve_replica" in jobs[0].command[2] and "--port 18002" in jobs[1].command[2]
    assert f"--wait-for {spec.run_path}/base-model" in jobs[0].command[2]
    assert "--host 127.0.0.1" in jobs[0].command[2], "local replicas listen on loopback only"
    # On a machine with one GPU, the replicas split half of it (the trainer keeps the rest); float32 only on CPU.
    assert all("--gpu-memory-utilization 0.25" in j.command[2] for j in jobs)
    assert all(f"--kv-cache-memory-bytes {2**30}" in j.command[2] for j in jobs), "no profiling race on one GPU"
    assert "--dtype-without-cuda float32" in jobs[0].command[2] and " --dtype " not in jobs[0].command[2]
    remote = recipe.replica_jobs(RunSpec(mode="distributed", replicas=2, executor="hf_jobs", bucket="alice/b"))
    assert "--gpu-memory-utilization" not in remote[0].command[2] and "dtype" not in remote[0].command[2]
    assert "--kv-cache-memory-bytes" not in remote[0].command[2], "a replica alone on its machine sizes its own cache"


def test_local_replicas_each_get_cores_of_their_own():
    assert recipe.split_cores([0, 1], 2) == ["0", "1"]
    assert recipe.split_cores([0, 1, 2, 3, 4, 5, 6, 7], 2) == ["0,1,2,3", "4,5,6,7"]
    assert recipe.split_cores([3], 2) == ["3", "3"], "fewer cores than replicas: they take turns"
    spec = RunSpec(mode="distributed", replicas=2)
    jobs = recipe.replica_jobs(spec, ports=[8001, 8002], cpu_binds=["0", "1"])
    assert [j.env["VLLM_CPU_OMP_THREADS_BIND"] for j in jobs] == ["0", "1"]
    remote = RunSpec(mode="distributed", replicas=2, executor="hf_jobs", bucket="alice/runs",
                     model="Qwen/Qwen2.5-0.5B-Instruct")
    assert all("VLLM_CPU_OMP_THREADS_BIND" not in j.env for j in recipe.replica_jobs(remote)), "a GPU job's own"
