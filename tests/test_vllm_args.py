"""The vLLM replica command: LoRA rank rounding and adapter slots follow vLLM's and TRL's rules."""

import pytest

from backend.plan.vllm_args import (
    VLLM_LORA_RANKS,
    round_lora_rank,
    vllm_serve_command,
    vllm_server_args,
    vllm_server_env,
)

pytestmark = pytest.mark.unit


def _flag(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


@pytest.mark.parametrize("rank, served", [(1, 1), (2, 8), (8, 8), (9, 16), (64, 64), (300, 320), (321, 512)])
def test_lora_rank_is_rounded_up_to_a_rank_vllm_accepts(rank, served):
    assert round_lora_rank(rank) == served
    assert _flag(vllm_server_args("/m", 8000, rank, 1), "--max-lora-rank") == str(served)


def test_a_rank_above_vllms_largest_is_refused():
    with pytest.raises(ValueError, match="512"):
        round_lora_rank(VLLM_LORA_RANKS[-1] + 1)


@pytest.mark.parametrize("staleness", [0, 1, 4])
def test_adapter_slots_hold_every_servable_version_plus_the_one_being_loaded(staleness):
    args = vllm_server_args("/m", 8000, 8, staleness)
    assert int(_flag(args, "--max-loras")) == staleness + 2
    assert int(_flag(args, "--max-cpu-loras")) >= staleness + 2


def test_the_command_serves_lora_with_processed_logprobs_on_the_given_port():
    args = vllm_server_args("/bucket/runs/r/base-model", 8123, 16, 1, dtype="float32", extra_args=("--seed", "1"))
    command = vllm_serve_command(args)
    assert command[:3] == ["vllm", "serve", "/bucket/runs/r/base-model"], "the model is `vllm serve`'s argument"
    assert "--model" not in command
    assert _flag(args, "--port") == "8123" and _flag(args, "--host") == "0.0.0.0"
    assert "--enable-lora" in args and _flag(args, "--logprobs-mode") == "processed_logprobs"
    assert _flag(args, "--generation-config") == "vllm", "vLLM's sampling defaults, not the model card's"
    assert _flag(args, "--dtype") == "float32" and args[-2:] == ["--seed", "1"]
    assert all(isinstance(a, str) for a in args)


def test_the_environment_enables_runtime_lora_and_the_dev_routes():
    env = vllm_server_env()
    assert env == {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "1", "VLLM_SERVER_DEV_MODE": "1"}
    assert vllm_server_env(cpu=True)["VLLM_CPU_KVCACHE_SPACE"] == "1"
