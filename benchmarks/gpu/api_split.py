#!/usr/bin/env python3
"""Where a request's time goes on the real engine (issue #28 item 3): per request, the
gateway's media time (its ``Server-Timing``), the engine's API-server share (send ->
response headers, which vLLM 0.24 answers only after its API server has rendered the
template and preprocessed every image) and the engine's share (headers -> first token),
for (a) raw images straight to vLLM, (b) images resized by the client to exactly what the
gateway sends, (c) raw images through the gateway; every image new to its cell. vLLM's own
request metrics are scraped before and after each cell to confirm the split: its TTFT
counts from the API server's arrival, ``request_queue_time`` is the scheduler's waiting
queue and ``request_prefill_time`` scheduling -> first token, so TTFT - queue - prefill is
the time before the scheduler (docs/benchmarks/gpu.md, "Where the time goes inside vLLM
0.24"). Writes JSON after every cell, then a markdown table and a stacked-bar plot.

    bash benchmarks/gpu/start_engines.sh STAGE 1 --enable-server-load-tracking   # /load: requests held
    KEEPALIVE_S=600 bash benchmarks/gpu/start_gateway.sh 1 affinity 8
    python3 benchmarks/gpu/api_split.py --out split.json              # 27 cells, ~8.5 min on one H200
    python3 benchmarks/gpu/api_split.py --out knee2.json --api-servers 2 --workloads mix --modes a,c \\
        --concurrencies 64,128                                          # after API_SERVERS=2 start_engines.sh
    python3 benchmarks/gpu/api_split.py --report split.json knee2.json --plot split.png   # table + plot
    python3 benchmarks/gpu/api_split.py --dry-run --out /tmp/split.json  # here: simulator + gateway

Workloads: ``desktop`` 1920x1080 desktop windows with 11-14 px text (PNG), ``terminal``
1920x1080 light text on dark (PNG), ``mix`` a 1080p desktop, a 1170x2532 phone screen, a
4000x3000 photo (JPEG q90), a 1240x1754 document page and a 2880x1800 Retina desktop in
turn (tests/text_corpus.py). Each request carries a variant of a base image never sent
before (benchmarks/gpu/variants.py). Streaming, 64 tokens with ignore_eos, temperature 0.

A cell: ``conc`` closed-loop clients for ``--warm-s`` + ``--cell-s``; requests started in the
window are counted and given ``--drain-s`` more to finish (an engine whose queue is longer
than that leaves some unfinished: they are counted as such, with their time to the headers
when they had them, and cancelled). Throughput = completions inside the window / its length.
Before each cell the engine is given time to settle (nothing running or waiting).

Time per cell ~ warm + cell + min(drain, the queue's latency); the script prints its plan.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))                      # the text corpus
sys.path.insert(0, str(Path(__file__).resolve().parent))

DIRECT = os.environ.get("LOADGEN_DIRECT", "http://127.0.0.1:8000/v1")
GATEWAY = os.environ.get("LOADGEN_GATEWAY", "http://127.0.0.1:8080/v1")
MODEL = os.environ.get("LOADGEN_MODEL", "qwen3vl")
IMAGE_CAP = int(os.environ.get("LOADGEN_IMAGE_CAP", "1280"))  # the backend profile's image_max_long_side

WORKLOADS = {
    "desktop": "1920x1080 desktop, 11-14 px text (PNG)",
    "terminal": "1920x1080 terminal, light text on dark (PNG)",
    "mix": "desktop 1080p, phone 1170x2532, photo 4000x3000 (JPEG), document 1240x1754, Retina 2880x1800",
}
MODES = {"a": ("direct", "raw", "raw straight to vLLM"), "b": ("direct", "sent", "pre-resized straight to vLLM"),
         "c": ("gateway", "raw", "raw through the gateway")}
# req/s measured on one H200 with one API server (issue #28), to plan cell lengths
ASSUMED_RPS = {("a", "desktop"): 9.0, ("a", "terminal"): 10.0, ("a", "mix"): 3.3, ("b", "desktop"): 18.0,
               ("b", "terminal"): 22.0, ("b", "mix"): 24.0, ("c", "desktop"): 20.0, ("c", "terminal"): 19.0,
               ("c", "mix"): 27.0}
SETTLE_S = 3.0        # per cell: waiting for the engine to settle, scrapes, CPU snapshots
VLLM_HISTOGRAMS = ("time_to_first_token_seconds", "request_queue_time_seconds", "request_prefill_time_seconds",
                   "e2e_request_latency_seconds", "request_inference_time_seconds")
VLLM_COUNTERS = ("mm_cache_queries_total", "mm_cache_hits_total", "prompt_tokens_total",
                 "request_success_total")


# -- images ---------------------------------------------------------------------------------------

def _fonts() -> None:
    """Pillow's built-in font where the machine lacks DejaVu (a bare GPU machine)."""
    import text_corpus as tc
    if not os.path.exists(tc.SANS):
        from PIL import ImageFont
        tc.font = lambda path, px: ImageFont.load_default(px)   # noqa: E731 (the corpus reads this global)
        print("note: DejaVu fonts not found; drawing text with Pillow's built-in font", flush=True)


def bases(kind: str, small: bool) -> list[tuple[str, bytes]]:
    """(class, encoded bytes) of the base images of a workload; ``small`` halves every side."""
    import text_corpus as tc
    _fonts()
    k = 2 if small else 1

    def png(im) -> bytes:
        return tc._png(im)

    if kind == "desktop":
        return [(f"desktop_{px}px", png(tc.ui(1920 // k, 1080 // k, px, 40 + px)[0])) for px in (11, 12, 13, 14)]
    if kind == "terminal":
        return [(f"terminal_{px}px", png(tc.terminal(1920 // k, 1080 // k, px, 50 + px)[0])) for px in (13, 14)]
    if kind == "mix":
        return [("desktop", png(tc.ui(1920 // k, 1080 // k, 13, 61)[0])),
                ("phone", png(tc.phone(1170 // k, 2532 // k, 44 // k, 62)[0])),
                ("photo", tc._jpeg(tc.photo(4000 // k, 3000 // k, 63), 90)),
                ("document", png(tc.document(1240 // k, 1754 // k, 20 // k, 64)[0])),
                ("retina", png(tc.ui(2880 // k, 1800 // k, 26 // k, 65)[0]))]
    raise KeyError(kind)


class Source:
    """One base image: its variants raw (a, c) and as the gateway sends it (b: the gateway's
    own rewrite under the profile's cap, varied the same way)."""

    def __init__(self, cls: str, raw: bytes) -> None:
        from variants import variants
        from vlm_gateway.stages.images.policy import Policy
        from vlm_gateway.stages.images.rewrite import rewrite_bytes
        self.cls, self.raw = cls, raw
        r = rewrite_bytes(raw, Policy().capped(IMAGE_CAP))
        self.sent, self.size_out = r.data, f"{r.width}x{r.height}"
        self._raw, self._sent = variants(raw), variants(r.data)
        self.n = 0

    def next(self, which: str) -> bytes:
        self.n += 1
        return (self._sent if which == "sent" else self._raw)(self.n)


def uri(data: bytes) -> str:
    mime = "image/png" if data[:4] == b"\x89PNG" else "image/jpeg"
    return f"data:{mime};base64," + base64.b64encode(data).decode()


def chat(image: bytes, model: str) -> bytes:
    return json.dumps({"model": model, "max_tokens": 64, "ignore_eos": True, "stream": True, "temperature": 0,
                       "stream_options": {"include_usage": True},
                       "messages": [{"role": "user", "content": [
                           {"type": "text", "text": "Describe this image."},
                           {"type": "image_url", "image_url": {"url": uri(image)}}]}]}).encode()


# -- one request ----------------------------------------------------------------------------------

def server_timing(value: str | None) -> dict[str, float]:
    out = {}
    for part in (value or "").split(","):
        m = re.match(r"\s*([\w-]+);dur=([\d.]+)", part)
        if m:
            out[m.group(1)] = float(m.group(2))
    return out


async def one(s: aiohttp.ClientSession, base: str, body: bytes, rec: dict) -> None:
    """Fills ``rec`` as the request goes: headers_s, ttft_s, e2e_s (from the send), the
    gateway's Server-Timing (ms), keepalive comments seen before the first token."""
    t0 = time.perf_counter()
    async with s.post(base + "/chat/completions", data=body, headers={"content-type": "application/json"}) as r:
        rec["headers_s"] = time.perf_counter() - t0
        rec["status"] = r.status
        st = server_timing(r.headers.get("server-timing"))
        rec["media_ms"], rec["gateway_ms"] = st.get("media"), st.get("gateway")
        if r.status != 200:
            rec["error"] = (await r.text())[:200]
            return
        keepalive = 0
        async for line in r.content:
            if line.startswith(b": keepalive"):
                keepalive += rec.get("ttft_s") is None
                continue
            if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
                continue
            ev = json.loads(line[6:])
            if rec.get("ttft_s") is None and any((c.get("delta") or {}).get("content")
                                                 for c in ev.get("choices") or ()):
                rec["ttft_s"] = time.perf_counter() - t0
            if ev.get("usage"):
                rec["prompt_tokens"] = ev["usage"].get("prompt_tokens")
        rec["keepalive_before_first"] = keepalive
    rec["e2e_s"] = time.perf_counter() - t0


# -- the engine's own metrics ---------------------------------------------------------------------

def parse_metrics(text: str) -> dict[str, float]:
    """Sums over label sets of the vLLM series the split needs."""
    want = {f"vllm:{h}_{x}" for h in VLLM_HISTOGRAMS for x in ("sum", "count")} | \
        {f"vllm:{c}" for c in VLLM_COUNTERS} | {"vllm:num_requests_waiting", "vllm:num_requests_running"}
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line.startswith("vllm:"):
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in want:
            try:
                out[name] = out.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
            except ValueError:
                pass
    return out


async def scrape(s: aiohttp.ClientSession, origin: str) -> dict[str, float]:
    try:
        async with s.get(origin + "/metrics", timeout=aiohttp.ClientTimeout(total=5)) as r:
            return parse_metrics(await r.text())
    except (aiohttp.ClientError, asyncio.TimeoutError):
        return {}


def engine_split(a: dict[str, float], b: dict[str, float]) -> dict:
    """What vLLM's own metrics say about the requests between two scrapes (means, ms)."""
    def mean(h: str) -> float | None:
        n = b.get(f"vllm:{h}_count", 0.0) - a.get(f"vllm:{h}_count", 0.0)
        return round(1000.0 * (b.get(f"vllm:{h}_sum", 0.0) - a.get(f"vllm:{h}_sum", 0.0)) / n, 1) if n > 0 else None

    out = {"requests": b.get("vllm:time_to_first_token_seconds_count", 0.0)
           - a.get("vllm:time_to_first_token_seconds_count", 0.0),
           "ttft_mean_ms": mean("time_to_first_token_seconds"), "queue_mean_ms": mean("request_queue_time_seconds"),
           "prefill_mean_ms": mean("request_prefill_time_seconds"), "e2e_mean_ms": mean("e2e_request_latency_seconds"),
           "inference_mean_ms": mean("request_inference_time_seconds")}
    if None not in (out["ttft_mean_ms"], out["queue_mean_ms"], out["prefill_mean_ms"]):
        # arrival at the API server -> the scheduler's queue: render, media, HF processor, hand-over
        out["before_scheduler_mean_ms"] = round(out["ttft_mean_ms"] - out["queue_mean_ms"] - out["prefill_mean_ms"], 1)
    q = b.get("vllm:mm_cache_queries_total", 0.0) - a.get("vllm:mm_cache_queries_total", 0.0)
    h = b.get("vllm:mm_cache_hits_total", 0.0) - a.get("vllm:mm_cache_hits_total", 0.0)
    out["mm_cache_queries"], out["mm_cache_hits"] = q, h
    return out


async def server_load(s: aiohttp.ClientSession, origin: str) -> float | None:
    """vLLM's /load (non-zero only with --enable-server-load-tracking): the requests held by
    the API-server process that answers, from its handler's start to the response's end."""
    try:
        async with s.get(origin + "/load", timeout=aiohttp.ClientTimeout(total=2)) as r:
            return float((await r.json())["server_load"]) if r.status == 200 else None
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError, KeyError, TypeError):
        return None


async def settle(s: aiohttp.ClientSession, origin: str, timeout: float = 20.0) -> bool:
    """Until the engine runs and queues nothing (the last cell's requests are gone)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        m = await scrape(s, origin)
        if m and m.get("vllm:num_requests_running", 0) == 0 and m.get("vllm:num_requests_waiting", 0) == 0:
            return True
        await asyncio.sleep(0.25)
    return False


# -- a cell ---------------------------------------------------------------------------------------

async def cell(base: str, origin: str, make_body, conc: int, warm_s: float, cell_s: float, drain_s: float) -> dict:
    conn = aiohttp.TCPConnector(limit=conc + 8, force_close=False)
    records: list[dict] = []
    gauges = {"waiting_max": 0.0, "running_max": 0.0, "server_load_max": 0.0, "in_api_server_max": 0.0}
    async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=None)) as s, \
            aiohttp.ClientSession() as probe:
        await settle(probe, origin)
        before = await scrape(probe, origin)
        t0 = time.perf_counter()
        t_w, t_end = t0 + warm_s, t0 + warm_s + cell_s

        async def worker() -> None:
            while time.perf_counter() < t_end:
                body, cls = make_body()
                rec = {"start": time.perf_counter() - t0, "cls": cls}
                records.append(rec)
                try:
                    await one(s, base, body, rec)
                except (aiohttp.ClientError, asyncio.TimeoutError) as e:
                    rec["error"] = repr(e)[:200]
                rec["end"] = time.perf_counter() - t0

        async def poll() -> None:
            while True:
                m = await scrape(probe, origin)
                waiting, running = m.get("vllm:num_requests_waiting", 0.0), m.get("vllm:num_requests_running", 0.0)
                gauges["waiting_max"] = max(gauges["waiting_max"], waiting)
                gauges["running_max"] = max(gauges["running_max"], running)
                load = await server_load(probe, origin)
                if load is not None:   # one API server: what it holds beyond the scheduler's view
                    gauges["server_load_max"] = max(gauges["server_load_max"], load)
                    gauges["in_api_server_max"] = max(gauges["in_api_server_max"], load - waiting - running)
                await asyncio.sleep(0.5)

        poller = asyncio.ensure_future(poll())
        tasks = [asyncio.ensure_future(worker()) for _ in range(conc)]
        _, pending = await asyncio.wait(tasks, timeout=warm_s + cell_s + drain_s)
        for t in pending:
            t.cancel()                                  # unfinished: the client goes away
        await asyncio.gather(*pending, return_exceptions=True)
        poller.cancel()
        await asyncio.gather(poller, return_exceptions=True)
        await settle(probe, origin)
        after = await scrape(probe, origin)
    return summarise(records, warm_s, cell_s) | {"engine": engine_split(before, after), "engine_gauges": gauges}


def _q(v: list[float], q: float) -> float | None:
    if not v:
        return None
    s = sorted(v)
    return round(s[min(len(s) - 1, int(q * len(s)))], 1)


def summarise(records: list[dict], warm_s: float, cell_s: float) -> dict:
    counted = [r for r in records if warm_s <= r["start"] < warm_s + cell_s]
    done = [r for r in counted if r.get("ttft_s") is not None and "error" not in r and "end" in r]
    unfinished = [r for r in counted if "end" not in r]           # cancelled at the drain deadline
    failed = [r for r in counted if "end" in r and r not in done]
    completed_in_window = sum(1 for r in records if r.get("e2e_s") is not None and warm_s <= r["end"] < warm_s + cell_s)

    def ms(key: str, rs=done) -> list[float]:
        return [1000.0 * r[key] for r in rs if r.get(key) is not None]

    gw = [r.get("gateway_ms") or 0.0 for r in done]
    media = [r.get("media_ms") or 0.0 for r in done]
    heads = ms("headers_s")
    api = [h - g for h, g in zip(heads, gw)]                  # the engine's API server (gateway time off)
    engine = [1000.0 * (r["ttft_s"] - r["headers_s"]) for r in done]
    ttft = ms("ttft_s")
    out = {"n": len(counted), "ok": len(done), "unfinished": len(unfinished), "failed": len(failed),
           "unfinished_with_headers": sum(1 for r in unfinished if r.get("headers_s") is not None),
           "warmup_requests": len(records) - len(counted), "rps": round(completed_in_window / cell_s, 2),
           "keepalive_before_first": sum(1 for r in done if r.get("keepalive_before_first")),
           "errors": [r.get("error") for r in counted if r.get("error")][:3],
           "prompt_tokens_p50": _q([r["prompt_tokens"] for r in done if r.get("prompt_tokens")], 0.5)}
    for name, v in (("ttft", ttft), ("headers", heads), ("gateway", gw), ("media", media), ("api", api),
                    ("engine", engine)):
        out[f"{name}_p50_ms"] = _q(v, 0.5)
        out[f"{name}_p99_ms"] = _q(v, 0.99)
        out[f"{name}_mean_ms"] = round(statistics.fmean(v), 1) if v else None
    if ttft:
        # shares of the mean TTFT (means add up: gateway + API server + engine = TTFT)
        t = statistics.fmean(ttft)
        out["share"] = {k: round(statistics.fmean(v) / t, 3) for k, v in
                        (("gateway", gw), ("api_server", api), ("engine", engine))}
        out["before_headers_p50"] = round(statistics.median(heads) / statistics.median(ttft), 3)
    out["by_class"] = {c: {"n": len(rs), "ttft_p50_ms": _q(ms("ttft_s", rs), 0.5),
                           "headers_p50_ms": _q(ms("headers_s", rs), 0.5)}
                       for c in sorted({r["cls"] for r in done}) for rs in [[r for r in done if r["cls"] == c]]}
    out["records"] = [{k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items()} for r in counted]
    return out


# -- plan, run ------------------------------------------------------------------------------------

def planned_s(cells: list[tuple[str, str, int]], warm_s: float, cell_s: float, drain_s: float, speed: float) -> float:
    return sum(warm_s + cell_s + min(drain_s, conc / (ASSUMED_RPS[(m, w)] * speed)) + SETTLE_S
               for m, w, conc in cells)


def run(args, base_direct: str, base_gateway: str, origin: str, small: bool) -> dict:
    from procs import Sampler
    workloads = args.workloads.split(",")
    modes = args.modes.split(",")
    concs = [int(c) for c in args.concurrencies.split(",")]
    cells = [(m, w, c) for w in workloads for c in concs for m in modes]
    t_plan = planned_s(cells, args.warm_s, args.cell_s, args.drain_s, 1.0)
    print(f"{len(cells)} cells, about {t_plan / 60:.1f} min at the measured H200 rates (+ image setup)", flush=True)
    sampler = Sampler({"gateway": args.gateway_pid_file, "engine": args.engine_pid_file})
    out = {"api_servers": args.api_servers, "image_cap": IMAGE_CAP, "cell_s": args.cell_s, "warm_s": args.warm_s,
           "drain_s": args.drain_s, "dry_run": small, "workloads": {}, "cells": []}
    t_start = time.time()
    for w in workloads:
        t = time.time()
        srcs = [Source(cls, raw) for cls, raw in bases(w, small)]
        out["workloads"][w] = {"what": WORKLOADS[w], "setup_s": round(time.time() - t, 1),
                               "classes": [{"cls": s.cls, "raw_bytes": len(s.raw), "sent_bytes": len(s.sent),
                                            "sent_size": s.size_out} for s in srcs]}
        for conc in concs:
            for m in modes:
                where, which, _ = MODES[m]
                turn = iter(range(10 ** 9))

                def make_body(srcs=srcs, which=which, turn=turn):
                    src = srcs[next(turn) % len(srcs)]
                    return chat(src.next(which), args.model), src.cls

                base = base_gateway if where == "gateway" else base_direct
                snap = sampler.snapshot()
                res = asyncio.run(cell(base, origin, make_body, conc, args.warm_s, args.cell_s, args.drain_s))
                cpu = Sampler.delta(snap, sampler.snapshot())
                res["cpu"] = {"group_cpu_pct": cpu["group_cpu_pct"], "machine_busy_pct": cpu["machine_busy_pct"],
                              "engine_top": [{k: p[k] for k in ("name", "cpu_pct")} for p in cpu["procs"]
                                             if p["group"] == "engine"][:4]}
                res.update(workload=w, mode=m, conc=conc, api_servers=args.api_servers)
                if not args.records:
                    res.pop("records")
                out["cells"].append(res)
                e = res["engine"]
                print(f"{w:8s} ({m}) c{conc:<4d} TTFT p50 {res['ttft_p50_ms'] or 0:8.0f} ms = gateway "
                      f"{res['gateway_p50_ms'] or 0:6.0f} + API server {res['api_p50_ms'] or 0:8.0f} + engine "
                      f"{res['engine_p50_ms'] or 0:6.0f} (p50s) | {res['rps']:6.2f} req/s ok {res['ok']}/{res['n']}"
                      f" unfinished {res['unfinished']} | vLLM: TTFT {e.get('ttft_mean_ms')} queue "
                      f"{e.get('queue_mean_ms')} prefill {e.get('prefill_mean_ms')} before scheduler "
                      f"{e.get('before_scheduler_mean_ms')} ms (means), waiting max "
                      f"{res['engine_gauges']['waiting_max']:.0f}, in the API server max "
                      f"{res['engine_gauges']['in_api_server_max']:.0f} {res['errors'] or ''}", flush=True)
                Path(args.out).write_text(json.dumps(out, indent=1))
    out["total_s"] = round(time.time() - t_start, 1)
    Path(args.out).write_text(json.dumps(out, indent=1))
    return out


# -- report ---------------------------------------------------------------------------------------

def report(runs: list[dict]) -> str:
    rows = ["| workload | API servers | conc | mode | TTFT p50 ms | req/s | gateway media p50 ms | send -> headers p50 "
            "(API server) | headers -> first token p50 (engine) | before the headers (p50s) | shares of mean TTFT: "
            "gateway / API server / engine | vLLM means ms: TTFT / queue / prefill / before the scheduler | "
            "vLLM waiting max | in the API server max (/load - running - waiting) | unfinished |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for run_ in runs:
        for c in run_["cells"]:
            e, sh = c["engine"], c.get("share") or {}
            rows.append(
                f"| {c['workload']} | {c['api_servers']} | {c['conc']} | ({c['mode']}) | {c['ttft_p50_ms']} | "
                f"{c['rps']} | {c['media_p50_ms'] if c['mode'] == 'c' else '-'} | {c['api_p50_ms']} | "
                f"{c['engine_p50_ms']} | {c.get('before_headers_p50')} | "
                f"{sh.get('gateway', 0):.2f} / {sh.get('api_server', 0):.2f} / {sh.get('engine', 0):.2f} | "
                f"{e.get('ttft_mean_ms')} / {e.get('queue_mean_ms')} / {e.get('prefill_mean_ms')} / "
                f"{e.get('before_scheduler_mean_ms')} | {c['engine_gauges']['waiting_max']:.0f} | "
                f"{c['engine_gauges'].get('in_api_server_max', 0):.0f} | {c['unfinished']} |")
    return "\n".join(rows)


def plot(runs: list[dict], path: str) -> None:
    """Stacked bars of the mean TTFT per cell, one panel per workload (linear scales: the
    raw mix at concurrency 64 takes seconds where a pre-resized desktop takes a fraction)."""
    try:
        import matplotlib
    except ImportError:
        print("matplotlib is not installed: no plot (run --report JSON --plot PNG where it is)", flush=True)
        return
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    cells = [c for r in runs for c in r["cells"] if c.get("ttft_mean_ms")]
    workloads = list(dict.fromkeys(c["workload"] for c in cells))
    fig, axes = plt.subplots(1, len(workloads), figsize=(max(9, 0.6 * len(cells) + 2), 5.5), squeeze=False)
    parts = (("gateway media", "tab:green", lambda c: c["media_mean_ms"] or 0.0),
             ("gateway, rest (pool queue, parse, route)", "tab:olive",
              lambda c: max(0.0, (c["gateway_mean_ms"] or 0.0) - (c["media_mean_ms"] or 0.0))),
             ("engine API server: send -> headers", "tab:red", lambda c: max(0.0, c["api_mean_ms"] or 0.0)),
             ("engine: headers -> first token", "tab:blue", lambda c: max(0.0, c["engine_mean_ms"] or 0.0)))
    for ax, w in zip(axes[0], workloads):
        cs = [c for c in cells if c["workload"] == w]
        x = list(range(len(cs)))
        bottom = [0.0] * len(cs)
        for label, colour, get in parts:
            v = [get(c) / 1000.0 for c in cs]
            ax.bar(x, v, bottom=bottom, color=colour, label=label)
            bottom = [b + y for b, y in zip(bottom, v)]
        for i, c in enumerate(cs):
            ax.annotate(f"{c['rps']:.1f}/s", (i, bottom[i]), ha="center", va="bottom", fontsize=6)
        ax.set_xticks(x, [f"({c['mode']}) c{c['conc']}" + (f" {c['api_servers']}API" if c["api_servers"] != 1
                                                          else "") for c in cs], rotation=60, fontsize=7)
        ax.set_title(w)
        ax.set_ylabel("mean time to first token, s")
    axes[0][0].legend(fontsize=7, loc="upper left")
    fig.suptitle("Where the time to first token goes\n(a) raw straight to the engine, (b) pre-resized straight "
                 "to it, (c) raw through the gateway; above each bar: req/s", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"wrote {path}", flush=True)


# -- the dry run: a simulator and a gateway here ---------------------------------------------------

def _port() -> int:
    import socket
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


def start_local(tmp: str, model: str, api_servers: int) -> tuple[list[subprocess.Popen], str, str]:
    sim_port, gw_port = _port(), _port()
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    sim = subprocess.Popen([sys.executable, "-m", "vlm_gateway", "sim", "--port", str(sim_port), "--profile", "h200",
                            "--model", model, "--api-servers", str(api_servers)], env=env,
                           stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, start_new_session=True)
    cfg = Path(tmp) / "gateway.yaml"
    cfg.write_text(f"server: {{keepalive_interval_s: 600}}\nbackends: [{{url: 'http://127.0.0.1:{sim_port}/v1', "
                   f"name: sim0, engine: sim, profile: h200, models: [{model}]}}]\n")
    gw = subprocess.Popen([sys.executable, "-m", "vlm_gateway", "serve", "--config", str(cfg), "--port", str(gw_port)],
                          env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, start_new_session=True)
    (Path(tmp) / "gateway.pid").write_text(f"{gw.pid}\n")
    (Path(tmp) / "engine.pid").write_text(f"{sim.pid}\n")
    _wait(f"http://127.0.0.1:{sim_port}/health", sim)
    _wait(f"http://127.0.0.1:{gw_port}/ready", gw)
    return [gw, sim], f"http://127.0.0.1:{gw_port}", f"http://127.0.0.1:{sim_port}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", help="JSON results (written after every cell)")
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    ap.add_argument("--modes", default="a,b,c", help="a: raw direct, b: pre-resized direct, c: raw via gateway")
    ap.add_argument("--concurrencies", default="16,64,128")
    ap.add_argument("--cell-s", type=float, default=8.0, help="counted window per cell, seconds")
    ap.add_argument("--warm-s", type=float, default=2.0, help="warm-up per cell, not counted")
    ap.add_argument("--drain-s", type=float, default=15.0, help="time the counted requests get to finish")
    ap.add_argument("--api-servers", type=int, default=1, help="what the engine was started with (recorded)")
    ap.add_argument("--records", action="store_true", help="keep every request's record in the JSON")
    ap.add_argument("--model", default=MODEL)
    ap.add_argument("--engine", default="http://127.0.0.1:8000", help="the engine's origin (its /metrics)")
    ap.add_argument("--gateway-pid-file", default="/root/gateway.pid")
    ap.add_argument("--engine-pid-file", default="/root/vllm-8000.pid")
    ap.add_argument("--report", nargs="+", metavar="JSON", help="only write the table (and --plot) from results")
    ap.add_argument("--plot", help="PNG of stacked bars per cell")
    ap.add_argument("--dry-run", action="store_true",
                    help="start a simulator (h200 profile) and a gateway here; small images, short cells, "
                         "concurrency 2,4,8 unless given")
    a = ap.parse_args(argv)
    if a.report:
        runs = [json.loads(Path(p).read_text()) for p in a.report]
        print(report(runs))
        if a.plot:
            plot(runs, a.plot)
        return 0
    if not a.out:
        ap.error("--out is required (or --report)")
    procs: list[subprocess.Popen] = []
    tmp = tempfile.mkdtemp(prefix="api-split-")
    direct, gateway, origin = DIRECT, GATEWAY, a.engine
    if a.dry_run:
        if a.model == MODEL:
            a.model = "qwen3vl-sim"
        for k, v in (("concurrencies", "2,4,8"), ("cell_s", 2.0), ("warm_s", 1.0), ("drain_s", 10.0)):
            if getattr(a, k) == ap.get_default(k):
                setattr(a, k, v)
        procs, gw_origin, origin = start_local(tmp, a.model, a.api_servers)
        direct, gateway = origin + "/v1", gw_origin + "/v1"
        a.gateway_pid_file, a.engine_pid_file = str(Path(tmp) / "gateway.pid"), str(Path(tmp) / "engine.pid")
    try:
        res = run(a, direct, gateway, origin, a.dry_run)
    finally:
        for p in procs:
            try:
                os.killpg(p.pid, signal.SIGTERM)
                p.wait(10)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                pass
        shutil.rmtree(tmp, ignore_errors=True)
    print(report([res]))
    if a.plot:
        plot([res], a.plot)
    bad = [c for c in res["cells"] if not c["ok"]]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
