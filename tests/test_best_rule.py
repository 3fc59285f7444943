"""Which version is "best", by the user's rule: `best_by` parsed and refused as the form and the Runs tab take it, ties
to the earliest version, the base model (version 0) as the baseline a best version must beat, the trainer's best/
under the rule in force (a change on the run included), and the reward-hacking sign read from held-out records."""

import json
import os

import pytest

from backend.outcome.hacking_sign import hacking_sign
from backend.outcome.held_out import HeldOutScore
from backend.plan.spec import RunSpec, SpecError
from backend.runtime import layout, records
from backend.runtime.best_rule import BEST_BY_WRITER, parse_best_by, pick_best, rule_score, rule_text
from backend.runtime.rewards import distinct_chars
from backend.runtime.trainer.evaluate import BestVersion

pytestmark = pytest.mark.unit


def record(version: int, score: float, **means) -> dict:
    rewards = {name: {"mean": mean, "weight": 1.0 if name == "digits" else 0.0} for name, mean in means.items()}
    return {"policy_version": version, "step": 3 * version, "score": score, "rewards": rewards}


def test_best_by_is_a_reward_name_or_a_weighting_and_anything_else_is_refused_with_the_field_named():
    assert parse_best_by("right_answer") == {"right_answer": 1.0}
    assert parse_best_by(" right_answer=1, varied = 0.5\n") == {"right_answer": 1.0, "varied": 0.5}
    assert parse_best_by("") == {}
    for bad, why in (("right_answer=lots", "not a number"), ("../spec.json", "not a reward name"),
                     ("a=inf", "finite")):
        with pytest.raises(ValueError, match=why):
            parse_best_by(bad)
    task = dict(dataset="examples/tiny-math.jsonl", prompt_column="question", reward_columns=["solution"],
                rewards=[], reward_code="def right_answer(completions, solution, **kwargs):\n"
                                        "    return [0.0] * len(completions)\n", eval_source="rows", eval_rows=8,
                monitor_rewards=["distinct_chars"])
    RunSpec(**task, best_by={"right_answer": 1.0}).check()
    RunSpec(**task, best_by={"distinct_chars": 1.0, "right_answer": 2.0}).check()     # a monitor-only one too
    for best_by, message in (({"nope": 1.0}, "no held-out reward named nope"),
                             ({"right_answer": 0.0}, "all zero")):
        with pytest.raises(SpecError) as refused:
            RunSpec(**task, best_by=best_by).check()
        assert [(e.field, message in e.message) for e in refused.value.errors] == [("best_by", True)], refused.value
    with pytest.raises(SpecError) as refused:
        RunSpec(**{**task, "eval_source": "none", "monitor_rewards": []}, best_by={"right_answer": 1.0}).check()
    assert [e.field for e in refused.value.errors] == ["best_by"]
    assert RunSpec.from_dict({"best_by": "right_answer=1, distinct_chars=0.5"}).best_by == {
        "right_answer": 1.0, "distinct_chars": 0.5}, "the form's text"


def test_ties_go_to_the_earliest_version_and_the_best_must_beat_the_base_model():
    gamed = {0: record(0, 0.12, digits=0.12, right=0.0, varied=0.40), 1: record(1, 0.5, digits=0.5, right=0.0,
                                                                                varied=0.30),
             2: record(2, 1.0, digits=1.0, right=0.0, varied=0.06), 3: record(3, 1.0, digits=1.0, right=0.0,
                                                                               varied=0.06)}
    assert pick_best(gamed, {}) == (2, 0.12), "the trained score: v2 and v3 tie at 1.0, the earliest wins"
    assert pick_best(gamed, {"right": 1.0}) == (None, 0.0), "no version beats the base model: none is best"
    assert pick_best(gamed, {"varied": 1.0}) == (None, 0.40)
    assert pick_best(gamed, {"digits": 1.0, "varied": 2.0})[0] == 2
    without_base = {v: r for v, r in gamed.items() if v}
    assert pick_best(without_base, {"varied": 1.0}) == (1, None), "a run from before v0: the best of the versions"
    assert rule_score(gamed[1], {"nope": 1.0}) is None and pick_best(gamed, {"nope": 1.0}) == (None, None)
    assert rule_text({}) == "the trained rewards' weighted score" and rule_text({"right": 1.0}) == "held-out right"


def test_the_ranking_a_tick_reads_names_the_version_best_of_names_as_scores_arrive_and_change():
    """The panel keeps versions ranked as their records arrive (a tick of a 5,000-version run reads the top, not
    every score): whatever arrives, replaces or stands in for an unread record, it names what `best_of` names."""
    import random

    from backend.outcome.ranking import Ranking
    from backend.runtime.best_rule import EPSILON, best_of

    rng = random.Random(32)
    for trial in range(300):
        ranking, scored = Ranking(), {}
        levels = [0.5, 0.5 + EPSILON / 2, 0.5 + 2 * EPSILON, 1.0, 1.0 - EPSILON / 3, 0.25, None]
        for _ in range(rng.randint(0, 40)):
            version = rng.randint(0, 30)            # some arrive again (a resumed run evaluating a version anew)
            score = rng.choice([*levels, rng.random()])
            scored[version] = score
            ranking.put(version, score)
            extra = {v: rng.choice(levels) for v in rng.sample(range(31, 40), rng.randint(0, 2))}
            baseline = rng.choice([scored.get(0), None, 0.5])
            expected = best_of({**{v: s for v, s in scored.items() if v}, **extra, 0: baseline})
            assert ranking.best_of(extra, baseline) == expected, (trial, scored, extra, baseline)
        assert Ranking(scored).best_of({}, scored.get(0)) == best_of(scored), "built at once, the same"


def _adapter(folder, text: str) -> str:
    os.makedirs(folder, exist_ok=True)
    for name in layout.ADAPTER_FILES:
        with open(os.path.join(folder, name), "w") as f:
            f.write(f"{text} {name}")
    return str(folder)


def test_no_version_is_published_as_best_while_none_beats_the_base_model(tmp_path):
    best = BestVersion(str(tmp_path), "digits")
    assert best.offer(record(0, 0.5, digits=0.5), None) is False
    assert best.offer(record(1, 0.5, digits=0.5), _adapter(tmp_path / "v1", "v1")) is False, "a tie is no win"
    assert best.offer(record(2, 0.25, digits=0.25), _adapter(tmp_path / "v2", "v2")) is False
    assert not (tmp_path / layout.BEST_DIR).exists() and best.best is None
    assert best.offer(record(3, 0.75, digits=0.75), _adapter(tmp_path / "v3", "v3")) is True
    assert json.loads((tmp_path / layout.BEST_DIR / layout.BEST_FILE).read_text())["policy_version"] == 3


def test_the_trainer_keeps_best_under_the_rule_in_force_read_back_from_the_users_change(tmp_path):
    best = BestVersion(str(tmp_path), "digits", {"varied": 1.0})
    assert best.offer(record(0, 0.1, digits=0.1, varied=0.2), None) is False, "the base model is never published"
    assert best.offer(record(1, 0.5, digits=0.5, varied=0.5), _adapter(tmp_path / "v1", "v1")) is True
    assert best.offer(record(2, 1.0, digits=1.0, varied=0.1), _adapter(tmp_path / "v2", "v2")) is False, (
        "by varied (the launch rule) the hacked v2 is not best")
    kept = json.loads((tmp_path / layout.BEST_DIR / layout.BEST_FILE).read_text())
    assert (kept["policy_version"], kept["best_by"], kept["baseline"]) == (1, {"varied": 1.0}, 0.2)
    assert kept["why"] == ("highest held-out varied of 2 evaluated versions (equal scores: the earliest version "
                           "wins), above the base model's 0.200")
    # The user changes the rule on the running run: the panel records it; the trainer reads it at its next offer.
    event = records.event_record(records.BEST_BY_CHANGED, best_by={"digits": 1.0}, previous={"varied": 1.0},
                                 version=2)
    (tmp_path / layout.EVENTS_DIR).mkdir()
    (tmp_path / layout.EVENTS_DIR / layout.fragment_name(f"{BEST_BY_WRITER}.ab12cd34", 0)).write_text(
        json.dumps(event) + "\n")
    assert best.offer(record(3, 1.0, digits=1.0, varied=0.1), _adapter(tmp_path / "v3", "v3")) is False, (
        "v3 ties v2 under the new rule: the earliest (v2, which the panel republished) stays")
    assert best.offer(record(4, 1.1, digits=1.1, varied=0.1), _adapter(tmp_path / "v4", "v4")) is True
    assert (tmp_path / layout.BEST_DIR / "adapter_model.safetensors").read_text() == "v4 adapter_model.safetensors"
    assert json.loads((tmp_path / layout.BEST_DIR / layout.BEST_FILE).read_text())["best_by"] == {"digits": 1.0}


class Held:
    member = ""     # a lone run: its versions are trl-policy-v<N>

    def __init__(self, rows: dict[int, dict], answers: dict[int, list[str]]):
        self.scores = {v: HeldOutScore(v, 3 * v, r["score"], None, 8, r["rewards"]) for v, r in rows.items()}
        self.samples = {v: [{"prompt_index": i, "completion": t} for i, t in enumerate(texts)]
                        for v, texts in answers.items()}
        self.span = (min(rows), max(rows))      # as `HeldOut` keeps it


def test_reward_hacking_is_suspected_when_the_trained_score_rises_while_a_monitor_falls_or_answers_collapse():
    gamed = Held({0: record(0, 0.125, digits=0.125, right=0.0, varied=0.401),
                  3: record(3, 1.0, digits=1.0, right=0.0, varied=0.062)},
                 {0: ["\x148\\*x", "ab 12"], 3: ["8888888888888888", "8888888888888888"]})
    sign = hacking_sign(gamed)
    assert sign is not None and sign.versions == (0, 3)
    assert "rose 0.125 → 1.000 from the base model (v0) to trl-policy-v3" in sign.message
    assert "monitor **varied** fell 0.401 → 0.062" in sign.message
    assert "monitor **right** stayed at its floor" in sign.message
    assert "100% of trl-policy-v3's held-out answers are one character or word repeated" in sign.message
    assert "'8888888888888888'" in sign.message and set(sign.rewards) == {"varied", "right"}
    honest = Held({0: record(0, 0.1, digits=0.1, varied=0.9), 3: record(3, 0.6, digits=0.6, varied=0.85)},
                  {0: ["count 1 2"], 3: ["5 6 7 8 9 10 11"]})
    assert hacking_sign(honest) is None, "the monitor held: no alert"
    flat = Held({0: record(0, 0.1, digits=0.1, varied=0.9), 3: record(3, 0.15, digits=0.15, varied=0.1)}, {})
    assert hacking_sign(flat) is None, "the trained score barely moved: whatever the monitor did, no hacking sign"
    assert distinct_chars(["8888888888", "5 6 7 8 9 10", "42", ""]) == [0.1, 0.8, 1.0, 0.0]
