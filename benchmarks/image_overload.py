"""More images than the gateway's CPU can rewrite: what the image pool's wait bound
(``images.max_queue_wait_ms``) does to the requests it takes, side by side with the bound
off, in one run.

One-worker gateways (2 pool threads, the h200 profile) in front of one fast simulator; every
request carries a new 1920x1080 JPEG screenshot (benchmarks/gpu/variants.py), 4 output
tokens, not streamed. First the gateway's capacity C is measured closed-loop (8 concurrent,
``--cap-s`` seconds); then each config gets ``--seconds`` of open-loop Poisson arrivals at
``--load`` x C, the configs alternating (ABAB) so load changes on a shared machine hit
both alike. Per config: the latency p50/p99 of the answered requests, the share refused
(503 + Retry-After) and the share answered (without the bound every request is
answered in the end, after the backlog drains).

    python benchmarks/image_overload.py [--load 1.5 --seconds 20 --rounds 2] [--out FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "benchmarks"), str(ROOT / "benchmarks" / "gpu")]

import loadgen  # noqa: E402
from variants import variants  # noqa: E402

from localprocs import Procs, wait_ready  # noqa: E402

CONFIGS = {"bound_off": 0, "bound_1500ms": 1500}


def body(img: bytes) -> bytes:
    return json.dumps({"model": "qwen3vl", "max_tokens": 4, "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "data:image/jpeg;base64," + base64.b64encode(img).decode()}},
        {"type": "text", "text": "hi"}]}]}).encode()


async def one(s: aiohttp.ClientSession, url: str, data: bytes) -> tuple[int, float]:
    t0 = time.perf_counter()
    try:
        async with s.post(url, data=data, headers={"content-type": "application/json"}) as r:
            await r.read()
            return r.status, time.perf_counter() - t0
    except aiohttp.ClientError:
        return 0, time.perf_counter() - t0


async def closed_loop(url: str, bodies, seconds: float, conc: int) -> float:
    done = 0
    end = time.perf_counter() + seconds
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as s:
        async def worker():
            nonlocal done
            while time.perf_counter() < end:
                st, _ = await one(s, url, next(bodies))
                done += st == 200
        await asyncio.gather(*(worker() for _ in range(conc)))
    return done / seconds


async def open_loop(url: str, bodies, rate: float, seconds: float, seed: int) -> list[tuple[int, float]]:
    rnd = random.Random(seed)
    tasks = []
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                     timeout=aiohttp.ClientTimeout(total=600)) as s:
        t0 = time.perf_counter()
        t = 0.0
        while True:
            t += rnd.expovariate(rate)
            if t >= seconds:
                break
            delay = t0 + t - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)   # the arrival schedule itself
            tasks.append(asyncio.ensure_future(one(s, url, next(bodies))))
        return await asyncio.gather(*tasks)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--load", type=float, default=1.5)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--cap-s", type=float, default=10.0)
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="image-overload-"))
    with Procs(tmp) as procs:
        sim = procs.vlm_gateway(["sim", "--port", "18410", "--model", "qwen3vl", "--time-scale", "0.01"], "sim.log",
                                cwd=ROOT)
        wait_ready("http://127.0.0.1:18410/health", sim, "the simulator")
        urls = {}
        for i, (name, wait_ms) in enumerate(CONFIGS.items()):
            port = 18411 + i
            (tmp / f"{name}.yaml").write_text(
                f"server: {{port: {port}, workers: 1}}\n"
                f"images: {{pool_workers: 2, max_queue: 4096, max_queue_wait_ms: {wait_ms}}}\n"
                "slo: {enabled: false}\nbackends:\n"
                "  - {url: 'http://127.0.0.1:18410/v1', name: s, engine: sim, profile: h200, models: [qwen3vl]}\n")
            p = procs.vlm_gateway(["serve", "--config", str(tmp / f"{name}.yaml")], f"{name}.log", cwd=ROOT)
            wait_ready(f"http://127.0.0.1:{port}/ready", p, f"the {name} gateway")
            urls[name] = f"http://127.0.0.1:{port}/v1/chat/completions"
        vary = variants(loadgen.base_image("jpeg1080"))
        counter = iter(range(10**9))

        def gen():
            while True:
                yield body(vary(next(counter)))
        bodies = gen()
        caps = [asyncio.run(closed_loop(u, bodies, a.cap_s, 8)) for u in urls.values()]
        cap = statistics.mean(caps)
        rate = a.load * cap
        print(f"capacity {cap:.1f} req/s (closed loop, 8 concurrent; {caps}); offering {rate:.1f} req/s", flush=True)
        # pre-made bodies: making them must not slow the arrival loop
        results = {name: [] for name in urls}
        for r in range(a.rounds):
            for name in (list(urls) if r % 2 == 0 else list(reversed(list(urls)))):
                pre = iter([next(bodies) for _ in range(int(rate * a.seconds * 1.3) + 10)])
                got = asyncio.run(open_loop(urls[name], pre, rate, a.seconds, seed=r))
                results[name].extend(got)
                ok = sorted(t for st, t in got if st == 200)
                print(f"round {r} {name:13s} sent {len(got)}  answered {len(ok)}  refused "
                      f"{sum(st == 503 for st, _ in got)}  p50 {1000 * statistics.median(ok):.0f} ms  "
                      f"p99 {1000 * ok[int(0.99 * (len(ok) - 1))]:.0f} ms", flush=True)
        out = {"capacity_rps": round(cap, 2), "offered_rps": round(rate, 2), "load": a.load,
               "seconds": a.seconds, "rounds": a.rounds, "configs": {}}
        for name, got in results.items():
            ok = sorted(t for st, t in got if st == 200)
            row = {"max_queue_wait_ms": CONFIGS[name], "sent": len(got), "answered": len(ok),
                   "refused_503": sum(st == 503 for st, _ in got), "other": sum(st not in (200, 503) for st, _ in got),
                   "answered_share": round(len(ok) / len(got), 3),
                   "latency_p50_ms": round(1000 * statistics.median(ok)),
                   "latency_p99_ms": round(1000 * ok[int(0.99 * (len(ok) - 1))])}
            out["configs"][name] = row
            print(json.dumps({name: row}), flush=True)
        if a.out:
            Path(a.out).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
