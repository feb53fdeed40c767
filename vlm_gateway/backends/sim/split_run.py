"""The third H200 lease's image cells (issue #28; docs/benchmarks/gpu.md) and their replay
with the time to the response headers, the split vLLM 0.24's streaming answers show: the
headers leave its API server once the template and every image are preprocessed, so
send -> headers is the API server's share and headers -> first token the engine's.

Measured (vLLM 0.24.0, one H200, 16 cores; every image new to its cell; streaming, 64
tokens with ignore_eos): TTFT p50 and req/s of (a) raw images straight to vLLM and (b)
images the client resized to exactly what the gateway sends (the ``h200`` profile's
1280 px cap, 768 px for photos), for a 1080p desktop with 11-14 px text, a 1080p
terminal and a mix of desktops, phones, photos, documents and Retina screenshots; at
concurrency 64 the share of TTFT p50 spent before the headers (raw: 97-99 %, the raw mix
17.5 of 18.0 s; pre-resized: 88-93 %, the mix 1103 of 1249 ms, the desktop 1779 of
1936 ms). Only these figures were kept from that run (no per-request records), so the
image sizes below are the classes' sizes in tests/text_corpus.py and the mix takes them
in turn; the formats (PNG screenshots, JPEG photos) are not modelled apart.

``replay_split`` runs each cell on a fresh engine on a virtual clock: ``concurrency``
closed-loop clients, ``n`` requests, each image new; (TTFT p50 ms, req/s, share of the
TTFT p50 before the headers, headers p50 ms).
"""

from __future__ import annotations

import asyncio
import statistics
from dataclasses import dataclass

from .engine import SimEngine, SimProfile
from .prompt import synthetic_prompt
from .vclock import run_virtual
from .workload import OUTPUT_TOKENS, Row

PROMPT = "Describe this image."

DESKTOP_RAW = ((1920, 1080),)
DESKTOP_SENT = ((1280, 704),)                 # the gateway's 1280 px cap on the 32 px grid: 880 tokens
MIX_RAW = ((1920, 1080), (1170, 2532), (4032, 3024), (1240, 1754), (2880, 1800))
MIX_SENT = ((1280, 704), (576, 1280), (768, 576), (896, 1280), (1280, 800))


@dataclass(frozen=True)
class SplitRow(Row):
    """One measured cell; ``sizes`` are taken in turn, each request with a new image;
    ``before_headers``: the measured share of TTFT p50 before the response headers."""
    sizes: tuple[tuple[int, int], ...] = ()
    before_headers: float | None = None

    def requests(self, scale: float = 1.0) -> int:
        return 12 if self.concurrency == 1 else 4 * self.concurrency


RUN_2026_12_01 = [
    SplitRow("(a) desktop c1", 1920, 1080, 1, 147, 3.40, sizes=DESKTOP_RAW),
    SplitRow("(a) desktop c16", 1920, 1080, 16, 1219, 10.35, sizes=DESKTOP_RAW),
    SplitRow("(a) desktop c64", 1920, 1080, 64, 6861, 8.73, sizes=DESKTOP_RAW, before_headers=0.98),
    SplitRow("(a) terminal c1", 1920, 1080, 1, 167, 3.20, sizes=DESKTOP_RAW),
    SplitRow("(a) terminal c64", 1920, 1080, 64, 5862, 10.59, sizes=DESKTOP_RAW, before_headers=0.98),
    SplitRow("(a) mix c1", 1920, 1080, 1, 489, 1.15, sizes=MIX_RAW),
    SplitRow("(a) mix c16", 1920, 1080, 16, 3791, 3.30, sizes=MIX_RAW),
    SplitRow("(a) mix c64", 1920, 1080, 64, 17994, 3.33, sizes=MIX_RAW, before_headers=17.5 / 18.0),
    SplitRow("(b) desktop c1", 1280, 704, 1, 94, 4.25, sizes=DESKTOP_SENT),
    SplitRow("(b) desktop c16", 1280, 704, 16, 457, 18.39, sizes=DESKTOP_SENT),
    SplitRow("(b) desktop c64", 1280, 704, 64, 1936, 18.49, sizes=DESKTOP_SENT, before_headers=1779 / 1936),
    SplitRow("(b) terminal c1", 1280, 704, 1, 93, 4.25, sizes=DESKTOP_SENT),
    SplitRow("(b) terminal c64", 1280, 704, 64, 1615, 23.05, sizes=DESKTOP_SENT, before_headers=0.905),
    SplitRow("(b) mix c1", 1280, 704, 1, 91, 4.25, sizes=MIX_SENT),
    SplitRow("(b) mix c16", 1280, 704, 16, 469, 19.99, sizes=MIX_SENT),
    SplitRow("(b) mix c64", 1280, 704, 64, 1249, 25.68, sizes=MIX_SENT, before_headers=1103 / 1249),
]


def replay_split(profile: SimProfile, rows: list[SplitRow]) -> list[tuple[float, float, float, float]]:
    """(TTFT p50 ms, req/s, share of TTFT p50 before the headers, headers p50 ms) per row."""

    async def cell(r: SplitRow, idx: int) -> tuple[float, float, float, float]:
        engine = SimEngine(profile)
        loop = asyncio.get_running_loop()
        todo = iter(range(r.requests()))
        ttfts: list[float] = []
        heads: list[float] = []

        async def one(i: int) -> None:
            w, h = r.sizes[i % len(r.sizes)]
            spec = synthetic_prompt(PROMPT, [(w, h, f"{idx}/{i}".encode())])
            job = engine.submit(spec, OUTPUT_TOKENS)
            first = None
            async for _ in job.run():
                if first is None:
                    first = loop.time()
            ttfts.append(first - job.t_arrival)
            heads.append(job.t_rendered - job.t_arrival)

        async def worker() -> None:
            for i in todo:
                await one(i)

        t0 = loop.time()
        try:
            await asyncio.gather(*(worker() for _ in range(r.concurrency)))
        finally:
            engine.close()
        wall = loop.time() - t0
        ttft, head = statistics.median(ttfts), statistics.median(heads)
        return ttft * 1000.0, len(ttfts) / wall, head / ttft, head * 1000.0

    async def main():
        return [await cell(r, i) for i, r in enumerate(rows)]

    return run_virtual(main())
