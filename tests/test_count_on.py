"""The counting task and its exact-answer reward (the building blocks of a tiny demo that learns a real skill), and
the tiny model's supervised warm-up on it: deterministic, kept in the build cache, never shown a held-out count."""

import os

import pytest

from backend.runtime import prompts, tiny_model
from backend.runtime.rewards import exact_answer

pytestmark = pytest.mark.unit


def test_held_out_counts_are_never_trained_on_and_each_ends_on_a_number_training_counts_end_on():
    train, held = set(prompts.COUNT_ON_TRAIN), set(prompts.COUNT_ON_HELD_OUT)
    assert len(train) == 60 and len(held) == 20 and not train & held
    ends = {q.rsplit(" ", 1)[1] for q in train}
    assert sum(q.rsplit(" ", 1)[1] in ends for q in held) >= 19, "the skill is the count, not unseen numbers"
    rows = prompts.builtin_eval_rows(prompts.COUNT_ON)
    assert rows[0]["prompt"][-1]["content"] == "Count on: 0 1" and rows[0]["answer"] == "2"
    assert all(r["answer"] == prompts.answer_of(r["prompt"][-1]["content"]) for r in rows)


def test_the_exact_answer_pays_a_constant_or_repeated_answer_only_where_it_happens_to_be_right():
    rows = prompts.builtin_rows(prompts.COUNT_ON)
    answers = [r["answer"] for r in rows]
    as_text = [[{"role": "assistant", "content": text}] for text in answers]
    assert exact_answer(as_text, answer=answers) == [1.0] * len(rows)
    assert exact_answer([[{"role": "assistant", "content": " 7 \n"}]], answer=["7"]) == [1.0]
    for constant in ("8", "88888888", "7 8 9", ""):
        scores = exact_answer([[{"role": "assistant", "content": constant}]] * len(rows), answer=answers)
        assert sum(scores) / len(scores) <= 0.1, (constant, sum(scores))
    assert exact_answer(["6"], answer=None) == [0.0], "no answer column: nothing is right"


def test_the_warm_up_is_deterministic_kept_in_the_cache_and_not_the_plain_tiny_models(tmp_path, monkeypatch):
    monkeypatch.setenv(tiny_model.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.setattr(tiny_model, "WARM_UP_STEPS", 3)
    warmed = tiny_model.ensure_tiny_model(str(tmp_path / "a"), 0, tiny_model.TINY_COUNTER)
    entry = tiny_model.cache_entry(0, tiny_model.TINY_COUNTER)
    assert entry and os.path.isfile(os.path.join(entry, "config.json")), "kept in the build cache"
    assert entry != tiny_model.cache_entry(0, tiny_model.TINY_MODEL)
    monkeypatch.delenv(tiny_model.CACHE_ENV)
    again = tiny_model.ensure_tiny_model(str(tmp_path / "b"), 0, tiny_model.TINY_COUNTER)
    plain = tiny_model.ensure_tiny_model(str(tmp_path / "c"), 0, tiny_model.TINY_MODEL)
    weights = "model.safetensors"
    read = lambda folder: open(os.path.join(folder, weights), "rb").read()
    assert read(warmed) == read(again), "the warm-up is deterministic: every job of a run gets the same weights"
    assert read(warmed) != read(plain), "the warm-up changed the weights"
