"""Soak: a bounded steady load for a fixed time (default 10 minutes), sampling the
gateway process's RSS and open file descriptors and its cache sizes, to show that
nothing grows without bound. Not part of CI.

Set-up: two simulators (echo mode), one gateway process with API keys, per-tenant
rate limits (in a private redis-server), L1 image cache and L3 response cache with
deliberately small byte bounds (so the bounds are hit early and eviction runs the
whole time). Open-loop load at ``--rate`` requests/s, a fixed mix:

  30 % text, unique prompt        (L3 miss + store: pushes the L3 bound)
  20 % text from a pool of 64     (L3 hits)
  15 % image from a pool of 16    (L1 hits)
  10 % unique image               (L1 miss + store: pushes the L1 bound)
  15 % stream, read to the end
   5 % stream, client hangs up after the first chunk (abort path)
   5 % refused: bad key / over a tenant's tiny rate limit (401 / 429 paths)

The first ``--warmup`` seconds are excluded from the growth figures (caches fill,
allocator arenas settle). Prints a markdown table of samples and a summary:

    python benchmarks/soak.py                      # 10 minutes
    python benchmarks/soak.py --duration 60 --rate 20
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import datetime as dt
import hashlib
import io
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
import uuid

import httpx

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))

from conftest import SIM_MODEL, Servers, free_port  # noqa: E402

KEY, LIMITED = "sk-soak-" + uuid.uuid4().hex, "sk-soak-limited-" + uuid.uuid4().hex


def sha(k: str) -> str:
    return hashlib.sha256(k.encode()).hexdigest()


def png(seed: int, size=(640, 480)) -> str:
    from PIL import Image
    rnd = random.Random(seed)
    im = Image.new("RGB", size, (rnd.randrange(256), rnd.randrange(256), rnd.randrange(256)))
    # a few blocks so the image is not uniform (no trim to nothing)
    for _ in range(6):
        x, y = rnd.randrange(size[0] - 64), rnd.randrange(size[1] - 64)
        im.paste((rnd.randrange(256), rnd.randrange(256), rnd.randrange(256)), (x, y, x + 64, y + 64))
    buf = io.BytesIO()
    im.save(buf, "PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def proc_sample(pid: int) -> tuple[float, int]:
    with open(f"/proc/{pid}/status") as f:
        rss = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
    return rss / 1024.0, len(os.listdir(f"/proc/{pid}/fd"))


def metric_values(text: str, name: str) -> dict[str, float]:
    out = {}
    for m in re.finditer(rf'^{name}(\{{[^}}]*\}})? ([0-9.e+-]+)$', text, re.M):
        out[m.group(1) or ""] = float(m.group(2))
    return out


class Load:
    def __init__(self, base: str, rate: float, max_inflight: int) -> None:
        self.base = base
        self.rate = rate
        self.sem = asyncio.Semaphore(max_inflight)
        self.client = httpx.AsyncClient(timeout=30, limits=httpx.Limits(max_connections=max_inflight))
        self.pool_text = [f"pooled question number {i}" for i in range(64)]
        self.pool_img = [png(i) for i in range(16)]
        self.unique_seed = 10_000
        self.counts: dict[str, int] = {}
        self.latencies: list[float] = []

    def count(self, k: str) -> None:
        self.counts[k] = self.counts.get(k, 0) + 1

    async def one(self, kind: str) -> None:
        h = {"authorization": f"Bearer {KEY}"}
        body: dict = {"model": SIM_MODEL, "max_tokens": 16, "temperature": 0}
        if kind == "text_unique":
            body["messages"] = [{"role": "user", "content": f"unique {uuid.uuid4().hex} question"}]
        elif kind == "text_pool":
            body["messages"] = [{"role": "user", "content": random.choice(self.pool_text)}]
        elif kind in ("img_pool", "img_unique"):
            if kind == "img_pool":
                url = random.choice(self.pool_img)
            else:
                self.unique_seed += 1
                url = png(self.unique_seed)
            body["messages"] = [{"role": "user", "content": [
                {"type": "text", "text": f"describe {uuid.uuid4().hex[:8]}"},
                {"type": "image_url", "image_url": {"url": url}}]}]
            body.pop("temperature")  # not cached at L3: L1 only
        elif kind in ("stream", "stream_abort"):
            body.update(stream=True, max_tokens=32)
            body.pop("temperature")
            body["messages"] = [{"role": "user", "content": f"stream {uuid.uuid4().hex}"}]
        elif kind == "refused":
            h = {"authorization": "Bearer " + random.choice(["sk-wrong", LIMITED])}
            body["messages"] = [{"role": "user", "content": "x"}]
        t0 = time.perf_counter()
        try:
            if kind.startswith("stream"):
                async with self.client.stream("POST", self.base + "/v1/chat/completions", json=body,
                                              headers=h) as r:
                    async for _ in r.aiter_lines():
                        if kind == "stream_abort":
                            break
                    status = r.status_code
            else:
                r = await self.client.post(self.base + "/v1/chat/completions", json=body, headers=h)
                status = r.status_code
            self.latencies.append(time.perf_counter() - t0)
            self.count(f"{kind}:{status}")
        except httpx.HTTPError as e:
            self.count(f"{kind}:{type(e).__name__}")

    async def run(self, duration: float) -> None:
        kinds = (["text_unique"] * 30 + ["text_pool"] * 20 + ["img_pool"] * 15 + ["img_unique"] * 10 +
                 ["stream"] * 15 + ["stream_abort"] * 5 + ["refused"] * 5)
        tasks: set[asyncio.Task] = set()
        t_end = time.monotonic() + duration
        next_t = time.monotonic()
        while time.monotonic() < t_end:
            next_t += 1.0 / self.rate
            await asyncio.sleep(max(0.0, next_t - time.monotonic()))
            if self.sem.locked():
                self.count("skipped:client_saturated")
                continue

            async def guarded(kind=random.choice(kinds)):
                async with self.sem:
                    await self.one(kind)
            t = asyncio.create_task(guarded())
            tasks.add(t)
            t.add_done_callback(tasks.discard)
        await asyncio.gather(*tasks)
        await self.client.aclose()


async def sampler(gw_pid: int, base: str, interval: float, samples: list, stop: asyncio.Event) -> None:
    t0 = time.monotonic()
    async with httpx.AsyncClient(timeout=10) as c:
        while not stop.is_set():
            rss, fds = proc_sample(gw_pid)
            text = (await c.get(base + "/metrics")).text
            entries = metric_values(text, "vlm_gateway_cache_entries")
            samples.append({"t": time.monotonic() - t0, "rss_mb": rss, "fds": fds,
                            "inflight": sum(metric_values(text, "vlm_gateway_backend_inflight").values()),
                            "l3_entries": sum(v for k, v in entries.items() if "l3" in k and "semantic" not in k)})
            try:
                await asyncio.wait_for(stop.wait(), interval)
            except asyncio.TimeoutError:
                pass


def slope_per_min(xs: list[float], ys: list[float]) -> float:
    n = len(xs)
    if n < 2:
        return 0.0
    mx, my = sum(xs) / n, sum(ys) / n
    den = sum((x - mx) ** 2 for x in xs) or 1.0
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / den * 60.0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duration", type=float, default=600.0)
    ap.add_argument("--rate", type=float, default=40.0, help="requests per second (open loop)")
    ap.add_argument("--warmup", type=float, default=60.0)
    ap.add_argument("--interval", type=float, default=10.0, help="seconds between samples")
    ap.add_argument("--max-inflight", type=int, default=256)
    args = ap.parse_args()
    assert shutil.which("redis-server"), "redis-server is required"

    with tempfile.TemporaryDirectory(prefix="vlmgw-soak-") as tmp:
        rport = free_port()
        redis = subprocess.Popen(["redis-server", "--port", str(rport), "--bind", "127.0.0.1", "--save", "",
                                  "--appendonly", "no", "--dir", tmp], stdout=subprocess.DEVNULL,
                                 start_new_session=True)
        s = Servers(tmp)
        try:
            time.sleep(0.3)
            sims = [s.sim(token_rate=400) for _ in range(2)]
            gw = s.gateway({
                "redis_url": f"redis://127.0.0.1:{rport}/0",
                "server": {"log_level": "warning"},
                "images": {"l1_max_bytes": 2 * 1024 * 1024},
                "cache": {"max_bytes": 512 * 1024},
                "auth": {"tenants": [{"name": "soak", "key_sha256": sha(KEY), "requests_per_minute": 1_000_000},
                                     {"name": "limited", "key_sha256": sha(LIMITED), "requests_per_minute": 2}]},
            }, backends=sims)
            samples: list = []
            stop = asyncio.Event()
            load = Load(gw.url, args.rate, args.max_inflight)

            async def go():
                st = asyncio.create_task(sampler(gw.proc.pid, gw.url, args.interval, samples, stop))
                await load.run(args.duration)
                stop.set()
                await st
            t0 = time.time()
            asyncio.run(go())
            wall = time.time() - t0
            alive = gw.proc.poll() is None
            log = gw.output()
        finally:
            s.stop_all()
            redis.kill()
            redis.wait(5)

    steady = [x for x in samples if x["t"] >= args.warmup] or samples
    ts = [x["t"] for x in steady]
    print(f"# soak: {args.duration:.0f} s at {args.rate:g} req/s, {dt.date.today()}, "
          f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs\n")
    print("| t (s) | RSS (MiB) | open fds | L3 entries | upstream in flight |")
    print("|---:|---:|---:|---:|---:|")
    for x in samples:
        print(f"| {x['t']:.0f} | {x['rss_mb']:.1f} | {x['fds']} | {x['l3_entries']:.0f} | {x['inflight']:.0f} |")
    total = sum(load.counts.values())
    print(f"\nrequests: {total} in {wall:.0f} s; outcomes: "
          + ", ".join(f"{k}={v}" for k, v in sorted(load.counts.items())))
    lat = sorted(load.latencies)
    if lat:
        print(f"latency (all kinds): median {lat[len(lat) // 2] * 1000:.1f} ms, "
              f"p99 {lat[int(len(lat) * 0.99)] * 1000:.1f} ms")
    print(f"after warm-up ({len(steady)} samples): RSS {steady[0]['rss_mb']:.1f} -> {steady[-1]['rss_mb']:.1f} MiB "
          f"(max {max(x['rss_mb'] for x in steady):.1f}), slope {slope_per_min(ts, [x['rss_mb'] for x in steady]):+.2f} MiB/min; "
          f"fds {steady[0]['fds']} -> {steady[-1]['fds']} (max {max(x['fds'] for x in steady)})")
    fivexx = sum(v for k, v in load.counts.items() if re.search(r":5\d\d$", k))
    print(f"5xx: {fivexx}; gateway alive at the end: {alive}; "
          f"tracebacks in its log: {log.count('Traceback')}")
    return 0 if alive and not fivexx else 1


if __name__ == "__main__":
    sys.exit(main())
