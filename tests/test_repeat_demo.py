"""The default demo's parts: the repeat-letters task and its held-out split, the exact-answer reward (no constant or
repeated answer wins), the tiny model's supervised warm-up (deterministic, kept in the build cache, never shown a
held-out question), and the two tiny demo presets (the default learns the task; the other shows the alert)."""

import os

import pytest

from backend.plan.spec import RunSpec
from backend.runtime import prompts, tiny_model
from backend.runtime.rewards import exact_answer
from panel.presets import TINY_DEMO, TINY_HACKING, preset_values

pytestmark = pytest.mark.unit


def test_held_out_questions_are_never_trained_on_and_are_unseen_combinations_of_seen_letters():
    train, held = prompts.QUESTIONS[prompts.REPEAT], prompts.HELD_OUT[prompts.REPEAT]
    assert len(train) == 192 and len(held) == 24 and not set(train) & set(held)
    for place in range(3):      # every letter at every place, in training and held out alike
        assert {q.split()[1][place] for q in train} == {q.split()[1][place] for q in held} == set("abcdef")
    rows = prompts.builtin_eval_rows(prompts.REPEAT)
    assert rows[0]["prompt"][-1]["content"] == "Say aaa" and rows[0]["answer"] == "aaa"
    assert all(r["answer"] == r["prompt"][-1]["content"].split()[1] for r in rows)
    assert len(prompts.builtin_rows(prompts.REPEAT)) == 192, "each training question once (not cut to 64)"
    assert "answer" not in prompts.builtin_rows("count-to-ten")[0], "the other sets are unchanged"


def test_the_exact_answer_pays_a_constant_or_repeated_answer_only_where_it_happens_to_be_right():
    rows = prompts.builtin_rows(prompts.REPEAT)
    answers = [r["answer"] for r in rows]
    as_text = [[{"role": "assistant", "content": text}] for text in answers]
    assert exact_answer(as_text, answer=answers) == [1.0] * len(rows)
    assert exact_answer([[{"role": "assistant", "content": " cab \n"}]], answer=["cab"]) == [1.0]
    assert exact_answer([[{"role": "assistant", "content": "cabcab"}]], answer=["cab"]) == [0.0]
    for constant in ("aaa", "cab", "aaaaaaaaaa", "a", ""):
        scores = exact_answer([[{"role": "assistant", "content": constant}]] * len(rows), answer=answers)
        assert sum(scores) <= 1, (constant, sum(scores))
    assert exact_answer(["cab"], answer=None) == [0.0], "no answer column: nothing is right"


def test_the_warm_up_is_deterministic_kept_in_the_cache_and_changes_the_tiny_models_weights(tmp_path, monkeypatch):
    from safetensors.torch import load_file

    monkeypatch.setenv(tiny_model.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.setattr(tiny_model, "WARM_UP_STEPS", 2)
    warmed = tiny_model.ensure_tiny_model(str(tmp_path / "a"), 0, tiny_model.TINY_REPEATER)
    entry = tiny_model.cache_entry(0, tiny_model.TINY_REPEATER)
    assert entry and os.path.isfile(os.path.join(entry, "config.json")), "kept in the build cache"
    assert entry != tiny_model.cache_entry(0, tiny_model.TINY_MODEL)
    monkeypatch.delenv(tiny_model.CACHE_ENV)
    again = tiny_model.ensure_tiny_model(str(tmp_path / "b"), 0, tiny_model.TINY_REPEATER)
    read = lambda folder: open(os.path.join(folder, "model.safetensors"), "rb").read()
    assert read(warmed) == read(again), "the warm-up is deterministic: every job of a run gets the same weights"
    plain = tiny_model.build_model(tiny_model.build_tokenizer()).state_dict()
    weights = load_file(os.path.join(warmed, "model.safetensors"))
    assert any(not weights[name].equal(plain[name]) for name in weights), "the warm-up changed the weights"


def test_the_default_preset_learns_repeat_letters_and_the_other_tiny_demo_is_the_gameable_digits_task():
    demo, hacking = preset_values(TINY_DEMO), preset_values(TINY_HACKING)
    assert RunSpec.from_dict(demo).validate() == [] and RunSpec.from_dict(hacking).validate() == []
    assert (demo["model"], demo["dataset"], demo["rewards"]) == (
        tiny_model.TINY_REPEATER, "builtin:repeat-letters", ["exact_answer"])
    assert demo["eval_source"] == "split" and not demo["eval_greedy"] and demo["eval_samples_per_prompt"] > 1
    assert (hacking["model"], hacking["dataset"], hacking["rewards"]) == (
        tiny_model.TINY_MODEL, "builtin:count-to-ten", ["digits"])
    assert "distinct_chars" in hacking["monitor_rewards"]
