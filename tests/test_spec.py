"""RunSpec validation: every bad field is refused with a message that names it and says what is valid."""

import dataclasses
import json

import pytest

from backend.plan.spec import RunSpec, SpecError
from backend.runtime.tiny_model import TINY_MODEL

pytestmark = pytest.mark.unit


def test_defaults_validate():
    assert RunSpec().validate() == []


BAD = [
    ({"model": "/no/such/model"}, "model", "no model folder"),
    ({"model": "not a model id!"}, "model", "a Hub id like"),
    ({"model": "not a model id!", "executor": "hf_jobs", "bucket": "me/b"}, "model", "a Hub id like"),
    ({"model": "Qwen/Qwen2.5-0.5B"}, "model", "local runs cannot download"),
    ({"lora_r": 0}, "lora_r", "between 1 and 512"),
    ({"lora_r": -4}, "lora_r", "between 1 and 512"),
    ({"lora_r": 1024}, "lora_r", "vLLM serves 8, 16"),
    ({"lora_alpha": 0}, "lora_alpha", "at least 1"),
    ({"learning_rate": 0.0}, "learning_rate", "> 0"),
    ({"learning_rate": -1e-5}, "learning_rate", "> 0"),
    ({"max_steps": 0}, "max_steps", "between 1 and 1,000,000"),
    ({"num_generations": 1}, "num_generations", "at least 2"),
    ({"per_device_batch_size": 6, "num_generations": 4}, "per_device_batch_size", "multiple of num_generations"),
    ({"vllm_gpu_memory_utilization": 0.0}, "vllm_gpu_memory_utilization", "between 0 and 1"),
    ({"vllm_gpu_memory_utilization": 1.0}, "vllm_gpu_memory_utilization", "between 0 and 1"),
    ({"vllm_gpu_memory_utilization": 1.5}, "vllm_gpu_memory_utilization", "between 0 and 1"),
    ({"bucket": "no-namespace"}, "bucket", "namespace/name"),
    ({"bucket": "me/has space"}, "bucket", "letters, digits"),
    ({"bucket": "me/double--dash"}, "bucket", "'--'"),
    ({"bucket": "me/ends.git"}, "bucket", ".git"),
    ({"bucket": "me/" + "x" * 97}, "bucket", "1-96"),
    ({"timeout_minutes": 0}, "timeout_minutes", "timeout"),
    ({"timeout_minutes": 60 * 24 * 365}, "timeout_minutes", "7 days"),
    ({"rewards": []}, "rewards", "choose one or more"),
    ({"rewards": ["digits", "nope"]}, "rewards", "unknown: nope"),
    ({"dataset": "org/data"}, "dataset", "local runs cannot download"),
    ({"mode": "sideways"}, "mode", "colocated, distributed"),
    ({"mount_path": "relative"}, "mount_path", "absolute"),
    ({"mode": "distributed", "replicas": 0}, "replicas", "between 1 and 16"),
    ({"mode": "distributed", "max_staleness": -1}, "max_staleness", "between 1 and 16"),
    ({"mode": "distributed", "max_staleness": 0}, "max_staleness", "unloads the previous version"),
    ({"mode": "distributed", "max_tokens_per_batch": 4}, "max_tokens_per_batch", "at least one completion"),
    ({"temperature": 0}, "temperature", "> 0"),
    ({"trackio": True, "trackio_project": "has space"}, "trackio_project", "letters, digits"),
    ({"trackio": True, "trackio_space": "no-namespace"}, "trackio_space", "namespace/name"),
    ({"trackio": True, "trackio_space": "me/tracker"}, "trackio_space", "local runs do not reach the Hub"),
]


@pytest.mark.parametrize("overrides,field,fragment", BAD, ids=[f"{b[1]}-{i}" for i, b in enumerate(BAD)])
def test_bad_field_is_refused_with_a_message_naming_it(overrides, field, fragment):
    errors = RunSpec(**overrides).validate()
    messages = {e.field: e.message for e in errors}
    assert field in messages, errors
    assert fragment in messages[field]


def test_check_raises_with_every_problem():
    with pytest.raises(SpecError) as info:
        RunSpec(lora_r=0, learning_rate=0, max_steps=0).check()
    assert {e.field for e in info.value.errors} == {"lora_r", "learning_rate", "max_steps"}
    assert "lora_r:" in str(info.value)


def test_from_dict_coerces_form_values_and_refuses_unknown_or_mistyped_fields():
    spec = RunSpec.from_dict({"lora_r": 16.0, "use_vllm": "true", "lora_target_modules": "q_proj, v_proj"})
    assert (spec.lora_r, spec.use_vllm, spec.lora_target_modules) == (16, True, ["q_proj", "v_proj"])
    with pytest.raises(SpecError) as info:
        RunSpec.from_dict({"lora_r": "eight", "colour": "blue"})
    assert {e.field for e in info.value.errors} == {"lora_r", "colour"}


def test_local_model_folder_needs_a_config(tmp_path):
    assert [e.field for e in RunSpec(model=str(tmp_path)).validate()] == ["model"]
    (tmp_path / "config.json").write_text("{}")
    assert RunSpec(model=str(tmp_path)).validate() == []


def test_hub_ids_are_fine_on_hf_jobs():
    spec = RunSpec(executor="hf_jobs", model="Qwen/Qwen2.5-0.5B-Instruct", dataset="trl-lib/DeepMath-103K",
                   bucket="alice/grpo-runs", flavor="a10g-small")
    assert spec.validate() == []


def test_spec_round_trips_through_json():
    spec = RunSpec(name="x", lora_r=4, model=TINY_MODEL)
    again = RunSpec.from_dict(json.loads(spec.to_json()))
    assert again == spec


def test_a_distributed_run_refuses_an_adapter_that_would_ship_the_whole_model_at_every_sync():
    errors = RunSpec(mode="distributed", lora_target_modules=["q_proj", "lm_head"]).validate()
    [error] = [e for e in errors if e.field == "lora_target_modules"]
    assert "lm_head" in error.message and "whole model" in error.message
    assert not [e for e in RunSpec(lora_target_modules=["q_proj", "lm_head"]).validate()
                if e.field == "lora_target_modules"], "colocated runs merge anyway: allowed there"


def test_a_mount_path_that_would_hide_a_system_folder_is_refused():
    for mount in ("/tmp", "/usr", "/", "/proc/self"):
        assert [e for e in RunSpec(mount_path=mount).validate() if e.field == "mount_path"], mount
    assert not [e for e in RunSpec(mount_path="/data/bucket").validate() if e.field == "mount_path"]


def _field_errors(name: str, value) -> list:
    spec = RunSpec(mode="distributed", **{name: value})
    return [e for e in spec.validate() if e.field == name]


@pytest.mark.parametrize("name", [f.name for f in dataclasses.fields(RunSpec) if f.metadata.get("limits")])
def test_the_limits_the_form_shows_are_the_ones_validate_enforces(name):
    low, high = next(f for f in dataclasses.fields(RunSpec) if f.name == name).metadata["limits"]
    assert _field_errors(name, low) == [] and _field_errors(name, low - 1) != []
    if high is not None:
        assert _field_errors(name, high) == [] and _field_errors(name, high + 1) != []


def test_every_field_says_what_it_is_for():
    assert [f.name for f in dataclasses.fields(RunSpec) if not f.metadata.get("help")] == []


def test_a_declared_choice_is_enforced_and_a_distributed_limit_binds_only_distributed_runs():
    assert "must be one of 1, 2, 4, 8" in str(RunSpec(vllm_tensor_parallel_size=3).validate())
    assert RunSpec(replicas=0).validate() == [], "a colocated run never reads replicas"


@pytest.mark.parametrize("fields,field,fragment", [
    (dict(eval_source="split", eval_split="train"), "eval_split", "a builtin set's held-out split is 'test'"),
    (dict(executor="hf_jobs", model="Qwen/Qwen2.5-0.5B-Instruct", dataset="org/math", dataset_split="train",
          eval_source="split", eval_split="train"), "eval_split", "the held-out split is the training split"),
    (dict(dataset="examples/tiny-math.jsonl", prompt_column="question", eval_source="split"), "eval_source",
     "a local file has no splits"),
    (dict(eval_source="file"), "eval_file", "give a local .jsonl or .parquet file"),
    (dict(dataset="examples/tiny-math.jsonl", prompt_column="question", eval_source="file",
          eval_file="examples/tiny-math.jsonl"), "eval_file", "the held-out file is the training dataset"),
    (dict(eval_source="split", monitor_rewards=["accuracy_reward"]), "monitor_rewards",
     "compares answers with a 'solution' column"),
    (dict(eval_source="split", monitor_rewards=["digits"]), "monitor_rewards", "already a training reward"),
    (dict(monitor_rewards=["format"]), "monitor_rewards", "choose a held-out set"),
    (dict(eval_source="split", monitor_rewards=["vibes"]), "monitor_rewards", "unknown: vibes"),
    (dict(eval_source="rows", eval_rows=0), "eval_rows", "between 1 and 100,000"),
    (dict(eval_source="sometimes"), "eval_source", "must be one of none, split, file, rows"),
    (dict(eval_source="split", eval_max_inflight=0), "eval_max_inflight", "between 1 and 1,024"),
], ids=["builtin-split", "hub-same-split", "file-has-no-split", "no-file", "same-file", "monitor-needs-column",
        "monitor-twice", "monitor-without-set", "monitor-unknown", "no-rows", "bad-source",
        "no-inflight"])
def test_a_held_out_setting_that_cannot_work_is_refused_naming_its_field(fields, field, fragment):
    errors = {e.field: e.message for e in RunSpec(**fields).validate()}
    assert fragment in errors.get(field, ""), errors


def test_the_held_out_defaults_validate_and_the_preview_line_says_what_is_evaluated():
    from backend.plan.task_spec import held_out_summary

    spec = RunSpec(eval_source="split", monitor_rewards=["format"]).check()
    assert held_out_summary(spec) == (
        "Held-out evaluation: split `test` of `builtin:count-to-ten`, up to 64 prompts, greedy, at every published "
        "adapter version; monitor-only: format; the base model first, as version 0; the best version by the trained "
        "rewards' weighted score (ties: the earliest), if it beats version 0.")
    sampled = RunSpec(mode="distributed", eval_source="rows", eval_greedy=False, eval_samples_per_prompt=4,
                      eval_every=10, dataset="examples/tiny-math.jsonl", prompt_column="question").check()
    assert "sampled at temperature 1, 4 per prompt, at a version at least every 10 steps, at most 4 requests" in (
        held_out_summary(sampled))
    assert held_out_summary(RunSpec()) == "Held-out evaluation: none (no held-out set)."


def test_the_task_form_shows_every_task_field_and_its_held_out_accordion_exactly_the_held_out_group():
    import gradio as gr

    from backend.plan.spec import HELD_OUT_FIELDS, HELD_OUT_SETTINGS, TASK_FIELDS
    from backend.plan.spec_fields import TASK
    from panel.task_form import TaskSection

    def inside(block) -> list:
        return [c for child in getattr(block, "children", []) for c in (child, *inside(child))]

    with gr.Blocks():
        section = TaskSection.build(RunSpec().to_dict())
    task_section = {f.name for f in dataclasses.fields(RunSpec) if f.metadata.get("section") == TASK}
    assert set(section.fields) == task_section and task_section < set(TASK_FIELDS)
    in_accordion = {name for name, widget in section.fields.items() if widget in inside(section.held_out)}
    assert in_accordion == HELD_OUT_FIELDS and set(HELD_OUT_SETTINGS) < HELD_OUT_FIELDS
