"""Scale benchmark: 1 vs 2 vs 4 gateway replicas (processes) sharing one Redis, or one
Redis Cluster, in front of 8 simulated engines, at the same offered load.

Per cell (fresh gateways, a flushed private Redis; the simulators stay up):

- **load**: each of ``--rates`` requests/s, open loop (Poisson arrivals) for ``--duration`` s, spread
  round-robin over the replicas as a load balancer would. Half are text questions drawn
  from ``--prompts`` distinct ones at temperature 0 (repeats are L3 hits, shared through
  Redis), half carry one of ``--images`` distinct 1280x720 JPEGs with a fresh question (L3
  misses; the image's rewrite is an L1 hit once any replica made it). All stream.
  Reported: achieved req/s, client TTFT p50/p99, the gateway's own overhead header
  (x-vlm-gateway-overhead-ms) p50/p99, L1/L3 hit rates (summed over the replicas' /metrics),
  CPU seconds per request of the gateways, the simulators, Redis and the load generator.
- **rate limit**: a tenant with ``requests_per_minute: --rpm`` is sent requests as fast as
  32 concurrent clients can for ``--burst-s`` s across the replicas; a token bucket admits
  at most rpm + rpm x seconds / 60. Reported: admitted, that bound, the excess (goal: no more
  than one request per replica).
- **concurrency limit**: a tenant with ``concurrent_streams: --streams`` opens 6x that many
  long streams at once across the replicas; reported: how many ran (goal: at most the limit
  plus one per replica).

    python benchmarks/scale.py                     # writes docs/benchmarks/scale.md
    python benchmarks/scale.py --replicas 1 2 --duration 10 --no-write

``--redis single cluster`` (the default) runs every cell twice, side by side: against a
private redis-server, and against a private Redis Cluster of three primaries with one
replica each (loopback ports, ``redis-cli --cluster create``; each replica's gateways
are pointed at a different node). The CPU time of Redis is read from every node
(INFO cpu). ``--redis-url`` uses an existing Redis or cluster instead (not flushed).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import datetime
import hashlib
import io
import os
import platform
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid

import aiohttp
import numpy as np
import orjson
import yaml
from PIL import Image

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
from redis_cluster import LocalCluster  # noqa: E402  (the tests' local cluster)

MODEL = "qwen3vl-sim"
DOCS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "docs", "benchmarks")
TICK = os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_s(pid: int) -> float:
    """utime + stime of a process and its reaped children, in seconds."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return sum(int(x) for x in fields[11:15]) / TICK


class Proc:
    def __init__(self, argv: list[str], port: int, log: str, ready: str | None) -> None:
        self.port, self.log = port, log
        with open(log, "w") as f:
            self.p = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, start_new_session=True,
                                      env={**os.environ, "PYTHONUNBUFFERED": "1"})
        self.ready = f"http://127.0.0.1:{port}{ready}" if ready else None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def wait(self, timeout: float = 60) -> None:
        import httpx
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.p.poll() is not None:
                raise RuntimeError(f"{self.log}: exited\n{open(self.log).read()[-3000:]}")
            try:
                if self.ready is None or httpx.get(self.ready, timeout=1).status_code == 200:
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


def vg(*args: str) -> list[str]:
    return [sys.executable, "-m", "vlm_gateway", *args]


def make_image(seed: int) -> str:
    rng = np.random.default_rng(seed)
    small = rng.integers(0, 255, (6, 8, 3), dtype=np.uint8)
    img = Image.fromarray(small).resize((1280, 720), Image.BICUBIC)
    arr = np.asarray(img, dtype=np.int16) + rng.integers(-12, 12, (720, 1280, 3), dtype=np.int16)
    buf = io.BytesIO()
    Image.fromarray(arr.clip(0, 255).astype(np.uint8)).save(buf, "JPEG", quality=85)
    return "data:image/jpeg;base64," + base64.b64encode(buf.getvalue()).decode()


def pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def scrape_sum(text: str, name: str, **labels) -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


# -- one cell ----------------------------------------------------------------------------------
async def one_request(session, url: str, key: str, body: dict, out: list) -> None:
    t0 = time.perf_counter()
    rec = {"status": 0, "ttft": None, "overhead": None, "cache": ""}
    try:
        async with session.post(url + "/v1/chat/completions", json=body,
                                headers={"authorization": f"Bearer {key}"}) as r:
            rec["status"] = r.status
            rec["cache"] = r.headers.get("x-vlm-gateway-cache", "")
            async for line in r.content:
                if rec["ttft"] is None and line.startswith(b"data: {"):
                    rec["ttft"] = time.perf_counter() - t0
            # the overhead header of a stream is written with the first bytes
            oh = r.headers.get("x-vlm-gateway-overhead-ms")
            rec["overhead"] = float(oh) if oh else None
    except (aiohttp.ClientError, asyncio.TimeoutError) as e:
        rec["error"] = type(e).__name__
    out.append(rec)


async def load_phase(gws: list[Proc], args, images: list[str], prompts: list[str], key: str) -> tuple[list, float]:
    rng = random.Random(7)
    out: list = []
    tasks = []
    conn = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=120)) as s:
        t0 = time.perf_counter()
        n = int(args.rate * args.duration)
        at = 0.0
        for i in range(n):
            at += rng.expovariate(args.rate)
            delay = t0 + at - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            if i % 2 == 0:
                content = rng.choice(prompts)
                body = {"model": MODEL, "messages": [{"role": "user", "content": content}], "temperature": 0,
                        "max_tokens": args.max_tokens, "stream": True}
            else:
                content = [{"type": "image_url", "image_url": {"url": rng.choice(images)}},
                           {"type": "text", "text": f"What is shown here? ({uuid.uuid4().hex[:8]})"}]
                body = {"model": MODEL, "messages": [{"role": "user", "content": content}], "temperature": 0,
                        "max_tokens": args.max_tokens, "stream": True}
            tasks.append(asyncio.create_task(one_request(s, gws[i % len(gws)].url, key, body, out)))
        await asyncio.gather(*tasks)
        wall = time.perf_counter() - t0
    return out, wall


async def rpm_phase(gws: list[Proc], key: str, seconds: float) -> int:
    ok = 0
    stop = time.perf_counter() + seconds
    counter = iter(range(10 ** 9))
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}

    async def worker(s):
        nonlocal ok
        while time.perf_counter() < stop:
            i = next(counter)
            async with s.post(gws[i % len(gws)].url + "/v1/chat/completions", json=body,
                              headers={"authorization": f"Bearer {key}"}) as r:
                await r.read()
                ok += r.status == 200
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as s:
        await asyncio.gather(*(worker(s) for _ in range(32)))
    return ok


async def streams_phase(gws: list[Proc], key: str, n: int) -> int:
    """Open n long streams at once; how many were admitted (200) while all were open."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": "long"}], "max_tokens": 400, "stream": True}
    admitted = 0
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as s:
        async def one(i):
            nonlocal admitted
            async with s.post(gws[i % len(gws)].url + "/v1/chat/completions", json=body,
                              headers={"authorization": f"Bearer {key}"}) as r:
                if r.status == 200:
                    admitted += 1
                    await r.content.readany()
                    await asyncio.sleep(2.0)   # hold it open while the others try
                else:
                    await r.read()
        await asyncio.gather(*(one(i) for i in range(n)))
    return admitted


def redis_cpu(urls: list[str]) -> float:
    """CPU seconds of every node (a cluster's replicas included: they apply every write)."""
    import redis
    total = 0.0
    for url in urls:
        info = redis.Redis.from_url(url).info("cpu")
        total += float(info["used_cpu_sys"]) + float(info["used_cpu_user"])
    return total


def run_cell(replicas: int, sims: list[Proc], args, tmp: str, nodes: list[str]) -> dict:
    """``nodes``: the Redis URLs (one, or every node of a cluster); replica i uses nodes[i % len]."""
    import redis
    if args.own_redis:
        for url in nodes:   # our private instance(s)
            r = redis.Redis.from_url(url)
            if r.info("replication").get("role") == "master":
                r.flushall()
    cell = uuid.uuid4().hex[:8]
    keys = {n: f"{n}-{cell}" for n in ("load", "rpm", "conc")}
    sha = lambda k: hashlib.sha256(k.encode()).hexdigest()  # noqa: E731
    cfg = {"server": {"workers": 1},
           "redis_prefix": f"scale-{cell}",
           "routing": {"policy": "affinity", "health_interval_s": 1.0},
           "backends": [{"url": s.url + "/v1", "name": f"sim{i}", "engine": "sim", "profile": "h200"}
                        for i, s in enumerate(sims)],
           "auth": {"tenants": [{"name": f"load-{cell}", "key_sha256": sha(keys["load"])},
                                {"name": f"rpm-{cell}", "key_sha256": sha(keys["rpm"]),
                                 "requests_per_minute": args.rpm},
                                {"name": f"conc-{cell}", "key_sha256": sha(keys["conc"]),
                                 "concurrent_streams": args.streams}]}}
    gws = []
    for r in range(replicas):
        path = os.path.join(tmp, f"gw-{replicas}-{r}.yaml")
        with open(path, "w") as f:
            yaml.safe_dump({**cfg, "redis_url": nodes[r % len(nodes)]}, f)
        port = free_port()
        gws.append(Proc(vg("serve", "--config", path, "--port", str(port)), port,
                        os.path.join(tmp, f"gw-{replicas}-{r}.log"), "/ready"))
    for g in gws:
        g.wait()
    images = [make_image(hash((cell, i)) & 0xFFFFFFFF) for i in range(args.images)]
    prompts = [f"Question {cell}-{i}: explain topic number {i} briefly." for i in range(args.prompts)]
    time.sleep(1.5)   # first scrapes and probes
    cpu0 = {"gateways": sum(cpu_s(g.p.pid) for g in gws), "engines": sum(cpu_s(s.p.pid) for s in sims),
            "redis": redis_cpu(nodes) if args.own_redis else 0.0, "client": time.process_time()}
    out, wall = asyncio.run(load_phase(gws, args, images, prompts, keys["load"]))
    cpu1 = {"gateways": sum(cpu_s(g.p.pid) for g in gws), "engines": sum(cpu_s(s.p.pid) for s in sims),
            "redis": redis_cpu(nodes) if args.own_redis else 0.0, "client": time.process_time()}
    metrics_text = "\n".join(aiohttp_get(g.url + "/metrics") for g in gws)
    ok = [r for r in out if r["status"] == 200 and r["ttft"] is not None]
    look = {lv: scrape_sum(metrics_text, "vlm_gateway_cache_lookups_total", level=lv) for lv in ("l1", "l3_exact")}
    hits = {lv: scrape_sum(metrics_text, "vlm_gateway_cache_hits_total", level=lv) for lv in ("l1", "l3_exact")}
    rpm_ok = asyncio.run(rpm_phase(gws, keys["rpm"], args.burst_s))
    conc_ok = asyncio.run(streams_phase(gws, keys["conc"], 6 * args.streams))
    for g in gws:
        g.stop()
    n = max(1, len(ok))
    return {
        "redis": args.mode, "replicas": replicas, "offered": args.rate, "sent": len(out), "ok": len(ok), "errors": len(out) - len(ok), "wall": wall,
        "rps": len(ok) / wall,
        "ttft_p50": pct([r["ttft"] for r in ok], 0.5) * 1000, "ttft_p99": pct([r["ttft"] for r in ok], 0.99) * 1000,
        "oh_p50": pct([r["overhead"] for r in ok if r["overhead"] is not None], 0.5),
        "oh_p99": pct([r["overhead"] for r in ok if r["overhead"] is not None], 0.99),
        "l1_hit": hits["l1"] / look["l1"] if look["l1"] else float("nan"),
        "l3_hit": hits["l3_exact"] / look["l3_exact"] if look["l3_exact"] else float("nan"),
        "cpu_per_req": {k: (cpu1[k] - cpu0[k]) / n * 1000 for k in cpu0},
        "cpu_share": {k: (cpu1[k] - cpu0[k]) / wall for k in cpu0},
        "rpm_ok": rpm_ok, "rpm_bound": args.rpm + args.rpm * args.burst_s / 60.0,
        "conc_ok": conc_ok,
    }


def aiohttp_get(url: str) -> str:
    import httpx
    return httpx.get(url, timeout=10).text


def _redis_words(args) -> str:
    if not args.own_redis:
        return args.redis_url
    words = {"single": "a private redis-server 7", "cluster": "a private Redis Cluster (3 primaries, 1 replica each)"}
    return " and ".join(words[m] for m in args.redis) + " on loopback"


def write(rows: list[dict], args, started: str) -> None:
    lines = ["## Gateway replicas sharing one Redis or a Redis Cluster (scale)", "",
             f"{args.engines} simulated engines (profile `fast`, {args.token_rate:g} tokens/s per sequence, "
             f"{args.max_tokens} tokens per answer) behind 1, 2 and 4 gateway processes sharing "
             f"{_redis_words(args)} (in a cluster, each replica is pointed at a different node); the same offered "
             f"load per row (Poisson arrivals: {', '.join(f'{r:g}' for r in args.rates)} requests/s) for {args.duration:g} s per cell, round-robin over the "
             f"replicas: half text questions from {args.prompts} distinct prompts at temperature 0 (repeats hit the "
             f"L3 cache), half a 1280x720 JPEG from {args.images} distinct images with a fresh question (the "
             "rewrite is an L1 hit once any replica made it). Fresh gateways and a flushed Redis per cell.", "",
             "| Redis | offered req/s | replicas | req/s achieved | errors | TTFT p50 / p99 (ms, client) | gateway overhead p50 / p99 (ms) "
             "| L1 hit | L3 hit | CPU ms/request: gateways / engines / Redis / client |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        c = r["cpu_per_req"]
        lines.append(f"| {r['redis']} | {r['offered']:g} | {r['replicas']} | {r['rps']:.1f} | {r['errors']} | {r['ttft_p50']:.0f} / {r['ttft_p99']:.0f} "
                     f"| {r['oh_p50']:.1f} / {r['oh_p99']:.1f} | {r['l1_hit']:.1%} | {r['l3_hit']:.1%} "
                     f"| {c['gateways']:.1f} / {c['engines']:.1f} / {c['redis']:.2f} / {c['client']:.1f} |")
    lines += ["", "Where the CPU went during the load phase (cores busy on average; the machine has "
              f"{os.cpu_count()}; Redis: every node):", "",
              "| Redis | offered req/s | replicas | gateways | engines | Redis | load generator | total |",
              "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        s = r["cpu_share"]
        lines.append(f"| {r['redis']} | {r['offered']:g} | {r['replicas']} | {s['gateways']:.2f} | {s['engines']:.2f} | {s['redis']:.3f} | "
                     f"{s['client']:.2f} | {sum(s.values()):.2f} |")
    lines += ["", f"Rate limits across replicas (shared token buckets and concurrency slots in Redis, atomic Lua; "
              f"in a cluster a tenant's keys share one hash slot): "
              f"a tenant with `requests_per_minute: {args.rpm}` driven by 32 concurrent clients for "
              f"{args.burst_s:g} s, and one with `concurrent_streams: {args.streams}` opening "
              f"{6 * args.streams} streams at once.", "",
              "| Redis | offered req/s | replicas | admitted (rpm) | bucket bound | excess (goal <= replicas) | streams admitted "
              "| limit (goal <= limit + replicas) |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        excess = r["rpm_ok"] - int(r["rpm_bound"])
        lines.append(f"| {r['redis']} | {r['offered']:g} | {r['replicas']} | {r['rpm_ok']} | {r['rpm_bound']:.1f} | {max(0, excess)} "
                     f"| {r['conc_ok']} | {args.streams} |")
    lines += ["", f"Command: `python benchmarks/scale.py {' '.join(sys.argv[1:])}`".rstrip() + " "
              f"({started}; this machine: {os.cpu_count()} cores, shared with other work "
              "while it ran; Python " + platform.python_version() + "). Raw rows: `scale.json`.", "",
              "**Machine caveat.** Every process (engines, gateways, Redis and the load generator) shares the same "
              f"{os.cpu_count()} cores, so adding gateway processes cannot add capacity here: the table shows what "
              "replicas cost and what they share, not how far they scale on separate machines. Run it on a larger "
              "machine (or with the engines elsewhere) for the scaling curve.", ""]
    os.makedirs(DOCS, exist_ok=True)
    with open(os.path.join(DOCS, "scale.md"), "w") as f:
        f.write("\n".join(lines))
    with open(os.path.join(DOCS, "scale.json"), "wb") as f:
        f.write(orjson.dumps({"started": started, "argv": sys.argv[1:], "rows": rows}, option=orjson.OPT_INDENT_2))


def start_redis(mode: str, tmp: str, procs: list, clusters: list) -> list[str]:
    """Start a private Redis of ``mode``; the URLs of its nodes."""
    if mode == "single":
        port = free_port()
        procs.append(Proc(["redis-server", "--bind", "127.0.0.1", "--port", str(port), "--save", "",
                           "--appendonly", "no"], port, os.path.join(tmp, "redis.log"), None))
        time.sleep(0.5)
        return [f"redis://127.0.0.1:{port}/0"]
    cl = LocalCluster(os.path.join(tmp, "cluster")).start()
    clusters.append(cl)
    return [cl.url_of(p) for p in cl.ports]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--replicas", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--engines", type=int, default=8)
    ap.add_argument("--rates", type=float, nargs="+", default=[40.0, 160.0],
                    help="offered loads (requests/s); each is run with every replica count")
    ap.add_argument("--duration", type=float, default=20.0)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--token-rate", type=float, default=100.0)
    ap.add_argument("--prompts", type=int, default=100)
    ap.add_argument("--images", type=int, default=40)
    ap.add_argument("--rpm", type=int, default=60)
    ap.add_argument("--burst-s", type=float, default=3.0)
    ap.add_argument("--streams", type=int, default=4)
    ap.add_argument("--redis", nargs="+", choices=["single", "cluster"], default=["single", "cluster"],
                    help="private Redis kinds to run every cell against, side by side")
    ap.add_argument("--redis-url", default="", help="an existing Redis or cluster node instead (not flushed)")
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()
    args.own_redis = not args.redis_url
    started = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    with tempfile.TemporaryDirectory(prefix="vlmgw-scale-") as tmp:
        procs: list[Proc] = []
        clusters: list[LocalCluster] = []
        try:
            if args.own_redis and not (shutil.which("redis-server") and shutil.which("redis-cli")):
                sys.exit("redis-server and redis-cli are not installed; pass --redis-url")
            nodes = {m: start_redis(m, tmp, procs, clusters) for m in args.redis} if args.own_redis \
                else {"given": [args.redis_url]}
            sims = []
            for i in range(args.engines):
                port = free_port()
                sims.append(Proc(vg("sim", "--port", str(port), "--profile", "fast", "--token-rate",
                                    str(args.token_rate), "--model", MODEL), port,
                                 os.path.join(tmp, f"sim{i}.log"), "/health"))
            procs += sims
            for s in sims:
                s.wait()
            rows = []
            for rate in args.rates:
                for r in args.replicas:
                    for mode, urls in nodes.items():   # side by side: same rate and replicas, each Redis
                        args.rate, args.mode = rate, mode
                        row = run_cell(r, sims, args, tmp, urls)
                        print(orjson.dumps(row, option=orjson.OPT_INDENT_2).decode(), flush=True)
                        rows.append(row)
            if not args.no_write:
                write(rows, args, started)
        finally:
            for p in reversed(procs):
                p.stop()
            for cl in clusters:
                cl.stop()


if __name__ == "__main__":
    main()
