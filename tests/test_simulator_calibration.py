"""The h200-qwen3vl-2b profile reproduces every real vLLM measurement within 25%.

Two checks: the timing model alone on a virtual clock (deterministic, instant),
and the same workloads over HTTP against a simulator process, with real JPEGs
of the stated sizes (distinct per request; one repeated in the prefix-cache
row), streaming, 64 output tokens, ignore_eos, through the OpenAI SDK. The live
run is sped up per row (``Row.time_scale``: 0.1x to ~0.7x real time, chosen so
the client and server keep up on a 2-core machine) and converted back, after
taking off this machine's own per-request overhead (measured first with the
simulated delays at ~0), which a time scale would otherwise magnify.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace

import httpx
import pytest

from vlm_gateway.backends.sim.profiles import get_profile
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
def calibrated_sim(module_servers):
    return module_servers.sim(profile="h200-qwen3vl-2b", echo=False)


@pytest.mark.parametrize("row", CALIBRATION, ids=[r.label for r in CALIBRATION])
def test_simulator_over_http_reproduces_measurement(calibrated_sim, row):
    # this machine's own per-request cost (HTTP on loopback, SDK, JSON, image parsing), which the
    # time scale does not shrink: the TTFT of the same requests with the simulated delays ~0
    httpx.post(calibrated_sim.url + "/sim/config", json={"time_scale": 1e-4, "reset_cache": True}, timeout=5)
    probe = replace(row, concurrency=1, same_image=False)
    overhead_ms, _ = asyncio.run(run_row_http(calibrated_sim.base_url, "qwen3vl-sim", probe, n=3))
    scale = row.time_scale()
    httpx.post(calibrated_sim.url + "/sim/config", json={"time_scale": scale, "reset_cache": True}, timeout=5)
    ttft, rps = asyncio.run(run_row_http(calibrated_sim.base_url, "qwen3vl-sim", row, time_scale=scale,
                                         overhead_s=overhead_ms / 1000.0))
    stats = calibrated_sim.sim_stats()
    assert stats["running"] == 0 and stats["waiting"] == 0
    assert within(ttft, row.ttft_p50_ms), f"TTFT p50 {ttft:.0f} ms vs measured {row.ttft_p50_ms} (scale {scale})"
    assert within(rps, row.req_per_s), f"{rps:.2f} req/s vs measured {row.req_per_s} (scale {scale})"
