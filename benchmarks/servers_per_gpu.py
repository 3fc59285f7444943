"""Several vLLM servers on one GPU: one replica job started as the recipe starts it, through the proxy at K = 1, 2, 4
servers, at the in-flight counts a trainer keeps; what the proxy costs per request; several ports against one port
and a small router inside the job.

    python benchmarks/servers_per_gpu.py [--model builtin:bench-qwen2.5-0.5b] [--servers 1 2 4] \\
        [--inflight 256 512 1024] [--tokens 1024] [--rounds 2] [--json OUT]
    python benchmarks/servers_per_gpu.py --fake 4 --fake-tok-s 400 ...   # CPU: stand-in servers, the proxy's cost

The replica job is the recipe's own: `RunJobs(spec).first()` of a distributed spec with `servers_per_gpu` = the
largest K (on a GPU the HF Jobs command for `--flavor`: each server 1/K of the GPU as a fixed KV cache; on CPU the
local one), run here as a process. Proxies (each its own process, as the trainer runs it) front its first 1, 2, 4
servers; a K = 1 measurement leaves the other servers idle on the GPU. Each measurement keeps exactly C requests in
flight with TRL 1.16's request body (`replica_scaling.body`), each worker's first request cut to a random length so
the requests are at every age from the start (a training run's steady state), waits `--ramp` s, then measures over
`--window` s: generated tok/s (the servers' own counters; the client's count with stand-in servers), the GPU's
utilisation, each server's API process CPU (and its busiest thread), and the proxy's CPU per generation it relayed.
At the largest C it also compares, for the largest K: the proxy, the client splitting requests itself (no proxy),
and the proxy reaching the servers through a router in the job (a second proxy process: what one exposed port with
a router behind it would add). Variants compared alternate in rounds (order reversed every other round); medians,
with the minimum of the paired ratios. Asserts nothing: it measures.

`--fake N` replaces the replica job by N stand-in servers answering TRL-shaped completions (token ids and logprobs)
at `--fake-tok-s` tokens a second per request: what the proxy and a router cost per request, without a GPU.
"""

import argparse
import asyncio
import json
import os
import random
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time

import aiohttp
import psutil
import requests

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT]

from backend.plan.engines.base import Placement
from backend.plan.engines.local import free_port
from backend.plan.recipe import RunJobs
from backend.plan.spec import RunSpec
from backend.runtime.serving.cpu_pinning import PIN_ENV, core_split
from backend.runtime.serving.proxy_process import start_proxy_process
from backend.runtime.serving.replicas import parse_load
from backend.runtime.tiny_model import BUILTIN_MODELS, ensure_tiny_model
from benchmarks import replica_scaling as rs

ADAPTER = rs.ADAPTER
AUTH = rs.AUTH


# ---- the replica job
def replica_job(args, root: str) -> tuple[subprocess.Popen, list[str], str]:
    """Start the recipe's replica job of `max(args.servers)` servers; return (its process, its servers' URLs, the
    model folder). Its log is `root/replica.log`."""
    count = max(args.servers)
    on_gpu = bool(args.gpu)
    spec = RunSpec(mode="distributed", executor="hf_jobs" if on_gpu else "local", model=args.model, replicas=1,
                   servers_per_gpu=count, vllm_flavor=args.flavor, bucket="bench/bench", mount_path=root,
                   replica_max_model_len=args.context, max_staleness=1, lora_r=8, network="exposed").check()
    ports = [free_port() for _ in range(count)]
    cores = sorted(os.sched_getaffinity(0))
    binds = None if on_gpu else [str(cores[k % len(cores)]) for k in range(count)]
    [job] = RunJobs(spec, Placement(sys.executable, ports=[ports], cpu_binds=[binds] if binds else None)).first()
    model_dir = ensure_tiny_model(f"{spec.run_path}/base-model", name=args.model)
    # The runtime from this checkout, ahead of whatever else the path holds (the GPU machine's offline site).
    path = [os.path.join(ROOT, "backend"), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = {**os.environ, **job.env, "PYTHONPATH": os.pathsep.join(path)}
    if "pinning" in args.parts:     # the servers start unpinned: the pinning part sets each variant's cores itself
        env[PIN_ENV] = "0"
    print("replica job:", shlex.join(job.command)[:1500], flush=True)
    log = open(os.path.join(root, "replica.log"), "ab")
    proc = subprocess.Popen(job.command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    urls = [f"http://127.0.0.1:{p}" for p in ports]
    deadline = time.monotonic() + args.start_timeout
    while not all(_healthy(u) for u in urls):
        if proc.poll() is not None or time.monotonic() > deadline:
            tail = open(os.path.join(root, "replica.log"), errors="replace").read()[-4000:]
            raise RuntimeError(f"the replica job did not start ({proc.poll()}):\n{tail}")
        time.sleep(1)
    return proc, urls, model_dir


def _healthy(url: str) -> bool:
    try:
        return requests.get(f"{url}/health", timeout=2).status_code == 200
    except requests.RequestException:
        return False


def api_processes(job: subprocess.Popen, urls: list[str]) -> dict[str, psutil.Process]:
    """Each server's API process (the wrapper's children), by its URL."""
    out = {}
    for child in psutil.Process(job.pid).children():
        command = child.cmdline()
        if "--port" in command:
            out[f"http://127.0.0.1:{command[command.index('--port') + 1]}"] = child
    return {u: out[u] for u in urls if u in out}


# ---- stand-in servers (--fake)
def fake_answer(prompt: list[int], max_tokens: int) -> dict:
    """A completion shaped as vLLM answers TRL's request (token ids, one logprob each)."""
    ids = [random.randrange(3, 150_000) for _ in range(max_tokens)]
    return {"id": "cmpl-fake", "object": "text_completion", "model": ADAPTER, "choices": [{
        "index": 0, "text": " x" * max_tokens, "finish_reason": "length", "token_ids": ids,
        "prompt_token_ids": prompt, "logprobs": {"tokens": [f"t{i}" for i in ids],
                                                 "token_logprobs": [-random.random() * 5 for _ in ids],
                                                 "top_logprobs": None, "text_offset": list(range(max_tokens))}}],
        "usage": {"prompt_tokens": len(prompt), "completion_tokens": max_tokens}}


def serve_fake(port: int, tok_s: float) -> None:
    from aiohttp import web

    state = {"tokens": 0, "running": 0}

    async def complete(request: web.Request) -> web.Response:
        body = await request.json()
        state["running"] += 1
        try:
            await asyncio.sleep(body["max_tokens"] / tok_s)
        finally:
            state["running"] -= 1
        state["tokens"] += body["max_tokens"]
        return web.json_response(fake_answer(body.get("prompt") or [], body["max_tokens"]))

    async def metrics(_request) -> web.Response:
        cpu = sum(psutil.Process().cpu_times()[:2])
        return web.Response(text=f"vllm:generation_tokens_total {state['tokens']}\nprocess_cpu_seconds_total {cpu}\n"
                                 f"vllm:num_requests_running {state['running']}\nvllm:num_requests_waiting 0\n")

    async def ok(_request) -> web.Response:
        return web.Response(text="ok")

    async def models(_request) -> web.Response:
        return web.json_response({"data": [{"id": "base", "parent": None}]})

    app = web.Application()
    app.router.add_post("/v1/completions", complete)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/health", ok)
    app.router.add_get("/v1/models", models)
    for path in ("/v1/load_lora_adapter", "/v1/unload_lora_adapter", "/pause", "/resume"):
        app.router.add_post(path, ok)
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None)


def fake_servers(args) -> tuple[list[subprocess.Popen], list[str]]:
    ports = [free_port() for _ in range(args.fake)]
    procs = [subprocess.Popen([sys.executable, __file__, "--serve-fake", str(p), "--fake-tok-s", str(args.fake_tok_s)],
                              start_new_session=True) for p in ports]
    urls = [f"http://127.0.0.1:{p}" for p in ports]
    while not all(_healthy(u) for u in urls):
        time.sleep(0.2)
    return procs, urls


# ---- one measurement
def cpu_of(proc: psutil.Process | None) -> tuple[float, dict]:
    return rs.cpu_seconds(proc) if proc is not None else (0.0, {})


async def _measure(targets: list[str], servers: list[str], c: int, seed: int, args, watch: dict) -> dict:
    """C requests kept in flight to `targets`; `servers` are the servers they reach, `watch` names -> processes whose
    CPU is measured (the proxy, a router, each server's API process)."""
    rng = random.Random(seed)
    stop = asyncio.Event()
    done = {"requests": 0, "tokens": 0, "failed": 0, "errors": []}
    counting = asyncio.Event()

    async def worker(session: aiohttp.ClientSession, url: str) -> None:
        first = True
        while not stop.is_set():
            length = rng.randint(1, args.tokens) if first else args.tokens
            first = False
            prompt = [rng.randrange(3, args.vocab) for _ in range(rs.PROMPT_TOKENS)]
            payload = rs.body("trl", prompt, length, "base", rng)
            try:
                async with session.post(url + "/v1/completions", json=payload, headers=AUTH) as response:
                    await response.read()
                    if response.status != 200:
                        done["failed"] += 1
                        done["errors"].append(f"{response.status}: {(await response.text())[:200]}")
                        await asyncio.sleep(0.5)
                    elif counting.is_set():
                        done["requests"] += 1
                        done["tokens"] += length
            except aiohttp.ClientError as error:
                done["failed"] += 1
                done["errors"].append(f"{type(error).__name__}: {error}")
                await asyncio.sleep(0.5)

    loop = asyncio.get_running_loop()
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                     timeout=aiohttp.ClientTimeout(total=None)) as session:
        tasks = [asyncio.create_task(worker(session, targets[k % len(targets)])) for k in range(c)]
        await asyncio.sleep(args.ramp)

        def read() -> tuple[list[dict], dict]:
            return ([parse_load(requests.get(u + "/metrics", headers=AUTH, timeout=10).text) for u in servers],
                    {name: cpu_of(p) for name, p in watch.items()})

        before = await loop.run_in_executor(None, read)
        counting.set()
        with rs.GpuSampler(args.gpu_index) as gpu:
            began = time.perf_counter()
            await asyncio.sleep(args.window)
            after = await loop.run_in_executor(None, read)
            seconds = time.perf_counter() - began
        counting.clear()
        stop.set()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    tokens = sum(a.get("tokens", 0) - b.get("tokens", 0) for a, b in zip(after[0], before[0]))
    cpu = {}
    for name, (t0, threads0) in before[1].items():
        t1, threads1 = after[1][name]
        busiest = max((threads1[t] - threads0.get(t, 0.0) for t in threads1), default=0.0)
        cpu[name] = {"cores": (t1 - t0) / seconds, "busiest_thread": busiest / seconds, "cpu_s": t1 - t0}
    return {"tok_s": tokens / seconds, "client_tok_s": done["tokens"] / seconds, "completed": done["requests"],
            "gpu_util": gpu.mean, "cpu": cpu, "failed": done["failed"], "errors": done["errors"][:3]}


SEED = iter(range(10**9))


def measure(targets, servers, c, args, watch) -> dict:
    result = asyncio.run(_measure(targets, servers, c, 7000 + next(SEED), args, watch))
    if args.fake:
        time.sleep(args.tokens / args.fake_tok_s + 0.5)   # what the proxy still relays finishes
    else:
        rs.drain(servers)
    for name in ("proxy", "router"):
        if name in result["cpu"] and result["completed"]:
            result[f"{name}_ms_per_request"] = 1e3 * result["cpu"][name]["cpu_s"] / result["completed"]
    return result


def show(name: str, r: int, m: dict) -> None:
    apis = [v for k, v in m["cpu"].items() if k.startswith("http")]
    api = (f", API processes {statistics.median(a['cores'] for a in apis):.2f} cores (busiest thread "
           f"{max(a['busiest_thread'] for a in apis):.2f})" if apis else "")
    proxy = "".join(f", {k} {m['cpu'][k]['cores']:.2f} cores = {m[f'{k}_ms_per_request']:.2f} ms a request"
                    for k in ("proxy", "router") if f"{k}_ms_per_request" in m)
    gpu = f", GPU {m['gpu_util']:.0f} %" if m["gpu_util"] is not None else ""
    print(f"  round {r} {name}: {m['tok_s']:,.0f} tok/s (client {m['client_tok_s']:,.0f}), {m['completed']} done"
          f"{gpu}{api}{proxy}" + (f", {m['failed']} FAILED: {m['errors']}" if m["failed"] else ""), flush=True)


def rounds(variants: dict, args) -> dict[str, list[dict]]:
    out = {name: [] for name in variants}
    for r in range(args.rounds):
        for name in (list(variants) if r % 2 == 0 else list(variants)[::-1]):
            out[name].append(variants[name]())
            show(name, r, out[name][-1])
    return out


def ratio(a: list[dict], b: list[dict], key: str = "tok_s") -> str:
    values = [y[key] / x[key] for x, y in zip(a, b) if x[key]]
    return f"x{statistics.median(values):.2f} (min {min(values):.2f})" if values else "-"


def med(ms: list[dict], key: str) -> float | None:
    values = [m[key] for m in ms if m.get(key) is not None]
    return statistics.median(values) if values else None


# ---- the parts
def scaling(args, urls, proxies, apis, results) -> None:
    print(f"\n== K servers on one GPU through the proxy, TRL's body, {args.tokens}-token completions", flush=True)
    for c in args.inflight:
        variants = {f"K={k}": (lambda k=k, c=c: measure([proxies[k].url], urls[:k], c, args, {
            "proxy": psutil.Process(proxies[k].proc.pid), **{u: apis[u] for u in urls[:k] if u in apis}}))
            for k in args.servers}
        got = results["scaling"][str(c)] = rounds(variants, args)
        base = got[f"K={args.servers[0]}"]
        print(f"| {c} | " + " | ".join(f"{med(got[f'K={k}'], 'tok_s') / 1e3:.1f}k"
                                      + ("" if k == args.servers[0] else f" ({ratio(base, got[f'K={k}'])})")
                                      for k in args.servers)
              + " | proxy " + ", ".join(f"{med(got[f'K={k}'], 'proxy_ms_per_request') or 0:.2f}"
                                        for k in args.servers) + " ms a request |", flush=True)


def paths(args, urls, proxies, router_pair, apis, results) -> None:
    c, k = max(args.inflight), max(args.servers)
    print(f"\n== {k} servers at {c} in flight: the proxy, the client's own split, the proxy through an in-job router",
          flush=True)
    router, front = router_pair
    servers = {u: apis[u] for u in urls if u in apis}
    variants = {
        "proxy -> servers (ports)": lambda: measure([proxies[k].url], urls, c, args,
                                                    {"proxy": psutil.Process(proxies[k].proc.pid), **servers}),
        "client split": lambda: measure(urls, urls, c, args, servers),
        "proxy -> router -> servers": lambda: measure([front.url], urls, c, args, {
            "proxy": psutil.Process(front.proc.pid), "router": psutil.Process(router.proc.pid), **servers}),
    }
    got = results["paths"] = rounds(variants, args)
    ports, split, routed = got["proxy -> servers (ports)"], got["client split"], got["proxy -> router -> servers"]
    print(f"proxy / client split {ratio(split, ports)}; router path / ports {ratio(ports, routed)}; proxy "
          f"{med(ports, 'proxy_ms_per_request') or 0:.2f} ms a request, router "
          f"{med(routed, 'router_ms_per_request') or 0:.2f} ms a request on top", flush=True)


def pin_tree(pid: int, cores: list[int]) -> int:
    """Every thread of process `pid` and of its descendants onto `cores` (threads started later inherit them);
    how many threads were set."""
    top = psutil.Process(pid)
    count = 0
    for proc in (top, *top.children(recursive=True)):
        try:
            threads = proc.threads()
        except psutil.Error:
            continue
        for thread in threads:
            try:
                os.sched_setaffinity(thread.id, cores)
                count += 1
            except ProcessLookupError:      # a thread that ended meanwhile
                pass
    return count


def pinning(args, urls, proxies, apis, results) -> None:
    """K servers and their proxy, pinned (each server's API process and engine core on cores of its own, the proxy
    on one core: runtime/serving/cpu_pinning.py's split) against unpinned (all on every core), interleaved on the same
    running servers. The client (this process: the trainer's rollout worker, elsewhere in a real run) keeps one core
    of its own in both. Pinning here is set on running processes, so each server's thread pools keep the size they
    took at start (on every core), where a job that pins at start sizes them to its share."""
    k = max(args.servers)
    cores = sorted(os.sched_getaffinity(0))
    client, rest = cores[-1], cores[:-1]
    shares, proxy_core, why = core_split(rest, k, proxy=True)
    if shares is None:
        print(f"\n== pinning: not measured: {why}", flush=True)
        return
    pin_tree(os.getpid(), [client])
    proxy = proxies[k]
    servers = [u for u in urls[:k] if u in apis]
    layout = {"client": client, "proxy": proxy_core, "servers": shares, "unpinned": rest}
    print(f"\n== {k} servers pinned against unpinned, TRL's body, {args.tokens}-token completions; cores: {layout}",
          flush=True)

    def pinned(on: bool):
        set_ = sum(pin_tree(apis[u].pid, shares[i] if on else rest) for i, u in enumerate(servers))
        set_ += pin_tree(proxy.proc.pid, [proxy_core] if on else rest)
        return set_

    results["pinning"] = {"layout": layout}
    for c in args.inflight:
        def variant(on: bool, c=c):
            threads = pinned(on)
            m = measure([proxy.url], urls[:k], c, args, {"proxy": psutil.Process(proxy.proc.pid),
                                                         **{u: apis[u] for u in servers}})
            m["threads_pinned"] = threads
            return m

        got = results["pinning"][str(c)] = rounds({"unpinned": lambda: variant(False),
                                                   "pinned": lambda: variant(True)}, args)
        print(f"| {c} | unpinned {med(got['unpinned'], 'tok_s') / 1e3:.1f}k | pinned "
              f"{med(got['pinned'], 'tok_s') / 1e3:.1f}k | pinned / unpinned {ratio(got['unpinned'], got['pinned'])} "
              f"| GPU {med(got['unpinned'], 'gpu_util') or 0:.0f} / {med(got['pinned'], 'gpu_util') or 0:.0f} % |",
              flush=True)
    pinned(False)


def memory_report(root: str) -> None:
    """What each server held on the GPU, as nvidia-smi and vLLM's own log lines say (the overhead figure)."""
    try:
        print(subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv"],
                             capture_output=True, text=True, timeout=30).stdout)
    except (OSError, subprocess.SubprocessError) as error:
        print(f"no nvidia-smi: {error}")
    wanted = ("Model loading took", "KV cache", "CUDA graph", "memory", "Maximum concurrency")
    lines = [line for line in open(os.path.join(root, "replica.log"), errors="replace")
             if any(w in line for w in wanted)]
    print("".join(lines[-24:]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="builtin:bench-qwen2.5-0.5b", choices=BUILTIN_MODELS)
    parser.add_argument("--flavor", default="h200", help="the HF Jobs flavor whose replica command runs (GPU)")
    parser.add_argument("--servers", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--inflight", type=int, nargs="+", default=[256, 512, 1024])
    parser.add_argument("--tokens", type=int, default=1024, help="completion length")
    parser.add_argument("--context", type=int, default=2048, help="each server's --max-model-len")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--ramp", type=float, default=3.0)
    parser.add_argument("--window", type=float, default=4.0)
    parser.add_argument("--parts", nargs="+", default=["scaling", "paths"],
                        help="scaling, paths, pinning (K = the largest --servers, pinned against not)")
    parser.add_argument("--start-timeout", type=float, default=600)
    parser.add_argument("--fake", type=int, default=0, help="N stand-in servers instead of the replica job")
    parser.add_argument("--fake-tok-s", type=float, default=400.0)
    parser.add_argument("--serve-fake", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--json")
    args = parser.parse_args()
    if args.serve_fake:
        return serve_fake(args.serve_fake, args.fake_tok_s)
    args.gpu = not args.fake and bool(subprocess.run(["nvidia-smi", "-L"], capture_output=True).returncode == 0
                                      if os.path.exists("/usr/bin/nvidia-smi") else False)
    args.gpu_index = 0 if args.gpu else None
    args.vocab = 250 if args.model == "builtin:tiny-qwen2" else 151_000
    rs.ARGS = argparse.Namespace(window=args.window)
    root = tempfile.mkdtemp(prefix="servers-per-gpu-")
    started, procs, proxies, extra = time.perf_counter(), [], {}, ()
    results = {"args": vars(args), "scaling": {}, "paths": {}}
    try:
        if args.fake:
            procs, urls = fake_servers(args)
            apis, adapter = {}, "/nowhere"
        else:
            job, urls, model_dir = replica_job(args, root)
            procs = [job]
            apis = api_processes(job, urls)
            adapter = rs.make_adapter(model_dir, os.path.join(root, ADAPTER))
        print(f"{len(urls)} servers up in {time.perf_counter() - started:.0f} s ({'GPU' if args.gpu else 'CPU'}, "
              f"{os.cpu_count()} CPUs)", flush=True)
        # Every proxy starts before the adapter is loaded (a proxy unloads adapters it did not load, a previous
        # trainer's, when a server rejoins it); the one in front of the router loads it, through the router, on
        # every server. Without the paths part there is no router and the proxy of the largest K loads it, so that a
        # disconnect under load cannot make an idle proxy unload it on the servers' rejoin (at 1024 in flight it did).
        proxies = {k: start_proxy_process(urls[:k], token=rs.API_KEY) for k in args.servers}
        if "paths" in args.parts:
            router = start_proxy_process(urls, token=rs.API_KEY)
            front = start_proxy_process([router.url], token=rs.API_KEY)
            extra = (router, front)
        for proxy in (*proxies.values(), *extra):
            while requests.get(proxy.url + "/health", params={"require": "all"}).status_code != 200:
                time.sleep(0.5)
        loader = extra[1] if extra else proxies[max(args.servers)]
        reply = requests.post(loader.url + "/v1/load_lora_adapter", json={"lora_name": ADAPTER, "lora_path": adapter})
        assert reply.ok, reply.text
        measure(urls, urls, 2 * len(urls), argparse.Namespace(**{**vars(args), "tokens": 16, "window": 1,
                                                                   "ramp": 0.5}), {})
        if not args.fake:
            memory_report(root)
        if "scaling" in args.parts:
            scaling(args, urls, proxies, apis, results)
        if "paths" in args.parts:
            paths(args, urls, proxies, extra, apis, results)
        if "pinning" in args.parts:
            pinning(args, urls, proxies, apis, results)
    finally:
        if args.json:
            with open(args.json, "w") as f:
                json.dump(results, f, default=str)
        for proxy in (*proxies.values(), *extra):
            proxy.stop()
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(timeout=40)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)


if __name__ == "__main__":
    main()
