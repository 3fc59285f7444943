"""First contact waits like an operator: a server slow to answer /server_info (a fresh vLLM server collects its
environment then: 21.7 and 25.5 s seen at load 21) is asked once however many callers wait on it, is not marked down
for it, and the trainer waits for the answer until its start deadline (runtime/server_info.py)."""

import json
import os
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import requests

from backend.runtime.proxy import start_proxy
from tests.fakehub import wait_until

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SLOW_S = 40.0                # past the proxy's former 30 s, as the case
pytestmark = pytest.mark.integration


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
        result = subprocess.run([sys.executable, "-m", "runtime.train_async", "--run-dir", str(run_dir)], env=env,
                                capture_output=True, text=True, timeout=900)
    finally:
        slow.stop()
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-5000:]
    [line] = [x for x in out.splitlines() if x.startswith("/server_info answered in")]
    assert float(line.split()[3]) >= SLOW_S - 5, line
    assert slow.asked == 1, "TRL's own question was answered from the proxy's copy"
    assert (run_dir / "final" / "adapter_config.json").is_file()
