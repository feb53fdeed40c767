"""Simulator profiles, read from profiles.yaml (shipped with the package), and the
real-engine measurements each calibrated profile is fitted to."""

from __future__ import annotations

import asyncio
import os
import statistics
from dataclasses import dataclass, replace
from functools import lru_cache

import yaml

from .engine import SimEngine, SimProfile
from .prompt import synthetic_prompt
from .split_run import RUN_2026_12_01, SplitRow, replay_split
from .vclock import run_virtual
from .workload import CALIBRATION, OUTPUT_TOKENS, Row, simulate_row

PROFILES_PATH = os.path.join(os.path.dirname(__file__), "profiles.yaml")
# engine-step constants a profile's `speed` divides
GPU_KEYS = ("step_base_s", "step_seq_s", "kv_read_s_per_ktok", "prefill_s_per_ktok", "vit_s_per_ktok",
            "vit_quad_s_per_ktok2")


def _resolve(raw: dict, name: str, seen: tuple = ()) -> dict:
    if name in seen:
        raise ValueError(f"simulator profile {name!r}: base cycle {' -> '.join(seen + (name,))}")
    entry = dict(raw[name])
    base = entry.pop("base", None)
    speed = float(entry.pop("speed", 1.0))
    merged = {**(_resolve(raw, base, seen + (name,)) if base else {}), **entry}
    if speed != 1.0:
        for k in GPU_KEYS:
            if k in merged and k not in entry:
                merged[k] = merged[k] / speed
    return merged


@lru_cache(maxsize=1)
def load_profiles(path: str = PROFILES_PATH) -> dict[str, SimProfile]:
    with open(path) as f:
        raw = yaml.safe_load(f) or {}
    return {name: SimProfile.from_dict(name, _resolve(raw, name)) for name in raw}


def profile_names() -> list[str]:
    return sorted(load_profiles())


def get_profile(name: str, time_scale: float = 1.0, decode_tokens_per_s: float | None = None,
                max_num_seqs: int | None = None, api_servers: int | None = None) -> SimProfile:
    """A copy of profile ``name`` (KeyError if unknown) at ``time_scale``; a
    ``decode_tokens_per_s`` sets the single-sequence decode rate, ``max_num_seqs``
    the concurrent sequences, ``api_servers`` the API-server processes (ValueError below 1)."""
    profiles = load_profiles()
    if name not in profiles:
        raise KeyError(f"unknown simulator profile {name!r}; known: {', '.join(sorted(profiles))}")
    if time_scale <= 0:
        raise ValueError("time_scale must be positive")
    p = replace(profiles[name], time_scale=time_scale, name=name)
    if decode_tokens_per_s:
        p = replace(p, decode_tokens_per_s=decode_tokens_per_s)   # __post_init__ sets step_base_s
    if max_num_seqs:
        p = replace(p, max_num_seqs=max_num_seqs)
    if api_servers is not None:
        p = replace(p, api_servers=api_servers)
    return p


# -- measurements the calibrated profiles reproduce -------------------------------------------

@dataclass(frozen=True)
class MeasuredRow(Row):
    """One cell of a measured run, replayed in sequence with the others on ONE engine
    (``replay_run``): the measured cells reused images, so what earlier cells left in the
    processor and prefix caches is part of what was measured. ``images``: the image set
    (the same set = the same pictures); the cell sends its images 0..n-1."""
    n: int = 0
    images: str = ""

    def requests(self, scale: float = 1.0) -> int:
        return self.n


# vLLM 0.24.0, one H200, 2026-11-30 (docs/benchmarks/gpu/images-run2.json, modes a_direct_raw and
# b_direct_prerewritten, in the order they ran; benchmarks/gpu/loadgen.py `images`): 1920x1080
# screenshots and 4032x3024 photos raw, or resized to 768x448 / 768x576 by the client; streaming,
# 64 tokens with ignore_eos, --skip-mm-profiling; n requests pulled by `concurrency` workers. Each
# cell sends images 0..n-1 of its set, so a cell repeats the images of the one before it at lower
# concurrency (1080p: 16 of 64, then 64 of 128; 12 MP: 8 of 48, then 48 of 64).
RUN_2026_11_30 = [
    MeasuredRow("1920x1080 c1", 1920, 1080, 1, 212.9, 2.725, n=16, images="1080p-raw"),
    MeasuredRow("768x448 c1", 768, 448, 1, 70.8, 4.441, n=16, images="1080p-768"),
    MeasuredRow("1920x1080 c16", 1920, 1080, 16, 1713.0, 8.464, n=64, images="1080p-raw"),
    MeasuredRow("768x448 c16", 768, 448, 16, 337.9, 28.83, n=64, images="1080p-768"),
    MeasuredRow("1920x1080 c64", 1920, 1080, 64, 1949.3, 12.28, n=128, images="1080p-raw"),
    MeasuredRow("768x448 c64", 768, 448, 64, 640.1, 46.07, n=128, images="1080p-768"),
    MeasuredRow("4032x3024 c1", 4032, 3024, 1, 1412.6, 0.6317, n=8, images="12mp-raw"),
    MeasuredRow("768x576 c1", 768, 576, 1, 58.5, 5.038, n=8, images="12mp-768"),
    MeasuredRow("4032x3024 c16", 4032, 3024, 16, 8355.0, 1.682, n=48, images="12mp-raw"),
    MeasuredRow("768x576 c16", 768, 576, 16, 263.9, 24.61, n=48, images="12mp-768"),
    MeasuredRow("4032x3024 c64", 4032, 3024, 64, 23903.4, 1.345, n=64, images="12mp-raw"),
    MeasuredRow("768x576 c64", 768, 576, 64, 1177.0, 28.23, n=64, images="12mp-768"),
]
# The same workload on another H200 machine earlier that day (images-run1.json; its 12 MP photos
# were simpler images). Not fitted: a hold-out check of the profile fitted to the run above.
RUN1_2026_11_30 = [
    MeasuredRow("1920x1080 c1", 1920, 1080, 1, 194.6, 2.91, n=16, images="1080p-raw"),
    MeasuredRow("768x448 c1", 768, 448, 1, 59.4, 4.766, n=16, images="1080p-768"),
    MeasuredRow("1920x1080 c16", 1920, 1080, 16, 1380.4, 10.06, n=64, images="1080p-raw"),
    MeasuredRow("768x448 c16", 768, 448, 16, 328.3, 29.02, n=64, images="1080p-768"),
    MeasuredRow("1920x1080 c64", 1920, 1080, 64, 1960.0, 12.7, n=128, images="1080p-raw"),
    MeasuredRow("768x448 c64", 768, 448, 64, 397.6, 53.76, n=128, images="1080p-768"),
    MeasuredRow("4032x3024 c1", 4032, 3024, 1, 1564.7, 0.5875, n=8, images="12mp-raw"),
    MeasuredRow("768x576 c1", 768, 576, 1, 84.5, 4.011, n=8, images="12mp-768"),
    MeasuredRow("4032x3024 c16", 4032, 3024, 16, 12579.7, 1.408, n=48, images="12mp-raw"),
    MeasuredRow("768x576 c16", 768, 576, 16, 263.2, 23.49, n=48, images="12mp-768"),
    MeasuredRow("4032x3024 c64", 4032, 3024, 64, 25228.5, 1.229, n=64, images="12mp-raw"),
    MeasuredRow("768x576 c64", 768, 576, 64, 1051.5, 29.97, n=64, images="12mp-768"),
]
LOADGEN_TEXT = "Describe this image."     # 17 text tokens with the template, as vLLM reported


def replay_run(profile: SimProfile, rows: list[MeasuredRow]) -> list[tuple[float, float]]:
    """(TTFT p50 ms, req/s) per row, on a virtual clock, running the rows in order on one
    engine as the load generator did: before each cell 2 warm-up requests (concurrency 2)
    with two images of the set that no cell sends."""
    per_set: dict[str, int] = {}
    for r in rows:
        per_set[r.images] = max(per_set.get(r.images, 0), r.n)

    async def main():
        engine = SimEngine(profile)
        loop = asyncio.get_running_loop()

        async def one(r: MeasuredRow, i: int) -> float:
            spec = synthetic_prompt(LOADGEN_TEXT, [(r.width, r.height, f"{r.images}/{i}".encode())])
            t = loop.time()
            ttft = None
            async for _ in engine.submit(spec, OUTPUT_TOKENS).run():
                if ttft is None:
                    ttft = loop.time() - t
            return ttft

        async def cell(r: MeasuredRow, idx: list[int], conc: int) -> tuple[list[float], float]:
            queue, ttfts = list(idx), []

            async def worker():
                while queue:
                    ttfts.append(await one(r, queue.pop(0)))

            t0 = loop.time()
            await asyncio.gather(*(worker() for _ in range(conc)))
            return ttfts, loop.time() - t0

        out = []
        try:
            for r in rows:
                last = per_set[r.images] + 3
                await cell(r, [last, last - 1], 2)
                ttfts, wall = await cell(r, list(range(r.n)), r.concurrency)
                out.append((statistics.median(ttfts) * 1000.0, r.n / wall))
        finally:
            engine.close()
        return out

    return run_virtual(main())


MEASURED_RUNS = {"table": CALIBRATION, "2026-11-30-run1": RUN1_2026_11_30, "2026-11-30-run2": RUN_2026_11_30,
                 "2026-12-01": RUN_2026_12_01}
# calibrated profile -> the measured run it is fitted to (aliases resolve through `base`)
FITTED_TO = {"h200-qwen3vl-2b": "table", "h200-vllm024-2026-11-30": "2026-11-30-run2",
             "h200-vllm024-2026-12-01": "2026-12-01"}


def calibration_rows(name: str) -> list[Row]:
    """The rows of measured run ``name``, or of the run profile ``name`` is fitted to
    (KeyError if neither)."""
    if name in MEASURED_RUNS:
        return MEASURED_RUNS[name]
    with open(PROFILES_PATH) as f:
        raw = yaml.safe_load(f) or {}
    seen = name
    while seen not in FITTED_TO and seen in raw and raw[seen].get("base") and \
            set(raw[seen]) <= {"base", "description"}:
        seen = raw[seen]["base"]                 # a pure alias (h200 -> its calibrated profile)
    if seen not in FITTED_TO:
        raise KeyError(f"{name!r} is neither a measured run ({', '.join(MEASURED_RUNS)}) "
                       f"nor a calibrated profile ({', '.join(FITTED_TO)})")
    return MEASURED_RUNS[FITTED_TO[seen]]


def simulate_rows(profile: SimProfile, rows: list[Row]) -> list[tuple[float, float]]:
    """(TTFT p50 ms, req/s) per row: a measured run is replayed in order on one engine,
    independent rows (the first table, the 2026-12-01 cells) each on a fresh engine."""
    if rows and all(isinstance(r, MeasuredRow) for r in rows):
        return replay_run(profile, rows)
    if rows and all(isinstance(r, SplitRow) for r in rows):
        return [(t, q) for t, q, _, _ in replay_split(profile, rows)]
    return [simulate_row(profile, r) for r in rows]
