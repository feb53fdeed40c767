"""Routing benchmark: round_robin vs least_loaded vs text-only prefix vs affinity.

A pool of simulators (default 4, H200 profile, with the simulator's prefix
cache) behind one gateway per policy. 200 three-turn conversations, each about
its own image (a distinct JPEG sent in every turn, as chat clients do), start
at Poisson arrival times; a conversation's next turn follows its previous
answer after a short think time. The arrival rate is set to ``--load`` (0.7) of
the pool's saturated request throughput, measured first with round_robin in a
closed loop (``--rate`` skips that). First-turn questions come from a small set
of templates, as in real traffic, so a text-only router sees many identical
prompts whose images differ.

Reported per policy: TTFT mean / p50 / p99 (client-side, first SSE chunk),
throughput, and the prefix-cache hit rate summed over the simulators' own
/metrics (tokens hit / tokens queried). Simulators run ``--time-scale`` times
slower than the H200 they model so that a 2-core machine can drive them; times
are reported in model time (wall / time scale). Fresh simulators and gateway
for every policy.

    python benchmarks/routing.py                       # full run, writes docs/benchmarks/routing.md
    python benchmarks/routing.py --conversations 40 --no-write   # quick look
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import datetime
import io
import math
import os
import random
import shlex
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import aiohttp
import numpy as np
import orjson
import yaml
from PIL import Image

MODEL = "qwen3vl-sim"
SYSTEM = ("You are a meticulous visual assistant. Describe what you see precisely, name objects, colours and "
          "positions, and say when you are unsure.")
FIRST = ["What is in this picture?", "Describe this image in detail.", "What stands out in this photo?",
         "Summarise what this image shows.", "What is happening here?"]
FOLLOW = ["What colours dominate it?", "Is there any text visible?", "What would you crop to improve it?",
          "How many distinct objects can you count?", "Where was this likely taken?"]


# -- processes -------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Proc:
    def __init__(self, args: list[str], port: int, log: str, ready: str) -> None:
        self.port = port
        self.log = log
        with open(log, "w") as f:
            self.p = subprocess.Popen([sys.executable, "-m", "vlm_gateway", *args], stdout=f,
                                      stderr=subprocess.STDOUT, start_new_session=True,
                                      env={**os.environ, "PYTHONUNBUFFERED": "1"})
        self.ready = f"http://127.0.0.1:{port}{ready}"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def wait(self, timeout: float = 60) -> None:
        import httpx
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.p.poll() is not None:
                raise RuntimeError(f"{self.ready} exited:\n{open(self.log).read()[-3000:]}")
            try:
                if httpx.get(self.ready, timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"{self.ready} not ready after {timeout}s")

    def stop(self) -> None:
        if self.p.poll() is None:
            self.p.terminate()
            try:
                self.p.wait(10)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait(5)


def start_pool(policy: str, args, tmp: str) -> tuple[list[Proc], Proc]:
    sims = []
    for i in range(args.sims):
        port = free_port()
        sims.append(Proc(["sim", "--port", str(port), "--profile", args.sim_profile, "--time-scale",
                          str(args.time_scale), "--model", MODEL], port, os.path.join(tmp, f"sim{i}.log"), "/health"))
    for s in sims:
        s.wait()
    cfg = {"routing": {"policy": policy, "health_interval_s": 1.0},
           "cache": {"enabled": False},
           "backends": [{"url": s.url + "/v1", "name": f"sim{i}", "engine": "sim", "profile": args.profile}
                        for i, s in enumerate(sims)]}
    path = os.path.join(tmp, f"gateway-{policy}.yaml")
    with open(path, "w") as f:
        yaml.safe_dump(cfg, f)
    port = free_port()
    gw = Proc(["serve", "--config", path, "--port", str(port)], port, os.path.join(tmp, f"gw-{policy}.log"), "/ready")
    gw.wait()
    return sims, gw


# -- workload --------------------------------------------------------------------------------
def make_image(i: int, size: tuple[int, int]) -> str:
    """A distinct, deterministic photo-like JPEG (smooth colour field + noise)."""
    rng = np.random.default_rng(1000 + i)
    w, h = size
    small = rng.integers(0, 255, (6, 8, 3), dtype=np.uint8)
    img = Image.fromarray(small).resize((w, h), Image.BICUBIC)
    arr = np.asarray(img, dtype=np.int16) + rng.integers(-12, 12, (h, w, 3), dtype=np.int16)
    buf = io.BytesIO()
    Image.fromarray(arr.clip(0, 255).astype(np.uint8)).save(buf, "JPEG", quality=85)
    return "data:image/jpeg;base64," + base64.b64encode(buf.getvalue()).decode()


class Conversation:
    def __init__(self, i: int, image: str, rng: random.Random) -> None:
        self.messages = [{"role": "system", "content": SYSTEM},
                         {"role": "user", "content": [{"type": "image_url", "image_url": {"url": image}},
                                                      {"type": "text", "text": rng.choice(FIRST)}]}]
        self.follow = rng.sample(FOLLOW, 2)


async def one_request(session: aiohttp.ClientSession, url: str, messages: list, max_tokens: int) -> dict:
    body = orjson.dumps({"model": MODEL, "messages": messages, "max_tokens": max_tokens, "stream": True,
                         "temperature": 0.7})
    t0 = time.perf_counter()
    ttft = None
    text = []
    buf = b""
    try:
        async with session.post(url, data=body, headers={"content-type": "application/json"}) as r:
            if r.status != 200:
                await r.read()
                return {"ok": False, "status": r.status}
            async for chunk in r.content.iter_any():
                if ttft is None and b"data:" in chunk:
                    ttft = time.perf_counter() - t0
                buf += chunk
                while b"\n\n" in buf:
                    ev, buf = buf.split(b"\n\n", 1)
                    if ev.startswith(b"data: ") and ev != b"data: [DONE]":
                        obj = orjson.loads(ev[6:])
                        if obj.get("error"):
                            return {"ok": False, "status": "stream_error"}
                        for ch in obj.get("choices") or ():
                            text.append((ch.get("delta") or {}).get("content") or "")
    except (aiohttp.ClientError, asyncio.TimeoutError) as e:
        return {"ok": False, "status": type(e).__name__}
    return {"ok": ttft is not None, "ttft": ttft, "e2e": time.perf_counter() - t0, "text": "".join(text),
            "tokens": len(text)}


async def run_conversation(session, url, conv: Conversation, args, results: list, rng: random.Random) -> None:
    for turn in range(3):
        res = await one_request(session, url, conv.messages, args.max_tokens)
        res["turn"] = turn
        results.append(res)
        if not res["ok"]:
            return
        conv.messages.append({"role": "assistant", "content": res["text"]})
        if turn < 2:
            conv.messages.append({"role": "user", "content": conv.follow[turn]})
            await asyncio.sleep(rng.expovariate(1.0 / args.think_s) * args.time_scale)


async def drive_open(url: str, images: list[str], args, rate_conv: float) -> tuple[list[dict], float]:
    rng = random.Random(7)
    conns = aiohttp.TCPConnector(limit=0)
    results: list[dict] = []
    async with aiohttp.ClientSession(connector=conns, timeout=aiohttp.ClientTimeout(total=600)) as session:
        tasks = []
        t0 = time.perf_counter()
        for i in range(args.conversations):
            conv = Conversation(i, images[i], rng)
            tasks.append(asyncio.create_task(run_conversation(session, url, conv, args, results,
                                                              random.Random(i))))
            await asyncio.sleep(rng.expovariate(rate_conv))
        await asyncio.gather(*tasks, return_exceptions=True)
        wall = time.perf_counter() - t0
    return results, wall


async def drive_closed(url: str, images: list[str], args, workers: int, duration: float) -> float:
    """Saturated request throughput (req/s wall) with ``workers`` conversations back to back."""
    rng = random.Random(3)
    done = 0
    failed: list = []
    stop = time.perf_counter() + duration
    conns = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=conns, timeout=aiohttp.ClientTimeout(total=600)) as session:
        async def worker(w: int) -> None:
            nonlocal done
            k = w
            while time.perf_counter() < stop:
                conv = Conversation(k, images[k % len(images)], rng)
                for turn in range(3):
                    res = await one_request(session, url, conv.messages, args.max_tokens)
                    if time.perf_counter() < stop and res["ok"]:
                        done += 1
                    elif not res["ok"]:
                        failed.append(res.get("status"))
                        return
                    conv.messages += [{"role": "assistant", "content": res.get("text", "")},
                                      {"role": "user", "content": conv.follow[turn % 2]}]
                k += workers
        t0 = time.perf_counter()
        await asyncio.gather(*(worker(w) for w in range(workers)))
        if failed:
            print(f"calibration: {len(failed)} failed requests, e.g. {failed[:3]}", flush=True)
        return done / (min(time.perf_counter(), stop) - t0)


async def prefix_counters(sims: list[Proc]) -> tuple[float, float]:
    from vlm_gateway.backends.scrape import extract, parse
    hits = queries = 0.0
    async with aiohttp.ClientSession() as s:
        for sim in sims:
            async with s.get(sim.url + "/metrics") as r:
                fig = extract(parse((await r.read()).decode()))
            hits += fig.get("prefix_hits", 0.0)
            queries += fig.get("prefix_queries", 0.0)
    return hits, queries


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, math.ceil(q * len(xs)) - 1))]


# -- main ------------------------------------------------------------------------------------
def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--conversations", type=int, default=200)
    ap.add_argument("--sims", type=int, default=4)
    ap.add_argument("--sim-profile", default="h200")
    ap.add_argument("--profile", default="h200", help="gateway GPU profile of every backend")
    ap.add_argument("--time-scale", type=float, default=10.0)
    ap.add_argument("--load", type=float, default=0.7)
    ap.add_argument("--rate", type=float, default=0.0, help="requests/s (wall); 0 = measure and use --load")
    ap.add_argument("--calib-workers", type=int, default=32)
    ap.add_argument("--calib-s", type=float, default=30.0)
    ap.add_argument("--think-s", type=float, default=0.25, help="mean think time between turns (model s)")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--image-size", default="1280x960")
    ap.add_argument("--policies", default="round_robin,least_loaded,text_prefix,affinity")
    ap.add_argument("--out", default="docs/benchmarks/routing.md")
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()
    size = tuple(int(x) for x in args.image_size.split("x"))
    print(f"generating {args.conversations} images {size[0]}x{size[1]} ...", flush=True)
    images = [make_image(i, size) for i in range(args.conversations)]
    policies = args.policies.split(",")
    rows = []
    with tempfile.TemporaryDirectory(prefix="vlmgw-bench-routing-") as tmp:
        rate = args.rate
        if not rate:
            sims, gw = start_pool("round_robin", args, tmp)
            try:
                sat = asyncio.run(drive_closed(gw.url + "/v1/chat/completions", images, args, args.calib_workers,
                                               args.calib_s))
            finally:
                gw.stop()
                for s in sims:
                    s.stop()
            rate = args.load * sat
            print(f"saturated throughput (round_robin, {args.calib_workers} closed-loop conversations): "
                  f"{sat:.2f} req/s wall -> offered {rate:.2f} req/s", flush=True)
        rate_conv = rate / 3
        for policy in policies:
            sims, gw = start_pool(policy, args, tmp)
            try:
                results, wall = asyncio.run(drive_open(gw.url + "/v1/chat/completions", images, args, rate_conv))
                hits, queries = asyncio.run(prefix_counters(sims))
            finally:
                gw.stop()
                for s in sims:
                    s.stop()
            ok = [r for r in results if r["ok"]]
            ttft = [r["ttft"] / args.time_scale * 1000 for r in ok]
            late = [r["ttft"] / args.time_scale * 1000 for r in ok if r["turn"] > 0]
            row = {"policy": policy, "n": len(results), "errors": len(results) - len(ok),
                   "mean": statistics.fmean(ttft), "p50": pct(ttft, 0.5), "p99": pct(ttft, 0.99),
                   "mean_later": statistics.fmean(late) if late else float("nan"),
                   "rps": len(ok) / wall * args.time_scale, "tok_s": sum(r["tokens"] for r in ok) / wall * args.time_scale,
                   "hit": hits / queries if queries else float("nan")}
            rows.append(row)
            print(f"{policy:13s} n={row['n']} err={row['errors']} TTFT mean {row['mean']:.1f} ms p50 {row['p50']:.1f} "
                  f"p99 {row['p99']:.1f} (turns 2-3 mean {row['mean_later']:.1f}) thr {row['rps']:.1f} req/s "
                  f"hit {row['hit']:.1%}", flush=True)
    base = {r["policy"]: r for r in rows}
    rr = base.get("round_robin")
    lines = ["| policy | requests | errors | TTFT mean (ms) | TTFT p50 (ms) | TTFT p99 (ms) | turns 2-3 TTFT mean (ms) "
             "| throughput (req/s) | prefix-cache hit rate | mean TTFT vs round_robin |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        ratio = f"{rr['mean'] / r['mean']:.2f}x better" if rr else "-"
        lines.append(f"| {r['policy']} | {r['n']} | {r['errors']} | {r['mean']:.1f} | {r['p50']:.1f} | {r['p99']:.1f} "
                     f"| {r['mean_later']:.1f} | {r['rps']:.1f} | {r['hit']:.1%} | {ratio} |")
    table = "\n".join(lines)
    print(table)
    if not args.no_write:
        cmd = "python benchmarks/routing.py " + " ".join(shlex.quote(a) for a in sys.argv[1:])
        doc = f"""# Routing benchmark

{__doc__.split(chr(10) + chr(10), 1)[1].split(chr(10) + chr(10) + '    python')[0]}

Command: `{cmd.strip()}`
Machine: 2-core shared VM (other work running at the same time); date {datetime.date.today().isoformat()}.
Pool: {args.sims} simulators, simulator profile `{args.sim_profile}`, gateway profile `{args.profile}`,
time scale {args.time_scale:g}; {args.conversations} conversations x 3 turns, images {args.image_size} JPEG,
max_tokens {args.max_tokens}, think time mean {args.think_s:g} s; offered load {rate:.2f} req/s wall
({args.load:.0%} of round_robin's saturated throughput unless --rate was given).
Times are model time (wall / time scale); throughput is model-time requests/s.

{table}
"""
        os.makedirs(os.path.dirname(args.out), exist_ok=True)
        with open(args.out, "w") as f:
            f.write(doc)
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
