"""The colocated trainer runtime: a real `python -m runtime.trainer.train` job on the builtin tiny model, run from a
copy of backend/runtime the way a job runs it, plus its rewards and metric names."""

import json
import math
import os
import pickle
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from backend.plan.spec import RunSpec
from backend.runtime import layout
from backend.runtime.rewards import digits, length_target, reward_functions
from backend.runtime.rewards import format as plain_format
from backend.runtime.trainer.metrics_callback import RunFolderCallback, canonical_metrics

pytestmark = pytest.mark.integration

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

RUNTIME_SRC = Path(__file__).resolve().parents[1] / "backend" / "runtime"
JOB_TIMEOUT_S = 150
PLANTED_TOKEN = "hf_" + "TrAcKiOpLaNtEdToKeNtRaCkIoPlAnTeD"


# ---- rewards

def test_digits_scores_the_share_of_digit_characters_in_plain_and_conversational_completions():
    assert digits(["1234", "ab12", "", "xyz"]) == [1.0, 0.5, 0.0, 0.0]
    conversational = [[{"role": "assistant", "content": "12ab"}]]
    assert digits(conversational) == [0.5]


def test_length_target_peaks_at_the_dataset_target_and_falls_to_zero_at_twice_it():
    completions = ["x" * 8, "x" * 4, "x" * 16, "x" * 30]
    assert length_target(completions) == [1.0, 0.5, 0.0, 0.0]
    assert length_target(["abc"], target_length=[3]) == [1.0]


def test_format_rewards_plain_printable_text_over_byte_soup():
    assert plain_format(["hello, world 42!"]) == [1.0]
    assert plain_format(["\ufffd\ufffd\x07a"]) == [0.25]


def test_rewards_are_picklable_and_named_as_in_the_spec():
    funcs = reward_functions(["digits", "length_target", "format"])
    assert [f.__name__ for f in funcs] == ["digits", "length_target", "format"]
    assert pickle.loads(pickle.dumps(funcs))[0](["7"]) == [1.0]
    with pytest.raises(ValueError, match="unknown reward"):
        reward_functions(["digits", "vibes"])


# ---- metric names

def test_canonical_metrics_keep_every_trl_metric_and_add_the_names_the_panel_plots():
    logs = {"reward": 0.5, "reward_std": 0.1, "rewards/digits/mean": 0.5, "rewards/digits/std": 0.1,
            "kl": None, "entropy": float("nan"), "completions/mean_length": 12.0, "num_tokens": 900.0,
            "loss": 0.01, "grad_norm": 0.3, "learning_rate": 5e-3, "step_time": 0.05, "clip_ratio/low_mean": 0.0}
    assert canonical_metrics(logs) == {
        "reward": 0.5, "reward_std": 0.1, "rewards/digits/mean": 0.5, "rewards/digits/std": 0.1,
        "rewards/digits": 0.5, "completions/mean_length": 12.0, "completion_length": 12.0, "num_tokens": 900.0,
        "loss": 0.01, "grad_norm": 0.3, "learning_rate": 5e-3, "step_time": 0.05, "clip_ratio/low_mean": 0.0,
    }, "missing values (None, NaN) are left out; nothing else is"


def test_canonical_metrics_maps_async_trainer_keys_including_printed_strings():
    logs = {"reward": "0.25", "rewards/format": "0.25", "ratio": "1", "kl": "0.001", "entropy": "4.2",
            "sample/staleness_mean": "1.5", "sample/staleness_max": "2", "sample/dropped_stale_total": "3",
            "sample/time_in_queue_s": "0.7", "perf/weight_sync_s": "0.2", "perf/step_s": "1.1",
            "rollout/generated_tok_s": "800", "perf/trained_tok_s_wall_clock": "600", "step": "7"}
    metrics = canonical_metrics(logs)
    assert {k: metrics[k] for k in ("staleness_mean", "staleness_max", "dropped_stale_total", "time_in_queue_s",
                                    "weight_sync_s", "step_time", "gen_tokens_per_s", "train_tokens_per_s",
                                    "tokens_per_s", "step")} == {
        "staleness_mean": 1.5, "staleness_max": 2.0, "dropped_stale_total": 3.0, "time_in_queue_s": 0.7,
        "weight_sync_s": 0.2, "step_time": 1.1, "gen_tokens_per_s": 800.0, "train_tokens_per_s": 600.0,
        "tokens_per_s": 600.0, "step": 7}
    assert metrics["perf/step_s"] == 1.1 and metrics["sample/staleness_mean"] == 1.5, "TRL's own names kept too"


def test_metric_fragments_are_flushed_on_an_interval_not_per_step(tmp_path):
    from transformers import TrainerControl, TrainerState, TrainingArguments

    callback = RunFolderCallback(str(tmp_path), adapter_every=1000, flush_every_s=3600)
    state, control = TrainerState(max_steps=3), TrainerControl()
    args = TrainingArguments(output_dir=str(tmp_path / "out"), report_to="none")
    callback.on_train_begin(args, state, control)
    for step in (1, 2):
        state.global_step = step
        callback.on_log(args, state, control, logs={"reward": 0.1 * step, "num_tokens": 100.0 * step})
    assert not (tmp_path / layout.METRICS_DIR).exists()
    callback.flush_every_s = 0
    state.global_step = 3
    callback.on_log(args, state, control, logs={"reward": 0.3})
    records = metric_records(str(tmp_path))
    assert [r["step"] for r in records] == [1, 2, 3]
    assert records[1]["tokens_per_s"] > 0 and records[0]["staleness_max"] == 0


# ---- the builtin model and a real training job

def test_tiny_model_carries_a_chat_template_that_trl_recognises(tmp_path):
    import trl
    from transformers import AutoTokenizer
    from trl.chat_template_utils import add_response_schema, get_training_chat_template

    from backend.runtime.tiny_model import ensure_tiny_model

    bundled = Path(trl.__file__).parent / "chat_templates" / "qwen2_5.jinja"
    assert (RUNTIME_SRC / "qwen2_5_chat_template.jinja").read_bytes() == bundled.read_bytes()
    tokenizer = AutoTokenizer.from_pretrained(ensure_tiny_model(str(tmp_path / "base-model")))
    text = tokenizer.apply_chat_template([{"role": "user", "content": "Count to ten."}], tokenize=False,
                                         add_generation_prompt=True)
    assert text.endswith("<|im_start|>user\nCount to ten.<|im_end|>\n<|im_start|>assistant\n")
    assert get_training_chat_template(tokenizer)
    add_response_schema(tokenizer)  # raises "Unrecognized chat template" for templates TRL does not know


def metric_records(run_dir: str) -> list[dict]:
    folder = os.path.join(run_dir, layout.METRICS_DIR)
    names = sorted(n for n in os.listdir(folder) if layout.FRAGMENT_RE.match(n))
    return [json.loads(line) for n in names for line in Path(folder, n).read_text().splitlines()]


def events(run_dir: str) -> list[dict]:
    folder = os.path.join(run_dir, layout.EVENTS_DIR)
    return [json.loads(line) for n in sorted(os.listdir(folder)) for line in Path(folder, n).read_text().splitlines()]


def write_job(run_dir: Path, **overrides) -> None:
    """Lay out a run folder as the launcher does: spec.json and the runtime under code/runtime."""
    if not (run_dir / layout.CODE_DIR).exists():
        shutil.copytree(RUNTIME_SRC, run_dir / layout.CODE_DIR / "runtime",
                        ignore=shutil.ignore_patterns("__pycache__"))
    (run_dir / layout.SPEC_FILE).write_text(RunSpec(**overrides).to_json())


def run_job(run_dir: Path, watch=lambda: None, expect_rc: int = 0, env: dict | None = None) -> str:
    """Run the trainer as a job would, calling watch() while it runs; return its stdout."""
    env = {**os.environ, "PYTHONPATH": str(run_dir / layout.CODE_DIR), "HF_HUB_OFFLINE": "1", **(env or {})}
    proc = subprocess.Popen([sys.executable, "-m", "runtime.trainer.train", "--run-dir", str(run_dir)], cwd=run_dir,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + JOB_TIMEOUT_S
        while proc.poll() is None and time.monotonic() < deadline:
            watch()
            time.sleep(0.05)
        out = proc.communicate(timeout=max(1, deadline - time.monotonic()))[0]
        assert proc.returncode == expect_rc, out[-4000:]
        return out
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def watch_adapters(run_dir: Path, seen: set[str]):
    """Every adapters/ entry a reader can see is either a `_tmp` folder or a complete version."""
    folder = run_dir / layout.ADAPTERS_DIR

    def watch():
        for name in os.listdir(folder) if folder.exists() else []:
            if name.startswith("_tmp"):
                continue
            assert layout.ADAPTER_NAME_RE.match(name), name
            assert {*layout.ADAPTER_FILES, layout.ADAPTER_META_FILE} <= set(os.listdir(folder / name)), name
            seen.add(name)
    return watch


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("run")
    # "Also log to trackio" on, with no Space: the run's own folder holds a local trackio project. The job's token
    # is planted to prove it reaches none of trackio's files.
    write_job(run_dir, max_steps=6, adapter_every=2, checkpoint_every=3, seed=1, eval_source="split",
              monitor_rewards=["format"], name="tiny-tracked", trackio=True)
    seen: set[str] = set()
    out = run_job(run_dir, watch_adapters(run_dir, seen), env={"HF_TOKEN": PLANTED_TOKEN})
    return run_dir, out, seen


def test_training_job_writes_live_metrics_with_canonical_keys(trained_run):
    run_dir, out, _ = trained_run
    records = metric_records(str(run_dir))
    assert [r["step"] for r in records] == [1, 2, 3, 4, 5, 6]
    for record in records:
        assert {"step", "time", "reward", "reward_std", "rewards/digits", "entropy", "completion_length",
                "staleness_mean", "staleness_max", "loss", "grad_norm", "learning_rate", "step_time"} <= set(record)
        assert all(isinstance(v, (int, float)) and math.isfinite(v) for v in record.values())
    assert "tokens_per_s" in records[-1]
    assert "generation engine: transformers (CPU)" in out
    assert re.search(r"^step 6/6  reward \d\.\d{3}  \d+\.\ds$", out, re.MULTILINE), out[-2000:]
    assert out.count("TRL currently supports vLLM versions") <= 1, "TRL's version warning is said at most once"
    assert "pin_memory" not in out, "no pinned-memory warning on a machine without an accelerator"
    assert "it/s]" not in out, "no progress bars: the panel reads the log line by line"


def test_the_run_is_also_a_run_of_a_local_trackio_project_with_its_name_and_metrics_and_no_token(trained_run):
    run_dir, _, _ = trained_run
    folder = run_dir / layout.TRACKIO_DIR
    # Read back with trackio's own API, in a process of its own: trackio reads TRACKIO_DIR when it is imported.
    code = ("import json, trackio; from trackio.sqlite_storage import SQLiteStorage; "
            "runs = list(trackio.Api().runs('grpo-panel')); "
            "print(json.dumps({'runs': [r.name for r in runs], 'config': runs[0].config, "
            "'logs': SQLiteStorage.get_logs('grpo-panel', runs[0].name, scalar_only=True)}, default=str))")
    done = subprocess.run([sys.executable, "-c", code], env={**os.environ, "TRACKIO_DIR": str(folder)},
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["runs"] == ["tiny-tracked"], "one trackio run, named as the panel's run"
    # trackio numbers its own log calls; the trainer's step is train/global_step.
    rewards = {log["train/global_step"]: log["train/reward"] for log in found["logs"] if "train/reward" in log}
    panel = {r["step"]: r["reward"] for r in metric_records(str(run_dir))}
    assert sorted(rewards) == sorted(panel) == [1, 2, 3, 4, 5, 6]
    assert all(math.isclose(rewards[s], panel[s], rel_tol=1e-6) for s in panel), (rewards, panel)
    assert found["config"].get("learning_rate") == RunSpec().learning_rate, "transformers' config went with it"
    assert PLANTED_TOKEN not in done.stdout
    for path in folder.rglob("*"):
        if path.is_file():
            assert PLANTED_TOKEN.encode() not in path.read_bytes(), f"the token is in trackio's {path.name}"


def test_the_vllm_version_warning_is_said_once_and_other_warnings_pass_through(tmp_path):
    code = """
import warnings
from backend.runtime.trainer.common import say_vllm_version_warning_once
say_vllm_version_warning_once()
def a(): warnings.warn("TRL currently supports vLLM versions from 0.22.0 to 0.31.0. You have version 9.9.")
def b(): warnings.warn("TRL currently supports vLLM versions from 0.22.0 to 0.31.0. You have version 9.9.")
a(); b()
warnings.warn("something else entirely")
"""
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    both = result.stdout + result.stderr
    assert both.count("TRL currently supports vLLM versions") == 1 and "(shown once)" in result.stdout, both
    assert "something else entirely" in result.stderr


def test_training_job_publishes_adapter_versions_atomically_and_a_final_adapter(trained_run):
    run_dir, _, seen = trained_run
    adapters = run_dir / layout.ADAPTERS_DIR
    assert sorted(os.listdir(adapters)) == ["trl-policy-v1", "trl-policy-v2", "trl-policy-v3"]
    assert seen <= {"trl-policy-v1", "trl-policy-v2", "trl-policy-v3"}
    for version, step in ((1, 2), (2, 4), (3, 6)):
        meta = json.loads((adapters / f"trl-policy-v{version}" / layout.ADAPTER_META_FILE).read_text())
        assert meta["version"] == version and meta["step"] == step and meta["size_bytes"] > 0
    final = run_dir / layout.FINAL_DIR
    assert {*layout.ADAPTER_FILES, layout.ADAPTER_META_FILE} <= set(os.listdir(final))
    assert json.loads((final / layout.ADAPTER_META_FILE).read_text())["step"] == 6
    assert [e["event"] for e in events(str(run_dir))] == [
        "engine", "started", "adapter_published", "adapter_published", "adapter_published", "finished"]


def test_each_published_version_is_scored_on_the_held_out_split_and_the_best_is_kept_apart(trained_run):
    run_dir, out, _ = trained_run
    folder = run_dir / layout.EVALS_DIR
    records = [json.loads(line) for n in sorted(os.listdir(folder)) for line in (folder / n).read_text().splitlines()]
    assert [(r["policy_version"], r["step"]) for r in records] == [(0, 0), (1, 2), (2, 4), (3, 6)], (
        "the base model first, as version 0")
    for record in records:
        assert (record["n_prompts"], record["samples_per_prompt"], record["greedy"]) == (8, 1, True)
        assert record["rewards"]["format"]["weight"] == 0.0 and record["rewards"]["digits"]["weight"] == 1.0
        assert record["score"] == record["rewards"]["digits"]["mean"], "a monitor-only reward adds nothing"
        assert record["samples"][0]["prompt"].endswith("[user] Count from 5 to 15."), "the held-out questions"
    assert "held-out v0 (the base model): score" in out and "held-out v3 (step 6): score" in out
    top = max(records[1:], key=lambda r: (r["score"], -r["policy_version"]))
    if top["score"] <= records[0]["score"]:
        assert not (run_dir / layout.BEST_DIR).exists(), "no version beats the base model: none is published"
        return
    best = json.loads((run_dir / layout.BEST_DIR / layout.BEST_FILE).read_text())
    assert (best["policy_version"], best["score"]) == (top["policy_version"], top["score"])
    assert best["why"] == ("highest held-out score (digits) of 3 evaluated versions (equal scores: the earliest "
                           f"version wins), above the base model's {records[0]['score']:.3f}")
    kept = run_dir / layout.BEST_DIR
    source = run_dir / layout.ADAPTERS_DIR / f"trl-policy-v{best['policy_version']}"
    assert (kept / "adapter_model.safetensors").read_bytes() == (source / "adapter_model.safetensors").read_bytes()
    assert json.loads((kept / layout.ADAPTER_META_FILE).read_text())["version"] == best["policy_version"]


def test_the_best_version_is_replaced_only_by_a_higher_score_and_every_k_steps_skips_versions(tmp_path):
    from backend.runtime.trainer.evaluate import BestVersion, HeldOutEvaluation

    adapter = tmp_path / "v"
    adapter.mkdir()
    for name in layout.ADAPTER_FILES:
        (adapter / name).write_text(name)
    best = BestVersion(str(tmp_path), "digits")
    assert [best.offer({"policy_version": v, "step": v, "score": s}, str(adapter))
            for v, s in ((1, 0.5), (2, 0.5), (3, 0.7), (4, 0.1))] == [True, False, True, False]
    kept = json.loads((tmp_path / layout.BEST_DIR / layout.BEST_FILE).read_text())
    assert kept == {"policy_version": 3, "step": 3, "score": 0.7, "best_by": {}, "baseline": None,
                    "why": "highest held-out score (digits) of 4 evaluated versions (equal scores: the earliest "
                           "version wins)"}
    every = HeldOutEvaluation.__new__(HeldOutEvaluation)
    every.every, every.last_step = 10, None
    due = []
    for step in (4, 8, 12, 16, 20, 24):
        if every.due(step, last=step == 24):
            every.last_step = step
            due.append(step)
    assert due == [4, 16, 24], "the first version, then one 10 or more steps later, and always the last"


@pytest.mark.full   # tier 2 only (~50 s loaded)
def test_a_restarted_job_resumes_from_its_last_complete_checkpoint_and_keeps_numbering_versions(trained_run):
    run_dir, _, _ = trained_run
    write_job(run_dir, max_steps=8, adapter_every=2, checkpoint_every=3, seed=1)
    (run_dir / layout.CHECKPOINTS_DIR / "checkpoint-7").mkdir()  # what a job stopped while saving leaves
    out = run_job(run_dir)
    assert "resuming from" in out and "checkpoint-6" in out
    assert [r["step"] for r in metric_records(str(run_dir))][-2:] == [7, 8]
    assert "trl-policy-v4" in os.listdir(run_dir / layout.ADAPTERS_DIR)
    final_meta = json.loads((run_dir / layout.FINAL_DIR / layout.ADAPTER_META_FILE).read_text())
    assert (final_meta["version"], final_meta["step"]) == (4, 8)
    assert not [n for n in os.listdir(run_dir) if n.startswith("_tmp")]


@pytest.mark.full   # tier 2 only (~45 s loaded)
def test_a_job_resumed_from_an_earlier_checkpoint_marks_the_discarded_versions_and_never_reuses_a_name(trained_run):
    run_dir, _, _ = trained_run
    adapters = run_dir / layout.ADAPTERS_DIR
    before = {n: (adapters / n / "adapter_model.safetensors").read_bytes() for n in os.listdir(adapters)}
    assert sorted(before) == ["trl-policy-v1", "trl-policy-v2", "trl-policy-v3", "trl-policy-v4"]
    # Checkpoints 6 and 8 lost (cut off while saving): the next attempt resumes from checkpoint-3, so the versions
    # published after step 3 (v2 at 4, v3 at 6, v4 at 8) are a discarded branch. A half-written v99 counts for nothing.
    for step in (6, 8):
        (run_dir / layout.CHECKPOINTS_DIR / f"checkpoint-{step}" / "trainer_state.json").unlink()
    (adapters / "trl-policy-v99").mkdir()
    (adapters / "trl-policy-v99" / "adapter_config.json").write_text("{}")
    write_job(run_dir, max_steps=10, adapter_every=2, checkpoint_every=3, seed=1)
    out = run_job(run_dir)
    assert "checkpoint-3" in out and "superseded" in out
    [superseded] = [e for e in events(str(run_dir)) if e["event"] == "adapters_superseded"]
    assert superseded["names"] == ["trl-policy-v2", "trl-policy-v3", "trl-policy-v4"]
    assert superseded["resumed_from_step"] == 3
    published = [(e["name"], e["step"]) for e in events(str(run_dir)) if e["event"] == "adapter_published"]
    assert published[-4:] == [("trl-policy-v5", 4), ("trl-policy-v6", 6), ("trl-policy-v7", 8), ("trl-policy-v8", 10)]
    names = [name for name, _ in published]
    assert len(names) == len(set(names)), "a version name was published twice"
    assert all((adapters / n / "adapter_model.safetensors").read_bytes() == b for n, b in before.items())
    assert not (adapters / "trl-policy-v100").exists()


def test_a_trainer_that_cannot_write_to_the_bucket_says_so_and_does_not_raise_again(tmp_path, monkeypatch, capsys):
    import errno

    from backend.runtime.trainer import run_end

    def full(*_args, **_kwargs):
        raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "events" / "trainer-000001.jsonl"))

    monkeypatch.setattr(run_end, "write_event", full)
    try:
        full()
    except OSError as error:
        message = run_end.record_end(str(tmp_path), "trainer", error, flush=full)
    assert message.startswith("cannot write to the bucket: No space left on device (")
    err = capsys.readouterr().err
    assert "could not write the last metrics into the bucket: cannot write to the bucket" in err
    assert "could not write the 'failed' event into the bucket" in err
    wrapped = RuntimeError("Error while serializing: IoError(Os { code: 28, message: \"No space left on device\" })")
    assert run_end.describe(wrapped) == "cannot write to the bucket: No space left on device"
    assert run_end.describe(ValueError("bad dataset")) == "ValueError: bad dataset"


def test_a_job_that_fails_exits_non_zero_and_records_the_error(tmp_path):
    write_job(tmp_path, dataset="builtin:no-such-set")
    out = run_job(tmp_path, expect_rc=1)
    assert "training failed: ValueError: unknown builtin dataset 'no-such-set'" in out
    failed = events(str(tmp_path))[-1]
    assert failed["event"] == "failed" and "no-such-set" in failed["error"]


def test_resume_picks_the_newest_complete_checkpoint_and_skips_one_cut_off_mid_save(tmp_path):
    from backend.runtime.trainer.common import latest_checkpoint

    assert latest_checkpoint(str(tmp_path)) is None, "no checkpoints folder: start from scratch"
    folder = tmp_path / layout.CHECKPOINTS_DIR
    for step, state in [(3, '{"global_step": 3}'), (6, '{"global_step": 6}'), (9, '{"global_st'), (12, None)]:
        (folder / f"checkpoint-{step}").mkdir(parents=True)
        (folder / f"checkpoint-{step}" / "adapter_model.safetensors").write_bytes(b"x")
        if state is not None:
            (folder / f"checkpoint-{step}" / "trainer_state.json").write_text(state)
    (folder / "checkpoint-99.tmp").mkdir()
    assert latest_checkpoint(str(tmp_path)) == str(folder / "checkpoint-6")
