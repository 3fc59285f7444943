"""Your dataset: the column mapping, the prompt exactly as the model sees it (chat template, token count), local
JSONL / Parquet files, Hub datasets through the dataset viewer (the loopback fake answers it), and every way a
dataset can be refused before launch."""

import json
import os

import pytest

from backend.plan.spec import RunSpec
from backend.runtime.task import TaskDataError, parse_reward_columns, task_row, to_messages
from backend.task.check import check_task
from backend.task.dataset_viewer import DatasetUnreadable, first_rows
from panel.actions import Panel, Settings
from panel.task_form import preview_outputs

pytestmark = pytest.mark.integration

ROWS = [{"question": f"What is {i} + {i}?", "answer": str(2 * i), "level": i % 3} for i in range(1, 21)]


def _jsonl(path, rows) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


# ---- column mapping

def test_reward_columns_map_a_keyword_to_a_column():
    assert parse_reward_columns(["solution", "answer=final", " level = difficulty "]) == {
        "solution": "solution", "answer": "final", "level": "difficulty"}


def test_a_plain_text_prompt_becomes_a_user_message_after_the_system_prompt():
    row = {"question": "What is 2 + 2?", "answer": "4", "unused": "x"}
    assert task_row(row, "question", {"solution": "answer"}, "Answer with a number.") == {
        "prompt": [{"role": "system", "content": "Answer with a number."},
                   {"role": "user", "content": "What is 2 + 2?"}],
        "solution": "4"}


def test_a_conversational_prompt_keeps_its_turns_and_the_system_prompt_replaces_its_own():
    conversation = [{"role": "system", "content": "old"}, {"role": "user", "content": "hi", "extra": 1}]
    assert to_messages(conversation) == [{"role": "system", "content": "old"}, {"role": "user", "content": "hi"}]
    assert to_messages(conversation, "new") == [{"role": "system", "content": "new"},
                                                {"role": "user", "content": "hi"}]
    for bad in (42, [], [{"text": "no role"}], None):
        with pytest.raises(TaskDataError, match="text or a list of"):
            to_messages(bad)


@pytest.mark.parametrize("entries,fragment", [
    (["2nd"], "must be a Python name"), (["completions"], "a name TRL passes itself"),
    (["solution", "solution=answer"], "mapped more than once"), (["solution="], "name the dataset column"),
])
def test_a_bad_column_mapping_is_refused(entries, fragment):
    errors = {e.field: e.message for e in RunSpec(reward_columns=entries).validate()}
    assert fragment in errors["reward_columns"], errors


def test_trl_accuracy_rewards_need_a_solution_column():
    errors = {e.field: e.message for e in RunSpec(rewards=["accuracy_reward"]).validate()}
    assert "compares answers with a 'solution' column" in errors["reward_columns"]
    assert RunSpec(rewards=["accuracy_reward"], reward_columns=["solution=answer"]).validate() == []


@pytest.mark.parametrize("dataset,fragment", [
    ("data/math.csv", "is not a .jsonl or .parquet file"), ("./notes.txt", "is not a .jsonl or .parquet file"),
    ("org/some-dataset", "local runs cannot download"), ("not a dataset id", "a Hub dataset id like"),
])
def test_a_dataset_that_is_neither_a_file_nor_a_hub_id_is_refused_by_name(dataset, fragment):
    errors = {e.field: e.message for e in RunSpec(dataset=dataset).validate()}
    assert fragment in errors["dataset"], errors


# ---- local files, read before launch

def test_a_local_jsonl_is_previewed_with_its_columns_rows_and_the_templated_prompt(panel, tmp_path):
    path = _jsonl(tmp_path / "math.jsonl", ROWS)
    report = panel.check_task({"dataset": path, "prompt_column": "question", "reward_columns": "solution=answer",
                               "system_prompt": "Answer with a number.", "rewards": ["digits"]})
    assert report.ok, report.errors
    assert report.num_rows == 20 and report.columns == ["question", "answer", "level"]
    expected = ("<|im_start|>system\nAnswer with a number.<|im_end|>\n<|im_start|>user\nWhat is 1 + 1?<|im_end|>\n"
                "<|im_start|>assistant\n")
    assert report.prompt_text == expected
    # The builtin tokenizer is byte-level: one token per byte, except that each special token is one token.
    specials = 3 * (len("<|im_start|>") - 1) + 2 * (len("<|im_end|>") - 1)
    assert report.prompt_tokens == len(expected.encode()) - specials == 64
    message, rows, prompt, scores = preview_outputs(report)
    assert "**Task checked.** 20 rows, columns `question`, `answer`, `level`." in message, "names shown as text"
    assert f"The first prompt has {report.prompt_tokens} tokens; of 20 rows checked, 0 (0%) are over" in message
    assert list(rows.columns) == ["question", "answer", "level"] and len(rows) == 5
    assert rows.iloc[0]["question"] == "What is 1 + 1?"
    assert prompt == f"{expected}\n\n[{report.prompt_tokens} tokens]"
    assert list(scores.columns) == ["row", "completion", "digits", "text"] and len(scores) == 12
    assert scores.iloc[0]["completion"] == "reasoned, boxed answer"


def test_a_parquet_file_is_read_like_a_jsonl(panel, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = str(tmp_path / "math.parquet")
    pq.write_table(pa.Table.from_pylist(ROWS), path)
    report = panel.check_task({"dataset": path, "prompt_column": "question", "rewards": ["digits"]})
    assert report.ok and report.num_rows == 20 and report.preview[0]["question"] == "What is 1 + 1?"


def test_prompts_over_the_limit_are_a_warning_on_some_rows_and_refused_on_most(panel, tmp_path):
    rows = [{"question": "x" * (400 if i < 5 else 10)} for i in range(20)]
    path = _jsonl(tmp_path / "long.jsonl", rows)
    # No system prompt: Qwen's chat template adds its default one (~70 tokens), and the count includes it.
    some = panel.check_task({"dataset": path, "prompt_column": "question", "max_prompt_tokens": 200})
    assert some.ok and some.long_rows == 5 and "You are Qwen" in some.prompt_text
    share = "25% of the 20 rows checked (5) have prompts longer than 200 tokens"
    assert any(w.startswith(share) for w in some.warnings), some.warnings
    message, rows_seen = panel.launch({"dataset": path, "prompt_column": "question", "max_prompt_tokens": 20})
    assert rows_seen is None and "**max_prompt_tokens**" in message and "100% of the 20 rows checked" in message


@pytest.mark.parametrize("content,field,fragment", [
    ("", "dataset", "has no rows"),
    ('{"question": "ok"}\nnot json\n', "dataset", "line 2 of data.jsonl is not JSON"),
    ('["a", "list"]\n', "dataset", "line 1 of data.jsonl is not a JSON object"),
    ('{"text": "hello"}\n', "prompt_column", "no column 'question' in the dataset; its columns are text"),
    ('{"question": 7}\n', "prompt_column", "row 0: a prompt must be text or a list of {role, content} messages"),
], ids=["empty", "not-json", "not-object", "missing-column", "prompt-not-text"])
def test_a_local_file_that_cannot_become_a_task_is_refused_and_nothing_is_written(panel, tmp_path, content, field,
                                                                                  fragment):
    path = tmp_path / "data.jsonl"
    path.write_text(content)
    message, run_id = panel.launch({"dataset": str(path), "prompt_column": "question"})
    assert run_id is None and f"**{field}**" in message and fragment in message, message
    assert panel.local.list_jobs() == [] and not os.path.exists(os.path.join(panel.settings.home, "buckets"))


def test_a_parquet_name_on_a_file_that_is_not_parquet_is_refused(panel, tmp_path):
    path = tmp_path / "data.parquet"
    path.write_text('{"question": "hi"}\n')
    report = panel.check_task({"dataset": str(path), "prompt_column": "question"})
    assert [e.field for e in report.errors] == ["dataset"] and "is not a Parquet file" in report.errors[0].message


def test_a_mapped_reward_column_that_does_not_exist_is_refused(panel, tmp_path):
    path = _jsonl(tmp_path / "math.jsonl", ROWS)
    report = panel.check_task({"dataset": path, "prompt_column": "question", "reward_columns": "solution"})
    assert [(e.field, e.message) for e in report.errors] == [
        ("reward_columns", "no column 'solution' in the dataset; its columns are question, answer, level")]


# ---- Hub datasets, through the dataset viewer (the loopback fake)

def test_the_dataset_viewer_gives_the_first_rows_of_a_hub_split(hub):
    hub.put_dataset("alice/math", ROWS, config="easy", split="test")
    viewer = first_rows(hub.url, "alice/math", "", "test", 200, None)
    assert (viewer.config, viewer.columns, viewer.num_rows_total, viewer.rows[0]) == (
        "easy", ["question", "answer", "level"], 20, ROWS[0])
    [rows_call] = [r for r in hub.requests if r.path == "/rows"]
    assert rows_call.query["length"] == ["100"], "the viewer serves at most 100 rows per call"


def test_a_private_dataset_is_read_with_the_visitors_token_and_refused_without(hub):
    hub.put_dataset("alice/secret-math", ROWS, private=True)
    assert len(first_rows(hub.url, "alice/secret-math", "", "train", 5, hub.token).rows) == 5
    with pytest.raises(DatasetUnreadable, match="does not exist, or your token cannot read it") as info:
        first_rows(hub.url, "alice/secret-math", "", "train", 5, None)
    assert hub.token not in str(info.value)


@pytest.mark.parametrize("config,split,fragment", [
    ("", "validation", "has no split 'validation'; its splits are train"),
    ("hard", "train", "has no config 'hard'; its configs are default"),
])
def test_a_missing_config_or_split_is_refused_with_what_exists(hub, tmp_path, config, split, fragment):
    spec = RunSpec(executor="hf_jobs", dataset="trl-lib/DeepMath-103K", dataset_config=config, dataset_split=split,
                   model="Qwen/Qwen2.5-0.5B-Instruct", bucket="alice/runs").check()
    report = check_task(spec, hub.token, hub.url)
    assert [e.field for e in report.errors] == ["dataset"] and fragment in report.errors[0].message


def test_an_hf_jobs_run_with_a_local_file_and_reward_code_carries_both_in_its_bucket(hub, tmp_path):
    path = _jsonl(tmp_path / "math.jsonl", ROWS)
    code = "import math_verify\n\ndef exact(completions, solution, **kwargs):\n    return [0.0] * len(completions)\n"
    panel = Panel(Settings(home=str(tmp_path / "home")))
    try:
        form = {"executor": "hf_jobs", "model": "Qwen/Qwen2.5-0.5B-Instruct", "dataset": path, "bucket": "alice/runs",
                "flavor": "a10g-small", "prompt_column": "question", "reward_columns": "solution=answer",
                "rewards": ["think_format_reward"], "reward_code": code}
        message, run_id = panel.launch(form, confirmed=panel.preview(form).fingerprint)
        assert run_id, message
        files = hub.buckets["alice/runs"].files
        assert files[f"runs/{run_id}/data/math.jsonl"].data == open(path, "rb").read()
        assert files[f"runs/{run_id}/code/user_rewards.py"].data.decode() == code.strip()
        [post] = hub.job_posts()
        assert "pip install --quiet trl==1.16.0 peft==0.21.2 math-verify==0.9.0 " in post.json["command"][-1]
        spec = json.loads(files[f"runs/{run_id}/spec.json"].data)
        assert spec["reward_code"] == code.strip() and spec["reward_columns"] == ["solution=answer"]
    finally:
        panel.shutdown()


def test_on_a_space_only_an_uploaded_file_is_read(tmp_path, monkeypatch):
    monkeypatch.setenv("GRADIO_TEMP_DIR", str(tmp_path / "uploads"))
    (tmp_path / "uploads" / "3f2a").mkdir(parents=True)
    uploaded = _jsonl(tmp_path / "uploads" / "3f2a" / "math.jsonl", ROWS)
    elsewhere = _jsonl(tmp_path / "server-side.jsonl", ROWS)
    space = Panel(Settings(home=str(tmp_path / "home"), on_space=True))
    try:
        refused = space.check_task({"dataset": elsewhere, "prompt_column": "question", "executor": "hf_jobs"})
        assert [e.field for e in refused.errors] == ["dataset"] and "upload your file" in refused.errors[0].message
        assert refused.preview == [], "nothing of the Space's own file is shown"
        report = space.check_task({"dataset": uploaded, "prompt_column": "question", "executor": "hf_jobs"})
        assert [e.field for e in report.errors] == ["account"] and "Sign in" in report.errors[0].message, (
            "an uploaded file is accepted; checking it runs code, which on a Space needs the visitor's own job")
    finally:
        space.shutdown()


def test_a_resumed_run_keeps_the_dataset_copy_it_was_launched_with(tmp_path):
    from backend.runs.launch import LaunchError, launch_run, write_run_files
    from backend.storage.store import FolderStore
    from tests.test_engines import Submissions

    path = tmp_path / "math.jsonl"
    _jsonl(path, ROWS)
    store = FolderStore(str(tmp_path / "bucket"))
    spec = RunSpec(dataset=str(path), prompt_column="question").check()
    write_run_files(spec, store)
    copy = f"runs/{spec.run_id}/data/math.jsonl"
    assert store.read_bytes(copy) == path.read_bytes()
    path.unlink()                       # the panel that resumes it no longer has the file
    executor = Submissions()
    launch_run(spec, executor, store, resume=True)
    assert [job.role for job in executor.jobs] == ["trainer"]
    assert store.read_bytes(copy).count(b"\n") == len(ROWS), "the copy the run was launched with stays"
    with pytest.raises(LaunchError, match="is gone. No job was submitted, and nothing was left in the bucket"):
        write_run_files(RunSpec(dataset=str(path), prompt_column="question"), store)

# ---- the held-out set: refused before launch when it is empty, lacks a column, or overlaps the training rows

HELD_OUT = [{"question": f"What is {i} x {i}?", "answer": str(i * i)} for i in range(1, 9)]


@pytest.mark.parametrize("rows,field,fragment", [
    ([], "eval_file", "the held-out set has no rows"),
    ([{"prompt_text": "What is 3 x 3?", "answer": "9"}], "eval_file", "has no column 'question', which the prompt"),
    ([{"question": "What is 3 x 3?"}], "eval_file", "has no column 'answer', which a reward (reward_columns)"),
    ([*HELD_OUT, ROWS[4]], "eval_file", "1 of the 9 held-out prompts checked are training prompts too"),
], ids=["empty", "no-prompt-column", "no-reward-column", "overlapping"])
def test_a_held_out_file_that_cannot_score_the_task_is_refused_naming_it_and_nothing_launches(
        panel, tmp_path, rows, field, fragment):
    data, held = _jsonl(tmp_path / "math.jsonl", ROWS), _jsonl(tmp_path / "held.jsonl", rows)
    message, run_id = panel.launch({"dataset": data, "prompt_column": "question", "reward_columns": "solution=answer",
                                    "eval_source": "file", "eval_file": held})
    assert run_id is None and f"**{field}**" in message and fragment in message, message
    assert panel.local.list_jobs() == [] and not os.path.exists(os.path.join(panel.settings.home, "buckets"))


def test_held_out_rows_are_checked_against_the_rest_and_a_clean_set_is_counted(panel, tmp_path):
    repeated = _jsonl(tmp_path / "repeated.jsonl", ROWS + ROWS[:2])
    report = panel.check_task({"dataset": repeated, "prompt_column": "question", "eval_source": "rows",
                               "eval_rows": 4})
    assert [e.field for e in report.errors] == ["eval_rows"], report.errors
    assert "2 of the 4 held-out prompts checked are training prompts too (held-out row 0 first)" in (
        report.errors[0].message)
    every = panel.check_task({"dataset": repeated, "prompt_column": "question", "eval_source": "rows",
                              "eval_rows": 22})
    assert "holds out 22 rows, but the dataset has 22: training would have none" in every.errors[0].message
    clean = panel.check_task({"dataset": _jsonl(tmp_path / "math.jsonl", ROWS), "prompt_column": "question",
                              "eval_source": "file", "eval_file": _jsonl(tmp_path / "held.jsonl", HELD_OUT),
                              "monitor_rewards": ["length_target"]})
    assert clean.ok and clean.held_out_rows == 8, clean.errors
    assert "length_target" in clean.scores, "a monitor-only reward is called on the sample completions too"
    builtin = panel.check_task({"eval_source": "split", "eval_split": "test"})
    assert builtin.ok and builtin.held_out_rows == 8, builtin.errors


def test_a_hub_held_out_split_lacking_a_reward_column_is_refused_by_its_field(hub):
    hub.put_dataset("alice/math", ROWS, split="train")
    hub.put_dataset("alice/math", [{"question": q["question"]} for q in HELD_OUT], split="test")
    spec = RunSpec(executor="hf_jobs", dataset="alice/math", model="Qwen/Qwen2.5-0.5B-Instruct", bucket="alice/runs",
                   prompt_column="question", reward_columns=["solution=answer"], rewards=["accuracy_reward"],
                   eval_source="split", eval_split="test").check()
    report = check_task(spec, hub.token, hub.url)
    assert [e.field for e in report.errors] == ["eval_split"], report.errors
    assert "has no column 'answer', which a reward (reward_columns) reads" in report.errors[0].message
