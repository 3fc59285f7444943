"""Each HF Jobs preset against its published source, the async GRPO + LoRA study: every value the study sets
either matches or has a stated reason, in `panel/presets.py` and in the note the form shows under the picker."""

import pytest

from backend.plan.hardware import FALLBACK_FLAVORS, hardware_problems
from backend.plan.spec import RunSpec
from panel.presets import PRESETS, STUDY, STUDY_DISTRIBUTED, preset_note, preset_values, study_differences

pytestmark = pytest.mark.unit

HF_PRESETS = [name for name, preset in PRESETS.items() if preset["executor"] == "hf_jobs"]


def _completions_per_step(values: dict) -> int:
    return values["per_device_batch_size"] * values["num_processes"] * values["gradient_accumulation_steps"]


@pytest.mark.parametrize("name", HF_PRESETS)
def test_every_study_value_of_a_preset_matches_or_says_why_not(name):
    values = preset_values(name, bucket="alice/grpo-runs")
    published = {**STUDY, **(STUDY_DISTRIBUTED if values["mode"] == "distributed" else {})}
    reasons = study_differences(name)
    for field, study_value in published.items():
        if values[field] != study_value:
            assert reasons.get(field), f"{name}: {field}={values[field]!r}, the study's {study_value!r}: no reason"
    for field in reasons:       # a reason is for a value that does differ: none is left behind by an edit
        assert field in published and values[field] != published[field], (name, field)
    assert RunSpec.from_dict(values).validate() == [], name


@pytest.mark.parametrize("name", HF_PRESETS)
def test_the_form_shows_each_difference_and_its_reason_under_the_preset_picker(name):
    note = preset_note(name)
    for field, reason in study_differences(name).items():
        assert field in note and reason in note, (field, note)
    assert "Qwen2.5-Math-1.5B" in note


def test_a_colocated_preset_trains_as_many_completions_a_step_as_the_study():
    for name in HF_PRESETS:
        values = preset_values(name)
        if values["mode"] == "colocated":
            assert _completions_per_step(values) >= 128, name
            assert _completions_per_step(values) // values["num_generations"] > 1, f"{name}: one prompt a step"


def test_the_h200_preset_runs_several_servers_a_gpu_and_feeds_each_as_many_requests_as_one_server_had():
    [name] = [n for n in HF_PRESETS if PRESETS[n]["mode"] == "distributed"]
    values = preset_values(name, bucket="me/grpo-runs")
    spec = RunSpec.from_dict(values).check()
    assert spec.vllm_flavor == "h200" and spec.servers_per_gpu == 4
    servers = spec.replicas * spec.servers_per_gpu
    assert spec.max_inflight_tasks == 128 * servers > 384, "in flight rises with the servers: 128 each"
    # What is in flight and queued is trained within max_staleness steps of the study's 128 completions.
    assert spec.max_staleness * 128 >= spec.max_inflight_tasks + spec.queue_maxsize
    assert hardware_problems(spec, list(FALLBACK_FLAVORS)) == [], "4 servers of the 1.5B model fit one H200"
    notes = preset_note(name)
    assert all(f"`{field}`" in notes for field in ("max_inflight_tasks", "queue_maxsize", "max_staleness"))


def test_the_distributed_preset_follows_the_studys_tuned_run():
    [name] = [n for n in HF_PRESETS if PRESETS[n]["mode"] == "distributed"]
    values = preset_values(name)
    assert (values["max_tokens_per_batch"], values["gradient_accumulation_steps"]) == (16384, 6)
    assert (values["lora_r"], values["lora_alpha"], values["learning_rate"], values["adam_beta2"]) == (1, 2, 4e-5, 0.95)
