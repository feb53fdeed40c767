"""Load-aware routing in front of TensorRT-LLM: a real gateway and simulators serving
trtllm-serve's load endpoints, with traffic the gateway does not see (another client
talking to one engine directly). What the router can see depends on the release line:

- 1.3 pre-releases: ``/prometheus/metrics`` carries trtllm_num_requests_running/waiting,
  so the outside load is seen and avoided, as with vLLM;
- 1.2 (stable): only ``/metrics`` (JSON iteration statistics), which answers when the
  engine has been idle for 2 s. While the outside load runs it says nothing; the router
  keeps serving on its own in-flight counts, and the figures arrive once the engine idles.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import httpx
import openai
import pytest

from conftest import SIM_MODEL, until
from test_routing import chat, client, gateway_metric
from vlm_gateway.backends.sim.trtllm import WAIT_S
from waiting import wait_until


def _outside_load(sim, stop: threading.Event, workers: int = 6) -> list[threading.Thread]:
    """``workers`` clients sending short requests straight to ``sim`` until ``stop``."""
    c = openai.OpenAI(base_url=sim.base_url, api_key="x", max_retries=0, timeout=30)

    def loop(i: int) -> None:
        n = 0
        while not stop.is_set():
            c.chat.completions.create(model=SIM_MODEL, max_tokens=12,
                                      messages=[{"role": "user", "content": f"outside {i} {n}"}])
            n += 1

    threads = [threading.Thread(target=loop, args=(i,), daemon=True) for i in range(workers)]
    for t in threads:
        t.start()
    return threads


def _gateway(servers, sims, release_engine: str = "trtllm"):
    return servers.gateway({
        "routing": {"policy": "least_loaded", "scrape_interval_s": 0.1},
        "backends": [{"url": s.base_url, "name": f"sim{i}", "engine": release_engine, "profile": "rtx3090"}
                     for i, s in enumerate(sims)]})


def _engine_figure(gw, backend: str, metric: str) -> float | None:
    for line in httpx.get(gw.url + "/metrics", timeout=5).text.splitlines():
        if line.startswith("vlm_gateway_engine_metric{") and f'backend="{backend}"' in line \
                and f'metric="{metric}"' in line:
            return float(line.rsplit(" ", 1)[1])
    return None


def test_outside_load_on_a_1_3_engine_is_seen_and_avoided(servers):
    sims = [servers.sim(profile="fast", token_rate=60, engine="trtllm", extra_args=["--trtllm-release", "1.3"])
            for _ in range(2)]
    gw = _gateway(servers, sims)
    stop = threading.Event()
    threads = _outside_load(sims[0], stop)
    try:
        # the engine's own count reaches the gateway through trtllm_num_requests_running
        assert until(lambda: (_engine_figure(gw, "sim0", "running") or 0) >= 3, timeout=10), \
            httpx.get(gw.url + "/metrics").text[-2000:]
        c = client(gw)
        placed = [chat(c, [{"role": "user", "content": f"mine {i}"}], max_tokens=2)[1] for i in range(10)]
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=10)
    # rtx3090 profile: 2 slots, so six outside requests make sim0 look full; ours go to sim1
    assert placed.count("sim1") >= 9, placed
    assert "engine load from http://127.0.0.1:%d/prometheus/metrics (prometheus)" % sims[0].port in gw.output()


def test_1_2_engine_routes_on_in_flight_counts_while_busy_and_reports_once_idle(servers):
    sims = [servers.sim(profile="fast", token_rate=60, engine="trtllm") for _ in range(2)]
    gw = _gateway(servers, sims)
    c = client(gw)
    chat(c, [{"role": "user", "content": "warm"}])       # start both engines' statistics
    chat(c, [{"role": "user", "content": "warm 2"}])
    stop = threading.Event()
    threads = _outside_load(sims[0], stop)
    try:
        wait_until(lambda: sims[0].sim_stats()["running"] >= 3, "the outside load runs on sim0")
        # the engine stays busy for longer than the JSON endpoint's idle wait (2 s): an endpoint
        # that answered anyway would have shown the gateway the outside load by now
        time.sleep(WAIT_S + 0.5)  # behaviour: an engine busy past WAIT_S
        t0 = time.monotonic()
        placed = [chat(c, [{"role": "user", "content": f"mine {i}"}], max_tokens=2)[1] for i in range(10)]
        took = time.monotonic() - t0
        # busy engine: its /metrics has not answered, so the gateway holds no fresh figure of it
        running = _engine_figure(gw, "sim0", "running")
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=10)
    # a /metrics read that hangs while the engine is busy delays no request: ten short requests
    # take about their own time (2 tokens at 60/s each), not the 2 s of a scrape
    assert took < 5.0, took
    # the router could not see the outside load: our requests spread over both backends
    assert set(placed) == {"sim0", "sim1"}, placed
    assert running is None or running <= 1.0
    # once sim0 has been idle for 2 s its iteration statistics arrive: the last step's figures
    assert until(lambda: _engine_figure(gw, "sim0", "kv_usage") is not None
                 and _engine_figure(gw, "sim0", "running") is not None, timeout=10)
    assert "engine load from http://127.0.0.1:%d/metrics (trtllm_json)" % sims[0].port in gw.output()
    assert gateway_metric(gw, "vlm_gateway_requests_total") >= 12


@pytest.mark.parametrize("fmt", ["prometheus", "trtllm_json"])
def test_configured_metrics_format_is_honoured(servers, fmt):
    sim = servers.sim(profile="fast", engine="trtllm", extra_args=["--trtllm-release", "1.3"])
    gw = servers.gateway({"routing": {"scrape_interval_s": 0.1}, "backends": [
        {"url": sim.base_url, "name": "t", "engine": "trtllm", "metrics_format": fmt}]})
    chat(client(gw), [{"role": "user", "content": "hi"}])
    path = "/prometheus/metrics" if fmt == "prometheus" else "/metrics"
    assert until(lambda: f"engine load from http://127.0.0.1:{sim.port}{path} ({fmt})" in gw.output(),
                 timeout=8), gw.output()[-2000:]


@pytest.mark.parametrize("release", ["1.2", "1.3"])
def test_first_contact_script_passes_against_the_simulator(servers, release, tmp_path):
    """benchmarks/gpu/trtllm_first_contact.py, the checks a user runs against a real
    trtllm-serve, run here against the simulator's TensorRT-LLM mode: the engine alone
    first (nothing else may read its /metrics queue), then behind a gateway."""
    import json
    import subprocess
    import sys
    script = Path(__file__).resolve().parent.parent / "benchmarks/gpu/trtllm_first_contact.py"
    sim = servers.sim(profile="fast", token_rate=200, engine="trtllm", extra_args=["--trtllm-release", release])

    def run(*extra: str) -> dict:
        out = tmp_path / f"report-{len(extra)}.json"
        r = subprocess.run([sys.executable, str(script), "--engine", sim.url, "--model", SIM_MODEL,
                            "--out", str(out), *extra], capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stdout + r.stderr
        rows = {row["check"]: row for row in json.loads(out.read_text())}
        assert all(row["status"] == "PASS" for row in rows.values()), r.stdout
        return rows

    rows = run()
    assert "2 s for one more" in rows["iteration statistics"]["detail"]
    source = "gateway reads /prometheus/metrics" if release == "1.3" else "gateway reads /metrics (JSON)"
    assert source in rows["prometheus"]["detail"]
    gw = servers.gateway({"routing": {"scrape_interval_s": 0.1},
                          "backends": [{"url": sim.base_url, "name": "trt", "engine": "trtllm"}]})
    rows = run("--gateway", gw.url, "--backend", "trt", "--gateway-only")
    # the gateway's visual-token count matched the engine's prompt tokens
    assert "fewer" in rows["token accounting"]["detail"] and rows["gateway backend"]["detail"] == "trt"
