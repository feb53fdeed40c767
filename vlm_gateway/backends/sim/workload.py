"""The calibration workloads: the real vLLM measurements the ``h200-qwen3vl-2b``
profile is fitted to, and two ways to run them against the simulator.

- ``simulate_row``: the engine alone on a virtual clock (no HTTP, no image
  bytes): what the timing model predicts. The fit uses it.
- ``run_row_http``: real streaming requests with real JPEGs of the row's size
  (distinct per request, or one repeated) against a running simulator, through
  the OpenAI SDK: what a client observes. The test uses it at a time scale.

Every request: one user message (the image, then a short text), streaming,
``max_tokens`` 64 with ``ignore_eos``; ``concurrency`` closed-loop clients;
TTFT p50 in ms and requests/s over the whole run, in simulated time.
"""

from __future__ import annotations

import asyncio
import io
import os
import statistics
import time
from dataclasses import dataclass

from .engine import SimEngine, SimProfile
from .prompt import synthetic_prompt
from .vclock import run_virtual

PROMPT_TEXT = "hi"
OUTPUT_TOKENS = 64


@dataclass(frozen=True)
class Row:
    label: str
    width: int
    height: int
    concurrency: int
    ttft_p50_ms: float      # measured on vLLM 0.24, one H200
    req_per_s: float
    same_image: bool = False

    def requests(self, scale: float = 1.0) -> int:
        """Requests per run: enough for a steady state, few where statistics allow."""
        if self.concurrency == 1:
            return max(3, round(5 * scale))
        return max(self.concurrency + 4,
                   round((2.5 if self.concurrency < 64 else 2) * self.concurrency * min(1.0, scale)))

    def time_scale(self, max_req_per_s: float = 15.0, min_ttft_ms: float = 150.0,
                   min_latency_s: float = 0.4, max_megapixels_per_s: float = 60.0) -> float:
        """A time scale for running this row live on a small machine: as fast as
        possible while the client and server processes keep up (few enough
        requests, and few enough source megapixels to send and parse, a second)
        and fixed loopback/client overheads (a few ms a request, not scaled) stay
        small next to the scaled TTFT and latency. Above 1 the run is slower than the
        engine it models: a row faster than ``max_req_per_s`` would otherwise queue on this
        machine's CPU and measure that instead (768x448 at concurrency 16: 22.5 req/s)."""
        latency_s = self.concurrency / self.req_per_s
        megapixels_per_s = self.req_per_s * self.width * self.height / 1e6
        return min(4.0, max(0.1, self.req_per_s / max_req_per_s, min_ttft_ms / self.ttft_p50_ms,
                            min_latency_s / latency_s, megapixels_per_s / max_megapixels_per_s))


CALIBRATION = [
    Row("1920x1080 c1", 1920, 1080, 1, 218, 2.56),
    Row("768x448 c1", 768, 448, 1, 91, 3.57),
    Row("1920x1080 c16", 1920, 1080, 16, 1234, 9.28),
    Row("768x448 c16", 768, 448, 16, 358, 22.48),
    Row("1920x1080 c64", 1920, 1080, 64, 7125, 6.86),
    Row("768x448 c64", 768, 448, 64, 1326, 29.17),
    Row("4032x3024 c1", 4032, 3024, 1, 1691, 0.57),
    Row("768x576 c1", 768, 576, 1, 84, 4.03),
    Row("4032x3024 c16", 4032, 3024, 16, 5164, 1.58),
    Row("768x576 c16", 768, 576, 16, 275, 17.51),
    Row("same 1920x1080 c1", 1920, 1080, 1, 44, 4.53, same_image=True),
]


def _summary(ttfts: list[float], n: int, elapsed: float) -> tuple[float, float]:
    return statistics.median(ttfts) * 1000.0, n / elapsed


async def _closed_loop(row: Row, n: int, one) -> tuple[float, float]:
    """``concurrency`` workers take request numbers until ``n`` are done;
    ``one(i)`` runs request i and returns its TTFT in seconds."""
    loop = asyncio.get_running_loop()
    counter = iter(range(n))
    ttfts: list[float] = []

    async def worker():
        for i in counter:
            ttfts.append(await one(i))

    t0 = loop.time()
    await asyncio.gather(*(worker() for _ in range(row.concurrency)))
    return _summary(ttfts, n, loop.time() - t0)


def simulate_row(profile: SimProfile, row: Row, n: int | None = None, warm: bool = True) -> tuple[float, float]:
    """(TTFT p50 ms, req/s) the timing model gives for a row, on a virtual clock.

    ``warm``: like the measured runs, the repeated-image row starts with the image
    already seen (its first request is a warm-up that is not counted)."""
    n = n or row.requests()

    async def main():
        engine = SimEngine(profile)
        loop = asyncio.get_running_loop()
        same = synthetic_prompt(PROMPT_TEXT, [(row.width, row.height, b"same-image")])

        async def one(i: int) -> float:
            spec = same if row.same_image else synthetic_prompt(
                PROMPT_TEXT, [(row.width, row.height, b"img-%d" % i)])
            t = loop.time()
            job = engine.submit(spec, OUTPUT_TOKENS)
            ttft = None
            async for _ in job.run():
                if ttft is None:
                    ttft = loop.time() - t
            return ttft

        if row.same_image and warm:
            await one(-1)
        try:
            return await _closed_loop(row, n, one)
        finally:
            engine.close()

    return run_virtual(main())


# -- over HTTP ------------------------------------------------------------------

def make_jpeg(width: int, height: int, seed: int) -> bytes:
    """A synthetic screenshot-like JPEG, pixel-distinct per ``seed``."""
    from PIL import Image, ImageDraw

    im = Image.new("RGB", (width, height), (238, 240, 243))
    d = ImageDraw.Draw(im)
    d.rectangle([0, 0, width, max(24, height // 24)], fill=(40, 60, 90))
    rng = (seed * 2654435761) & 0xFFFFFFFF
    for k in range(6):
        rng = (rng * 1103515245 + 12345) & 0x7FFFFFFF
        x, y = rng % max(1, width - 200), (rng // 7) % max(1, height - 120)
        d.rectangle([x, y, x + 180, y + 100], fill=(rng % 256, (rng >> 8) % 256, (rng >> 16) % 256))
    d.text((12, 6), f"synthetic screen {seed}", fill=(255, 255, 255))
    buf = io.BytesIO()
    im.save(buf, "JPEG", quality=80)
    return buf.getvalue()


def _data_uri(jpeg: bytes) -> str:
    import base64
    return "data:image/jpeg;base64," + base64.b64encode(jpeg).decode()


async def run_row_http(base_url: str, model: str, row: Row, n: int | None = None,
                       time_scale: float = 1.0, seed: int | None = None,
                       overhead_s: float = 0.0) -> tuple[float, float]:
    """Run a row against an OpenAI-compatible server; (TTFT p50 ms, req/s) in
    simulated time: wall times minus ``overhead_s`` (this machine's own loopback
    and client cost, which is not scaled) divided by ``time_scale``."""
    import openai

    n = n or row.requests()
    seed = int.from_bytes(os.urandom(4), "big") if seed is None else seed
    count = 1 if row.same_image else n
    uris = await asyncio.to_thread(lambda: [_data_uri(make_jpeg(row.width, row.height, seed + i))
                                            for i in range(count)])
    client = openai.AsyncOpenAI(base_url=base_url, api_key="sim", max_retries=0, timeout=600)

    async def one(i: int) -> float:
        # raw SSE lines through the SDK: no per-chunk model parsing, so the client's
        # CPU time stays small next to the (scaled) latencies being measured
        uri = uris[0] if row.same_image else uris[i]
        t = time.perf_counter()
        ttft = None
        async with client.chat.completions.with_streaming_response.create(
                model=model, max_tokens=OUTPUT_TOKENS, stream=True, extra_body={"ignore_eos": True},
                messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": uri}},
                                                       {"type": "text", "text": PROMPT_TEXT}]}]) as resp:
            async for line in resp.iter_lines():
                if ttft is None and '"content":"' in line and '"content":""' not in line:
                    ttft = time.perf_counter() - t
        return ttft

    try:
        if row.same_image:
            await one(0)
        ttft_ms, rps = await _closed_loop(row, n, one)
    finally:
        await client.close()
    return max(0.0, ttft_ms - overhead_s * 1000.0) / time_scale, rps * time_scale
