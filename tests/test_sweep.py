"""A sweep (backend/plan/sweep.py): base settings and swept fields -> member runs on one fleet, or refusals that
name the field."""

import shlex

import pytest

from backend.plan.spec import RunSpec, SpecError
from backend.plan.sweep import (
    BUDGET_FIELD,
    MAX_FLEET_LORA_SLOTS,
    MAX_MEMBERS,
    SweepSpec,
    fleet_size,
    parse_budget,
    parse_swept,
)
from backend.runtime import layout

pytestmark = pytest.mark.unit


def base(**changes) -> RunSpec:
    return RunSpec(**{"name": "lr-sweep", "mode": "distributed", "max_steps": 4, "replicas": 2, **changes})


def refusal(sweep: SweepSpec) -> tuple[str, str]:
    problems = sweep.problems()
    assert problems, "the sweep was accepted"
    with pytest.raises(SpecError):
        sweep.members()
    return problems[0].field, problems[0].message


def test_a_grid_makes_every_combination_each_an_ordinary_valid_run_tied_by_the_sweep_id():
    sweep = SweepSpec(base(), {"learning_rate": [1e-4, "5e-4"], "lora_r": [8, 16]})
    members = sweep.members()
    assert [(m.learning_rate, m.lora_r) for m in members] == [(1e-4, 8), (1e-4, 16), (5e-4, 8), (5e-4, 16)]
    assert [m.sweep_member for m in members] == ["m0", "m1", "m2", "m3"]
    assert {m.sweep_id for m in members} == {sweep.sweep_id}
    assert len({m.run_id for m in members}) == 4, "each member is a run of its own (own folder, own resume)"
    assert all(m.validate() == [] for m in members)
    assert all(m.model == members[0].model and m.replicas == 2 and m.max_steps == 4 for m in members)
    names = {layout.adapter_name(3, m.sweep_member) for m in members}
    assert len(names) == 4 and layout.adapter_name(3) not in names, "no member's versions share a name"
    assert sweep.member_settings(members[2]) == {"learning_rate": 5e-4, "lora_r": 8}


def test_side_by_side_lists_pair_their_values_and_must_be_of_one_length():
    members = SweepSpec(base(), {"beta": [0.0, 0.04], "temperature": [1.0, 0.7]}, grid=False).members()
    assert [(m.beta, m.temperature) for m in members] == [(0.0, 1.0), (0.04, 0.7)]
    field, message = refusal(SweepSpec(base(), {"beta": [0.0, 0.04], "temperature": [1.0]}, grid=False))
    assert field == "beta" and "one length (beta 2, temperature 1)" in message


@pytest.mark.parametrize("name,why", [("model", "one base model"), ("mode", "sharing one replica fleet"),
                                      ("replicas", "fleet's size"), ("servers_per_gpu", "fleet's size"),
                                      ("vllm_flavor", "fleet's hardware"), ("name", "not a trainer's own setting")])
def test_a_field_the_fleet_shares_cannot_be_swept(name, why):
    field, message = refusal(SweepSpec(base(), {name: ["a", "b"]}))
    assert field == name and "cannot be swept" in message and why in message


@pytest.mark.parametrize("values,says", [([], "one or more values"), ("1e-4", "a list"),
                                         ([1e-4, 0.0001], "given twice"), ([1e-4, "x"], "of the field's type")])
def test_an_empty_duplicate_or_mistyped_value_list_is_refused_with_its_field(values, says):
    field, message = refusal(SweepSpec(base(), {"learning_rate": values}))
    assert field == "learning_rate" and says in message


def test_a_sweep_of_one_member_nothing_or_too_many_fields_is_refused():
    assert refusal(SweepSpec(base(), {"learning_rate": [1e-4]}))[0] == "learning_rate"
    assert refusal(SweepSpec(base(), {}))[0] == "sweep"
    many = {"learning_rate": [1e-4, 2e-4], "beta": [0.0, 0.1], "lora_r": [8, 16], "temperature": [1.0, 0.9]}
    field, message = refusal(SweepSpec(base(), many))
    assert field == "sweep" and "at most 3 fields" in message
    assert refusal(SweepSpec(base(), {"no_such_field": [1, 2]}))[0] == "no_such_field"


def test_the_forms_rows_parse_to_value_lists_and_bad_rows_are_refused_with_their_field():
    rows = [("learning_rate", " 1e-4, 5e-4 "), ("", ""), ("reward_weights", "digits=1,format=0.5; digits=1")]
    assert parse_swept(rows) == {"learning_rate": ["1e-4", "5e-4"],
                                 "reward_weights": ["digits=1,format=0.5", "digits=1"]}
    assert parse_swept([("", ""), ("", "  ")]) == {}, "no row filled: no sweep"
    refusals = (([("lora_r", "")], "lora_r", "give its values"),
                ([("lora_r", "8,,16")], "lora_r", "an empty value"),
                ([("", "8, 16")], "sweep", "name no field"),
                ([("beta", "0"), ("beta", "0.1")], "beta", "named twice"))
    for bad, field, says in refusals:
        with pytest.raises(SpecError) as refused:
            parse_swept(bad)
        assert [(e.field, says in e.message) for e in refused.value.errors] == [(field, True)], bad
    members = SweepSpec(base(rewards=["digits", "format"]),
                        parse_swept([("reward_weights", "digits=1,format=0.5; digits=1")])).members()
    assert [m.reward_weights for m in members] == [{"digits": 1.0, "format": 0.5}, {"digits": 1.0}]


def test_a_reviewed_sweep_launches_with_the_ids_its_preview_showed_and_any_change_needs_a_new_review():
    seen = SweepSpec(base(), {"learning_rate": [1e-4, 5e-4]})
    shown = seen.members()
    again = SweepSpec(base(), {"learning_rate": [1e-4, 5e-4]}, True, seen.sweep_id, tuple(m.run_id for m in shown))
    kept = again.members()
    assert [m.run_id for m in kept] == [m.run_id for m in shown]
    assert again.fingerprint(kept) == seen.fingerprint(shown)
    changed = SweepSpec(base(), {"learning_rate": [1e-4, 6e-4]}, True, seen.sweep_id, again.run_ids)
    assert changed.fingerprint(changed.members()) != seen.fingerprint(shown), "one member's value changed"
    other = SweepSpec(base(max_steps=5), {"learning_rate": [1e-4, 5e-4]}, True, seen.sweep_id, again.run_ids)
    assert other.fingerprint(other.members()) != seen.fingerprint(shown), "the base settings changed"
    three = SweepSpec(base(), {"learning_rate": [1e-4, 5e-4, 1e-3]}, True, seen.sweep_id, again.run_ids)
    assert len({m.run_id for m in three.members()} & set(again.run_ids)) == 0, "ids for another member count: new"
    record = seen.record(shown)
    assert record["members"] == {"m0": shown[0].run_id, "m1": shown[1].run_id}
    assert record["settings"]["m1"] == {"learning_rate": 5e-4} and record["sweep_id"] == seen.sweep_id


def test_a_grid_too_large_for_a_fleet_is_refused_before_any_combination_is_built(monkeypatch):
    built = []
    monkeypatch.setattr(SweepSpec, "_combinations", lambda self: built.append(1) or [])
    values = [str(i) for i in range(MAX_MEMBERS)]
    field, message = refusal(SweepSpec(base(), {"seed": values, "lora_r": [8, 16], "beta": [0.0, 0.1]}))
    assert field == "seed" and f"{4 * MAX_MEMBERS} members are more than a fleet serves" in message
    field, message = refusal(SweepSpec(base(), {"seed": [str(i) for i in range(100_000)]}, grid=False))
    assert field == "seed" and "100000 values make more members" in message
    assert built == [], "no grid was built"


def test_a_colocated_base_and_a_member_that_does_not_validate_are_refused():
    assert refusal(SweepSpec(base(mode="colocated"), {"learning_rate": [1e-4, 2e-4]}))[0] == "mode"
    field, message = refusal(SweepSpec(base(), {"learning_rate": [1e-4, 2.0]}))
    assert field == "learning_rate" and message.startswith("member m1 (learning_rate=2.0): must be > 0 and < 1")


def test_more_members_than_the_fleets_lora_slots_hold_is_refused_at_the_slots_field():
    fits = MAX_FLEET_LORA_SLOTS // 3           # max_staleness 1: 3 slots each
    assert len(SweepSpec(base(), {"seed": list(range(fits))}).members()) == fits
    field, message = refusal(SweepSpec(base(), {"seed": list(range(fits + 1))}))
    assert field == "seed" and f"{fits + 1} members need {3 * (fits + 1)} LoRA slots" in message
    field, _ = refusal(SweepSpec(base(), {"max_staleness": [15, 16], "seed": [0, 1]}))
    assert field == "max_staleness"


def test_the_fleet_holds_every_members_versions_at_once_at_the_largest_rank():
    members = SweepSpec(base(), {"max_staleness": [1, 2], "lora_r": [4, 16]}, grid=False).members()
    fleet = fleet_size(members)
    assert (fleet.max_loras, fleet.max_lora_rank) == ((1 + 2) + (2 + 2), 16)
    assert len(fleet.notes) == 1 and "pads every adapter to --max-lora-rank 16" in fleet.notes[0]
    assert "m0 (rank 4)" in fleet.notes[0]
    same = fleet_size(SweepSpec(base(), {"learning_rate": [1e-4, 2e-4]}).members())
    assert (same.max_loras, same.max_lora_rank, same.notes) == (6, 8, ())


def test_a_lone_run_stays_untagged_and_a_tag_needs_its_sweep_and_the_distributed_mode():
    assert RunSpec().validate() == [] and RunSpec().sweep_member == ""
    tagged = {"mode": "distributed", "sweep_id": "s1", "sweep_member": "m0"}
    assert RunSpec(**tagged).validate() == []
    assert [e.field for e in RunSpec(**{**tagged, "sweep_member": "M-0"}).validate()] == ["sweep_member"]
    assert [e.field for e in RunSpec(**{**tagged, "sweep_id": ""}).validate()] == ["sweep_id"]
    assert [e.field for e in RunSpec(**{**tagged, "mode": "colocated"}).validate()] == ["mode"]


@pytest.mark.parametrize("member", ["", "m1"])
def test_the_async_trainer_syncs_loads_and_unloads_under_the_runs_own_names(member):
    """TRL 1.16 assigns its `_lora_name` in __init__ and names every sync `f"{_lora_name}-v{N}"`: the run's trainer
    keeps its own name whatever TRL assigns (a lone run's is TRL's own)."""
    import inspect

    from trl.experimental.async_grpo import AsyncGRPOTrainer

    from backend.runtime.trainer.train_async import trainer_class

    assert 'self._lora_name = "trl-policy"' in inspect.getsource(AsyncGRPOTrainer.__init__)
    assert 'f"{self._lora_name}-v{version}"' in inspect.getsource(AsyncGRPOTrainer._sync_weight_lora)
    cls = trainer_class(member)
    trainer = cls.__new__(cls)
    trainer._lora_name = "trl-policy"          # what TRL's __init__ does
    assert f"{trainer._lora_name}-v{7}" == layout.adapter_name(7, member)


def test_a_members_trainer_starts_its_proxy_as_that_member_capped_at_its_own_concurrency():
    from backend.runtime.trainer.train_async import member_proxy

    spec = {"max_inflight_tasks": 8, "eval_max_inflight": 4}
    assert member_proxy({**spec, "sweep_member": ""}) == {}, "a lone run's proxy is started as before"
    assert member_proxy({**spec, "sweep_member": "m2"}) == {"member": "m2", "member_cap": 12}


def test_a_local_sweeps_members_share_one_fleet_started_once_and_a_lone_run_is_unchanged():
    from backend.plan.recipe import FleetJobs, server_urls
    from backend.runs.launch import preview_jobs
    from backend.runtime.tiny_model import TINY_MODEL

    sweep = SweepSpec(base(model=TINY_MODEL, max_staleness=1), {"lora_r": [8, 16, 32]})
    members = sweep.members()
    assert {m.fleet for m in members} == {sweep.sweep_id} and sweep.record(members)["fleet"] == sweep.sweep_id
    size = fleet_size(members)
    jobs = FleetJobs(tuple(members), size.max_loras, size.max_lora_rank).jobs()
    assert [(j.run_id, j.role) for j in jobs] == [(sweep.sweep_id, "vllm-0"), (sweep.sweep_id, "vllm-1")]
    command = jobs[0].command[-1]
    assert "--max-loras 9 --max-cpu-loras 9" in command and "--max-lora-rank 32" in command, command
    assert all(f"--member-run-dir {m.run_path}" in command for m in members), "it stops once all have ended"
    fleet_model = f"/bucket/runs/{sweep.sweep_id}/base-model"
    assert f"--wait-for {fleet_model}" in command and f"vllm serve {fleet_model}" in command
    [trainer] = preview_jobs(members[1], on_fleet=True)
    assert trainer.role == "trainer" and trainer.run_id == members[1].run_id
    assert trainer.env["GRPO_FLEET_DIR"] == f"/bucket/runs/{sweep.sweep_id}"
    assert trainer.env["VLLM_REPLICA_URLS"].count("http://") == 2
    assert f"runtime.tiny_model --out {fleet_model}" in trainer.command[-1], "one base model for the fleet and all"
    assert server_urls(jobs, lambda i, job, port: f"u{i}") == ["u0", "u1"]
    lone = base(model=TINY_MODEL)
    assert [j.role for j in preview_jobs(lone)] == ["vllm-0", "vllm-1", "trainer"], "a lone run is unchanged"
    assert "--max-loras 3 " in preview_jobs(lone)[0].command[-1] and "GRPO_FLEET_DIR" not in preview_jobs(lone)[2].env



def hub_sweep(**changes) -> list[RunSpec]:
    return SweepSpec(base(executor="hf_jobs", vllm_flavor="l4x1", flavor="a10g-small", **changes),
                     {"max_staleness": [1, 3], "lora_r": [8, 32]}).members()


def test_on_hf_jobs_the_members_trainers_join_the_fleets_network_group_each_under_its_own_alias():
    from backend.plan.engines.hf_jobs import ENGINE
    from backend.plan.recipe import FleetJobs, group_url, network_group
    from backend.runs.launch import preview_jobs

    members = hub_sweep()
    sweep_id = members[0].sweep_id
    assert {m.fleet for m in members} == {sweep_id}, "HF Jobs: one fleet for every member"
    size = fleet_size(members)
    fleet = FleetJobs(tuple(members), size.max_loras, size.max_lora_rank).jobs()
    group = network_group(FleetJobs(tuple(members), 0, 8).spec)
    assert group == f"grpo-{sweep_id}" and {j.network_group for j in fleet} == {group}
    assert [(j.run_id, j.role, j.network_aliases, j.expose) for j in fleet] == [
        (sweep_id, "vllm-0", ("vllm-0",), ()), (sweep_id, "vllm-1", ("vllm-1",), ())]
    assert "--max-loras 16 --max-cpu-loras 16" in fleet[0].command[-1], "2 members at staleness 1, 2 at 3: 3+3+5+5"
    assert "--max-lora-rank 32" in fleet[0].command[-1]
    trainers = [preview_jobs(m, on_fleet=True) for m in members]
    assert all(len(jobs) == 1 and jobs[0].role == "trainer" for jobs in trainers), "each member: its trainer alone"
    trainers = [jobs[0] for jobs in trainers]
    assert {t.network_group for t in trainers} == {group}, "every trainer reaches the fleet on its group"
    assert [t.network_aliases for t in trainers] == [(f"trainer-m{i}",) for i in range(4)], "told apart"
    replicas = [arg for arg in shlex.split(trainers[2].command[-1]) if arg.startswith("http")]
    assert replicas == [group_url("vllm-0", 8000), group_url("vllm-1", 8000)], trainers[2].command[-1]
    assert all(t.env["GRPO_FLEET_DIR"] == f"/bucket/runs/{sweep_id}" for t in trainers)
    note = ENGINE.preview_note(members[0], str)
    assert f"fleet's network group `{group}`" in note and "`trainer-m0`" in note, note
    lone = preview_jobs(members[0])      # a member resumed once its fleet is gone: its own replicas, its own group
    assert [j.role for j in lone] == ["vllm-0", "vllm-1", "trainer"]
    assert {j.network_group for j in lone} == {network_group(members[0])} != {group}
    assert lone[-1].network_aliases == ("trainer",)


def test_on_hf_jobs_exposed_ports_a_members_trainer_reaches_the_fleets_replicas_through_the_jobs_proxy():
    from backend.runs.launch import preview_jobs

    members = hub_sweep(network="exposed")
    [trainer] = preview_jobs(members[1], on_fleet=True)
    assert trainer.network_group is None and trainer.network_aliases == ()
    assert trainer.env["VLLM_REPLICA_URLS"] == "<vllm-0 url>,<vllm-1 url>", trainer.env


def test_only_a_sweeps_member_names_a_fleet_and_only_its_sweeps():
    assert [e.field for e in base(fleet="sweep-x").validate()] == ["fleet"]
    member = dict(sweep_id="sweep-x", sweep_member="m0")
    assert base(**member, fleet="sweep-x").validate() == []
    assert [e.field for e in base(**member, fleet="sweep-y").validate()] == ["fleet"]


def test_a_fleet_replicas_end_counts_the_members_attempts_from_fleet_json(tmp_path):
    """A fleet's folder has no spec.json: its replicas' attempts come from fleet.json, so a fleet replica's first
    failed end is not its last while attempts are left (each member's trainer would stop waiting for it)."""
    from backend.runtime.serving.run_ends import record_own_end, replicas_ended

    fleet = tmp_path / "runs" / "sweep-x"
    fleet.mkdir(parents=True)
    (fleet / layout.FLEET_FILE).write_text('{"sweep_id": "sweep-x", "attempts": 3}')
    record_own_end(str(fleet), "vllm-0", 1, env={})
    assert replicas_ended(str(fleet)) == {}, "attempt 1 of 3: a retry is coming"
    record_own_end(str(fleet), "vllm-0", 1, env={})
    record_own_end(str(fleet), "vllm-0", 1, env={})
    assert replicas_ended(str(fleet))["vllm-0"]["attempt"] == 3, "its third end is its last"
    alone = tmp_path / "runs" / "no-record"
    alone.mkdir()
    record_own_end(str(alone), "vllm-0", 1, env={})
    assert replicas_ended(str(alone))["vllm-0"]["attempts"] == 1, "with neither file: one attempt"


def test_a_fleets_row_reads_its_name_and_sweep_from_fleet_json(tmp_path):
    """The runs list's row of a fleet (no spec.json) names it from its fleet.json; a run's own spec.json wins."""
    from backend.storage.store import FolderStore
    from backend.view.summary import run_record

    store = FolderStore(str(tmp_path))
    store.write_bytes("runs/sweep-x/fleet.json", b'{"name": "lr-fleet", "sweep_id": "sweep-x", "mode": "distributed"}')
    assert run_record(store, "sweep-x")["name"] == "lr-fleet"
    store.write_bytes("runs/r1/spec.json", b'{"name": "lr-m0"}')
    assert run_record(store, "r1") == {"name": "lr-m0"}
    with pytest.raises((OSError, KeyError)):
        run_record(store, "nothing")


def test_the_sweeps_budget_cap_is_read_from_a_number_or_its_text_and_anything_else_is_refused_by_name():
    from panel.launch_view import sweep_form

    assert parse_budget(None) == parse_budget("") == parse_budget("  ") == 0.0
    assert parse_budget(20) == parse_budget("20") == parse_budget(" $20.00 ") == 20.0
    assert parse_budget("1,250.5") == 1250.5
    for bad in ("twenty", "5 USD", True, [5]):
        with pytest.raises(SpecError) as refused:
            parse_budget(bad)
        assert [e.field for e in refused.value.errors] == [BUDGET_FIELD], bad
    assert sweep_form({"field0": "learning_rate", "values0": "1e-4, 5e-4", "budget": 12.5}).budget_usd == 12.5
    base = RunSpec(mode="distributed", executor="hf_jobs", bucket="alice/grpo-runs", vllm_flavor="l4x1")
    swept = {"learning_rate": [1e-4, 5e-4]}
    for bad in (-1.0, float("nan"), float("inf")):
        assert [e.field for e in SweepSpec(base, swept, budget_usd=bad).field_problems()] == [BUDGET_FIELD], bad
    capped = SweepSpec(base, swept, sweep_id="sweep-a", budget_usd=20.0)
    members = capped.members()
    assert capped.record(members)["budget_usd"] == 20.0
    assert capped.fingerprint(members) != SweepSpec(base, swept, sweep_id="sweep-a").fingerprint(members)
