"""Load generator for the real-engine runs (vLLM on a GPU): raw vs rewritten images,
token accounting, and affinity across engines. Writes JSON results and prints tables.

  python3 benchmarks/gpu/loadgen.py images   --out results.json   # (a) direct raw, (b) direct
                                                                    # pre-rewritten, (c) raw via gateway
                                                                    # (benchmarks/gpu/image_matrix.py: b, c)
  python3 benchmarks/gpu/loadgen.py tokens   --out tokens.json    # x-vlm-gateway-visual-tokens vs usage
  python3 benchmarks/gpu/loadgen.py affinity --policy affinity --out aff.json
  python3 benchmarks/gpu/loadgen.py video    --out video.json     # video tokens + TTFT, raw vs rewritten
  python3 benchmarks/gpu/loadgen.py video --prepare /root/clips.pkl --out /dev/null  # make the clips
                                    # first (minutes of CPU: run it while the engine starts), then
                                    # ... video --clips /root/clips.pkl --out video.json

Every request streams, asks for 64 output tokens with ignore_eos at temperature 0, and
carries a distinct synthetic image (screenshots for 1920x1080, photos for 4032x3024, PNG
desktop screenshots at 1920x1080 and 2880x1800) unless stated. Image cells run for a time
(``--cell-s``, and at least 10 x the concurrency requests) after a warm-up that is not
counted, over variants of one base image per workload (benchmarks/gpu/variants.py: no
cache can serve one from another), with CPU per process sampled over each cell
(benchmarks/gpu/procs.py, from the gateway's and the engine's pid files).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import io
import json
import os
import pickle
import random
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import aiohttp
from PIL import Image, ImageDraw

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))  # the synthetic video corpus
from vlm_gateway.vision_tokens import target_size, visual_tokens  # noqa: E402

DIRECT = os.environ.get("LOADGEN_DIRECT", "http://127.0.0.1:8000/v1")
GATEWAY = os.environ.get("LOADGEN_GATEWAY", "http://127.0.0.1:8080/v1")
MODEL = os.environ.get("LOADGEN_MODEL", "qwen3vl")
IMAGE_CAP = int(os.environ.get("LOADGEN_IMAGE_CAP", "1280"))  # the backend profile's image_max_long_side
ENGINE_PORTS = [int(p) for p in os.environ.get("LOADGEN_ENGINE_PORTS", "8000,8001").split(",")]


# -- synthetic images -----------------------------------------------------------------------

def screenshot(seed: int, w: int = 1920, h: int = 1080) -> Image.Image:
    rnd = random.Random(seed)
    im = Image.new("RGB", (w, h), (255, 255, 255))
    d = ImageDraw.Draw(im)
    d.rectangle([0, 0, w, 60], fill=(rnd.randrange(256), rnd.randrange(256), rnd.randrange(256)))
    for _ in range(40):
        x, y = rnd.randrange(w - 300), rnd.randrange(80, h - 40)
        d.rectangle([x, y, x + rnd.randrange(60, 300), y + rnd.randrange(10, 40)],
                    fill=(rnd.randrange(256), rnd.randrange(256), rnd.randrange(256)))
    for row in range(100, h - 20, 24):
        d.text((40 + rnd.randrange(20), row), "invoice line %d total %d.%02d" % (row, rnd.randrange(999),
                                                                                 rnd.randrange(99)), fill=(0, 0, 0))
    return im


def photo(seed: int, w: int = 4032, h: int = 3024) -> Image.Image:
    """Photo-like: smooth colour structure plus fine grain in every channel (many colours)."""
    rnd = random.Random(seed)
    coarse = Image.merge("RGB", [Image.effect_noise((w // 64, h // 64), 80 + rnd.randrange(40))
                                 for _ in range(3)]).resize((w, h), Image.BICUBIC)
    grain = Image.merge("RGB", [Image.effect_noise((w // 2, h // 2), 20) for _ in range(3)]).resize((w, h))
    return Image.blend(coarse, grain, 0.25)


def jpeg(im: Image.Image, q: int = 90) -> bytes:
    buf = io.BytesIO()
    im.save(buf, "JPEG", quality=q)
    return buf.getvalue()


def make_pair(args: tuple[str, int]) -> tuple[bytes, bytes]:
    """(raw JPEG, client-side pre-rewritten JPEG at the gateway's target size)."""
    kind, seed = args
    im = screenshot(seed) if kind == "1080p" else photo(seed)
    tw, th = target_size(im.width, im.height, 768)
    return jpeg(im), jpeg(im.resize((tw, th), Image.LANCZOS))


def uri(data: bytes) -> str:
    mime = "image/png" if data[:4] == b"\x89PNG" else "image/jpeg"
    return f"data:{mime};base64," + base64.b64encode(data).decode()


def chat(image: bytes, text: str = "Describe this image.", max_tokens: int = 64) -> dict:
    # temperature 0: the gateway's default cache mode sees (and must pass) this traffic
    return {"model": MODEL, "max_tokens": max_tokens, "ignore_eos": True, "stream": True, "temperature": 0,
            "stream_options": {"include_usage": True},
            "messages": [{"role": "user", "content": [{"type": "text", "text": text},
                                                      {"type": "image_url", "image_url": {"url": uri(image)}}]}]}


# -- one streamed request -----------------------------------------------------------------------

async def stream_one(session: aiohttp.ClientSession, base: str, body: dict) -> dict:
    t0 = time.perf_counter()
    ttft = None
    usage = None
    text = []
    async with session.post(base + "/chat/completions", json=body) as r:
        headers = dict(r.headers)
        if r.status != 200:
            return {"ok": False, "status": r.status, "error": (await r.text())[:300]}
        async for line in r.content:
            if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
                continue
            ev = json.loads(line[6:])
            for c in ev.get("choices") or ():
                if (c.get("delta") or {}).get("content"):
                    if ttft is None:
                        ttft = time.perf_counter() - t0
                    text.append(c["delta"]["content"])
            if ev.get("usage"):
                usage = ev["usage"]
    return {"ok": ttft is not None, "ttft": ttft, "e2e": time.perf_counter() - t0, "usage": usage,
            "text": "".join(text), "visual": headers.get("x-vlm-gateway-visual-tokens"),
            "video": headers.get("x-vlm-gateway-video-tokens"),
            "budget": headers.get("x-vlm-gateway-image-budget"), "video_1": headers.get("x-vlm-gateway-video-1"),
            "backend": headers.get("x-vlm-gateway-backend"), "cache": headers.get("x-vlm-gateway-cache"),
            "overhead": headers.get("x-vlm-gateway-overhead-ms"), "server_timing": headers.get("server-timing")}


async def run_cell(base: str, bodies: list[dict], conc: int) -> dict:
    conn = aiohttp.TCPConnector(limit=conc + 8)
    async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=900)) as s:
        queue = list(bodies)
        results = []

        async def worker():
            while queue:
                results.append(await stream_one(s, base, queue.pop(0)))

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(conc)))
        wall = time.perf_counter() - t0
    ok = [r for r in results if r["ok"]]
    ttfts = sorted(r["ttft"] * 1000 for r in ok)
    return {"n": len(results), "ok": len(ok), "wall_s": wall, "rps": len(ok) / wall,
            "ttft_p50_ms": statistics.median(ttfts) if ttfts else None,
            "ttft_p99_ms": ttfts[min(len(ttfts) - 1, int(0.99 * len(ttfts)))] if ttfts else None,
            "ttft_mean_ms": statistics.fmean(ttfts) if ttfts else None,
            "errors": [r.get("error") or r.get("status") for r in results if not r["ok"]][:3],
            "prompt_tokens": ok[0]["usage"]["prompt_tokens"] if ok and ok[0]["usage"] else None,
            "visual": ok[0].get("visual") if ok else None, "budget": ok[0].get("budget") if ok else None}


# -- workloads -------------------------------------------------------------------------------------

# -- timed cells over distinct images ---------------------------------------------------------

# workload -> (what, base image maker); every request gets a variant never sent before
WORKLOADS = {
    "jpeg1080": "1920x1080 screenshot, JPEG q90",
    "jpeg12mp": "4032x3024 photo, JPEG q90",
    "png1080": "1920x1080 desktop screenshot, PNG",
    "png1800": "2880x1800 desktop screenshot, PNG",
}


def base_image(kind: str, seed: int = 0) -> bytes:
    import image_corpus as corpus
    if kind == "jpeg1080":
        return jpeg(screenshot(seed))
    if kind == "jpeg12mp":
        return jpeg(photo(seed))
    if kind == "png1080":
        return corpus.desktop_screenshot_png(1920, 1080, seed=5 + seed)
    if kind == "png1800":
        return corpus.desktop_screenshot_png(2880, 1800, seed=5 + seed)
    raise KeyError(kind)


class Images:
    """Raw (c, a) and client-side rewritten (b) variants of one workload's base image.
    (b) is the gateway's own rewrite of the base (same size, encoder and quality), varied."""

    def __init__(self, kind: str) -> None:
        from variants import variants
        from vlm_gateway.stages.images.policy import Policy
        from vlm_gateway.stages.images.rewrite import rewrite_bytes
        self.raw = base_image(kind)
        # the gateway's own decision for this backend: the default policy under the profile's
        # image cap (h200: 1280 px, as start_gateway.sh configures it)
        r = rewrite_bytes(self.raw, Policy().capped(IMAGE_CAP))
        self.rewritten = r.data
        self.rewrite_cpu_ms = r.seconds * 1000
        self.size_out = f"{r.width}x{r.height}"
        self._raw = variants(self.raw)
        self._rew = variants(self.rewritten)
        self.n = 0

    def next(self, which: str) -> bytes:
        self.n += 1
        return (self._rew if which == "rewritten" else self._raw)(self.n)


async def timed_cell(base: str, make_body, conc: int, cell_s: float, warm_s: float) -> dict:
    """Closed loop of ``conc`` clients for warm_s + max(cell_s, time for 10 x conc requests).
    Only requests started after the warm-up count; throughput is completions inside the
    measured window over its length."""
    conn = aiohttp.TCPConnector(limit=conc + 8)
    results = []
    async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=900)) as s:
        t0 = time.perf_counter()
        t_w = t0 + warm_s
        state = {"stop": None}

        async def worker():
            while True:
                now = time.perf_counter()
                counted = [r for r in results if r["start"] >= t_w]
                if now >= t_w + cell_s and len(counted) >= 10 * conc:
                    state["stop"] = state["stop"] or now
                    return
                start = time.perf_counter()
                r = await stream_one(s, base, make_body())
                r["start"], r["end"] = start, time.perf_counter()
                results.append(r)

        await asyncio.gather(*(worker() for _ in range(conc)))
    t_end = state["stop"] or time.perf_counter()
    window = max(1e-9, t_end - t_w)
    meas = [r for r in results if r["start"] >= t_w]
    ok = [r for r in meas if r["ok"]]
    done_in = sum(1 for r in ok if r["end"] <= t_end)
    ttfts = sorted(r["ttft"] * 1000 for r in ok)
    overhead = sorted(float(r["overhead"]) for r in ok if r.get("overhead"))
    return {"n": len(meas), "ok": len(ok), "warmup_requests": len(results) - len(meas), "window_s": window,
            "rps": done_in / window,
            "ttft_p50_ms": statistics.median(ttfts) if ttfts else None,
            "ttft_p99_ms": ttfts[min(len(ttfts) - 1, int(0.99 * len(ttfts)))] if ttfts else None,
            "ttft_mean_ms": statistics.fmean(ttfts) if ttfts else None,
            "gateway_overhead_p50_ms": statistics.median(overhead) if overhead else None,
            "gateway_overhead_p99_ms": overhead[min(len(overhead) - 1, int(0.99 * len(overhead)))] if overhead else None,
            "errors": [r.get("error") or r.get("status") for r in meas if not r["ok"]][:3],
            "prompt_tokens": ok[0]["usage"]["prompt_tokens"] if ok and ok[0]["usage"] else None}


MODES = {"a_direct_raw": ("direct", "raw"), "b_direct_prerewritten": ("direct", "rewritten"),
         "c_gateway_raw": ("gateway", "raw")}


def run_matrix(workloads: list[str], concs: list[int], modes: list[str], cell_s: float, warm_s: float,
               pid_files: dict[str, str], log=print, on_cell=None) -> dict:
    from procs import Sampler
    sampler = Sampler(pid_files)
    out = {"cell_s": cell_s, "warm_s": warm_s, "workloads": {}, "cells": [], "distinct_images": True}
    t_start = time.time()
    for kind in workloads:
        imgs = Images(kind)
        out["workloads"][kind] = {"what": WORKLOADS[kind], "raw_bytes": len(imgs.raw), "size_out": imgs.size_out,
                                  "rewritten_bytes": len(imgs.rewritten),
                                  "loadgen_rewrite_ms": round(imgs.rewrite_cpu_ms, 1)}
        for conc in concs:
            for mode in modes:
                where, which = MODES[mode]
                base = GATEWAY if where == "gateway" else DIRECT
                a = sampler.snapshot()
                res = asyncio.run(timed_cell(base, lambda: chat(imgs.next(which)), conc, cell_s, warm_s))
                res["cpu"] = Sampler.delta(a, sampler.snapshot())
                res.update(kind=kind, conc=conc, mode=mode)
                out["cells"].append(res)
                w = res["cpu"].get("gateway_workers") or {}
                log(f"{kind:8s} conc {conc:3d} {mode:22s} TTFT p50 {res['ttft_p50_ms'] or 0:8.1f} ms p99 "
                    f"{res['ttft_p99_ms'] or 0:8.1f}  {res['rps']:6.2f} req/s  ok {res['ok']}/{res['n']}  "
                    f"prompt {res['prompt_tokens']}  CPU gw {res['cpu']['group_cpu_pct'].get('gateway', 0):.0f}% "
                    f"eng {res['cpu']['group_cpu_pct'].get('engine', 0):.0f}% machine {res['cpu']['machine_busy_pct']}% "
                    f"workers max/min {w.get('busiest_pct')}/{w.get('quietest_pct')}  {res['errors'] or ''}",
                    flush=True)
                if on_cell is not None:
                    on_cell(out)
    out["total_s"] = round(time.time() - t_start, 1)
    return out


def cmd_images(a) -> dict:
    concs = [int(c) for c in a.concurrencies.split(",")]
    return run_matrix(a.workloads.split(","), concs, list(MODES), a.cell_s, a.warm_s,
                      {"gateway": a.gateway_pid_file, "engine": a.engine_pid_file})


def cmd_tokens(a) -> dict:
    """Gateway's after-count + text tokens vs vLLM's usage.prompt_tokens, per image size."""
    sizes = [(1920, 1080), (4032, 3024), (1280, 720), (768, 448), (500, 300), (3024, 4032), (1000, 1000)]

    async def go():
        rows = []
        async with aiohttp.ClientSession() as s:
            base_text = await stream_one(s, DIRECT, {"model": MODEL, "max_tokens": 1, "stream": True,
                                                     "stream_options": {"include_usage": True},
                                                     "messages": [{"role": "user", "content": "hi"}]})
            text_tokens = base_text["usage"]["prompt_tokens"]
            for w, h in sizes:
                im = screenshot(w * h, w, h)
                body = chat(jpeg(im), text="hi", max_tokens=1)
                direct = await stream_one(s, DIRECT, body)
                via = await stream_one(s, GATEWAY, body)
                after = int(via["visual"].split("after=")[1].split(";")[0]) if via["visual"] else None
                before = int(via["visual"].split("before=")[1].split(";")[0]) if via["visual"] else None
                tw, th = target_size(w, h, 768)
                rows.append({"size": f"{w}x{h}", "text_tokens": text_tokens,
                             "direct_prompt_tokens": direct["usage"]["prompt_tokens"],
                             "gateway_prompt_tokens": via["usage"]["prompt_tokens"],
                             "header_before": before, "header_after": after,
                             "expected_direct": text_tokens + visual_tokens(w, h) + 2,
                             "expected_gateway": text_tokens + visual_tokens(tw, th) + 2,
                             "rewritten_to": f"{tw}x{th}"})
                r = rows[-1]
                print(json.dumps(r), flush=True)
        return {"rows": rows}

    return asyncio.run(go())


def cmd_affinity(a) -> dict:
    """Multi-turn conversations, each about its own image, through the gateway."""
    n_conv, conc, turns = a.conversations, a.concurrency, 3
    with ProcessPoolExecutor(os.cpu_count()) as ex:
        imgs = [raw for raw, _ in ex.map(make_pair, [("1080p", 5000 + a.seed * 1000 + i) for i in range(n_conv)])]
    questions = ["Describe this image.", "What is the total on the last line?", "List every colour you see."]

    async def conversation(s, i) -> list[dict]:
        msgs = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": uri(imgs[i])}},
                                             {"type": "text", "text": questions[0]}]}]
        out = []
        for t in range(turns):
            body = {"model": MODEL, "max_tokens": 64, "ignore_eos": True, "stream": True,
                    "stream_options": {"include_usage": True}, "messages": msgs}
            r = await stream_one(s, GATEWAY, body)
            r["turn"] = t
            r["prev_prompt"] = out[-1]["usage"]["prompt_tokens"] if out and out[-1].get("usage") else None
            out.append(r)
            if not r["ok"]:
                break
            msgs = msgs + [{"role": "assistant", "content": r["text"]},
                           {"role": "user", "content": questions[(t + 1) % len(questions)]}]
        return out

    async def go():
        conn = aiohttp.TCPConnector(limit=conc + 8)
        async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=900)) as s:
            todo = list(range(n_conv))
            results = []

            async def worker():
                while todo:
                    results.extend(await conversation(s, todo.pop(0)))

            before = await engine_prefix(s)
            t0 = time.perf_counter()
            await asyncio.gather(*(worker() for _ in range(conc)))
            wall = time.perf_counter() - t0
            after = await engine_prefix(s)
        return results, wall, before, after

    results, wall, before, after = asyncio.run(go())
    ok = [r for r in results if r["ok"]]
    ttfts = sorted(r["ttft"] * 1000 for r in ok)
    later = [r for r in ok if r["turn"] > 0 and r["usage"]]
    # a later turn "hits" when the engine had its whole previous turn cached (16-token blocks)
    prefix_hits = sum(1 for r in later if r["prev_prompt"] and
                      ((r["usage"].get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
                      >= r["prev_prompt"] - 16)
    cached = sum((r["usage"].get("prompt_tokens_details") or {}).get("cached_tokens") or 0 for r in later)
    prompt = sum(r["usage"]["prompt_tokens"] for r in later)
    hits = sum(after[k][0] - before[k][0] for k in after)
    queries = sum(after[k][1] - before[k][1] for k in after)
    res = {"policy": a.policy, "conversations": n_conv, "concurrency": conc, "requests": len(results),
           "ok": len(ok), "wall_s": wall, "rps": len(ok) / wall,
           "ttft_p50_ms": statistics.median(ttfts), "ttft_p99_ms": ttfts[int(0.99 * (len(ttfts) - 1))],
           "ttft_mean_ms": statistics.fmean(ttfts),
           "later_turns_cached_token_ratio": cached / prompt if prompt else None,
           "later_turns_prefix_hit_rate": prefix_hits / len(later) if later else None,
           "engine_prefix_hit_rate": hits / queries if queries else None,
           "per_backend": {b: sum(1 for r in ok if r["backend"] == b) for b in {r["backend"] for r in ok}}}
    print(json.dumps(res), flush=True)
    return res


async def engine_prefix(s: aiohttp.ClientSession) -> dict[str, tuple[float, float]]:
    """(prefix_cache_hits_total, prefix_cache_queries_total) per engine."""
    out = {}
    for port in ENGINE_PORTS:
        try:
            async with s.get(f"http://127.0.0.1:{port}/metrics") as r:
                text = await r.text()
        except aiohttp.ClientError:
            continue
        vals = {"hits": 0.0, "queries": 0.0}
        for line in text.splitlines():
            for k in vals:
                if line.startswith(f"vllm:prefix_cache_{k}_total"):
                    vals[k] += float(line.rsplit(" ", 1)[1])
        out[str(port)] = (vals["hits"], vals["queries"])
    return out


# -- video ---------------------------------------------------------------------------------------

VIDEO_CLIPS = {  # name: (kind, seconds, width, height, fps); --small shrinks them for a local run
    "motion_10s_720p30": ("motion", 10, 1280, 720, 30),
    "screen_60s_1080p30": ("screen", 60, 1920, 1080, 30),
}
VIDEO_CLIPS_SMALL = {"motion_10s_720p30": ("motion", 2, 320, 240, 30),
                     "screen_60s_1080p30": ("screen", 12, 640, 360, 10)}


def make_video(args: tuple[str, tuple, int, bool]) -> dict:
    """One clip (seeded: every request gets frames no engine cache has seen) and its rewrite
    with the gateway's default settings (plan groups); with ``both`` also the frame plan."""
    import video_corpus as corpus
    from vlm_gateway.stages.video.rewrite import rewrite_video
    from vlm_gateway.stages.video.settings import VideoSettings
    name, (kind, sec, w, h, fps), seed, both = args
    if kind == "motion":
        raw, times = corpus.motion_clip(sec, w, h, fps, seed=seed), None
    else:
        raw, times = corpus.screen_recording(sec, w, h, fps, seed=seed)
    r = rewrite_video(raw, VideoSettings())
    out = {"name": name, "seed": seed, "raw": raw, "out": r.data, "times": times, "states": r.plan.states,
           "rewrite_cpu_s": r.cpu_s, "frames_out": r.frames, "rate_out": str(r.plan.rate),
           "size_out": f"{r.width}x{r.height}", "src": (r.source.opencv_frames, float(r.source.rate),
                                                         r.source.width, r.source.height),
           "dst": (r.frames, float(r.plan.rate), r.width, r.height), "plan": r.plan.kind,
           "mixed_groups": r.plan.mixed_groups}
    if both:
        f = rewrite_video(raw, VideoSettings(plan="frames"))
        out.update(out_frames=f.data, dst_frames=(f.frames, float(f.plan.rate), f.width, f.height),
                   mixed_groups_frames=f.plan.mixed_groups, plan_frames=f.plan.kind)
    return out


def video_chat(video: bytes, text: str = "Describe this video.", max_tokens: int = 64, prefix: str = "") -> dict:
    url = "data:video/mp4;base64," + base64.b64encode(video).decode()
    content = ([{"type": "text", "text": prefix}] if prefix else []) + [
        {"type": "video_url", "video_url": {"url": url}}, {"type": "text", "text": text}]
    return {"model": MODEL, "max_tokens": max_tokens, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}, "messages": [{"role": "user", "content": content}]}


async def engine_counter(s: aiohttp.ClientSession):
    """Counts "<t seconds>" with the engine's own tokenizer (vLLM /tokenize); Qwen's rule otherwise."""
    from vlm_gateway.video_tokens import qwen_timestamp_tokens
    cache: dict[str, int] = {}
    root = DIRECT.rsplit("/v1", 1)[0]
    try:
        async with s.post(root + "/tokenize", json={"model": MODEL, "prompt": "<0.5 seconds>",
                                                    "add_special_tokens": False}) as r:
            ok = r.status == 200 and "count" in await r.json()
    except aiohttp.ClientError:
        ok = False

    async def count(texts: list[str]) -> None:
        for t in texts:
            if t not in cache:
                if ok:
                    async with s.post(root + "/tokenize", json={"model": MODEL, "prompt": t,
                                                                "add_special_tokens": False}) as r:
                        cache[t] = (await r.json())["count"]
                else:
                    cache[t] = qwen_timestamp_tokens(t)

    return ok, cache, count


def load_clips(path: str, jobs: list) -> list | None:
    """The clips ``--prepare`` made for these same jobs (None: absent or made for others)."""
    try:
        with open(path, "rb") as f:
            got = pickle.load(f)
    except FileNotFoundError:
        return None
    if got["jobs"] != jobs:
        print(f"{path} holds clips for other settings: making them again", flush=True)
        return None
    return got["made"]


def cmd_video(a) -> dict:
    from vlm_gateway.video_tokens import tokens_for_indices, sample_indices, group_timestamps, timestamp_text
    clips = VIDEO_CLIPS_SMALL if a.small else VIDEO_CLIPS
    plan = [(1, 4), (8, 8 if a.small else 16)]
    n_modes = 3 if a.through_gateway else 2
    # clips of their own per cell and mode (+ 2 warm-ups each): the gateway's rewrite of a raw
    # clip is byte for byte the client-side rewrite, which the engine would otherwise have cached
    need = (sum(n for _, n in plan) + 2 * len(plan)) * n_modes
    t0 = time.time()
    # the last clip of each kind is the token-accounting one: also rewritten with the frame plan
    jobs = [(name, spec, 1000 * i + j, j == need + 1) for i, (name, spec) in enumerate(clips.items())
            for j in range(need + 2)]
    made = load_clips(a.clips, jobs) if a.clips else None
    if made is None:
        made = []
        with ProcessPoolExecutor(os.cpu_count()) as ex:
            for m in ex.map(make_video, jobs):
                made.append(m)
                if len(made) % 10 == 0 or len(made) == len(jobs):
                    print(f"clips: {len(made)}/{len(jobs)} made and rewritten ({time.time() - t0:.0f} s)", flush=True)
        if a.prepare:
            with open(a.prepare, "wb") as f:
                pickle.dump({"jobs": jobs, "made": made}, f)
            print(f"wrote {len(made)} clips to {a.prepare}", flush=True)
            return {"prepared": len(made), "seconds": round(time.time() - t0, 1)}
    vids = {name: [m for m in made if m["name"] == name] for name in clips}
    print(f"generated and rewrote {len(made)} clips in {time.time() - t0:.1f}s", flush=True)
    out: dict = {"clips": {}, "tokens": [], "cells": []}
    for name, ms in vids.items():
        cpu = [m["rewrite_cpu_s"] for m in ms]
        out["clips"][name] = {"spec": clips[name], "raw_bytes": statistics.median(len(m["raw"]) for m in ms),
                              "out_bytes": statistics.median(len(m["out"]) for m in ms),
                              "rewrite_cpu_s_p50": statistics.median(cpu), "frames_out": ms[0]["frames_out"],
                              "rate_out": ms[0]["rate_out"], "size_out": ms[0]["size_out"],
                              "states_kept": [m["states"] for m in ms[:4]],
                              "states_true": [len(m["times"]) for m in ms[:4]] if ms[0]["times"] else None,
                              "plan": ms[0]["plan"], "mixed_groups": [m["mixed_groups"] for m in ms[:4]],
                              "mixed_groups_frames_plan": ms[-1].get("mixed_groups_frames")}

    async def tokens():
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=900)) as s:
            engine_tok, cache, count = await engine_counter(s)
            base = await stream_one(s, DIRECT, {"model": MODEL, "max_tokens": 1, "stream": True,
                                                "stream_options": {"include_usage": True},
                                                "messages": [{"role": "user", "content": [
                                                    {"type": "text", "text": "hi"}]}]})
            text_tokens = base["usage"]["prompt_tokens"]
            for name, ms in vids.items():
                m = ms[-1]                      # one not used by the timing cells
                raw_got = None
                for kind, data, (n, fps, w, h) in (("raw", m["raw"], m["src"]), ("rewritten", m["out"], m["dst"]),
                                                   ("rewritten_frames_plan", m["out_frames"], m["dst_frames"])):
                    idx = sample_indices(n, fps)
                    await count([timestamp_text(t) for t in group_timestamps(idx, fps)])
                    v = tokens_for_indices(idx, fps, w, h, count=lambda t: cache[t])
                    r = await stream_one(s, DIRECT, video_chat(data, text="hi", max_tokens=1))
                    got = r["usage"]["prompt_tokens"] if r.get("usage") else None
                    raw_got = got if kind == "raw" else raw_got
                    row = {"clip": name, "sent": kind, "frames": v.frames, "size": f"{v.width}x{v.height}",
                           "groups": v.groups, "tokens_per_group": v.tokens_per_group, "visual": v.visual,
                           "timestamp_tokens": v.timestamp_tokens, "predicted": text_tokens + v.total,
                           "vllm_prompt_tokens": got, "exact": got == text_tokens + v.total,
                           "text_tokens": text_tokens, "engine_tokenizer": engine_tok,
                           "error": None if r["ok"] else r.get("error")}
                    out["tokens"].append(row)
                    print(json.dumps(row), flush=True)
                if a.through_gateway:
                    # the raw clip through the gateway: its header against what the engine reports
                    # for what the gateway sent (after) and for the raw clip sent directly (before)
                    r = await stream_one(s, GATEWAY, video_chat(m["raw"], text="hi", max_tokens=1))
                    got = r["usage"]["prompt_tokens"] if r.get("usage") else None
                    kv = dict(x.split("=") for x in (r.get("video") or "before=;after=").split(";"))
                    before = int(kv["before"]) if kv["before"].isdigit() else None
                    after = int(kv["after"]) if kv["after"].isdigit() else None
                    row = {"clip": name, "sent": "raw_via_gateway", "header_before": before, "header_after": after,
                           "detail": r.get("video_1"), "vllm_prompt_tokens": got, "text_tokens": text_tokens,
                           "exact_after": got is not None and after is not None and got == text_tokens + after,
                           "exact_before": raw_got is not None and before is not None and
                           raw_got == text_tokens + before, "error": None if r["ok"] else r.get("error")}
                    out["tokens"].append(row)
                    print(json.dumps(row), flush=True)

    asyncio.run(tokens())
    modes = {"a_direct_raw": (DIRECT, "raw"), "b_direct_rewritten": (DIRECT, "out")}
    if a.through_gateway:
        modes["c_gateway_raw"] = (GATEWAY, "raw")
    for name, ms in vids.items():
        off = 0
        for conc, n in plan:
            for mode, (base, key) in modes.items():
                cell = ms[off:off + n + 2]
                off += n + 2
                asyncio.run(run_cell(base, [video_chat(m[key]) for m in cell[n:]], 2))       # warm-up
                res = asyncio.run(run_cell(base, [video_chat(m[key]) for m in cell[:n]], conc))
                res.update(clip=name, conc=conc, mode=mode)
                out["cells"].append(res)
                print(f"{name:20s} conc {conc:2d} {mode:20s} TTFT p50 {res['ttft_p50_ms'] or 0:9.1f} ms  "
                      f"{res['rps']:6.2f} req/s  ok {res['ok']}/{res['n']}  prompt_tokens {res['prompt_tokens']} "
                      f"{res['errors'] or ''}", flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("cmd", choices=["images", "tokens", "affinity", "video"])
    ap.add_argument("--small", action="store_true", help="video: small clips (a local run against the simulator)")
    ap.add_argument("--through-gateway", action="store_true",
                    help="video: also send raw clips through the gateway (its token header checked, TTFT cells)")
    ap.add_argument("--prepare", default="", help="video: make the clips, write them to this file, stop")
    ap.add_argument("--clips", default="", help="video: the clips a --prepare run wrote (same options)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--policy", default="affinity")
    ap.add_argument("--conversations", type=int, default=96)
    ap.add_argument("--concurrency", type=int, default=24)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workloads", default=",".join(WORKLOADS), help="images: " + ", ".join(WORKLOADS))
    ap.add_argument("--concurrencies", default="1,16,64")
    ap.add_argument("--cell-s", type=float, default=30.0, help="images: measured seconds per cell (at least "
                    "10 x concurrency requests are always measured)")
    ap.add_argument("--warm-s", type=float, default=3.0, help="images: warm-up seconds per cell, not counted")
    ap.add_argument("--gateway-pid-file", default="/root/gateway.pid")
    ap.add_argument("--engine-pid-file", default="/root/vllm-8000.pid")
    a = ap.parse_args()
    res = {"images": cmd_images, "tokens": cmd_tokens, "affinity": cmd_affinity, "video": cmd_video}[a.cmd](a)
    Path(a.out).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
