"""Several vLLM servers on one replica job's GPU (`servers_per_gpu`): the field and its refusals, the jobs the recipe
plans for it on each engine, how each server's memory is split, how the dashboard names and judges the servers."""

import shlex
from types import SimpleNamespace

import pytest

from backend.executors.base import ResourceSample
from backend.plan import recipe
from backend.plan.engines import engine
from backend.plan.engines.base import Placement
from backend.plan.hardware import FALLBACK_FLAVORS, _from_hub, hardware_problems
from backend.plan.servers import footprint
from backend.plan.spec import RunSpec
from backend.runs.launch import preview_jobs
from backend.runtime.serving import gpu_split
from backend.runtime.serving.replicas import load_rates, parse_load
from backend.runtime.serving.server_setup import server_commands, server_envs, with_option
from backend.view.diagnose import verdict
from backend.view.servers import listed_per_job, replica_gpu_busy, server_name, server_role
from panel.preview_text import distributed_engine

pytestmark = pytest.mark.unit

QWEN15 = "Qwen/Qwen2.5-Math-1.5B"


def hf_spec(**fields) -> RunSpec:
    return RunSpec(**{"mode": "distributed", "executor": "hf_jobs", "bucket": "alice/runs", "model": QWEN15,
                      "vllm_flavor": "h200", "servers_per_gpu": 4, **fields})


def replica_args(job) -> list[str]:
    """The serve_replica wrapper's arguments and the vLLM command of a replica job, as one list."""
    return shlex.split(job.command[2].split(" && ")[-1])


# ---- the field and its refusals
def test_servers_per_gpu_is_refused_on_a_colocated_run_and_outside_its_limits():
    [error] = RunSpec(servers_per_gpu=2).validate()
    assert error.field == "servers_per_gpu" and "colocated" in error.message
    assert RunSpec(servers_per_gpu=1).validate() == []
    assert [e.field for e in RunSpec(mode="distributed", servers_per_gpu=9).validate()] == ["servers_per_gpu"]
    assert [e.field for e in RunSpec(mode="distributed", servers_per_gpu=0).validate()] == ["servers_per_gpu"]


def test_a_gpu_that_cannot_hold_the_servers_for_the_model_and_context_is_refused_naming_the_field():
    flavors = list(FALLBACK_FLAVORS)
    assert hardware_problems(hf_spec(replica_max_model_len=4096), flavors) == []      # 4 x 1.5B on an H200
    [error] = hardware_problems(hf_spec(servers_per_gpu=8, vllm_flavor="l4x1", replica_max_model_len=4096), flavors)
    assert error.field == "servers_per_gpu" and "l4x1" in error.message and "at most 3 fit" in error.message
    # A 7B model (by its name) does not fit twice on a 24 GB GPU, but twice on an 80 GB one.
    big = dict(model="Qwen/Qwen2.5-7B-Instruct", servers_per_gpu=2)
    [error] = hardware_problems(hf_spec(vllm_flavor="a10g-small", **big), flavors)
    assert "only one fits" in error.message and "replica_max_model_len" in error.message
    assert hardware_problems(hf_spec(vllm_flavor="a100-large", **big), flavors) == []
    # The context counts: a KV cache for one full sequence must fit beside the weights.
    long = dict(model="builtin:bench-qwen2.5-1.5b", vllm_flavor="l4x1", servers_per_gpu=3)
    assert hardware_problems(hf_spec(replica_max_model_len=4096, **long), flavors) == []
    assert [e.field for e in hardware_problems(hf_spec(replica_max_model_len=131072, **long), flavors)] == [
        "servers_per_gpu"]


def test_a_model_whose_size_nothing_states_cannot_be_split_and_is_refused():
    [error] = hf_spec(model="someone/mystery-model").validate()
    assert error.field == "servers_per_gpu" and "states no size" in error.message
    assert hf_spec(model="someone/mystery-model", servers_per_gpu=1).validate() == []


def test_a_models_footprint_comes_from_its_config_or_the_size_its_name_states(tmp_path):
    bench = footprint("builtin:bench-qwen2.5-0.5b")
    assert 0.9e9 < bench.weights_bytes < 1.1e9 and bench.kv_bytes_per_token == 2 * 24 * 2 * 64 * 2
    assert footprint(QWEN15).weights_bytes == 3_000_000_000 and footprint(QWEN15).context == 32768
    assert footprint("mistralai/Mixtral-8x7B-v0.1").weights_bytes == 112_000_000_000
    assert footprint("HuggingFaceTB/SmolLM2-135M").weights_bytes == 270_000_000
    assert footprint("openai-community/gpt2") is None
    (tmp_path / "config.json").write_text('{"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 1,'
                                          ' "vocab_size": 256, "max_position_embeddings": 512}')
    assert footprint(str(tmp_path), 128).context == 128


def test_the_hubs_vram_is_for_all_the_flavors_gpus_together():
    accelerator = SimpleNamespace(quantity="4", vram="96 GB")
    hardware = SimpleNamespace(name="l4x4", pretty_name="4xL4", unit_label="hour", unit_cost_usd=3.8,
                               accelerator=accelerator)
    assert _from_hub(hardware).gpu_memory_gb == 24.0


# ---- the jobs the recipe plans
def test_an_hf_jobs_replica_runs_its_servers_on_ports_of_their_own_each_exposed_with_a_split_of_the_gpu():
    spec = hf_spec(network="exposed", replicas=2)
    jobs = preview_jobs(spec)
    replica, trainer = jobs[0], jobs[-1]
    assert replica.expose == (8000, 8001, 8002, 8003) == replica.ports
    args = replica_args(replica)
    assert args[args.index("--ports") + 1:args.index("--ports") + 5] == ["8000", "8001", "8002", "8003"]
    assert args[args.index("--split-gpu") + 1] == "0.9" and args[args.index("--servers-per-gpu") + 1] == "4"
    assert args[args.index("--model-bytes") + 1] == "3000000000"
    assert "--gpu-memory-utilization" not in args, "the split sets each server's share"
    urls = trainer.env[recipe.REPLICAS_ENV].split(",")
    assert urls == ["<vllm-0 url>", "<vllm-0:8001 url>", "<vllm-0:8002 url>", "<vllm-0:8003 url>",
                    "<vllm-1 url>", "<vllm-1:8001 url>", "<vllm-1:8002 url>", "<vllm-1:8003 url>"]


def test_on_the_private_network_the_trainer_reaches_each_server_at_the_replicas_alias():
    replica, trainer = preview_jobs(hf_spec(replicas=1))
    assert replica.expose == () and replica.ports == (8000, 8001, 8002, 8003)
    reached = [a for a in replica_args(trainer) if a.startswith("http://")]
    assert reached == [f"http://${{HF_NETWORK_GROUP_PREFIX}}vllm-0:{p}" for p in (8000, 8001, 8002, 8003)]


def test_a_replica_of_several_gpus_runs_its_servers_on_each_gpu():
    [replica] = recipe.replica_jobs(hf_spec(vllm_flavor="h200x2", servers_per_gpu=2, replicas=1))
    args = replica_args(replica)
    assert replica.ports == (8000, 8001, 8002, 8003) and args[args.index("--gpus") + 1] == "2"
    assert recipe.server_count(hf_spec(vllm_flavor="h200x2", servers_per_gpu=2, replicas=3)) == 12


def test_one_server_a_gpu_plans_the_replica_exactly_as_before():
    [replica] = recipe.replica_jobs(hf_spec(servers_per_gpu=1, replicas=1, network="exposed"))
    args = replica_args(replica)
    assert replica.expose == (8000,) and not {"--ports", "--split-gpu", "--cpu-binds"} & set(args)


def test_a_local_replica_runs_its_servers_on_free_ports_and_cores_of_their_own():
    spec = RunSpec(mode="distributed", replicas=1, servers_per_gpu=2)
    place = engine("local").placement(spec, preview=True)
    [replica, trainer] = recipe.RunJobs(spec, place).preview(engine("local").replica_url)
    args = replica_args(replica)
    assert replica.ports == ("FREE_PORT_0", "FREE_PORT_1")
    assert args[args.index("--ports") + 1:args.index("--ports") + 3] == ["FREE_PORT_0", "FREE_PORT_1"]
    assert "--cpu-binds" in args and "VLLM_CPU_OMP_THREADS_BIND" not in replica.env
    assert trainer.env[recipe.REPLICAS_ENV] == "http://127.0.0.1:FREE_PORT_0,http://127.0.0.1:FREE_PORT_1"
    # On one shared GPU each server keeps its fixed 1 GiB cache, and a quarter of the replicas' half.
    assert args[args.index("--gpu-memory-utilization") + 1] == "0.25"
    [own] = recipe.replica_jobs(spec, ports=[[18001, 18002]], gpus=["1"])
    own_args = replica_args(own)
    assert own.env["CUDA_VISIBLE_DEVICES"] == "1" and own_args[own_args.index("--split-gpu") + 1] == "0.9"


def test_ray_replicas_split_their_gpus_and_get_a_port_for_each_server():
    spec = RunSpec(mode="distributed", executor="ray", vllm_flavor="ray-1gpu", model=QWEN15, servers_per_gpu=2,
                   replicas=2)
    place = engine("ray").placement(spec, preview=True)
    assert place.ports == [["FREE_PORT_0", "FREE_PORT_1"], ["FREE_PORT_2", "FREE_PORT_3"]]
    jobs = recipe.RunJobs(spec, Placement(ports=[[9000, 9001], [9002, 9003]])).first()
    assert [j.ports for j in jobs] == [(9000, 9001), (9002, 9003)]
    assert "--split-gpu" in replica_args(jobs[0])


def test_the_preview_says_how_many_requests_each_server_gets_and_warns_when_they_are_too_few():
    spec = hf_spec(replicas=2, max_inflight_tasks=1024)
    assert "2 replica job(s) x 4 vLLM servers (4 a GPU) = 8" in distributed_engine(spec)
    assert "128 a server" in distributed_engine(spec) and "⚠️" not in distributed_engine(spec)
    assert "raise max_inflight_tasks to 512" in distributed_engine(hf_spec(replicas=2, max_inflight_tasks=384))
    assert distributed_engine(RunSpec(mode="distributed", replicas=2)).startswith("vLLM server x2 behind the proxy")


# ---- what serve_replica runs
def test_each_server_gets_its_port_cores_gpu_cache_folder_and_memory_split():
    command = ["vllm", "serve", "m", "--port", "8000", "--gpu-memory-utilization", "0.9", "--max-loras", "3"]
    memory = gpu_split.server_memory_args(100 * 2**30, 0.9, 2, 2**30)
    first, second = server_commands(command, ["8000", "8001"], memory)
    assert first[first.index("--port") + 1] == "8000"
    assert second[second.index("--port") + 1] == "8001" and second.count("--port") == 1
    assert second[second.index("--gpu-memory-utilization") + 1] == "0.45"
    assert int(second[second.index("--kv-cache-memory-bytes") + 1]) == int(0.45 * 100 * 2**30) - 2**30 - 3 * 2**30
    assert with_option(["a", "--port=1", "b"], "--port", None) == ["a", "b"]
    envs = server_envs(4, ["0", "1", "0", "1"], gpus=2, per_gpu=2, env={"VLLM_CACHE_ROOT": "/c"})
    assert [e["CUDA_VISIBLE_DEVICES"] for e in envs] == ["0", "0", "1", "1"]
    assert [e["VLLM_CPU_OMP_THREADS_BIND"] for e in envs] == ["0", "1", "0", "1"]
    assert len({e["VLLM_CACHE_ROOT"] for e in envs}) == 4, "servers compiling at once each write their own cache"
    visible = server_envs(2, None, gpus=2, per_gpu=1, env={"CUDA_VISIBLE_DEVICES": "5,7"})
    assert [e["CUDA_VISIBLE_DEVICES"] for e in visible] == ["5", "7"]
    assert gpu_split.server_share(0.85, 4) == 0.21


# ---- the proxy's reading of each server, and the dashboard's
def test_a_servers_load_is_read_from_its_metrics():
    text = ('# HELP x\nvllm:generation_tokens_total{model_name="m"} 1000.0\n'
            'vllm:generation_tokens_total{model_name="a"} 500.0\nprocess_cpu_seconds_total 10.0\n'
            'vllm:num_requests_running{model_name="m"} 250.0\nvllm:num_requests_waiting{model_name="m"} 3.0\n')
    before = (100.0, parse_load(text))
    after = (110.0, parse_load(text.replace("1000.0", "151000.0").replace("10.0\n", "19.7\n")))
    assert before[1] == {"tokens": 1500.0, "cpu_s": 10.0, "running": 250.0, "waiting": 3.0}
    assert load_rates(before, after) == {"gen_tok_s": 15000.0, "api_cpu": 0.97, "running": 250.0, "waiting": 3.0}


def test_servers_are_named_by_their_replica_job():
    assert listed_per_job(8, 2) == 4 and listed_per_job(3, 2) == 1 and listed_per_job(2, 0) == 1
    assert [server_name(i, 2) for i in range(4)] == ["vllm-0/0", "vllm-0/1", "vllm-1/0", "vllm-1/1"]
    assert server_role(3, 2) == "vllm-1" and server_name(1, 1) == "vllm-1"


SPEC = {"mode": "distributed", "queue_maxsize": 1024, "max_inflight_tasks": 256, "adapter_every": 1,
        "max_staleness": 4, "replicas": 1, "servers_per_gpu": 1}
WAITING = [{"step": i, "time": 100.0 + i, "perf/step_s": 8.0, "perf/rollout_wait_s": 5.0, "rollout/inflight": 256.0,
            "sample/rollout_queue_size": 0.0, "perf/weight_sync_s": 0.05} for i in range(1, 21)]


def test_saturated_api_processes_beside_an_idle_gpu_say_raise_servers_per_gpu():
    servers = [{"healthy": True, "api_cpu": 0.98, "gen_tok_s": 15000.0}]
    v = verdict(WAITING, SPEC, servers, gpu_busy=30.0)
    assert v.kind == "generation-bound" and "API-server bound" in v.line and "0.98 of a core" in v.line
    assert "30% busy" in v.line and v.change == {"servers_per_gpu": 2, "max_inflight_tasks": 512}
    # A busy GPU, spare API processes, or no GPU at all (CPU replicas): not an API-server bound.
    assert "API-server" not in verdict(WAITING, SPEC, servers, gpu_busy=95.0).line
    assert "API-server" not in verdict(WAITING, SPEC, [{"healthy": True, "api_cpu": 0.4}], gpu_busy=30.0).line
    assert "API-server" not in verdict(WAITING, SPEC, servers, gpu_busy=None).line
    assert verdict(WAITING, {**SPEC, "servers_per_gpu": 8}, servers, 30.0).change == {"replicas": 2}


def test_the_replicas_gpu_use_is_read_from_their_jobs_newest_samples():
    def job(utils, t0=1000.0):
        return SimpleNamespace(resources=[ResourceSample(t0 + i, 1.0, 1, gpu_util=(u,)) for i, u in enumerate(utils)])

    view = SimpleNamespace(current_jobs={"trainer": job([99, 99]), "vllm-0": job([20, 40]), "vllm-1": job([30])})
    assert replica_gpu_busy(view) == pytest.approx(30.0)
    assert replica_gpu_busy(SimpleNamespace(current_jobs={"vllm-0": job([])})) is None
