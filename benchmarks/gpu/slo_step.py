#!/usr/bin/env python3
"""SLO-aware image budgets on a real engine: the step load 0.5x -> 2x -> 0.5x of the
fixed-budget capacity, against a gateway on :8080 in front of one vLLM on :8000.

    bash benchmarks/gpu/start_gateway.sh 1 affinity 8      # default slo config (p99 2000 ms)
    python3 benchmarks/gpu/slo_step.py --out slo-step.json
    python3 benchmarks/gpu/slo_step.py --dry-run --out /tmp/slo-dry.json   # here: simulator

1. capacity: ``--cap-seconds`` closed loop at ``--cap-concurrency`` through the gateway, with
   fixed budgets (no request opts in, so no image is made smaller): completed req/s = C;
2. step load, open loop (Poisson, seeded): ``--phases`` seconds at 0.5 C, 2 C, 0.5 C.

Traffic: 45 % 1920x1080 screenshots (text), 35 % 1920x1440 photos, 20 % text only (~300
tokens); each image is new (a unique mark drawn into a shared base picture, so neither the
gateway's L1 nor the engine's processor cache serves it); 64 output tokens (ignore_eos),
streamed. Until the gateway estimates legibility every image is of class "unknown" and keeps
its budget, so by default the photos opt in to smaller sizes
(``x-vlm-gateway-image-policy: below-floor``; ``--opt-in none|photos|all``).

Recorded per request: send time, phase, kind, status (429 = refused), TTFT (first content
token), the level and long side of ``x-vlm-gateway-image-budget``, visual tokens before/after;
every second the gateway's /ui/api/status (level and TTFT per pool: the controller's own
reading of real engine metrics) and the engine's waiting/running. Output: one JSON file with
the summary per phase and the raw records. Total run time with the defaults: under 4 minutes.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import io
import json
import math
import os
import random
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import aiohttp
from PIL import Image, ImageDraw

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from loadgen import photo, screenshot  # noqa: E402

BUDGET_HEADER = "x-vlm-gateway-image-budget"
POLICY_HEADER = "x-vlm-gateway-image-policy"
MIX = (("screenshot", 0.45), ("photo", 0.35), ("text", 0.20))


# -- traffic ------------------------------------------------------------------------------------

_BASES: dict[str, Image.Image] = {}


def _image(args: tuple[str, int, bool]) -> str:
    """A new JPEG (data: URI) of ``kind``: a shared base picture with a unique mark."""
    kind, seed, small = args
    key = f"{kind}{small}"
    if key not in _BASES:
        if kind == "screenshot":
            _BASES[key] = screenshot(7, *((1280, 720) if small else (1920, 1080)))
        else:
            _BASES[key] = photo(7, *((1024, 768) if small else (1920, 1440)))
    im = _BASES[key].copy()
    rnd = random.Random(seed)
    d = ImageDraw.Draw(im)
    for _ in range(3):
        x, y = rnd.randrange(im.width - 64), rnd.randrange(im.height - 64)
        d.rectangle([x, y, x + 48, y + 48], fill=(rnd.randrange(256), rnd.randrange(256), rnd.randrange(256)))
    buf = io.BytesIO()
    im.save(buf, "JPEG", quality=90)
    return "data:image/jpeg;base64," + base64.b64encode(buf.getvalue()).decode()


def kinds(n: int, seed: int) -> list[str]:
    rnd = random.Random(seed)
    return [rnd.choices([k for k, _ in MIX], [w for _, w in MIX])[0] for _ in range(n)]


def bodies_for(ks: list[str], seed: int, small: bool, model: str, pool: ProcessPoolExecutor) -> list[dict]:
    jobs = [(k, seed * 1_000_003 + i, small) for i, k in enumerate(ks) if k != "text"]
    uris = iter(pool.map(_image, jobs, chunksize=16))
    out = []
    for k in ks:
        content: list[dict] = [{"type": "text", "text": "Describe this image." if k != "text" else
                                "Summarise the following notes. " + "lorem ipsum " * 100}]
        if k != "text":
            content.append({"type": "image_url", "image_url": {"url": next(uris)}})
        out.append({"kind": k, "body": {"model": model, "max_tokens": 64, "ignore_eos": True, "stream": True,
                                        "messages": [{"role": "user", "content": content}]}})
    return out


# -- one request --------------------------------------------------------------------------------

async def send(session: aiohttp.ClientSession, base: str, item: dict, opt_in: str) -> dict:
    headers = {}
    if opt_in == "all" or (opt_in == "photos" and item["kind"] == "photo"):
        headers[POLICY_HEADER] = "below-floor"
    t0 = time.perf_counter()
    rec = {"kind": item["kind"], "status": 0, "ttft": None}
    try:
        async with session.post(base + "/chat/completions", json=item["body"], headers=headers) as r:
            rec["status"] = r.status
            budget = r.headers.get(BUDGET_HEADER, "")
            # "param;class=..;long_side=N;...;level=L" or "param;long_side=original;level=L"
            side, level = re.search(r"long_side=(\w+)", budget), re.search(r"level=(\d+)", budget)
            if side and level:
                rec["long_side"] = int(side.group(1)) if side.group(1).isdigit() else 0
                rec["level"] = int(level.group(1))
            vt = r.headers.get("x-vlm-gateway-visual-tokens", "")
            m = re.match(r"before=(\d+);after=(\d+)", vt)
            if m:
                rec["tokens_before"], rec["tokens_after"] = int(m.group(1)), int(m.group(2))
            if r.status != 200:
                await r.read()
                return rec
            async for line in r.content:
                if rec["ttft"] is None and line.startswith(b"data: {") and b'"content":"' in line:
                    ev = json.loads(line[6:])
                    if any((c.get("delta") or {}).get("content") for c in ev.get("choices") or ()):
                        rec["ttft"] = time.perf_counter() - t0
    except (aiohttp.ClientError, asyncio.TimeoutError) as e:
        rec["error"] = type(e).__name__
    return rec


# -- phases -------------------------------------------------------------------------------------

async def capacity(base: str, items: list[dict], concurrency: int, seconds: float) -> tuple[float, list[dict]]:
    """Completed req/s in the second half of a closed-loop run (no opt-in: fixed budgets)."""
    done: list[tuple[float, dict]] = []
    t0 = time.perf_counter()
    queue = list(items)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as s:
        async def worker():
            while queue and time.perf_counter() - t0 < seconds:
                rec = await send(s, base, queue.pop(), "none")
                done.append((time.perf_counter() - t0, rec))
        await asyncio.gather(*(worker() for _ in range(concurrency)))
    ok = [t for t, r in done if r["ttft"] is not None and seconds / 2 <= t < seconds]
    return len(ok) / (seconds / 2), [r for _, r in done]


async def poll(gw: str, engine: str, samples: list[dict], stop: asyncio.Event, t0: float) -> None:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as s:
        while not stop.is_set():
            row = {"t": round(time.perf_counter() - t0, 2)}
            try:
                async with s.get(gw + "/ui/api/status") as r:
                    if r.status == 200:
                        st = await r.json()
                        row["pools"] = (st.get("image_budget") or {}).get("pools")
                async with s.get(engine + "/metrics") as r:
                    text = await r.text()
                for name in ("num_requests_waiting", "num_requests_running", "kv_cache_usage_perc"):
                    vals = [float(m.group(1)) for m in re.finditer(rf"^vllm:{name}\{{[^}}]*\}} (\S+)$", text, re.M)]
                    if vals:
                        row[name] = sum(vals)
            except (aiohttp.ClientError, asyncio.TimeoutError, ValueError):
                pass
            samples.append(row)
            try:
                await asyncio.wait_for(stop.wait(), 1.0)
            except asyncio.TimeoutError:
                pass


async def step(base: str, gw: str, engine: str, items: list[dict], times: list[float], opt_in: str
               ) -> tuple[list[dict], list[dict]]:
    recs: list[dict] = []
    samples: list[dict] = []
    stop = asyncio.Event()
    t0 = time.perf_counter()
    poller = asyncio.ensure_future(poll(gw, engine, samples, stop, t0))
    conn = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600), connector=conn) as s:
        async def one(t: float, item: dict):
            rec = await send(s, base, item, opt_in)
            rec["t"] = round(t, 3)
            recs.append(rec)
        tasks = []
        for t, item in zip(times, items):
            delay = t0 + t - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.ensure_future(one(t, item)))
        await asyncio.gather(*tasks)
    stop.set()
    await poller
    return recs, samples


def pct(v: list[float], q: float) -> float | None:
    if not v:
        return None
    s = sorted(v)
    return s[max(0, math.ceil(q * len(s)) - 1)]


def summary(recs: list[dict], phases: list[tuple[str, float, float]], target_ms: float) -> dict:
    out = {}
    # each kind's budget: its long side at level 0 (over the whole run)
    full = {k: max((r["long_side"] for r in recs if r["kind"] == k and r.get("level") == 0 and r.get("long_side")),
                   default=0) for k in ("screenshot", "photo")}
    for name, a, b in phases:
        ph = [r for r in recs if a <= r["t"] < b]
        ok = [r for r in ph if r["ttft"] is not None]
        tt = [r["ttft"] * 1000 for r in ok]
        imgs = [r for r in ok if r["kind"] != "text" and "long_side" in r]
        row = {"sent": len(ph), "offered_rps": round(len(ph) / (b - a), 2), "answered_rps": round(len(ok) / (b - a), 2),
               "rejected_429": sum(1 for r in ph if r["status"] == 429),
               "failed": sum(1 for r in ph if r["status"] not in (200, 429)),
               "ttft_p50_ms": round(statistics.median(tt), 1) if tt else None,
               "ttft_p99_ms": round(pct(tt, 0.99), 1) if tt else None}
        row["p99_over_slo"] = round(row["ttft_p99_ms"] / target_ms, 2) if tt and target_ms else None
        for k in ("screenshot", "photo"):
            ki = [r for r in imgs if r["kind"] == k]
            deg = [r for r in ki if r["long_side"] and full[k] and r["long_side"] < full[k]]
            row[f"{k}_degraded_share"] = round(len(deg) / len(ki), 3) if ki else None
            row[f"{k}_mean_tokens_after"] = round(statistics.mean(r["tokens_after"] for r in ki), 1) \
                if ki and all("tokens_after" in r for r in ki) else None
        row["max_level"] = max((r.get("level", 0) for r in ph), default=0)
        out[name] = row
    return out


# -- the dry run: a simulator and a gateway on this machine ---------------------------------------

def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait(url: str, proc: subprocess.Popen, timeout: float = 60.0) -> None:
    import urllib.request
    end = time.time() + timeout
    while time.time() < end:
        if proc.poll() is not None:
            raise SystemExit(f"{url}: process exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.2)
    raise SystemExit(f"{url} did not answer in {timeout:g}s")


def start_local(tmp: str, model: str) -> tuple[list[subprocess.Popen], str, str]:
    sim_port, gw_port = _port(), _port()
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    sim = subprocess.Popen([sys.executable, "-m", "vlm_gateway", "sim", "--port", str(sim_port), "--profile", "h200",
                            "--model", model, "--time-scale", "4"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
                           start_new_session=True)
    cfg = Path(tmp) / "gateway.yaml"
    cfg.write_text(f"backends: [{{url: 'http://127.0.0.1:{sim_port}/v1', name: sim0, engine: sim, models: [{model}]}}]\n")
    gw = subprocess.Popen([sys.executable, "-m", "vlm_gateway", "serve", "--config", str(cfg), "--port", str(gw_port)],
                          env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, start_new_session=True)
    _wait(f"http://127.0.0.1:{sim_port}/health", sim)
    _wait(f"http://127.0.0.1:{gw_port}/ready", gw)
    return [gw, sim], f"http://127.0.0.1:{gw_port}", f"http://127.0.0.1:{sim_port}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="JSON results")
    ap.add_argument("--gateway", default="http://127.0.0.1:8080")
    ap.add_argument("--engine", default="http://127.0.0.1:8000", help="the engine's origin (its /metrics)")
    ap.add_argument("--model", default=os.environ.get("LOADGEN_MODEL", "qwen3vl"))
    ap.add_argument("--phases", default="40,90,60", help="seconds at 0.5x, 2x, 0.5x")
    ap.add_argument("--peak", type=float, default=2.0)
    ap.add_argument("--cap-seconds", type=float, default=20.0)
    ap.add_argument("--cap-concurrency", type=int, default=48)
    ap.add_argument("--capacity", type=float, default=0.0, help="req/s; 0 = measure it first")
    ap.add_argument("--opt-in", choices=("none", "photos", "all"), default="photos")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--dry-run", action="store_true",
                    help="start a simulator (h200 at a quarter speed, so that it and not this machine's "
                         "gateway is what saturates) and a gateway here; short phases, small images")
    args = ap.parse_args(argv)
    procs: list[subprocess.Popen] = []
    tmp = tempfile.mkdtemp(prefix="slo-step-")
    small = args.dry_run
    if args.dry_run:
        procs, args.gateway, args.engine = start_local(tmp, args.model)
        if args.phases == ap.get_default("phases"):
            args.phases = "8,16,14"
        if args.cap_seconds == ap.get_default("cap_seconds"):
            args.cap_seconds = 8.0
        if args.cap_concurrency == ap.get_default("cap_concurrency"):
            args.cap_concurrency = 8
    try:
        return run(args, small)
    finally:
        for p in procs:
            try:
                os.killpg(p.pid, signal.SIGTERM)
                p.wait(10)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                pass
        shutil.rmtree(tmp, ignore_errors=True)


def run(args, small: bool) -> int:
    base = args.gateway.rstrip("/") + "/v1"
    p1, p2, p3 = (float(x) for x in args.phases.split(","))
    t_start = time.time()
    with ProcessPoolExecutor(max(1, min(14, (os.cpu_count() or 2) - 2))) as pool:
        cap, cap_recs = args.capacity, []
        if not cap:
            items = bodies_for(kinds(int(args.cap_concurrency * args.cap_seconds * 4), args.seed + 1), args.seed + 1,
                               small, args.model, pool)
            cap, cap_recs = asyncio.run(capacity(base, items, args.cap_concurrency, args.cap_seconds))
        print(f"fixed-budget capacity {cap:.1f} req/s", flush=True)
        rnd = random.Random(args.seed)
        times, t = [], 0.0
        while True:
            rate = cap * (args.peak if p1 <= t < p1 + p2 else 0.5)
            t += rnd.expovariate(rate)  # piecewise: the next gap at the rate of now
            if t >= p1 + p2 + p3:
                break
            times.append(t)
        items = bodies_for(kinds(len(times), args.seed), args.seed, small, args.model, pool)
    print(f"{len(times)} requests over {p1 + p2 + p3:g} s", flush=True)
    recs, samples = asyncio.run(step(base, args.gateway, args.engine, items, times, args.opt_in))
    pools = next((s["pools"] for s in reversed(samples) if s.get("pools")), None) or []
    target = pools[0]["target_ms"] if pools else 0.0
    phases = [("0.5x", 0.0, p1), (f"{args.peak:g}x", p1, p1 + p2), ("0.5x after", p1 + p2, p1 + p2 + p3)]
    levels = [(s["t"], max((p["level"] for p in s.get("pools") or []), default=0)) for s in samples]
    last_high = max((t for t, lv in levels if lv and t >= p1 + p2), default=None)
    recovery = 0.0 if last_high is None else next((round(t - (p1 + p2), 1) for t, lv in levels
                                                   if t > last_high and lv == 0), None)
    out = {"gateway": args.gateway, "engine": args.engine, "dry_run": small, "capacity_rps": round(cap, 2),
           "capacity_records": len(cap_recs), "peak": args.peak, "phases_s": [p1, p2, p3], "opt_in": args.opt_in,
           "slo_target_ms": target, "summary": summary(recs, phases, target), "recovery_s": recovery,
           "wall_s": round(time.time() - t_start, 1), "samples": samples, "records": sorted(recs, key=lambda r: r["t"])}
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps({k: out[k] for k in ("capacity_rps", "slo_target_ms", "summary", "recovery_s", "wall_s")},
                     indent=1), flush=True)
    ok = [r for r in recs if r["ttft"] is not None]
    if not ok or not samples or not pools:
        print("no answers or no controller status: see the gateway's log", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
