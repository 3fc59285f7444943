"""A sweep's stop orders (backend/runtime/trainer/sweep_stops.py) and the trainer's side of them
(runtime/trainer/train_async.py, async_callback.py):
the rule decided by the first member still training from what the bucket holds, orders written once, obeyed only by
the member whose sweep, tag and run id they name, and a member's trainer ending as at its last step on its own.
Files in a tmp folder laid out as a bucket; no process."""

import json
import os
from types import SimpleNamespace

import pytest

from backend.runtime import layout
from backend.runtime.records import FINISHED, STARTED, SWEEP_STOP, write_event
from backend.runtime.trainer import sweep_stops
from backend.runtime.trainer.sweep_stops import (
    SweepStops,
    best_held_out,
    order_path,
    order_problem,
    orders_dir,
    read_orders,
    stop_event_fields,
    stop_order,
    write_order,
)

pytestmark = pytest.mark.unit

SWEEP = "sweep-20260101-000000-abcdef"


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def bucket(tmp_path, scores: dict[str, list[float]], after: int = 2, sweep_id: str = SWEEP) -> dict[str, str]:
    """A bucket with a sweep's record and its members' run folders: spec.json, a held-out record per version (the
    base model's v0 at 0.1, then `scores[tag]` for v1, v2, ...), a started event. Their run folders by tag."""
    root = str(tmp_path)
    dirs = {}
    for i, (tag, versions) in enumerate(scores.items()):
        run_id = f"20260101-00000{i}-sweep{i}"
        run_dir = os.path.join(root, layout.run_prefix(run_id))
        os.makedirs(os.path.join(run_dir, layout.EVALS_DIR))
        with open(os.path.join(run_dir, layout.SPEC_FILE), "w") as f:
            json.dump({"run_id": run_id, "sweep_id": sweep_id, "sweep_member": tag, "best_by": {}}, f)
        with open(os.path.join(run_dir, layout.EVALS_DIR, "trainer-000000.jsonl"), "w") as f:
            f.writelines(json.dumps({"policy_version": v, "step": 10 * v, "score": s}) + "\n"
                         for v, s in enumerate([0.1, *versions]))
        write_event(run_dir, layout.TRAINER_WRITER, STARTED, step=0, max_steps=100)
        dirs[tag] = run_dir
    record = {"sweep_id": sweep_id, "members": {t: os.path.basename(d) for t, d in dirs.items()},
              "early_stop": {"rule": "successive halving", "after_versions": after} if after else {"rule": "by hand"}}
    os.makedirs(os.path.join(root, layout.SWEEPS_DIR), exist_ok=True)
    with open(os.path.join(root, layout.sweep_record_path(sweep_id)), "w") as f:
        json.dump(record, f)
    return dirs


def stops_of(run_dir: str, **kw) -> SweepStops:
    with open(os.path.join(run_dir, layout.SPEC_FILE)) as f:
        spec = json.load(f)
    return SweepStops(run_dir, spec, log=lambda *a, **k: None, **kw)


def order_file(tmp_path, tag: str, sweep_id: str = SWEEP) -> dict:
    with open(os.path.join(str(tmp_path), order_path(sweep_id, tag))) as f:
        return json.load(f)


# ---- the decision, from the bucket

def test_the_first_member_still_training_orders_the_worse_half_once_each_has_k_versions(tmp_path):
    dirs = bucket(tmp_path, {"m0": [0.5, 0.5], "m1": [0.7, 0.7], "m2": [0.3, 0.3], "m3": [0.9, 0.2]})
    assert [stops_of(dirs[t]).apply_rule() for t in ("m1", "m2", "m3")] == [None] * 3, "only the first decides"
    decision = stops_of(dirs["m0"]).apply_rule()
    assert decision.rung == 1 and decision.stopped == ("m0", "m2"), "m3's best is 0.9, m1's 0.7: m0 and m2 go"
    order = order_file(tmp_path, "m2")
    assert order["sweep_id"] == SWEEP and order["run_id"] == os.path.basename(dirs["m2"]) and order["rung"] == 1
    assert order["by"] == "m0" and order["scores"] == pytest.approx({"m0": 0.5, "m1": 0.7, "m2": 0.3, "m3": 0.9})
    assert "successive halving, rung 1" in order["rule"]
    assert stops_of(dirs["m0"]).apply_rule() is None, "a rung ordered is not decided again"
    # m0 is stopping (its order stands): m1 is now the first still training, and rung 2 waits for 4 versions each
    assert stops_of(dirs["m1"]).apply_rule() is None and sorted(read_orders(str(tmp_path), SWEEP)) == ["m0", "m2"]


def test_a_rung_waits_for_a_member_short_of_versions_and_an_ended_member_takes_no_part(tmp_path):
    dirs = bucket(tmp_path, {"m0": [0.5, 0.5], "m1": [0.7], "m2": [0.3, 0.3]})
    assert stops_of(dirs["m0"]).apply_rule() is None, "m1 has 1 of 2 versions"
    write_event(dirs["m1"], layout.TRAINER_WRITER, FINISHED, final="final", version=1, step=10, size_bytes=0)
    decision = stops_of(dirs["m0"]).apply_rule()
    assert decision.stopped == ("m2",) and "of 2 members" in decision.rule, "m1 ended: 2 take part, m2 goes"


def test_a_sweep_stopped_by_hand_only_decides_nothing(tmp_path):
    dirs = bucket(tmp_path, {"m0": [0.5, 0.5], "m1": [0.7, 0.7]}, after=0)
    assert stops_of(dirs["m0"]).apply_rule() is None
    assert not os.path.exists(os.path.join(str(tmp_path), orders_dir(SWEEP)))


def test_a_members_score_is_its_best_version_beating_the_base_else_its_highest():
    records = {0: {"score": 0.5}, 1: {"score": 0.4}, 2: {"score": 0.45}}
    assert best_held_out(records, {}) == (2, 0.45), "none beats the base: the highest"
    records[3] = {"score": 0.6}
    assert best_held_out(records, {}) == (3, 0.6)
    assert best_held_out({0: {"score": 0.1}}, {}) == (0, None)


# ---- the record: written once, obeyed only by its own member

def test_an_order_is_written_once_and_the_first_decision_stands(tmp_path):
    bucket(tmp_path, {"m0": [0.5], "m1": [0.7]})
    first = stop_order(SWEEP, "m1", "20260101-000001-sweep1", "by hand", {"m1": 0.7}, by="panel")
    assert write_order(str(tmp_path), first) is True
    second = stop_order(SWEEP, "m1", "20260101-000001-sweep1", "successive halving, rung 1", {}, rung=1, by="m0")
    assert write_order(str(tmp_path), second) is False
    assert order_file(tmp_path, "m1")["rule"] == "by hand"
    assert [n for n in os.listdir(os.path.join(str(tmp_path), orders_dir(SWEEP)))] == ["m1.json"], "no temp left"


def test_an_obeyed_order_gives_way_to_a_new_one_after_a_resume(tmp_path):
    dirs = bucket(tmp_path, {"m0": [0.5], "m1": [0.7]})
    first = stop_order(SWEEP, "m1", os.path.basename(dirs["m1"]), "by hand", {}, by="panel")
    write_order(str(tmp_path), first)
    member = stops_of(dirs["m1"], decide=False)
    assert member.check() == first
    write_event(dirs["m1"], layout.TRAINER_WRITER, SWEEP_STOP, **stop_event_fields(first))
    resumed = stops_of(dirs["m1"], decide=False)
    assert resumed.check() is None, "obeyed before the resume: the resumed member trains on"
    again = {**stop_order(SWEEP, "m1", os.path.basename(dirs["m1"]), "by hand", {}, by="panel"), "time": 1e12}
    assert write_order(str(tmp_path), again) is True and resumed.mine() == again


def test_an_order_whose_run_id_is_a_path_stands_and_is_never_replaced(tmp_path):
    """An order in the member's place naming `../runs/<m1>` (a path to a run that obeyed) is not read as obeyed
    through that path: it stands, and a new order is not written over it."""
    dirs = bucket(tmp_path, {"m0": [0.5], "m1": [0.7]})
    m1 = os.path.basename(dirs["m1"])
    obeyed_order = stop_order(SWEEP, "m1", m1, "by hand", {}, by="panel")
    write_order(str(tmp_path), obeyed_order)
    write_event(dirs["m1"], layout.TRAINER_WRITER, SWEEP_STOP, **stop_event_fields(obeyed_order))
    with open(os.path.join(str(tmp_path), order_path(SWEEP, "m1")), "w") as f:
        json.dump({**obeyed_order, "run_id": f"../{layout.RUNS_DIR}/{m1}"}, f)
    again = {**stop_order(SWEEP, "m1", m1, "by hand", {}, by="panel"), "time": 1e12}
    assert write_order(str(tmp_path), again) is False
    assert order_file(tmp_path, "m1")["run_id"] == f"../{layout.RUNS_DIR}/{m1}"


@pytest.mark.parametrize("change, why", [
    ({"sweep_id": "sweep-20990101-000000-ffffff"}, "its sweep_id is"),
    ({"member": "m0"}, "its member is"),
    ({"run_id": "20260101-000000-sweep0"}, "its run_id is"),
    ({"rule": None}, "it states no rule"),
])
def test_a_member_obeys_only_an_order_naming_its_own_sweep_tag_and_run(tmp_path, change, why):
    dirs = bucket(tmp_path, {"m0": [0.5], "m1": [0.7]})
    mine = stop_order(SWEEP, "m1", os.path.basename(dirs["m1"]), "by hand", {}, by="panel")
    forged = {**mine, **change}
    path = os.path.join(str(tmp_path), order_path(SWEEP, "m1"))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump(forged, f)
    said = []
    member = SweepStops(dirs["m1"], {"sweep_id": SWEEP, "sweep_member": "m1", "run_id": os.path.basename(dirs["m1"])},
                        log=lambda text, **_: said.append(text), decide=False)
    assert member.check() is None
    assert why in order_problem(forged, SWEEP, "m1", os.path.basename(dirs["m1"]))
    assert any("not this member's" in s and why in s for s in said), said
    assert read_orders(str(tmp_path), SWEEP, json.load(open(os.path.join(str(tmp_path),
                                                                         layout.sweep_record_path(SWEEP))))) == {}


def test_another_sweeps_order_is_never_read_and_a_bad_tag_or_sweep_id_is_no_path(tmp_path):
    dirs = bucket(tmp_path, {"m0": [0.5], "m1": [0.7]})
    other = "sweep-20990101-000000-ffffff"
    write_order(str(tmp_path), stop_order(other, "m1", os.path.basename(dirs["m1"]), "by hand", {}, by="panel"))
    assert stops_of(dirs["m1"], decide=False).check() is None, "an order of another sweep's folder"
    for sweep_id, tag in ((SWEEP, "../m1"), (SWEEP, "M1"), ("../" + SWEEP, "m1"), ("", "m1")):
        with pytest.raises(ValueError):
            order_path(sweep_id, tag)


def test_a_member_polls_at_most_every_poll_s(tmp_path):
    dirs = bucket(tmp_path, {"m0": [0.5], "m1": [0.7]})
    clock = Clock()
    member = stops_of(dirs["m1"], decide=False, clock=clock, poll_s=15)
    assert member.check() is None
    order = stop_order(SWEEP, "m1", os.path.basename(dirs["m1"]), "by hand", {}, by="panel")
    write_order(str(tmp_path), order)
    clock.now = 14.0
    assert member.check() is None, "not yet due"
    clock.now = 15.0
    assert member.check() == order


def test_a_lone_run_or_a_folder_outside_a_buckets_runs_reads_no_orders(tmp_path):
    from backend.runtime.trainer.train_async import member_stops
    assert member_stops(str(tmp_path), {"run_id": "r"}) is None
    assert member_stops(str(tmp_path / "elsewhere"), {"run_id": "r", "sweep_id": SWEEP, "sweep_member": "m0"}) is None


# ---- the trainer obeys: it ends as at its last step

def test_the_trainer_ends_training_on_its_own_order_and_records_it(tmp_path):
    from backend.runtime.trainer.async_callback import AsyncRunFolderCallback
    from backend.runtime.trainer.train_async import member_stops
    dirs = bucket(tmp_path, {"m0": [0.5, 0.5], "m1": [0.7, 0.7]})
    with open(os.path.join(dirs["m0"], layout.SPEC_FILE)) as f:
        spec = json.load(f)
    callback = AsyncRunFolderCallback(dirs["m0"])
    callback.stops = member_stops(dirs["m0"], spec)
    control = SimpleNamespace(should_training_stop=False, should_save=False)
    state = SimpleNamespace(global_step=7)
    callback.on_step_end(None, state, control)      # m0 decides rung 1 (m0 0.5 < m1 0.7) and obeys its own order
    assert control.should_training_stop and control.should_save
    events = [json.loads(line) for name in sorted(os.listdir(os.path.join(dirs["m0"], layout.EVENTS_DIR)))
              for line in open(os.path.join(dirs["m0"], layout.EVENTS_DIR, name))]
    [stop] = [e for e in events if e["event"] == SWEEP_STOP]
    assert stop["member"] == "m0" and stop["rung"] == 1 and stop["cancelled"] == []
    assert stop["ordered_at"] == order_file(tmp_path, "m0")["time"]
    control.should_training_stop = False
    callback.on_step_end(None, state, control)
    assert not control.should_training_stop, "obeyed once: TRL's own end (on_train_end, `finished`) follows"


def test_a_record_naming_a_path_for_a_run_decides_nothing_and_the_members_own_order_still_holds(tmp_path):
    dirs = bucket(tmp_path, {"m0": [0.5, 0.5], "m1": [0.7, 0.7]})
    path = os.path.join(str(tmp_path), layout.sweep_record_path(SWEEP))
    with open(path) as f:
        record = json.load(f)
    record["members"]["m1"] = "../../elsewhere"
    with open(path, "w") as f:
        json.dump(record, f)
    said = []
    member = SweepStops(dirs["m0"], {"sweep_id": SWEEP, "sweep_member": "m0", "run_id": os.path.basename(dirs["m0"])},
                        log=lambda text, **_: said.append(text))
    with pytest.raises(ValueError, match="not a sweep member's tag and run id"):
        member.apply_rule()
    order = stop_order(SWEEP, "m0", os.path.basename(dirs["m0"]), "by hand", {}, by="panel")
    write_order(str(tmp_path), order)
    assert member.check() == order and any("could not be checked" in s for s in said), said
    assert sorted(os.listdir(os.path.join(str(tmp_path), orders_dir(SWEEP)))) == ["m0.json"]


@pytest.mark.parametrize("text", ["0", "-3", "nan", "inf", "soon"])
def test_a_poll_period_that_is_not_a_positive_number_of_seconds_is_refused_by_name(monkeypatch, text):
    monkeypatch.setenv(sweep_stops.POLL_ENV, text)
    with pytest.raises(ValueError, match=sweep_stops.POLL_ENV):
        sweep_stops.poll_period()


def test_the_poll_period_is_fifteen_seconds_unless_the_environment_gives_another(monkeypatch):
    monkeypatch.delenv(sweep_stops.POLL_ENV, raising=False)
    assert sweep_stops.poll_period() == sweep_stops.POLL_S == 15.0
    monkeypatch.setenv(sweep_stops.POLL_ENV, "1.5")
    assert sweep_stops.poll_period() == 1.5
