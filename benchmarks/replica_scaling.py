"""Do replicas scale? One vLLM replica's generation rate against requests in flight, what bounds it, and two
replicas against one through the proxy.

    python benchmarks/replica_scaling.py [--gpus 0 0] [--model builtin:bench-qwen2.5-0.5b] [--rounds 2]
                                         [--sweep 16 64 128 256 384 512] [--lengths 128 1024] [--profile DIR]

Starts two replicas as the recipe starts them (LoRA slots, `--logprobs-mode processed_logprobs`, vLLM's own
generation config), each on a GPU of `--gpus` (the same GPU twice: they time-share it, each with a fixed KV
cache) or, without `--gpus`, on CPU cores of their own (a smoke test). Every measurement keeps exactly C
requests in flight, waits `--ramp` seconds, then reads the replicas' own counters over `--window` seconds:
generated tokens/s (`vllm:generation_tokens`), engine steps/s (`vllm:iteration_tokens_total`), requests running,
the CPU each replica process used (its busiest thread too) and the GPU's utilisation. Each request has a prompt
of its own (random ids, a fresh seed per measurement), `ignore_eos`, so every completion runs to its length.
Measurements compared with each other run interleaved in rounds (which goes first alternates), min and median.

1. Sweep: one replica, straight, base model, plain sampling (the table in the issue), at each C and length.
2. What TRL sends, at C = 128 and 256, added one at a time: the adapter as model, `logprobs: 0` +
   `return_token_ids`, then a seed per request (TRL 1.16's AsyncRolloutWorker body: vLLM samples a seeded
   request with its own generator, one at a time). With `--profile`, py-spy records both processes of the
   replica (API server, engine core) during the first round at 256 for the plain and the TRL body.
3. Two replicas against one through the proxy at C = 128 and 384 (TRL's body), and the same split made by the
   client straight to both replicas (no proxy). Two replicas on one GPU time-share it: a partial datum only.
Prints a table per part and writes every figure to `--json`. Asserts nothing: it measures.
"""

import argparse
import asyncio
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import aiohttp
import psutil
import requests

sys.path[:0] = [os.path.dirname(os.path.dirname(os.path.abspath(__file__)))]

from backend.runtime.serving.proxy_process import start_proxy_process
from backend.runtime.tiny_model import BUILTIN_MODELS, TINY_MODEL
from tests.vllm_replicas import API_KEY, ReplicaPool

AUTH = {"Authorization": f"Bearer {API_KEY}"}
PROMPT_TOKENS = 32
ADAPTER = "trl-policy-v1"
# What TRL 1.16's AsyncRolloutWorker._generate_one_turn sends (its defaults), built up one field group at a time.
BODIES = ("base", "adapter", "adapter+logprobs", "trl")


def body(kind: str, prompt: list[int], max_tokens: int, base: str, rng: random.Random) -> dict:
    out = {"model": base if kind == "base" else ADAPTER, "prompt": prompt, "max_tokens": max_tokens,
           "ignore_eos": True}
    if kind in ("adapter+logprobs", "trl"):
        out.update(logprobs=0, return_token_ids=True)
    if kind == "trl":
        out.update(temperature=1.0, top_p=1.0, top_k=0, repetition_penalty=1.0, n=1, seed=rng.getrandbits(63))
    return out


# ---- the replicas' own figures
def scrape(url: str) -> dict[str, float]:
    """The counters and gauges a measurement needs from a replica's /metrics (summed over label sets)."""
    wanted = {"vllm:generation_tokens_total": "tokens", "vllm:iteration_tokens_total_count": "steps",
              "vllm:num_requests_running": "running", "vllm:num_requests_waiting": "waiting"}
    out = dict.fromkeys(wanted.values(), 0.0)
    for line in requests.get(url + "/metrics", headers=AUTH, timeout=10).text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in wanted:
            out[wanted[name]] += float(line.rsplit(" ", 1)[1])
    return out


def cpu_seconds(proc: psutil.Process) -> tuple[float, dict[int, float]]:
    """(the process's CPU seconds, CPU seconds of each of its threads)."""
    try:
        times = proc.cpu_times()
        return times.user + times.system, {t.id: t.user_time + t.system_time for t in proc.threads()}
    except psutil.Error:
        return 0.0, {}


class Processes:
    """A replica's processes (API server, engine core), named as vLLM titles them."""

    def __init__(self, pid: int):
        root = psutil.Process(pid)
        self.procs = {"api": root}
        for child in root.children(recursive=True):
            name = child.name()
            if "EngineCore" in name or "Engine" in name:
                self.procs["engine"] = child

    def sample(self) -> dict:
        return {name: cpu_seconds(p) for name, p in self.procs.items()}

    @staticmethod
    def usage(before: dict, after: dict, seconds: float) -> dict:
        out = {}
        for name, (t0, threads0) in before.items():
            t1, threads1 = after[name]
            busiest = max((threads1[t] - threads0.get(t, 0.0) for t in threads1), default=0.0)
            out[name] = {"cpu": (t1 - t0) / seconds, "busiest_thread": busiest / seconds}
        return out


class GpuSampler:
    """The GPU's utilisation (NVML, %), sampled every 0.2 s while running; nothing without a GPU."""

    def __init__(self, index: int | None):
        self.handle, self.samples, self._stop = None, [], threading.Event()
        if index is None:
            return
        try:
            import pynvml
            pynvml.nvmlInit()
            self.handle, self._nvml = pynvml.nvmlDeviceGetHandleByIndex(index), pynvml
        except Exception as error:
            print(f"no GPU utilisation: {error}")

    def __enter__(self):
        if self.handle is not None:
            self._thread = threading.Thread(target=self._run, daemon=True)
            self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            self.samples.append(self._nvml.nvmlDeviceGetUtilizationRates(self.handle).gpu)

    def __exit__(self, *_):
        self._stop.set()

    @property
    def mean(self) -> float | None:
        return statistics.mean(self.samples) if self.samples else None


# ---- one measurement
async def _measure(targets: list[str], replicas: list[str], kind: str, concurrency: int, max_tokens: int,
                   seed: int, args, procs: list[Processes], profile: str | None) -> dict:
    rng = random.Random(seed)
    vocab = args.vocab
    stop = asyncio.Event()
    failures: list[str] = []

    async def worker(session: aiohttp.ClientSession, url: str) -> None:
        while not stop.is_set():
            prompt = [rng.randrange(3, vocab) for _ in range(PROMPT_TOKENS)]
            payload = body(kind, prompt, max_tokens, args.base, rng)
            try:
                async with session.post(url + "/v1/completions", json=payload, headers=AUTH) as response:
                    if response.status != 200:
                        failures.append(f"{response.status}: {(await response.text())[:300]}")
                        await asyncio.sleep(0.5)
                    await response.read()
            except aiohttp.ClientError as error:
                failures.append(f"{type(error).__name__}: {error}")
                await asyncio.sleep(0.5)

    loop = asyncio.get_running_loop()
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None)) as session:
        tasks = [asyncio.create_task(worker(session, targets[k % len(targets)])) for k in range(concurrency)]
        await asyncio.sleep(args.ramp)
        spies = [_spy(p, profile) for p in procs] if profile else []
        before = await loop.run_in_executor(None, lambda: ([scrape(u) for u in replicas], [p.sample() for p in procs]))
        with GpuSampler(args.gpu_index) as gpu:
            began = time.perf_counter()
            running = []
            while time.perf_counter() - began < args.window:
                await asyncio.sleep(0.5)
                running.append(sum(s["running"] for s in await loop.run_in_executor(
                    None, lambda: [scrape(u) for u in replicas])))
            after = await loop.run_in_executor(None, lambda: ([scrape(u) for u in replicas],
                                                              [p.sample() for p in procs]))
            seconds = time.perf_counter() - began
        stop.set()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    for spy in spies:
        spy.wait(timeout=60)
    tokens = sum(a["tokens"] - b["tokens"] for a, b in zip(after[0], before[0]))
    steps = [a["steps"] - b["steps"] for a, b in zip(after[0], before[0])]
    return {"tok_s": tokens / seconds, "step_ms": [1e3 * seconds / s if s else None for s in steps],
            "running": statistics.mean(running) if running else None, "gpu_util": gpu.mean,
            "cpu": [Processes.usage(b, a, seconds) for b, a in zip(before[1], after[1])],
            "failures": failures[:3], "n_failures": len(failures)}


def _spy(procs: Processes, prefix: str) -> subprocess.Popen:
    """py-spy on the replica's API server and engine core, in the background, for the measuring window."""
    spies = []
    for name, proc in procs.procs.items():
        out = f"{prefix}-{name}.txt"
        spies.append(subprocess.Popen([PY_SPY, "record", "--pid", str(proc.pid), "--duration", str(int(ARGS.window)),
                                       "--rate", "100", "--format", "raw", "--output", out, "--nonblocking"],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT))
    return _Group(spies)


def summarize(path: str, title: str, top: int = 10) -> str:
    """A py-spy raw profile (one stack a line, root first, then its sample count) as the functions that held the
    most samples themselves, and the share of the window the process was busy at all."""
    own, total = {}, 0
    try:
        lines = open(path).read().splitlines()
    except OSError as error:
        return f"profile {title}: none ({error})"
    for line in lines:
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        leaf = stack.rsplit(";", 1)[-1]
        own[leaf] = own.get(leaf, 0) + int(count)
        total += int(count)
    window = ARGS.window * 100      # samples at 100 a second
    rows = sorted(own.items(), key=lambda kv: -kv[1])[:top]
    return (f"profile {title}: {total} samples of ~{window:.0f} ({total / window:.0%} of the window busy)\n"
            + "\n".join(f"    {n / total:6.1%}  {leaf}" for leaf, n in rows))


class _Group:
    def __init__(self, procs: list[subprocess.Popen]):
        self.procs = procs

    def wait(self, timeout: float) -> None:
        for p in self.procs:
            try:
                p.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                p.kill()


def drain(replicas: list[str], timeout: float = 60.0) -> None:
    """Abort what still runs on each replica (the proxy does not pass a client's disconnect on) and wait until
    nothing runs or waits: the next measurement starts from an idle replica with an empty prefix cache."""
    for url in replicas:
        requests.post(url + "/pause", params={"mode": "abort"}, headers=AUTH, timeout=60)
        requests.post(url + "/resume", headers=AUTH, timeout=60)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(s["running"] + s["waiting"] == 0 for s in (scrape(u) for u in replicas)):
            return
        time.sleep(0.25)
    print(f"warning: requests still running on {replicas} {timeout:.0f} s after the client stopped")


SEED = iter(range(10**9))


def measure(targets, replicas, kind, c, length, procs, profile=None, quick: bool = False) -> dict:
    """`quick`: a warm-up, half a second of ramp and one of window."""
    args = argparse.Namespace(**{**vars(ARGS), "ramp": 0.5, "window": 1.0}) if quick else ARGS
    result = asyncio.run(_measure(targets, replicas, kind, c, length, 1000 + next(SEED), args, procs, profile))
    drain(replicas)
    return result


def rounds(variants: dict, args) -> dict[str, list[dict]]:
    """Each variant (name -> zero-argument measurement) once per round, the order reversed every other round."""
    out = {name: [] for name in variants}
    for r in range(args.rounds):
        for name in (list(variants) if r % 2 == 0 else list(variants)[::-1]):
            out[name].append(variants[name](r))
            m = out[name][-1]
            cpu = "; ".join(", ".join(f"{k} {v['cpu']:.2f} (thread {v['busiest_thread']:.2f})" for k, v in c.items())
                            for c in m["cpu"])
            steps = ", ".join(f"{s:.1f}" for s in m["step_ms"] if s)
            print(f"  round {r} {name}: {m['tok_s']:,.0f} tok/s, step {steps} ms, running {m['running']:.0f}, "
                  f"GPU {_fmt(m['gpu_util'])} %, CPU {cpu}"
                  + (f", {m['n_failures']} failed: {m['failures']}" if m["n_failures"] else ""), flush=True)
    return out


def _fmt(value) -> str:
    return "-" if value is None else f"{value:.0f}"


def med(ms: list[dict], key: str = "tok_s") -> float:
    return statistics.median(m[key] for m in ms)


def ratio_text(a: list[dict], b: list[dict]) -> str:
    ratios = [y["tok_s"] / x["tok_s"] for x, y in zip(a, b)]
    return f"min {min(ratios):.2f}, median {statistics.median(ratios):.2f}"


# ---- the three parts
def sweep(urls, procs, args, results) -> None:
    print(f"\n== 1. one replica, straight, base model, plain sampling: generated tok/s against requests in flight "
          f"({args.rounds} rounds, interleaved)", flush=True)
    for length in args.lengths:
        variants = {f"c={c}": (lambda r, c=c, n=length: measure(urls[:1], urls[:1], "base", c, n, procs[:1]))
                    for c in args.sweep}
        got = rounds(variants, args)
        results["sweep"][str(length)] = got
        print(f"| {length}-token completions | " + " | ".join(
            f"{med(got[f'c={c}']) / 1e3:.1f}k" for c in args.sweep) + " |", flush=True)
    print("| in flight | " + " | ".join(str(c) for c in args.sweep) + " |")


def bodies(urls, procs, args, results) -> None:
    print(f"\n== 2. what TRL sends, one field group at a time, one replica, {args.body_tokens}-token completions",
          flush=True)
    for c in args.body_concurrency:
        def one(kind, c=c):
            def run(r):
                profile = (os.path.join(args.profile, f"c{c}-{kind}") if args.profile and r == 0
                           and c == max(args.body_concurrency) and kind in ("base", "trl") else None)
                m = measure(urls[:1], urls[:1], kind, c, args.body_tokens, procs[:1], profile)
                if profile:
                    for name in procs[0].procs:
                        print(summarize(f"{profile}-{name}.txt", f"{kind} at {c} in flight, {name}"), flush=True)
                return m
            return run
        got = rounds({kind: one(kind) for kind in BODIES}, args)
        results["bodies"][str(c)] = got
        base = got["base"]
        print(f"at {c} in flight: " + "; ".join(
            f"{k} {med(got[k]):,.0f} tok/s (x{med(got[k]) / med(base):.2f}, {ratio_text(base, got[k])}), "
            f"step {statistics.median(m['step_ms'][0] for m in got[k]):.1f} ms" for k in BODIES), flush=True)


def scaling(urls, procs, args, results) -> None:
    print(f"\n== 3. two replicas / one, TRL's body, {args.body_tokens}-token completions"
          f"{' (both replicas on ONE GPU: time-shared, a partial datum)' if args.shared_gpu else ''}", flush=True)
    one, both = args.proxies
    for c in args.scale_concurrency:
        variants = {
            "proxy, 1 replica": lambda r, c=c: measure([one.url], urls[:1], "trl", c, args.body_tokens, procs[:1]),
            "proxy, 2 replicas": lambda r, c=c: measure([both.url], urls, "trl", c, args.body_tokens, procs),
            "client split, 2 replicas": lambda r, c=c: measure(urls, urls, "trl", c, args.body_tokens, procs),
        }
        got = rounds(variants, args)
        results["scaling"][str(c)] = got
        single, proxied, split = got["proxy, 1 replica"], got["proxy, 2 replicas"], got["client split, 2 replicas"]
        print(f"at {c} in flight: one {med(single):,.0f} tok/s; two through the proxy {med(proxied):,.0f} "
              f"({ratio_text(single, proxied)}); two split by the client {med(split):,.0f} "
              f"({ratio_text(single, split)}); proxy / client split {ratio_text(split, proxied)}", flush=True)


def start_proxies(urls: list[str], adapter: str) -> tuple:
    """A proxy in front of the first replica and one in front of both, as the trainer runs it (its own process).
    They start before the adapter is loaded, through the two-replica one: a proxy that finds adapters it did not
    load unloads them (a previous trainer's)."""
    one, both = start_proxy_process(urls[:1], token=API_KEY), start_proxy_process(urls, token=API_KEY)
    for proxy in (one, both):
        while requests.get(proxy.url + "/health", params={"require": "all"}).status_code != 200:
            time.sleep(0.5)
    reply = requests.post(both.url + "/v1/load_lora_adapter", json={"lora_name": ADAPTER, "lora_path": adapter})
    assert reply.ok, reply.text
    return one, both


def make_adapter(model_dir: str, out: str, rank: int = 8) -> str:
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir)
    lora = LoraConfig(r=rank, lora_alpha=16, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
                      init_lora_weights=False)
    get_peft_model(model, lora).save_pretrained(out)
    return out


PY_SPY = shutil.which("py-spy") or "py-spy"
ARGS = argparse.Namespace()


def main() -> None:
    global PY_SPY, ARGS
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", nargs=2, help="a GPU for each replica; the same one twice to time-share it")
    parser.add_argument("--model", default="builtin:bench-qwen2.5-0.5b", choices=BUILTIN_MODELS)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--ramp", type=float, default=2.0, help="seconds between filling C and measuring")
    parser.add_argument("--window", type=float, default=4.0, help="seconds measured")
    parser.add_argument("--sweep", type=int, nargs="*", default=[16, 64, 128, 256, 384, 512])
    parser.add_argument("--lengths", type=int, nargs="*", default=[128, 1024])
    parser.add_argument("--body-tokens", type=int, default=1024)
    parser.add_argument("--body-concurrency", type=int, nargs="*", default=[128, 256])
    parser.add_argument("--scale-concurrency", type=int, nargs="*", default=[128, 384])
    parser.add_argument("--kv-cache-gib", type=int, default=16, help="each replica's fixed KV cache on a GPU")
    parser.add_argument("--parts", nargs="+", default=["sweep", "bodies", "scaling"])
    parser.add_argument("--profile", help="write py-spy profiles here (needs --py-spy or py-spy on PATH)")
    parser.add_argument("--py-spy", default=None)
    parser.add_argument("--json", default=None, help="write every measurement here")
    args = parser.parse_args()
    ARGS = args
    PY_SPY = args.py_spy or PY_SPY
    args.shared_gpu = bool(args.gpus) and args.gpus[0] == args.gpus[1]
    args.gpu_index = int(args.gpus[0]) if args.gpus else None
    extra = ("--kv-cache-memory-bytes", str(args.kv_cache_gib * 2**30)) if args.gpus else ()
    if args.profile:
        os.makedirs(args.profile, exist_ok=True)
    pool = ReplicaPool(2, gpus=args.gpus, model=args.model, extra_args=extra)
    results = {"args": vars(args), "sweep": {}, "bodies": {}, "scaling": {}}
    try:
        started = time.perf_counter()
        urls = pool.ensure_running()
        print(f"replicas up in {time.perf_counter() - started:.0f} s: {args.model}, "
              f"{'GPUs ' + ', '.join(args.gpus) if args.gpus else 'CPU cores of their own'}, {os.cpu_count()} CPUs",
              flush=True)
        procs = [Processes(p.pid) for p in pool.procs]
        print("replica processes: " + "; ".join(", ".join(f"{k} {p.pid} {p.name()}" for k, p in pr.procs.items())
                                              for pr in procs))
        models = requests.get(urls[0] + "/v1/models", headers=AUTH).json()["data"]
        args.base = models[0]["id"]
        # Ids every builtin vocabulary holds: the tiny model's 256 bytes, or the bench models' Qwen-sized one.
        args.vocab = 250 if args.model == TINY_MODEL else 151_000
        args.adapter = make_adapter(pool.model_dir, os.path.join(tempfile.mkdtemp(), ADAPTER))
        args.proxies = start_proxies(urls, args.adapter)
        # Warm-up: every request shape, and the largest batch, once on each replica.
        for kind in BODIES:
            measure(urls, urls, kind, 8, 16, procs, quick=True)
        measure(urls, urls, "base", 2 * max(args.sweep + args.scale_concurrency), 16, procs, quick=True)
        for part in args.parts:
            {"sweep": sweep, "bodies": bodies, "scaling": scaling}[part](urls, procs, args, results)
            if args.json:
                with open(args.json, "w") as f:
                    json.dump(results, f, default=str)
    finally:
        for proxy in getattr(args, "proxies", ()):
            proxy.stop()
        pool.stop()


if __name__ == "__main__":
    main()
