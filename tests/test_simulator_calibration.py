"""The calibrated profiles reproduce the real vLLM measurements they are fitted to
within 25% (TTFT p50 and req/s).

``h200-qwen3vl-2b`` (the first table), two checks: the timing model alone on a virtual clock (deterministic, instant),
and the same workloads over HTTP against a simulator process, with real JPEGs
of the stated sizes (distinct per request; one repeated in the prefix-cache
row), streaming, 64 output tokens, ignore_eos, through the OpenAI SDK. The live
run is sped up per row (``Row.time_scale``: 0.1x to ~0.7x real time, chosen so
the client and server keep up on a 2-core machine) and converted back, after
taking off this machine's own per-request overhead (measured first with the
simulated delays at ~0), which a time scale would otherwise magnify.

``h200-vllm024-2026-11-30`` (the 2026-11-30 run): the timing model offline only,
replaying the measured cells in order on one engine (the cells reused images, so
the processor and prefix caches carry over from cell to cell); one replay, ~1 s.

``h200-vllm024-2026-12-01`` (the third lease's cells, issue #28): offline, each cell on a
fresh engine, TTFT p50 and req/s (the figures the fit does not reach are strict xfails) and
the share of TTFT raw images spend before the response headers; one replay, ~2 s.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace

import httpx
import pytest

from vlm_gateway.backends.sim.profiles import RUN_2026_11_30, get_profile, replay_run
from vlm_gateway.backends.sim.workload import CALIBRATION, run_row_http, simulate_row

TOLERANCE = 0.25


def within(value: float, target: float) -> bool:
    return (1 - TOLERANCE) * target <= value <= (1 + TOLERANCE) * target


@pytest.mark.parametrize("row", CALIBRATION, ids=[r.label for r in CALIBRATION])
def test_timing_model_reproduces_measurement(row):
    ttft, rps = simulate_row(get_profile("h200-qwen3vl-2b"), row)
    assert within(ttft, row.ttft_p50_ms), f"TTFT p50 {ttft:.0f} ms vs measured {row.ttft_p50_ms}"
    assert within(rps, row.req_per_s), f"{rps:.2f} req/s vs measured {row.req_per_s}"


@pytest.fixture(scope="module")
def run_2026_11_30():
    return dict(zip(RUN_2026_11_30, replay_run(get_profile("h200-vllm024-2026-11-30"), RUN_2026_11_30)))


# The one figure of that run the model cannot reach within 25% (docs/benchmarks/simulator.md,
# "Recalibration against the 2026-11-30 run"): the measured 768x576 c16 cell answered faster
# (264 ms) than 768x448 c16 (338 ms) with more pixels, more tokens and fewer cache hits, and
# decoded slower; the model's costs only grow with pixels and tokens.
UNREACHED = {("768x576 c16", "ttft"): "768x576 c16 measured faster than 768x448 c16 (simulated 1.37x)"}


def _cases():
    for row in RUN_2026_11_30:
        for metric in ("ttft", "req/s"):
            reason = UNREACHED.get((row.label, metric))
            marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
            yield pytest.param(row, metric, marks=marks, id=f"{row.label} {metric}")


@pytest.mark.parametrize("row,metric", list(_cases()))
def test_timing_model_reproduces_2026_11_30_run(run_2026_11_30, row, metric):
    ttft, rps = run_2026_11_30[row]
    if metric == "ttft":
        assert within(ttft, row.ttft_p50_ms), f"TTFT p50 {ttft:.0f} ms vs measured {row.ttft_p50_ms}"
    else:
        assert within(rps, row.req_per_s), f"{rps:.2f} req/s vs measured {row.req_per_s}"


@pytest.fixture(scope="module")
def calibrated_sim(module_servers):
    return module_servers.sim(profile="h200-qwen3vl-2b", echo=False)


@pytest.mark.parametrize("row", CALIBRATION, ids=[r.label for r in CALIBRATION])
def test_simulator_over_http_reproduces_measurement(calibrated_sim, row):
    # this machine's own per-request cost (HTTP on loopback, SDK, JSON, image parsing), which the
    # time scale does not shrink: the TTFT of the same requests with the simulated delays ~0
    httpx.post(calibrated_sim.url + "/sim/config", json={"time_scale": 1e-4, "reset_cache": True}, timeout=5)
    probe = replace(row, concurrency=1, same_image=False)
    # median of 9: a single slow request of a loaded machine must not set the overhead
    overhead_ms, _ = asyncio.run(run_row_http(calibrated_sim.base_url, "qwen3vl-sim", probe, n=9))
    scale = row.time_scale()
    httpx.post(calibrated_sim.url + "/sim/config", json={"time_scale": scale, "reset_cache": True}, timeout=5)
    ttft, rps = asyncio.run(run_row_http(calibrated_sim.base_url, "qwen3vl-sim", row, time_scale=scale,
                                         overhead_s=overhead_ms / 1000.0))
    stats = calibrated_sim.sim_stats()
    assert stats["running"] == 0 and stats["waiting"] == 0
    assert within(ttft, row.ttft_p50_ms), f"TTFT p50 {ttft:.0f} ms vs measured {row.ttft_p50_ms} (scale {scale})"
    assert within(rps, row.req_per_s), f"{rps:.2f} req/s vs measured {row.req_per_s} (scale {scale})"


# -- h200-vllm024-2026-12-01: the third lease's cells (issue #28), with the split at the headers ----

@pytest.fixture(scope="module")
def run_2026_12_01():
    from vlm_gateway.backends.sim.split_run import RUN_2026_12_01, replay_split
    return dict(zip(RUN_2026_12_01, replay_split(get_profile("h200-vllm024-2026-12-01"), RUN_2026_12_01)))


def _split_rows():
    from vlm_gateway.backends.sim.split_run import RUN_2026_12_01
    return RUN_2026_12_01


# Figures the fit does not reach within 25% (docs/benchmarks/simulator.md, "The API-server stage"):
# the mix's classes and formats are assumed (only summary figures were kept), and at concurrency 64
# the pre-resized cells decode 64 tokens in 1.2-1.5 s where the model's engine takes ~0.3 s, so
# their TTFT comes out long (and their share after the headers short: 1.4 % vs 8-12 %).
UNREACHED_2026_12_01 = {
    ("(a) desktop c1", "ttft"), ("(a) mix c1", "ttft"), ("(a) mix c1", "req/s"), ("(a) mix c16", "req/s"),
    ("(a) mix c64", "req/s"), ("(b) desktop c64", "ttft"), ("(b) terminal c64", "ttft"), ("(b) mix c1", "ttft"),
    ("(b) mix c16", "ttft"), ("(b) mix c64", "ttft")}


def _split_cases():
    for row in _split_rows():
        for metric in ("ttft", "req/s"):
            marks = ([pytest.mark.xfail(strict=True, reason="not reached by this model (simulator.md)")]
                     if (row.label, metric) in UNREACHED_2026_12_01 else [])
            yield pytest.param(row, metric, marks=marks, id=f"{row.label} {metric}")


@pytest.mark.parametrize("row,metric", list(_split_cases()))
def test_timing_model_reproduces_2026_12_01_cells(run_2026_12_01, row, metric):
    ttft, rps, _, _ = run_2026_12_01[row]
    if metric == "ttft":
        assert within(ttft, row.ttft_p50_ms), f"TTFT p50 {ttft:.0f} ms vs measured {row.ttft_p50_ms}"
    else:
        assert within(rps, row.req_per_s), f"{rps:.2f} req/s vs measured {row.req_per_s}"


def test_raw_images_wait_before_the_headers_as_measured(run_2026_12_01):
    """At concurrency 64 raw images spend 97-99 % of TTFT before the response headers (in the
    API server), and raw throughput stays flat from 16 to 64 while TTFT grows with the queue."""
    by = {r.label: v for r, v in run_2026_12_01.items()}
    for row in _split_rows():
        if row.before_headers and row.label.startswith("(a)"):
            assert abs(by[row.label][2] - row.before_headers) <= 0.02, (row.label, by[row.label][2])
    (t16, q16, _, _), (t64, q64, _, _) = by["(a) desktop c16"], by["(a) desktop c64"]
    assert 0.85 <= q64 / q16 <= 1.15 and t64 / t16 >= 4
