"""A colocated run's metrics carry generation and weight-sync time (TRL only hands them to wandb and co.) and
completion tokens per second, comparable with the async trainer's generated and trained rates."""

import json
import os
import time
from pathlib import Path

import pytest
from transformers import TrainerControl, TrainerState, TrainingArguments
from trl.extras.profiling import ProfilingContext

from backend.runtime import layout
from backend.runtime.trainer.metrics_callback import ProfiledSeconds, RunFolderCallback

pytestmark = pytest.mark.unit


def test_trls_profiled_generation_and_sync_are_kept_from_the_main_process_only():
    profiled = ProfiledSeconds().install()
    for name, main in [("GRPOTrainer.vLLM.generate", True), ("GRPOTrainer.sync_weights", True),
                       ("GRPOTrainer.vLLM.generate", False), ("GRPOTrainer.reward_digits", True)]:
        with ProfilingContext(name=name, report_to=[], is_main_process=main):
            time.sleep(0.05)
    taken = profiled.take()
    assert set(taken) == {"generation_s", "weight_sync_s"}
    assert 0.05 <= taken["generation_s"] < 0.1, "one main-process generation, not the other rank's"
    assert 0.05 <= taken["weight_sync_s"] < 0.1
    assert profiled.take() == {}, "each log takes the seconds since the previous one"


def test_the_colocated_callback_logs_generation_time_and_completion_token_rates(tmp_path):
    profiled = ProfiledSeconds()
    callback = RunFolderCallback(str(tmp_path), adapter_every=1000, flush_every_s=0, profiled=profiled)
    args = TrainingArguments(output_dir=str(tmp_path / "out"), report_to="none", per_device_train_batch_size=8)
    state, control = TrainerState(max_steps=2), TrainerControl()
    callback.on_train_begin(args, state, control)
    callback.last_log = (time.time() - 2.0, None)   # two seconds since the start
    profiled.totals["GRPOTrainer.vLLM.generate"] = 0.5
    state.global_step = 2
    callback.on_log(args, state, control, logs={"reward": 0.1, "completions/mean_length": 100.0})
    [record] = [json.loads(line) for name in sorted(os.listdir(tmp_path / layout.METRICS_DIR))
                for line in Path(tmp_path, layout.METRICS_DIR, name).read_text().splitlines()]
    assert record["generation_s"] == 0.5 and "weight_sync_s" not in record
    # two steps of 8 completions x 100 tokens in ~2 s of wall clock
    assert 750 < record["gen_tokens_per_s"] < 810 and record["train_tokens_per_s"] == record["gen_tokens_per_s"]
