"""First contact waits like an operator: a server slow to answer /server_info (a fresh vLLM server collects its
environment then: 21.7 and 25.5 s seen at load 21) is asked once however many callers wait on it, is not marked down
for it, and the trainer waits for the answer until its start deadline (runtime/serving/server_info.py)."""

import json
import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import requests

from backend.runtime.serving.proxy import start_proxy
from tests.fakehub import wait_until

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SLOW_S = 40.0                # past the proxy's former 30 s, as the case
pytestmark = [pytest.mark.integration, pytest.mark.full]    # tier 2: 40-s answers and real trainers, minutes


class SlowInfo:
    """A loopback server answering /server_info after `delay_s`; every other request is forwarded to `upstream`
    (a real replica) or, without one, answered as a stand-in vLLM server would (health, models)."""

    def __init__(self, delay_s: float, upstream: str | None = None):
        self.asked = 0
        slow = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _send(self, status: int, body: bytes, kind: str = "application/json"):
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _forward(self, method: str):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0)) if method == "POST" else None
                if self.path.startswith("/server_info"):
                    slow.asked += 1
                    time.sleep(delay_s)
                    if upstream is None:
                        return self._send(200, json.dumps({"vllm_config": {"lora_config": {"max_loras": 3}}}).encode())
                if upstream is None:
                    return self._send(200, b'{"data": []}' if self.path.startswith("/v1/models") else b"{}")
                headers = {k: v for k, v in self.headers.items() if k.lower() in ("authorization", "content-type")}
                reply = requests.request(method, upstream + self.path, data=body, headers=headers, timeout=600)
                self._send(reply.status_code, reply.content, reply.headers.get("Content-Type", "text/plain"))

            def do_GET(self):
                self._forward("GET")

            def do_POST(self):
                self._forward("POST")

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def stop(self):
        self.server.shutdown()
        self.server.server_close()


def test_many_callers_of_a_slow_server_info_share_one_request_and_the_server_stays_up():
    """Three sweep members' trainers asking at once, twice each: one request reaches the server, all are answered."""
    slow = SlowInfo(SLOW_S)
    proxy = start_proxy([slow.url], token="", health_interval_s=0.5)
    try:
        wait_until(lambda: requests.get(f"{proxy.url}/health").status_code == 200, 30, 0.2)

        def ask(_):
            return requests.get(f"{proxy.url}/server_info", params={"config_format": "json"}, timeout=300)

        started = time.monotonic()
        with ThreadPoolExecutor(6) as pool:
            answers = list(pool.map(ask, range(6)))
        took = time.monotonic() - started
        assert [a.status_code for a in answers] == [200] * 6, [a.text for a in answers]
        assert all(a.json()["vllm_config"]["lora_config"]["max_loras"] == 3 for a in answers)
        assert slow.asked == 1 and SLOW_S <= took < SLOW_S + 20, (slow.asked, took)
        assert proxy.stats()["replicas"][0]["healthy"], "a slow answer is not a dead server"
        again = time.monotonic()
        assert ask(0).status_code == 200 and time.monotonic() - again < 5 and slow.asked == 1, "kept"
    finally:
        proxy.stop()
        slow.stop()


def test_the_trainer_waits_for_a_slow_first_answer_and_trains(vllm_pool, tmp_path):
    """The real async trainer against one real replica whose /server_info answers after 40 s."""
    from vllm_replicas import API_KEY, MAX_STALENESS

    from backend.plan.spec import RunSpec
    from backend.runtime.tiny_model import TINY_MODEL

    urls = vllm_pool.ensure_running()
    slow = SlowInfo(SLOW_S, upstream=urls[0])
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    spec = RunSpec(mode="distributed", model=TINY_MODEL, rewards=["digits", "format"], max_steps=2, adapter_every=1,
                   checkpoint_every=100, max_staleness=MAX_STALENESS, replicas=1, per_device_batch_size=8,
                   num_generations=4, max_completion_length=16, max_inflight_tasks=8, queue_maxsize=32,
                   max_tokens_per_batch=512, lora_r=8, name="slow-first-answer").check()
    (run_dir / "spec.json").write_text(spec.to_json())
    env = {**os.environ, "PYTHONPATH": os.path.join(ROOT, "backend"), "VLLM_REPLICA_URLS": slow.url,
           "HF_TOKEN": API_KEY, "TRL_EXPERIMENTAL_SILENCE": "1"}
    try:
        result = subprocess.run([sys.executable, "-m", "runtime.trainer.train_async", "--run-dir", str(run_dir)],
                                env=env, capture_output=True, text=True, timeout=900)
    finally:
        slow.stop()
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-5000:]
    [line] = [x for x in out.splitlines() if x.startswith("/server_info answered in")]
    assert float(line.split()[3]) >= SLOW_S - 5, line
    assert slow.asked == 1, "TRL's own question was answered from the proxy's copy"
    assert (run_dir / "final" / "adapter_config.json").is_file()


BURNERS, BURN_S = 4, 240.0


def _trainer(run_dir, spec, urls: list[str]) -> subprocess.Popen:
    from vllm_replicas import API_KEY

    run_dir.mkdir()
    (run_dir / "spec.json").write_text(spec.to_json())
    env = {**os.environ, "PYTHONPATH": os.path.join(ROOT, "backend"), "VLLM_REPLICA_URLS": ",".join(urls),
           "HF_TOKEN": API_KEY, "TRL_EXPERIMENTAL_SILENCE": "1"}
    log = open(run_dir.parent / f"{run_dir.name}.log", "wb")
    return subprocess.Popen([sys.executable, "-m", "runtime.trainer.train_async", "--run-dir", str(run_dir)], env=env,
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def test_three_sweep_members_on_two_slow_servers_beside_four_cpu_burners_all_start_and_train(vllm_pool, tmp_path):
    """The issue's sweep: three members' trainers (each with its own proxy) start at once against two servers whose
    first /server_info takes 40 s each time it is asked (a fresh vLLM server under load), while four processes burn
    the CPU (bounded: BURN_S). Before, every member died at start on a 503 from its own proxy."""
    from vllm_replicas import MAX_STALENESS

    from backend.plan.spec import RunSpec
    from backend.runtime.tiny_model import TINY_MODEL

    urls = vllm_pool.ensure_running()
    slow = [SlowInfo(SLOW_S, upstream=url) for url in urls]
    burn = f"import time\nend = time.time() + {BURN_S}\nwhile time.time() < end:\n    pass\n"
    burners = [subprocess.Popen([sys.executable, "-c", burn]) for _ in range(BURNERS)]
    trainers = {}
    try:
        for tag in ("m0", "m1", "m2"):
            spec = RunSpec(mode="distributed", model=TINY_MODEL, rewards=["digits", "format"], max_steps=2,
                           adapter_every=1, checkpoint_every=100, max_staleness=MAX_STALENESS, replicas=2,
                           per_device_batch_size=8, num_generations=4, max_completion_length=16, max_inflight_tasks=4,
                           queue_maxsize=32, max_tokens_per_batch=512, lora_r=8, name=f"sweep-{tag}",
                           sweep_id="first-contact", sweep_member=tag).check()
            trainers[tag] = _trainer(tmp_path / tag, spec, [s.url for s in slow])
        for tag, proc in trainers.items():
            code = proc.wait(1200)
            log = (tmp_path / f"{tag}.log").read_text(errors="replace")
            assert code == 0, f"member {tag} failed:\n{log[-4000:]}"
            assert (tmp_path / tag / "final" / "adapter_config.json").is_file(), tag
            assert "/server_info answered in" in log
        assert all(s.asked <= 3 for s in slow), [s.asked for s in slow]    # once per member's proxy at most
    finally:
        for proc in burners:
            proc.kill()
            proc.wait(30)
        for proc in trainers.values():      # each a session of its own: its proxy and rollout worker go with it
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
        for server in slow:
            server.stop()
