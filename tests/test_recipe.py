"""The recipe: RunSpec -> JobSpecs, pure and previewable."""

import json
import shlex
from dataclasses import replace

import pytest

from backend.plan import recipe
from backend.plan.jobspec import LABEL_APP, LABEL_ROLE, LABEL_RUN
from backend.plan.spec import RunSpec
from backend.runs.launch import preview_jobs

pytestmark = pytest.mark.unit


def test_colocated_local_run_is_one_trainer_job_with_the_bucket_mounted():
    spec = RunSpec()
    [job] = recipe.colocated_jobs(spec, python="/usr/bin/python3")
    assert job.role == "trainer"
    assert job.timeout_s == spec.timeout_minutes * 60
    assert job.labels == {LABEL_APP: "1", LABEL_RUN: spec.run_id, LABEL_ROLE: "trainer"}
    assert [(v.bucket, v.mount_path, v.read_only) for v in job.volumes] == [(spec.bucket, "/bucket", False)]
    script = job.command[2]
    assert "runtime.tiny_model" in script and f"runtime.trainer.train --run-dir {spec.run_path}" in script
    assert script.count("/usr/bin/python3") == 3 and recipe.PY not in script
    # Every attempt is recorded first, before anything else runs (runtime.job.attempt).
    assert script.startswith(f"/usr/bin/python3 -m runtime.job.attempt --run-dir {spec.run_path} && ")
    assert job.env["PYTHONPATH"] == f"{spec.run_path}/code"
    assert job.secrets == ()


def test_colocated_hf_job_installs_pinned_trl_and_takes_the_token_as_a_secret():
    spec = RunSpec(executor="hf_jobs", model="Qwen/Qwen2.5-0.5B-Instruct", bucket="alice/runs", use_vllm=True,
                   flavor="a10g-large", num_processes=2, per_device_batch_size=8, num_generations=8)
    [job] = recipe.colocated_jobs(spec)
    assert job.image == recipe.VLLM_IMAGE and job.flavor == "a10g-large" and job.namespace == "alice"
    assert job.secrets == ("HF_TOKEN",) and "HF_TOKEN" not in job.env
    assert f"pip install --quiet trl=={recipe.TRL_VERSION} peft=={recipe.PEFT_VERSION}" in job.command[2]
    assert "trackio" not in job.command[2], "trackio is installed only for a run that logs to it"
    [tracked] = recipe.colocated_jobs(replace(spec, trackio=True, trackio_space="alice/tracker"))
    assert f"peft=={recipe.PEFT_VERSION} {recipe.TRACKIO_PIP} " in tracked.command[2]
    assert "python -m accelerate.commands.launch --num_processes 2 --num_machines 1" in job.command[2]
    assert job.command[2].endswith("-m runtime.trainer.train --run-dir /bucket/runs/" + spec.run_id)
    assert "runtime.tiny_model" not in job.command[2]
    preview = job.cli_preview()
    assert "-s HF_TOKEN" in preview and "-v hf://buckets/alice/runs:/bucket" in preview
    assert shlex.split(preview)[:3] == ["hf", "jobs", "run"]


def test_distributed_run_mounts_the_bucket_at_the_same_path_everywhere_and_replicas_read_only():
    spec = RunSpec(mode="distributed", executor="hf_jobs", model="Qwen/Qwen2.5-0.5B-Instruct", bucket="alice/runs",
                   replicas=3, max_staleness=2, lora_r=24)
    jobs = preview_jobs(spec)
    assert [j.role for j in jobs] == ["vllm-0", "vllm-1", "vllm-2", "trainer"]
    assert {v.mount_path for j in jobs for v in j.volumes} == {spec.mount_path}
    assert all(j.volumes[0].read_only for j in jobs[:3]) and not jobs[3].volumes[0].read_only
    serve = jobs[0].command[2]
    assert "--max-loras 4" in serve and "--max-lora-rank 32" in serve and "--enable-lora" in serve
    assert jobs[0].env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "1"
    # Private network (the default): one group named after the run, each job at its alias, no replica port exposed,
    # the trainer's proxy port exposed for the panel, and no token on rollout requests.
    group = f"grpo-{spec.run_id}"
    assert {j.network_group for j in jobs} == {group} and [j.network_aliases for j in jobs] == [
        ("vllm-0",), ("vllm-1",), ("vllm-2",), ("trainer",)]
    assert [j.expose for j in jobs] == [(), (), (), (recipe.PROXY_PORT,)]
    assert "VLLM_REPLICA_URLS" not in jobs[3].env and jobs[3].env["GRPO_REPLICA_AUTH"] == "none"
    assert "".join(f" --replica 'http://${{HF_NETWORK_GROUP_PREFIX}}vllm-{i}:8000'" for i in range(3)) in \
        jobs[3].command[2]
    # Exposed ports (the published recipe): each replica's port, reached through the Jobs proxy with the token.
    exposed = preview_jobs(replace(spec, network="exposed"))
    assert [j.expose for j in exposed] == [(8000,)] * 3 + [()] and not any(j.network_group for j in exposed)
    assert exposed[3].env["VLLM_REPLICA_URLS"].count("<vllm-") == 3 and "GRPO_REPLICA_AUTH" not in exposed[3].env


def test_local_replicas_get_distinct_ports_and_wait_for_the_builtin_model():
    spec = RunSpec(mode="distributed", replicas=2)
    jobs = recipe.replica_jobs(spec, ports=[18001, 18002], python="python3")
    assert [j.expose for j in jobs] == [(18001,), (18002,)]
    assert "runtime.serving.serve_replica" in jobs[0].command[2] and "--port 18002" in jobs[1].command[2]
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


def test_two_gpu_colocated_runs_launch_one_process_per_gpu_with_the_jobs_own_python():
    dp = RunSpec(use_vllm=True, num_processes=2, per_device_batch_size=4, num_generations=8)
    tp = RunSpec(use_vllm=True, num_processes=2, vllm_tensor_parallel_size=2, per_device_batch_size=4,
                 num_generations=8)
    for spec in (dp, tp):
        assert spec.validate() == []
        script = recipe.colocated_jobs(spec, python="/opt/venv/bin/python3")[0].command[2]
        # accelerate as a module of the job's interpreter: no `accelerate` script from another environment
        train = shlex.split(script.split(" && ")[-1])
        assert train[:6] == ["exec", "/opt/venv/bin/python3", "-m", "accelerate.commands.launch", "--num_processes",
                             "2"]
        assert train[-4:] == ["-m", "runtime.trainer.train", "--run-dir", spec.run_path]


def test_tensor_parallel_vllm_needs_a_training_process_per_gpu_of_the_engine():
    """TRL groups the training processes by the TP size and refuses a size that does not divide them."""
    [error] = RunSpec(use_vllm=True, vllm_tensor_parallel_size=2).validate()
    assert error.field == "vllm_tensor_parallel_size" and "num_processes=2" in error.message
    assert RunSpec(use_vllm=False, vllm_tensor_parallel_size=2).validate() == [], "TP only matters with vLLM"
    remote = RunSpec(executor="hf_jobs", bucket="alice/runs", model="Qwen/Qwen2.5-1.5B", use_vllm=True,
                     num_processes=4, vllm_tensor_parallel_size=8, per_device_batch_size=2)
    assert [e.field for e in remote.validate()] == ["vllm_tensor_parallel_size"]


def test_a_benchmarking_model_is_built_in_the_run_folder_and_replicas_wait_for_it():
    spec = RunSpec(mode="distributed", model="builtin:bench-qwen2.5-1.5b", replicas=1)
    replica, trainer = preview_jobs(spec)
    assert (f"runtime.tiny_model --out {spec.run_path}/base-model --seed 0 --name builtin:bench-qwen2.5-1.5b"
            in trainer.command[2])
    assert f"--wait-for {spec.run_path}/base-model" in replica.command[2]
    assert f"-- vllm serve {spec.run_path}/base-model --host" in replica.command[2]
    assert [e.field for e in RunSpec(model="builtin:bench-qwen2.5-7b").validate()] == ["model"]


def test_a_local_distributed_run_with_a_gpu_per_job_pins_each_job_to_its_own():
    assert recipe.assign_local_gpus(["0", "1"], replicas=1) == ("0", ["1"])
    assert recipe.assign_local_gpus(["2", "5", "7"], replicas=2) == ("2", ["5", "7"])
    assert recipe.assign_local_gpus(["0"], replicas=1) == (None, None), "one GPU: every job shares it"
    assert recipe.assign_local_gpus([], replicas=1) == (None, None)
    spec = RunSpec(mode="distributed", replicas=1)
    trainer_gpu, replica_gpus = recipe.assign_local_gpus(["0", "1"], spec.replicas)
    [replica] = recipe.replica_jobs(spec, ports=[18001], gpus=replica_gpus)
    trainer = recipe.trainer_job(spec, ["http://127.0.0.1:18001"], gpu=trainer_gpu)
    assert replica.env["CUDA_VISIBLE_DEVICES"] == "1" and trainer.env["CUDA_VISIBLE_DEVICES"] == "0"
    # Alone on its GPU a replica sizes its own KV cache, as on HF Jobs; it still listens on loopback only.
    assert "--gpu-memory-utilization" not in replica.command[2] and "--kv-cache-memory-bytes" not in replica.command[2]
    assert "--host 127.0.0.1" in replica.command[2]
    [shared] = recipe.replica_jobs(spec, ports=[18001])
    assert "CUDA_VISIBLE_DEVICES" not in shared.env and "--gpu-memory-utilization 0.5" in shared.command[2]
    assert "CUDA_VISIBLE_DEVICES" not in recipe.trainer_job(spec, ["http://127.0.0.1:18001"]).env


def test_local_gpus_follow_cuda_visible_devices(monkeypatch):
    from backend.plan.engines.local import local_gpu_ids

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,0")
    assert local_gpu_ids() == ["1", "0"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert local_gpu_ids() == []


def test_local_colocated_runs_each_rendezvous_on_a_port_of_their_own():
    """Two colocated runs at once on one machine (a GPU each) both took torch.distributed's 29500 for vLLM's
    process group; the second failed with EADDRINUSE. The launcher gives each local run a free port."""
    one = recipe.colocated_jobs(RunSpec(use_vllm=True), master_port=41001)[0]
    assert one.env["MASTER_PORT"] == "41001", "TRL keeps a MASTER_PORT that is set; vLLM's rendezvous uses it"
    two = recipe.colocated_jobs(RunSpec(use_vllm=True, num_processes=2, per_device_batch_size=4), master_port=41002)[0]
    assert "--num_machines 1 --main_process_port 41002" in two.command[2] and two.env["MASTER_PORT"] == "41002"
    remote = RunSpec(executor="hf_jobs", bucket="alice/runs", model="Qwen/Qwen2.5-1.5B", use_vllm=True)
    assert "MASTER_PORT" not in recipe.colocated_jobs(remote)[0].env, "a job alone on its machine keeps the default"


def test_the_launcher_gives_each_local_colocated_run_a_free_port(tmp_path):
    from backend.executors.local import LocalExecutor
    from backend.runs.launch import launch_run
    from backend.storage.store import FolderStore

    class Recorder(LocalExecutor):
        def submit(self, job, secrets=None):
            self.seen = [*getattr(self, "seen", []), job]
            return f"{job.run_id}--{job.role}"

    executor = Recorder(str(tmp_path))
    for _ in range(2):
        spec = RunSpec(use_vllm=True)
        launch_run(spec, executor, FolderStore(executor.bucket_root(spec.bucket)))
    ports = [job.env["MASTER_PORT"] for job in executor.seen]
    assert len(set(ports)) == 2 and all(p.isdigit() and p != "29500" for p in ports)


def test_a_ray_runs_replicas_and_trainer_share_a_key_of_their_own_launch_passed_only_as_a_secret(tmp_path):
    """Ray replicas listen on every interface of their node: each launch gives its replicas and its trainer a fresh
    key (runtime.serving.replica_key), a job secret, never in a job's environment or command; other engines
    need none."""
    from backend.runs.launch import launch_run
    from backend.storage.store import FolderStore

    class Recording:
        name = "ray"

        def __init__(self):
            self.submitted = []

        def submit(self, job, secrets=None):
            self.submitted.append((job, dict(secrets or {})))
            return f"{job.role}-{len(self.submitted)}"

        def exposed_url(self, job_id, port):
            return f"http://127.0.0.1:{port}"

    spec = RunSpec(executor="ray", mode="distributed", replicas=2, flavor="ray-cpu", vllm_flavor="ray-cpu",
                   bucket="local/grpo-runs", mount_path=str(tmp_path / "mount"))
    keys = []
    for attempt in range(2):
        executor = Recording()
        launch_run(replace(spec, run_id=f"{spec.run_id}-{attempt}"), executor, FolderStore(str(tmp_path / "mount")))
        assert [job.role for job, _ in executor.submitted] == ["vllm-0", "vllm-1", "trainer"]
        [key] = {secrets[recipe.REPLICA_KEY_SECRET] for _, secrets in executor.submitted}
        assert len(key) >= 40
        for job, _ in executor.submitted:
            assert recipe.REPLICA_KEY_SECRET in job.secrets
            assert key not in json.dumps(job.env) + " ".join(job.command)
        keys.append(key)
    assert keys[0] != keys[1], "each launch has a key of its own"
    for other in (replace(spec, mode="colocated"), replace(spec, executor="local", bucket="local/grpo-runs")):
        jobs = recipe.RunJobs(other, engine_placement(other)).preview(lambda i, port: f"http://x:{port}")
        assert all(recipe.REPLICA_KEY_SECRET not in job.secrets for job in jobs)


class RecordingRay:
    """A stand-in Ray executor: what was submitted (with its secrets) and cancelled; `unplaced`: the job ids whose
    node Ray never reports (exposed_url fails)."""

    name, namespace = "ray", None

    def __init__(self, unplaced=()):
        self.submitted, self.cancelled, self.unplaced = [], [], set(unplaced)

    def submit(self, job, secrets=None):
        self.submitted.append((job, dict(secrets or {})))
        return f"{job.run_id}-{job.role}"

    def exposed_url(self, job_id, port):
        if job_id in self.unplaced:
            raise RuntimeError(f"job {job_id} was not started on a node of the cluster")
        return f"http://10.0.0.{len(job_id) % 9}:{port}"

    def cancel(self, job_id):
        self.cancelled.append(job_id)

    def list_jobs(self, run_id=None, checks=False):
        return []


def test_a_ray_sweeps_members_share_one_fleet_and_its_key_and_a_fleet_never_placed_is_cancelled(tmp_path):
    """On Ray a sweep's fleet is submitted once; its replicas demand a key of the fleet's own, which every member's
    trainer gets as a secret (each member's launch would otherwise make its own, and the fleet would refuse it); a
    fleet whose replica the cluster never places is cancelled, and no member launches."""
    from backend.plan.sweep import SweepSpec, fleet_size
    from backend.runs.launch import SubmitFailed, launch_fleet, launch_run
    from backend.storage.store import FolderStore

    base = RunSpec(executor="ray", mode="distributed", replicas=2, flavor="ray-cpu", vllm_flavor="ray-cpu",
                   bucket="local/grpo-runs", mount_path=str(tmp_path / "mount"), max_staleness=1)
    members = SweepSpec(base, {"learning_rate": [1e-4, 5e-4]}).members()
    assert {m.fleet for m in members} == {members[0].sweep_id}, "Ray: one fleet for every member"
    store, executor = FolderStore(str(tmp_path / "mount")), RecordingRay()
    size = fleet_size(members)
    fleet = launch_fleet(members, size.max_loras, size.max_lora_rank, executor, store, {})
    for member in members:
        launch_run(member, executor, store, dict(fleet.secrets), fleet_urls=fleet.urls)
    assert [(job.run_id, job.role) for job, _ in executor.submitted] == [
        (fleet.fleet_id, "vllm-0"), (fleet.fleet_id, "vllm-1"), (members[0].run_id, "trainer"),
        (members[1].run_id, "trainer")], "the fleet once, then each member's trainer alone"
    [key] = {secrets[recipe.REPLICA_KEY_SECRET] for _, secrets in executor.submitted}
    assert len(key) >= 40 and key not in repr(fleet), "one key, the fleet's, never shown"
    assert all(job.env[recipe.REPLICAS_ENV] == ",".join(fleet.urls) for job, _ in executor.submitted[2:])
    assert "--max-loras 6 " in executor.submitted[0][0].command[-1]

    again = [replace(m, run_id=f"{m.run_id}-2") for m in SweepSpec(base, {"learning_rate": [1e-4, 5e-4]}).members()]
    unplaced = RecordingRay(unplaced={f"{again[0].fleet}-vllm-1"})
    with pytest.raises(SubmitFailed, match="could not find where the fleet's replicas answer"):
        launch_fleet(again, size.max_loras, size.max_lora_rank, unplaced, store, {})
    assert unplaced.cancelled == [f"{again[0].fleet}-vllm-0", f"{again[0].fleet}-vllm-1"], "nothing left running"


def engine_placement(spec):
    from backend.plan.engines import engine

    return engine(spec.executor).placement(spec, preview=True)


def _named_modules(jobs) -> set[str]:
    """Every `runtime...` module a job's command starts with `-m`."""
    import re
    return {m for job in jobs for part in job.command for m in re.findall(r"-m['\s]+(runtime(?:\.[a-z_]+)+)", part)}


@pytest.mark.parametrize("mode", ["colocated", "distributed"])
def test_every_module_a_jobs_command_names_is_in_the_runs_code_also_for_a_run_resumed_from_the_flat_layout(
        tmp_path, mode):
    """Jobs run the code in their run's bucket folder. runtime/ got sub-packages by process (`runtime.trainer.train`);
    a run launched before that has the flat `runtime/train.py` in its bucket, and resumed it must name the modules
    that code has, not this panel's."""
    import os
    import shutil

    from backend.executors.local import LocalExecutor
    from backend.runs.launch import launch_run
    from backend.runtime import RUNTIME_DIR
    from backend.storage.store import FolderStore

    class Recorder(LocalExecutor):
        def submit(self, job, secrets=None):
            self.seen = [*getattr(self, "seen", []), job]
            return f"{job.run_id}--{job.role}"

    executor = Recorder(str(tmp_path / "home"))
    spec = RunSpec(mode=mode, use_vllm=mode == "colocated")
    store = FolderStore(executor.bucket_root(spec.bucket))
    launch_run(spec, executor, store)
    code = os.path.join(executor.bucket_root(spec.bucket), "runs", spec.run_id, "code")

    def module_file(module):
        return os.path.join(code, *module.split(".")) + ".py"

    fresh = _named_modules(executor.seen)
    assert {m for m in fresh if "." in m[len("runtime."):]}, f"the sub-packages are named: {fresh}"
    assert [m for m in fresh if not os.path.isfile(module_file(m))] == []

    # The same run as a panel before the sub-packages left it: every module flat under code/runtime/.
    shutil.rmtree(os.path.join(code, "runtime"))
    os.makedirs(os.path.join(code, "runtime"))
    for folder, _, names in os.walk(RUNTIME_DIR):
        for name in names:
            if name.endswith(".py") and name != "__init__.py" or folder == RUNTIME_DIR and name == "__init__.py":
                shutil.copy(os.path.join(folder, name), os.path.join(code, "runtime", name))
    executor.seen = []
    launch_run(spec, executor, store, resume=True)
    resumed = _named_modules(executor.seen)
    assert {m.rsplit(".", 1)[1] for m in resumed} == {m.rsplit(".", 1)[1] for m in fresh}
    assert [m for m in resumed if not os.path.isfile(module_file(m))] == [], resumed
