"""A sweep's ranking and its early-stop rule (backend/view/sweep.py), and the rule as the sweep's record, review code
and preview state it (backend/plan/sweep.py, panel/preview_text.py). Pure: no panel, no process."""

import pytest

from backend.plan.spec import RunSpec
from backend.plan.sweep import EARLY_STOP_FIELD, SweepSpec
from backend.runtime.records import SWEEP_STOP
from backend.view.sweep import BY_HAND, Halving, Member, best_member, done_rungs, rank, rank_rows, worst_live

pytestmark = pytest.mark.unit


def member(tag: str, score: float | None, versions: int = 2, stage: str = "RUNNING", beats: bool = True) -> Member:
    return Member(tag, f"run-{tag}", stage, 40, 100, versions if score is not None else 0,
                  2 if score is not None else None, score, beats and score is not None, "trained score")


def tags(members) -> list[str]:
    return [m.tag for m in members]


# ---- the ranking

def test_ranking_is_by_best_held_out_score_best_first():
    assert tags(rank([member("m0", 0.5), member("m1", 0.7), member("m2", 0.3)])) == ["m1", "m0", "m2"]


def test_members_without_a_score_yet_rank_after_every_scored_member():
    ranked = rank([member("m0", None), member("m1", 0.1), member("m2", None), member("m3", 0.0)])
    assert tags(ranked) == ["m1", "m3", "m0", "m2"], "no score is not a score of 0; unscored keep sweep order"


def test_ties_go_to_more_versions_evaluated_then_to_the_sweep_order():
    ranked = rank([member("m2", 0.5, versions=3), member("m1", 0.5, versions=3), member("m0", 0.5, versions=1)])
    assert tags(ranked) == ["m1", "m2", "m0"]
    assert tags(rank([member("m10", 0.5), member("m9", 0.5)])) == ["m9", "m10"], "m10 is the 11th, not the 2nd"


def test_a_failed_member_is_ranked_by_its_score_but_is_never_the_worst_to_stop():
    members = [member("m0", 0.5), member("m1", 0.2, stage="ERROR"), member("m2", 0.4)]
    assert tags(rank(members)) == ["m0", "m2", "m1"]
    assert worst_live(members).tag == "m2", "a member that already ended has nothing left to stop"
    assert best_member([member("m0", 0.5), member("m1", 0.9, stage="CANCELED")]).tag == "m1", \
        "a stopped member's best version stays the sweep's best"
    assert best_member([member("m0", None)]) is None


def test_rank_rows_show_state_steps_and_a_version_below_base():
    rows = rank_rows([member("m0", 0.5), member("m1", 0.2, beats=False), member("m2", None, stage="ERROR")])
    assert [r[:2] for r in rows] == [["1", "m0"], ["2", "m1"], ["3", "m2"]]
    assert rows[0][4:8] == ["running", "40/100", "v2", "0.500"]
    assert rows[1][6] == "v2 (below base)"
    assert rows[2][4] == "error" and rows[2][6:9] == ["-", "-", "0"]


# ---- successive halving

def test_the_worse_half_of_the_members_still_training_is_stopped_once_each_has_k_versions():
    members = [member("m0", 0.5), member("m1", 0.7), member("m2", 0.3), member("m3", 0.6)]
    stop = Halving(2).decide(members, done_rungs=0)
    assert stop.stopped == ("m0", "m2") and stop.rung == 1
    assert stop.scores == {"m0": 0.5, "m1": 0.7, "m2": 0.3, "m3": 0.6}, "the event keeps the scores that decided"
    assert "rung 1" in stop.rule and "2 held-out versions each" in stop.rule
    assert Halving(2).decide([member("m0", 0.5), member("m1", 0.7), member("m2", 0.3)], 0).stopped == ("m2",), \
        "of 3, one is stopped (the worse half rounds down)"


def test_a_rung_waits_for_a_member_still_short_of_versions_or_without_a_score():
    short = [member("m0", 0.5), member("m1", 0.7), member("m2", 0.3, versions=1)]
    assert Halving(2).decide(short, 0) is None
    assert Halving(2).waiting(short, 0) == "rung 1 waits for 2 versions each: m2 (1/2)"
    unscored = [member("m0", 0.5), member("m1", None)]
    assert Halving(2).decide(unscored, 0) is None, "a member not evaluated yet may still catch up"


def test_a_failed_member_takes_no_part_in_the_rung():
    members = [member("m0", 0.5), member("m1", 0.7), member("m2", None, stage="ERROR"), member("m3", 0.1,
                                                                                              stage="CANCELED")]
    stop = Halving(2).decide(members, 0)
    assert stop.stopped == ("m0",), "two still train: the worse one stops; the ended ones neither wait nor count"


def test_members_tied_at_the_cut_are_all_kept():
    tied = [member("m0", 0.5), member("m1", 0.5), member("m2", 0.5), member("m3", 0.5)]
    assert Halving(2).decide(tied, 0) is None
    partly = [member("m0", 0.7), member("m1", 0.5), member("m2", 0.5), member("m3", 0.2)]
    assert Halving(2).decide(partly, 0).stopped == ("m3",), "m1 and m2 tie at the cut: both kept"


def test_each_rung_needs_k_more_versions_and_the_last_member_is_never_stopped():
    members = [member("m0", 0.5, versions=2), member("m1", 0.7, versions=2)]
    assert Halving(2).decide(members, done_rungs=1) is None, "rung 2 needs 4 versions each"
    members = [member("m0", 0.5, versions=4), member("m1", 0.7, versions=4)]
    assert Halving(2).decide(members, done_rungs=1).stopped == ("m0",)
    assert Halving(2).decide([member("m1", 0.7, versions=9), member("m0", 0.1, versions=9, stage="CANCELED")],
                             2) is None
    assert Halving(0).decide(members, 0) is None, "K = 0: by hand only"


def test_done_rungs_are_read_from_the_members_stop_events():
    events = [{"event": SWEEP_STOP, "rule": BY_HAND, "member": "m3"}, {"event": SWEEP_STOP, "rung": 1},
              {"event": SWEEP_STOP, "rung": 2}, {"event": "alert", "rung": 7}]
    assert done_rungs(events) == 2 and done_rungs([]) == 0


# ---- the rule stated: record, review code, refusals

BASE = RunSpec(mode="distributed", eval_source="split", name="lr")


def test_the_record_and_the_review_code_state_the_early_stop_rule():
    by_hand = SweepSpec(BASE, {"learning_rate": [1e-4, 5e-4]}, sweep_id="sweep-a")
    halving = SweepSpec(BASE, {"learning_rate": [1e-4, 5e-4]}, sweep_id="sweep-a", early_stop_after=3)
    members = by_hand.members()
    assert by_hand.record(members)["early_stop"] == {"rule": "by hand"}
    assert halving.record(members)["early_stop"] == {"rule": "successive halving", "after_versions": 3}
    assert by_hand.fingerprint(members) != halving.fingerprint(members), "a changed rule needs a new review"


@pytest.mark.parametrize("k", [-1, 1001, 1.5, "2", True])
def test_an_early_stop_k_that_is_not_a_whole_number_in_range_is_refused_by_its_field(k):
    errors = SweepSpec(BASE, {"learning_rate": [1e-4, 5e-4]}, early_stop_after=k).problems()
    assert [e.field for e in errors] == [EARLY_STOP_FIELD]


def test_successive_halving_without_a_held_out_set_is_refused():
    base = RunSpec(mode="distributed", eval_source="none")
    errors = SweepSpec(base, {"learning_rate": [1e-4, 5e-4]}, early_stop_after=2).problems()
    assert [e.field for e in errors] == [EARLY_STOP_FIELD] and "held-out" in errors[0].message
    assert SweepSpec(base, {"learning_rate": [1e-4, 5e-4]}).problems() == [], "by hand needs no held-out set"


def test_the_preview_states_the_rule():
    from panel.preview_text import early_stop_line

    assert "by hand only" in early_stop_line(SweepSpec(BASE, {"learning_rate": [1e-4, 5e-4]}))
    line = early_stop_line(SweepSpec(BASE, {"learning_rate": [1e-4, 5e-4]}, early_stop_after=3))
    assert "successive halving" in line and "3 more held-out version(s)" in line
