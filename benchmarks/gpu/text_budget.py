"""Text-dense screenshots on the real engine: what keeping text legible costs in latency.

  python3 benchmarks/gpu/text_budget.py --out text.json [--quick]

Starts two gateways itself (pid files, stopped by pid at the end), both in front of the
engine on :8000 (`LOADGEN_DIRECT`):
  :8080  the default image budget (legibility-aware)
  :8081  `images.budget: fixed` (the old rule: long side <= 768 for every image)
  :8082  the default budget with the h200 profile's image cap (1280 px) raised to 2560
and sends 1920x1080 PNG screenshots dense with 11-15 px text, (a) raw straight to vLLM,
(b) through the fixed-768 gateway, (c) through the default gateway (text budget capped at
the profile's 1280), (d) through :8082, at concurrency 1, 16 and 64. Every request carries an image never sent before (each mode and cell has its own,
warm-ups included), so no engine or gateway cache serves one. Streams, 64 output tokens
with ignore_eos, temperature 0. Reports TTFT p50/p99, req/s, prompt tokens and the budget
header the gateway returned; the accuracy each budget keeps is measured by
benchmarks/quality.py on the same kind of images (docs/benchmarks/quality.md).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import io
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from PIL import Image, ImageDraw, ImageFont

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from loadgen import DIRECT, MODEL, run_cell  # noqa: E402

WORDS = ("invoice total amount customer order status pending shipped delivered account balance due "
         "settings network display privacy update version build release server request latency error "
         "warning metric dashboard report quarterly revenue margin region north south export import").split()


def text_screenshot(seed: int, w: int = 1920, h: int = 1080) -> bytes:
    """A desktop-like screenshot: title bar, sidebar, and rows of 11-15 px text (PNG)."""
    rnd = random.Random(seed)
    im = Image.new("RGB", (w, h), (250, 250, 250))
    d = ImageDraw.Draw(im)
    d.rectangle([0, 0, w, 36], fill=(40, 44, 52))
    d.rectangle([0, 36, 240, h], fill=(235, 237, 240))
    size = rnd.choice((11, 12, 13, 14, 15))
    font = ImageFont.load_default(size=size)
    small = ImageFont.load_default(size=max(10, size - 1))
    d.text((12, 10), " ".join(rnd.choice(WORDS) for _ in range(6)), fill=(230, 230, 230), font=font)
    for y in range(52, h - 20, size + 10):
        d.text((16, y), rnd.choice(WORDS).title(), fill=(30, 30, 30), font=small)
    for y in range(56, h - 24, size + 8):
        x = 260
        while x < w - 200:
            line = " ".join(rnd.choice(WORDS) for _ in range(rnd.randrange(3, 9)))
            line += f" {rnd.randrange(10_000)}.{rnd.randrange(100):02d}"
            d.text((x, y), line, fill=(20, 20, 20), font=font)
            x += int(d.textlength(line, font=font)) + 60
    buf = io.BytesIO()
    im.save(buf, "PNG", compress_level=6)
    return buf.getvalue()


def body(png: bytes) -> dict:
    return {"model": MODEL, "max_tokens": 64, "ignore_eos": True, "stream": True, "temperature": 0,
            "stream_options": {"include_usage": True},
            "messages": [{"role": "user", "content": [
                {"type": "text", "text": "Read the text in this screenshot."},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.b64encode(png).decode()}}]}]}


def start_gateway(port: int, budget: str, workers: int, tmp: Path, uncapped: bool = False) -> subprocess.Popen:
    cfg = tmp / f"gateway-{port}.yaml"
    profile = "h200-text" if uncapped else "h200"
    cfg.write_text(
        f"server: {{port: {port}, workers: {workers}}}\n"
        f"images: {{budget: {budget}}}\n"
        + ("profiles: {h200-text: {base: h200, image_max_long_side: 2560, image_max_pixels: 3686400}}\n"
           if uncapped else "")
        + "backends:\n"
        f"  - {{url: {DIRECT}, name: gpu0, engine: vllm, profile: {profile}, models: [{MODEL}]}}\n")
    log = open(tmp / f"gateway-{port}.log", "wb")
    p = subprocess.Popen([sys.executable, "-m", "vlm_gateway", "serve", "--config", str(cfg)],
                         stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    (tmp / f"gateway-{port}.pid").write_text(str(p.pid))
    for _ in range(120):
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/ready", timeout=1)
            return p
        except OSError:
            if p.poll() is not None:
                break
            time.sleep(0.5)
    raise SystemExit(f"gateway :{port} did not start:\n" + (tmp / f"gateway-{port}.log").read_text()[-3000:])


def stop(p: subprocess.Popen) -> None:
    try:
        os.killpg(p.pid, signal.SIGTERM)  # its own session: the supervisor and its workers
        p.wait(10)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        os.killpg(p.pid, signal.SIGKILL)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--quick", action="store_true", help="a few requests per cell (a local dry run)")
    ap.add_argument("--workers", type=int, default=8)
    a = ap.parse_args()
    plan = [(1, 16), (16, 64), (64, 192)] if not a.quick else [(1, 3), (4, 8)]
    modes = {"a_direct_raw": DIRECT, "b_gateway_fixed768": "http://127.0.0.1:8081/v1",
             "c_gateway_legible": "http://127.0.0.1:8080/v1",
             "d_gateway_legible_uncapped": "http://127.0.0.1:8082/v1"}
    need = sum(n + 2 for _, n in plan) * len(modes)
    t0 = time.time()
    with ProcessPoolExecutor(os.cpu_count()) as ex:
        pngs = list(ex.map(text_screenshot, range(need), chunksize=8))
    print(f"generated {len(pngs)} screenshots in {time.time() - t0:.1f}s", flush=True)
    tmp = Path(tempfile.mkdtemp(prefix="text-budget-"))
    gws = [start_gateway(8080, "legible", a.workers, tmp), start_gateway(8081, "fixed", a.workers, tmp),
           start_gateway(8082, "legible", a.workers, tmp, uncapped=True)]
    out = {"cells": [], "images": "1920x1080 PNG, 11-15 px text, distinct per request"}
    try:
        off = 0
        for conc, n in plan:
            for mode, base in modes.items():
                cell = pngs[off:off + n + 2]
                off += n + 2
                asyncio.run(run_cell(base, [body(p) for p in cell[n:]], 2))  # warm-up
                res = asyncio.run(run_cell(base, [body(p) for p in cell[:n]], conc))
                res.update(conc=conc, mode=mode)
                out["cells"].append(res)
                print(f"conc {conc:3d} {mode:26s} TTFT p50 {res['ttft_p50_ms'] or 0:8.1f} ms  p99 "
                      f"{res['ttft_p99_ms'] or 0:8.1f}  {res['rps']:6.2f} req/s  ok {res['ok']}/{res['n']}  "
                      f"prompt_tokens {res['prompt_tokens']}  budget {res.get('budget')} {res['errors'] or ''}",
                      flush=True)
    finally:
        for p in gws:
            stop(p)
    Path(a.out).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
