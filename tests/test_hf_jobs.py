"""Running on Hugging Face Jobs: the real huggingface_hub client against a loopback fake of the Hub.

Run: python -m pytest tests/test_hf_jobs.py -q
"""

import json
from dataclasses import replace

import pytest
from huggingface_hub import HfApi

from backend.executors.base import SubmitError
from backend.executors.hf_jobs import HfJobsExecutor
from backend.plan.hardware import estimate_cost, list_flavors
from backend.plan.jobspec import LABEL_APP, LABEL_ROLE, LABEL_RUN, JobSpec, JobStatus, VolumeSpec
from backend.runs.access import Deployment, Visitor, acting_token
from backend.runs.hub_auth import can_control, whoami_namespaces
from backend.storage.hub_store import HubBucketStore, open_store
from backend.storage.store import FolderStore
from tests.fakehub import wait_until

pytestmark = pytest.mark.unit

BUCKET = "alice/grpo-runs"
PLANTED = "hf_" + "QwErTyUiOpAsDfGhJkLzXcVbNmQwErTyUi"   # token-shaped: hf_ + 34 letters


@pytest.fixture
def executor(hub):
    executor = HfJobsExecutor(hub.token, "alice", reconnect_delay_s=0.2)
    yield executor
    executor.stop()


def labels(run_id: str, role: str) -> dict[str, str]:
    return {LABEL_APP: "1", LABEL_RUN: run_id, LABEL_ROLE: role}


def replica_job(run_id: str = "run-1") -> JobSpec:
    return JobSpec(run_id=run_id, role="vllm-0", image="vllm/vllm-openai:v0.31.0",
                   command=["bash", "-c", "exec python -m vllm.entrypoints.openai.api_server"],
                   flavor="l4x1", timeout_s=5400, env={"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "1"},
                   secrets=("HF_TOKEN",), volumes=(VolumeSpec(BUCKET, "/bucket", read_only=True),),
                   expose=(8000,), labels=labels(run_id, "vllm-0"), namespace="alice")


def trainer_job(run_id: str = "run-1", flavor: str = "a10g-small") -> JobSpec:
    return JobSpec(run_id=run_id, role="trainer", image="vllm/vllm-openai:v0.31.0",
                   command=["bash", "-c", "exec python -m runtime.trainer.train_async"], flavor=flavor,
                   timeout_s=3600, env={"PYTHONUNBUFFERED": "1"}, secrets=("HF_TOKEN",),
                   volumes=(VolumeSpec(BUCKET, "/bucket"),), labels=labels(run_id, "trainer"),
                   namespace="alice")


def read_all(executor: HfJobsExecutor, job_id: str, count: int, timeout: float = 15.0) -> list[str]:
    """Poll read_logs from cursor 0 the way the panel does, until `count` lines have arrived."""
    lines: list[str] = []
    cursor = 0

    def arrived() -> bool:
        nonlocal cursor
        new, cursor = executor.read_logs(job_id, cursor)
        lines.extend(new)
        return len(lines) >= count

    wait_until(arrived, timeout)
    return lines


# ---- submission

def test_submit_sends_exact_job_bodies(hub, executor):
    secrets = {"HF_TOKEN": hub.token}
    replica_id = executor.submit(replica_job(), secrets)
    trainer_id = executor.submit(trainer_job(), secrets)

    replica_body, trainer_body = (r.json for r in hub.job_posts())
    assert replica_body == {
        "dockerImage": "vllm/vllm-openai:v0.31.0",
        "command": ["bash", "-c", "exec python -m vllm.entrypoints.openai.api_server"],
        "arguments": [],
        "environment": {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "1"},
        "secrets": {"HF_TOKEN": hub.token},
        "flavor": "l4x1",
        "timeoutSeconds": 5400,
        "labels": {**labels("run-1", "vllm-0"), "name": "run-1-vllm-0"},
        "volumes": [{"type": "bucket", "source": BUCKET, "mountPath": "/bucket", "readOnly": True}],
        "expose": {"ports": [8000], "portsPublic": []},
    }
    assert trainer_body == {
        "dockerImage": "vllm/vllm-openai:v0.31.0",
        "command": ["bash", "-c", "exec python -m runtime.trainer.train_async"],
        "arguments": [],
        "environment": {"PYTHONUNBUFFERED": "1"},
        "secrets": {"HF_TOKEN": hub.token},
        "flavor": "a10g-small",
        "timeoutSeconds": 3600,
        "labels": {**labels("run-1", "trainer"), "name": "run-1-trainer"},
        "volumes": [{"type": "bucket", "source": BUCKET, "mountPath": "/bucket", "readOnly": False}],
    }
    for body in (replica_body, trainer_body):
        assert hub.token not in json.dumps({k: v for k, v in body.items() if k != "secrets"})
    assert {r.path for r in hub.job_posts()} == {"/api/jobs/alice"}
    assert all(r.user == "alice" for r in hub.requests if r.path.startswith("/api/jobs"))
    assert not any(r.path == "/api/whoami-v2" for r in hub.requests)   # namespace is always passed
    assert executor.status(replica_id) == JobStatus("SCHEDULING")
    hub.set_stage(trainer_id, "RUNNING")
    assert executor.status(trainer_id) == JobStatus("RUNNING")
    assert executor.exposed_url(replica_id, 8000) == f"https://{replica_id}--8000.hf.jobs"


def test_submission_refused_by_the_hub_raises_submit_error(hub, executor):
    hub.fail_nth_post(1, status=500)
    with pytest.raises(SubmitError, match=r"trainer job of run run-1 .*HTTP 500"):
        executor.submit(trainer_job(), {"HF_TOKEN": hub.token})
    elsewhere = HfJobsExecutor(hub.token, "bob")
    with pytest.raises(SubmitError, match="HTTP 403"):
        elsewhere.submit(replace(trainer_job(), namespace=None), {"HF_TOKEN": hub.token})
    assert hub.jobs == {}


def test_missing_secret_value_is_refused_before_any_request(hub, executor):
    with pytest.raises(SubmitError, match="HF_TOKEN"):
        executor.submit(trainer_job(), {})
    assert hub.job_posts() == []


def test_cancel_stops_the_job(hub, executor):
    job_id = executor.submit(trainer_job(), {"HF_TOKEN": hub.token})
    hub.set_stage(job_id, "RUNNING")
    executor.cancel(job_id)
    assert executor.status(job_id).stage == "CANCELED"
    assert executor.status(job_id).done
    assert any(r.method == "POST" and r.path == f"/api/jobs/alice/{job_id}/cancel" for r in hub.requests)


def test_failed_second_submission_cancels_first(hub, executor):
    from backend.runs.launch import LaunchError, submit_jobs

    hub.fail_nth_post(2, status=500)
    with pytest.raises(LaunchError):
        submit_jobs(executor, [replica_job(), trainer_job()], {"HF_TOKEN": hub.token})
    (first,) = hub.jobs.values()
    assert first.spec["labels"][LABEL_ROLE] == "vllm-0"
    assert first.stage == "CANCELED"
    posts = [r.path for r in hub.requests if r.method == "POST"]
    assert posts == ["/api/jobs/alice", "/api/jobs/alice", f"/api/jobs/alice/{first.id}/cancel"]


# ---- logs

def test_logs_survive_dropped_streams_without_loss_or_duplicates(hub, executor):
    job_id = executor.submit(trainer_job(), {"HF_TOKEN": hub.token})
    hub.set_stage(job_id, "RUNNING")
    expected = [f"step {i}" for i in range(15)]
    hub.append_logs(job_id, *expected[:5])
    assert read_all(executor, job_id, 5) == expected[:5]

    # 1) a cut mid-stream: huggingface_hub reconnects inside fetch_job_logs and skips the replay itself.
    hub.drop_log_streams(job_id)
    hub.append_logs(job_id, *expected[5:10])
    wait_until(lambda: len(executor.read_logs(job_id, 0)[0]) >= 10)
    # 2) a cut, then the log service refuses twice: fetch_job_logs raises, the executor opens a new
    #    stream, which replays the whole log from line one.
    hub.drop_log_streams(job_id, refuse_next=2, status=503)
    hub.append_logs(job_id, *expected[10:])
    wait_until(lambda: len(executor.read_logs(job_id, 0)[0]) >= 15)
    hub.set_stage(job_id, "COMPLETED")
    wait_until(lambda: hub.open_streams(job_id, "logs") == 0)

    lines, cursor = executor.read_logs(job_id, 0)
    assert lines == expected                          # in order, none lost, none twice, no "Job started" banner
    assert cursor == 15
    assert executor.read_logs(job_id, cursor) == ([], 15)
    log_gets = [r for r in hub.requests if r.path == f"/api/jobs/alice/{job_id}/logs"]
    assert len(log_gets) >= 5                          # 1 + library retry + 2 refused + executor reconnect


def test_tokens_in_job_output_never_reach_read_logs(hub, executor):
    job_id = executor.submit(trainer_job(), {"HF_TOKEN": hub.token})
    wandb = replace(trainer_job(), role="logger", secrets=("HF_TOKEN", "WANDB_API_KEY"))
    wandb_id = executor.submit(wandb, {"HF_TOKEN": hub.token, "WANDB_API_KEY": "wandb-key-0123456789"})
    hub.set_stage(job_id, "RUNNING")
    hub.append_logs(job_id, f"export HF_TOKEN={PLANTED}", f"whoami with {hub.token} ok",
                    f"Authorization: Bearer {PLANTED}", "step 1 reward 0.5")
    lines = read_all(executor, job_id, 4)
    hub.set_stage(wandb_id, "RUNNING")
    hub.append_logs(wandb_id, "wandb: key=wandb-key-0123456789")
    other = read_all(executor, wandb_id, 1)

    text = "\n".join(lines + other)
    assert PLANTED not in text and hub.token not in text and "wandb-key-0123456789" not in text
    assert lines[0] == "export HF_TOKEN=hf_***"
    assert lines[3] == "step 1 reward 0.5"


# ---- run list, resources

def test_fresh_executor_rebuilds_the_run_list_from_labels(hub, executor):
    hub.page_size = 2                                  # the list spans pages: follow the Link header
    secrets = {"HF_TOKEN": hub.token}
    launched = {executor.submit(replica_job("run-a"), secrets): ("run-a", "vllm-0"),
                executor.submit(trainer_job("run-a"), secrets): ("run-a", "trainer"),
                executor.submit(trainer_job("run-b"), secrets): ("run-b", "trainer")}
    HfApi(token=hub.token).run_job(image="python:3.12", command=["true"], namespace="alice",
                                   labels={"team": "other"})   # not ours: must not be listed

    restarted = HfJobsExecutor(hub.token, "alice", reconnect_delay_s=0.2)
    try:
        records = restarted.list_jobs()
        assert {r.job_id: (r.run_id, r.role) for r in records} == launched
        assert [r.created_at for r in records] == sorted((r.created_at for r in records), reverse=True)
        assert {r.flavor for r in records} == {"l4x1", "a10g-small"}
        assert all(r.stage == "SCHEDULING" and r.url.endswith(r.job_id) for r in records)
        listing = [r for r in hub.requests if r.method == "GET" and r.path == "/api/jobs/alice"]
        assert listing[0].query["label"] == [f"{LABEL_APP}=1"]
        assert len(listing) == 2

        finished = next(r.job_id for r in records if r.run_id == "run-b")
        hub.set_stage(finished, "RUNNING")
        hub.append_logs(finished, "reward 0.1", "reward 0.9")
        hub.set_stage(finished, "COMPLETED")
        assert read_all(restarted, finished, 2) == ["reward 0.1", "reward 0.9"]   # a finished job's log replays
    finally:
        restarted.stop()


def test_gpu_metrics_come_back_as_resource_samples(hub, executor):
    job_id = executor.submit(trainer_job(flavor="l4x4"), {"HF_TOKEN": hub.token})
    hub.set_stage(job_id, "RUNNING")
    assert executor.read_resources(job_id, 0) == ([], 0)
    wait_until(lambda: hub.open_streams(job_id, "metrics") == 1)
    gpu = {"utilization": 87, "memory_used_bytes": 20_000_000_000, "memory_total_bytes": 24_000_000_000}
    idle = {"utilization": 3, "memory_used_bytes": 1_000_000, "memory_total_bytes": 24_000_000_000}
    hub.append_metrics(job_id,
                       {"cpu_usage_pct": 41, "cpu_millicores": 8000, "memory_used_bytes": 5_000_000,
                        "memory_total_bytes": 30_000_000_000, "rx_bps": 0, "tx_bps": 0,
                        "gpus": {"f00d": idle, "beef": gpu}, "replica": "57vr7"},
                       {"cpu_usage_pct": 40, "memory_used_bytes": 6_000_000, "gpus": {"f00d": gpu, "beef": gpu}})
    samples = wait_until(lambda: (s := executor.read_resources(job_id, 0)[0]) and len(s) == 2 and s)

    first, second = samples
    assert first.gpu_util == (87.0, 3.0)              # ordered by GPU id: "beef" before "f00d"
    assert first.gpu_mem_bytes == (20_000_000_000, 1_000_000)
    assert first.gpu_mem_total_bytes == (24_000_000_000, 24_000_000_000)
    assert (first.cpu_percent, first.ram_bytes) == (41, 5_000_000)
    assert second.gpu_util == (87.0, 87.0) and second.time >= first.time
    assert executor.read_resources(job_id, 2) == ([], 2)
    hub.set_stage(job_id, "COMPLETED")
    wait_until(lambda: hub.open_streams(job_id, "metrics") == 0)


# ---- bucket store

@pytest.mark.parametrize("where", ["hub", "folder"])
def test_a_folder_is_deleted_whole_and_only_it_and_never_the_bucket_root(hub, tmp_path, where):
    store = HubBucketStore(BUCKET, hub.token, cache_dir=str(tmp_path / "cache")) if where == "hub" else \
        FolderStore(str(tmp_path / "bucket"))
    store.ensure_bucket()
    for path in ("checks/c1/code/runtime/a.py", "checks/c1/request.json", "checks/c10/request.json", "runs/r/x"):
        store.write_bytes(path, b"{}")
    store.delete_folder("checks/c1")
    assert [f.path for f in store.list_files("")] == ["checks/c10/request.json", "runs/r/x"]
    for root in ("", "/", "."):
        with pytest.raises(ValueError, match="whole bucket"):
            store.delete_folder(root)
    assert len(store.list_files("")) == 2


def test_hub_store_lists_and_reads_incrementally(hub, tmp_path):
    store = HubBucketStore(BUCKET, hub.token, cache_dir=str(tmp_path / "cache"))
    store.ensure_bucket()
    store.ensure_bucket()                              # exists: the Hub answers 409 with the bucket's url
    creates = [r for r in hub.requests if r.method == "POST" and r.path == f"/api/buckets/{BUCKET}"]
    assert [r.json for r in creates] == [{"visibility": "private"}] * 2

    metrics = "runs/r1/metrics"
    store.write_bytes(f"{metrics}/trainer-000000.jsonl", b'{"step": 1}\n')
    store.write_bytes(f"{metrics}/trainer-000001.jsonl", b'{"step": 2}\n')
    hub.put_file(BUCKET, "runs/r10/spec.json", b"{}")  # shares the string prefix "runs/r1"
    files = store.list_files("runs/r1")
    assert [(f.path, f.size) for f in files] == [(f"{metrics}/trainer-000000.jsonl", 12),
                                                 (f"{metrics}/trainer-000001.jsonl", 12)]
    assert store.read_bytes(files[0].path) == b'{"step": 1}\n'
    assert store.read_bytes(files[0].path, start=2) == b'step": 1}\n'
    assert store.read_bytes(files[1].path) == b'{"step": 2}\n'

    store.write_bytes(f"{metrics}/trainer-000002.jsonl", b'{"step": 3}\n')
    files = store.list_files(metrics)
    assert len(files) == 3
    assert [store.read_bytes(f.path) for f in files][-1] == b'{"step": 3}\n'
    downloads = [path for op, _bucket, path in hub.transfers if op == "download"]
    assert downloads == [f"{metrics}/trainer-00000{i}.jsonl" for i in range(3)]   # each file once
    tree = [r for r in hub.requests if "/tree" in r.path]
    assert tree[0].path == f"/api/buckets/{BUCKET}/tree/runs/r1" and tree[0].query["recursive"] == ["true"]


def test_a_first_look_at_a_run_on_the_hub_downloads_its_fragments_in_batches(hub, tmp_path, monkeypatch):
    """A long run's fragments come down a batch per call, not one call each: its newest ones at once, its history
    in the background, and new fragments found by a probe together."""
    from huggingface_hub import HfApi

    from backend.runtime.layout import fragment_name
    from backend.storage.observers import FragmentReader

    store = HubBucketStore(BUCKET, hub.token, cache_dir=str(tmp_path / "cache"))
    store.ensure_bucket()
    metrics = "runs/r1/metrics"
    for seq in range(150):
        hub.put_file(BUCKET, f"{metrics}/{fragment_name('trainer', seq)}", b'{"step": %d}\n' % (seq + 1))
    calls = []
    fake = HfApi.download_bucket_files

    def counted(api, bucket_id, files, **kw):
        calls.append(len(files))
        return fake(api, bucket_id, files, **kw)

    monkeypatch.setattr(HfApi, "download_bucket_files", counted)
    clock = [0.0]
    reader = FragmentReader(store, metrics, clock=lambda: clock[0], defer={"trainer": 100})
    assert [r["step"] for _, r in reader.read()] == list(range(51, 151)) and calls == [100]
    history = [r["step"] for batch in reader.read_deferred(reader.deferred) for _, r in batch]
    assert history == list(range(1, 51)) and calls == [100, 50]
    for seq in (150, 151):
        hub.put_file(BUCKET, f"{metrics}/{fragment_name('trainer', seq)}", b'{"step": %d}\n' % (seq + 1))
    clock[0] = 1.0                                     # before the next listing: the next numbers are probed
    assert [r["step"] for _, r in reader.read()] == [151, 152] and calls == [100, 50, 2]


def test_hub_store_reads_a_file_it_has_not_listed(hub, tmp_path):
    HubBucketStore(BUCKET, hub.token, cache_dir=str(tmp_path / "other")).ensure_bucket()
    hub.put_file(BUCKET, "runs/r1/spec.json", b'{"mode": "distributed"}')   # written by a job
    store = HubBucketStore(BUCKET, hub.token, cache_dir=str(tmp_path / "cache"))
    assert store.read_bytes("runs/r1/spec.json") == b'{"mode": "distributed"}'
    assert [r.json for r in hub.requests if r.path.endswith("/paths-info")] == [{"paths": ["runs/r1/spec.json"]}]
    with pytest.raises(FileNotFoundError, match="runs/r1/missing.json"):
        store.read_bytes("runs/r1/missing.json")


def test_hub_store_round_trips_a_folder(hub, tmp_path):
    source = tmp_path / "code"
    (source / "runtime" / "__pycache__").mkdir(parents=True)
    (source / "runtime" / "train.py").write_text("print('train')\n")
    (source / "runtime" / "__pycache__" / "train.cpython-311.pyc").write_bytes(b"\0")
    (source / "README.md").write_text("code of run r1\n")
    store = HubBucketStore(BUCKET, hub.token, cache_dir=str(tmp_path / "cache"))
    store.ensure_bucket()
    store.upload_folder(str(source), "runs/r1/code")
    assert sorted(hub.buckets[BUCKET].files) == ["runs/r1/code/README.md", "runs/r1/code/runtime/train.py"]

    assert store.read_bytes("runs/r1/code/runtime/train.py") == b"print('train')\n"


def test_open_store_prefers_a_mounted_bucket(tmp_path):
    cache = str(tmp_path / "cache")
    assert isinstance(open_store(BUCKET, None, f"{BUCKET}:{tmp_path}", cache), FolderStore)
    assert isinstance(open_store("bob/other", None, f"{BUCKET}:{tmp_path}", cache), HubBucketStore), "another bucket"
    assert isinstance(open_store(BUCKET, None, f"{BUCKET}:{tmp_path / 'not-mounted'}", cache), HubBucketStore)
    assert isinstance(open_store(BUCKET, None, None, cache), HubBucketStore)


# ---- hardware and auth

def test_hardware_falls_back_when_the_endpoint_fails(hub):
    hub.hardware_error = 500
    fallback = list_flavors(hub.token)
    assert fallback and all(f.fallback for f in fallback)
    assert {"cpu-basic", "t4-small", "l4x1", "a10g-small", "a100-large"} <= {f.name for f in fallback}

    hub.hardware_error = None
    live = {f.name: f for f in list_flavors(HfApi(token=hub.token))}
    assert not any(f.fallback for f in live.values())
    assert live["a10g-small"].price_per_hour_usd == pytest.approx(1.0, abs=0.001)
    assert (live["l4x4"].gpus, live["cpu-basic"].gpus) == (4, 0)

    cost = estimate_cost([trainer_job(), replica_job()], list(live.values()))
    assert cost == pytest.approx(1.0 * 1.0 + 0.8 * 1.5, abs=0.01)   # $/h x timeout hours
    with pytest.raises(ValueError, match="h100"):
        estimate_cost([trainer_job(flavor="h100")], list(live.values()))


def test_the_space_never_lends_its_own_token_to_a_visitor(hub, monkeypatch, tmp_path):
    monkeypatch.setenv("HF_TOKEN", hub.token)          # the Space's own token must never be lent out
    space = Deployment(home=str(tmp_path), on_space=True)
    assert acting_token(Visitor(), space) is None
    assert acting_token(Visitor(token="hf_oauth_visitorToken0000000000"), space) == "hf_oauth_visitorToken0000000000"
    assert acting_token(Visitor(), Deployment(home=str(tmp_path), on_space=False, host="127.0.0.1")) == hub.token
    ok, reason = can_control("alice", None, on_space=True)
    assert not ok and "Sign in" in reason


def test_visitor_controls_only_namespaces_they_can_write(hub):
    token = hub.token
    assert whoami_namespaces(token) == {"alice", "acme", "readers"}
    assert can_control("alice", token, on_space=True) == (True, "")
    assert can_control("acme", token, on_space=True) == (True, "")
    ok, reason = can_control("readers", token, on_space=True)
    assert not ok and "read-only" in reason
    ok, reason = can_control("bob", token, on_space=True)
    assert not ok and "alice" in reason
    ok, _ = can_control("alice", "hf_" + "notARealTokenAtAll000", on_space=True)
    assert not ok
