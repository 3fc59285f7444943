"""The panel on Hugging Face Jobs, end to end through its handlers, against the loopback fake of the Hub."""

import json
import os
import zipfile

import pytest

from backend.jobspec import LABEL_RUN
from panel import dashboard
from panel.actions import Panel, Settings, full_log_file
from tests.fakehub import FakeHub, wait_until

PLANTED = "hf_" + "PlAnTeDtOkEnPlAnTeDtOkEnPlAnTeDtOk"
FORM = {"executor": "hf_jobs", "model": "Qwen/Qwen2.5-0.5B-Instruct", "dataset": "trl-lib/DeepMath-103K",
        "bucket": "alice/grpo-runs", "flavor": "a10g-small", "use_vllm": True, "rewards": ["format"]}


@pytest.fixture
def hub(monkeypatch):
    hub = FakeHub().start()
    hub.patch_endpoint(monkeypatch)
    hub.install_bucket_transfers(monkeypatch)
    monkeypatch.setenv("HF_TOKEN", hub.token)
    yield hub
    hub.stop()


def _panel(tmp_path, on_space=False) -> Panel:
    return Panel(Settings(home=str(tmp_path / "home"), on_space=on_space))


def _stop(panel: Panel) -> None:
    for registry in panel._hub_registries.values():
        registry.executor.stop()
    panel.shutdown()


def test_launch_a_colocated_run_and_watch_logs_gpus_and_metrics(hub, tmp_path):
    panel = _panel(tmp_path)
    try:
        message, run_id = panel.launch(FORM)
        assert run_id is None and "Estimated cost" in message and hub.job_posts() == [], "confirm first"
        message, run_id = panel.launch(FORM, confirmed=True)
        assert run_id, message
        [post] = hub.job_posts()
        body = post.json
        assert body["flavor"] == "a10g-small" and body["timeoutSeconds"] == 30 * 60
        assert body["labels"][LABEL_RUN] == run_id
        assert [v["mountPath"] for v in body["volumes"]] == ["/bucket"]
        assert "HF_TOKEN" in body["secrets"] and "HF_TOKEN" not in (body.get("environment") or {})
        assert hub.token not in json.dumps(body.get("environment")) and hub.token not in json.dumps(body["command"])
        spec_json = hub.buckets["alice/grpo-runs"].files[f"runs/{run_id}/spec.json"].data.decode()
        assert hub.token not in spec_json and json.loads(spec_json)["run_id"] == run_id
        assert f"runs/{run_id}/code/runtime/train.py" in hub.buckets["alice/grpo-runs"].files

        job_id = panel.view(run_id).jobs["trainer"].job_id
        hub.set_stage(job_id, "RUNNING")
        hub.append_logs(job_id, "generation engine: vLLM colocated", f"HF_TOKEN={PLANTED} leaked by a user script",
                        "step 1/500 reward 0.10")
        hub.append_metrics(job_id, {"cpu_usage_pct": 50.0, "memory_used_bytes": 2**30, "gpus": {
            "GPU-a": {"utilization": 87.0, "memory_used_bytes": 20 * 2**30, "memory_total_bytes": 24 * 2**30}}})
        records = [{"step": 1, "time": 1.0, "reward": 0.1, "reward_std": 0.05}, {"step": 2, "time": 2.0, "reward": 0.3}]
        hub.put_file("alice/grpo-runs", f"runs/{run_id}/metrics/trainer-000000.jsonl",
                     "".join(json.dumps(r) + "\n" for r in records).encode())

        view = panel.view(run_id)
        trainer = view.jobs["trainer"]

        def everything_arrived() -> bool:
            view.refresh()
            return len(trainer.logs) >= 3 and bool(trainer.resources) and len(view.metrics) == 2

        wait_until(everything_arrived, timeout=15)
        assert [r["reward"] for r in view.metrics] == [0.1, 0.3]
        frame = dashboard.build_frame(view)
        gpu = [t for t in frame.utilisation.data if t.name == "trainer GPU0 util"]
        assert gpu and list(gpu[0].y) == [87.0]
        logs = dashboard.log_text(view, "trainer")
        assert "step 1/500" in logs and PLANTED not in logs and hub.token not in logs
        assert "RUNNING" in frame.status

        # The full-log download is redacted too, and repeated downloads replace one file instead of piling up.
        log_path = full_log_file(panel, run_id, "trainer")
        text = open(log_path).read()
        assert "step 1/500" in text and PLANTED not in text and hub.token not in text
        assert full_log_file(panel, run_id, "trainer") == log_path
        assert panel.final_adapter(run_id) is None, "no final adapter yet"
        for name, data in [("adapter_config.json", b'{"r": 8}'), ("adapter_model.safetensors", b"weights")]:
            hub.put_file("alice/grpo-runs", f"runs/{run_id}/final/{name}", data)
        zip_path = panel.final_adapter(run_id)
        with zipfile.ZipFile(zip_path) as zf:
            assert zf.read("adapter_config.json") == b'{"r": 8}' and zf.read("adapter_model.safetensors") == b"weights"
        assert sorted(os.listdir(panel.downloads)) == sorted(map(os.path.basename, [log_path, zip_path]))
    finally:
        _stop(panel)

    restarted = _panel(tmp_path)
    try:
        assert run_id in [row[0] for row in restarted.runs_table()], "a restarted panel lists the run"
        assert restarted.view(run_id).jobs["trainer"].job_id == job_id
    finally:
        _stop(restarted)


def test_anonymous_space_visitor_cannot_launch_or_cancel_on_hf_jobs(hub, tmp_path):
    panel = _panel(tmp_path, on_space=True)
    try:
        message, run_id = panel.launch(FORM, confirmed=True)
        assert run_id is None and "Not launched" in message
        assert hub.job_posts() == []
    finally:
        _stop(panel)


def test_a_visitor_cannot_launch_into_a_namespace_they_do_not_own(hub, tmp_path):
    panel = _panel(tmp_path, on_space=True)
    try:
        message, run_id = panel.launch({**FORM, "bucket": "someone-else/runs"}, oauth_token=hub.token, confirmed=True)
        assert run_id is None and "Not launched" in message
        assert hub.job_posts() == []
    finally:
        _stop(panel)


def test_unknown_hardware_is_refused_with_the_valid_flavors(hub, tmp_path):
    panel = _panel(tmp_path)
    try:
        message, run_id = panel.launch({**FORM, "flavor": "quantum-xl"}, confirmed=True)
        assert run_id is None and "quantum-xl" in message and "a10g-small" in message
        assert hub.job_posts() == []
    finally:
        _stop(panel)


def test_a_failed_second_submission_cancels_the_first_and_says_so(hub, tmp_path):
    panel = _panel(tmp_path)
    try:
        hub.fail_nth_job_submission(2)
        form = {**FORM, "mode": "distributed", "replicas": 2, "vllm_flavor": "l4x1"}
        message, run_id = panel.launch(form, confirmed=True)
        assert run_id is None and "Cancelled the 1 job(s) already submitted" in message
        [first] = [r for r in hub.requests if r.method == "POST" and r.path.endswith("/cancel")]
        assert first.path.startswith("/api/jobs/alice/")
    finally:
        _stop(panel)


def test_parallelism_larger_than_the_flavor_is_refused(hub, tmp_path):
    panel = _panel(tmp_path)
    try:
        message, run_id = panel.launch({**FORM, "num_processes": 4, "per_device_batch_size": 8}, confirmed=True)
        assert run_id is None and "has 1 GPU(s)" in message and hub.job_posts() == []
    finally:
        _stop(panel)


def test_a_visitor_sees_only_runs_in_their_own_namespaces(tmp_path, monkeypatch):
    from tests.fakehub import FakeUser

    hub = FakeHub(users={"hf_alice_token_0000000000": FakeUser("alice"), "hf_bob_token_00000000000": FakeUser("bob")})
    hub.start()
    hub.patch_endpoint(monkeypatch)
    hub.install_bucket_transfers(monkeypatch)
    panel = _panel(tmp_path, on_space=True)
    try:
        _, run_id = panel.launch(FORM, oauth_token="hf_alice_token_0000000000", confirmed=True)
        assert run_id and panel.view(run_id, "hf_alice_token_0000000000").run_id == run_id
        assert run_id not in [row[0] for row in panel.runs_table("hf_bob_token_00000000000")]
        with pytest.raises(KeyError):
            panel.view(run_id, "hf_bob_token_00000000000")
        assert "Not cancelled" in panel.cancel(run_id, "hf_bob_token_00000000000")
        assert "Not cancelled" in panel.cancel(run_id, None)
    finally:
        _stop(panel)
        hub.stop()


def test_an_idle_visitors_registry_is_dropped_and_rebuilt_on_their_return(tmp_path, monkeypatch):
    from tests.fakehub import FakeUser

    alice, bob = "hf_alice_token_0000000000", "hf_bob_token_00000000000"
    hub = FakeHub(users={alice: FakeUser("alice"), bob: FakeUser("bob")})
    hub.start()
    hub.patch_endpoint(monkeypatch)
    hub.install_bucket_transfers(monkeypatch)
    panel = _panel(tmp_path, on_space=True)
    try:
        _, run_id = panel.launch(FORM, oauth_token=alice, confirmed=True)
        assert run_id
        view = panel.view(run_id, alice)
        view.refresh()                                  # starts alice's log reader
        old = panel._run_registry[run_id]
        assert old.executor._feeds, "a log reader runs for alice's job"

        panel.settings.registry_idle_s = 0.0            # everything not used this instant is idle
        panel.runs_table(bob)                           # bob's visit sweeps alice's registry away
        assert old not in panel._hub_registries.values() and run_id not in panel._run_registry
        assert old.executor._stopping.is_set(), "the dropped registry's log readers are told to stop"
        assert len(panel._hub_registries) == 1, "only bob's registry is held"

        panel.settings.registry_idle_s = 3600.0
        assert panel.view(run_id, alice).run_id == run_id, "alice's run comes back from the Hub's job list"
        assert panel._run_registry[run_id] is not old
    finally:
        _stop(panel)
        hub.stop()


def test_the_same_form_launches_a_distributed_run_on_hf_jobs(hub, tmp_path):
    panel = _panel(tmp_path)
    try:
        form = {**FORM, "mode": "distributed", "replicas": 2, "vllm_flavor": "l4x4", "max_staleness": 2}
        message, run_id = panel.launch(form, confirmed=True)
        assert run_id, message
        replicas, trainer = hub.job_posts()[:2], hub.job_posts()[2]
        assert [p.json["labels"]["grpo-panel-role"] for p in hub.job_posts()] == ["vllm-0", "vllm-1", "trainer"]
        for post in replicas:
            body = post.json
            assert body["flavor"] == "l4x4" and body["expose"]["ports"] == [8000]
            assert [(v["mountPath"], v["readOnly"]) for v in body["volumes"]] == [("/bucket", True)]
            assert "--max-loras 4" in body["command"][-1] and "runtime.serve_replica" in body["command"][-1]
        replica_ids = [panel.view(run_id).jobs[f"vllm-{i}"].job_id for i in range(2)]
        urls = trainer.json["environment"]["VLLM_REPLICA_URLS"].split(",")
        assert urls == [f"https://{job_id}--8000.hf.jobs" for job_id in replica_ids]
        assert [(v["mountPath"], v.get("readOnly", False)) for v in trainer.json["volumes"]] == [("/bucket", False)]
        assert "runtime.train_async" in trainer.json["command"][-1]
    finally:
        _stop(panel)
