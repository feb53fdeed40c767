"""A real Prometheus (Debian's binary, started here on a loopback port) scrapes a
two-worker gateway and two simulators under a short mixed load; then every panel
query of the Grafana dashboard, evaluated through Prometheus's HTTP API, must be
valid and return at least one finite value, and every alert rule must evaluate
without error."""

from __future__ import annotations

import base64
import hashlib
import json
import math
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai
import pytest
import yaml

from conftest import SIM_MODEL, free_port, wait_http
from images import data_uri, image_bytes
import image_corpus as corpus
import video_corpus
from test_security_support import RedisServer
from waiting import wait_until

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "grafana"))
import build_dashboard  # noqa: E402

KEY = "sk-prom-load-5e1f"
TINY_KEY = "sk-prom-tiny-9a2b"
RATE_WINDOW = "1m"

pytestmark = pytest.mark.slow


def _prometheus(tmp: Path, gateway_port: int, sim_ports: list[int]):
    binary = shutil.which("prometheus")
    assert binary, "prometheus missing: apt-get install prometheus (listed in .ci/run)"
    shutil.copy(ROOT / "prometheus" / "alerts.yml", tmp / "alerts.yml")
    cfg = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": ["alerts.yml"],
        "scrape_configs": [
            {"job_name": "vlm-gateway", "static_configs": [{"targets": [f"127.0.0.1:{gateway_port}"]}]},
            {"job_name": "engines", "static_configs": [{"targets": [f"127.0.0.1:{p}" for p in sim_ports]}]},
        ],
    }
    (tmp / "prometheus.yml").write_text(yaml.safe_dump(cfg))
    port = free_port()
    log = open(tmp / "prometheus.log", "w")
    proc = subprocess.Popen([binary, f"--config.file={tmp / 'prometheus.yml'}",
                             f"--storage.tsdb.path={tmp / 'data'}", f"--web.listen-address=127.0.0.1:{port}",
                             "--log.level=warn"], stdout=log, stderr=subprocess.STDOUT)
    wait_http(f"http://127.0.0.1:{port}/-/ready", proc, 30, str(tmp / "prometheus.log"))
    return proc, f"http://127.0.0.1:{port}"


def _query(prom: str, expr: str) -> list[dict]:
    r = httpx.get(prom + "/api/v1/query", params={"query": expr}, timeout=10)
    body = r.json()
    assert r.status_code == 200 and body["status"] == "success", f"{expr}: {body}"
    return body["data"]["result"]


def _scrapes_since(prom: str, t: float) -> int:
    """Scrapes since ``t`` (this machine's wall clock, which Prometheus reads too) of the
    target scraped least."""
    window_ms = max(1, int((time.time() - t) * 1000))
    res = _query(prom, f"min(count_over_time(up[{window_ms}ms]))")
    return int(float(res[0]["value"][1])) if res else 0


def _scraped(prom: str, n: int, what: str) -> None:
    t = time.time()
    wait_until(lambda: _scrapes_since(prom, t) >= n, f"{n} scrape(s) of every target {what}", timeout=20,
               every=0.25)


def _load(gw_url: str, sims, prom: str) -> int:
    """A short mixed load; returns how many completion requests it sent."""
    client = openai.OpenAI(base_url=gw_url + "/v1", api_key=KEY, max_retries=0)
    big = data_uri(image_bytes(1600, 1200, (30, 140, 90)))  # rewritten down to the 768 px budget
    small = data_uri(image_bytes(64, 48, (200, 30, 30)))
    # a window on a white desktop: trimmed, so coordinates in the (echoed) answer are mapped back
    window = "data:image/png;base64," + base64.b64encode(corpus.screenshot_png()).decode()
    sent = 0
    for rnd in range(3):
        for i in range(4):
            client.chat.completions.create(  # deterministic: L3 exact hits from the second round
                model=SIM_MODEL, max_tokens=4, temperature=0,
                messages=[{"role": "user", "content": f"what is {i} plus {i}?"}])
            client.chat.completions.create(  # images: L1 hits, visual tokens saved
                model=SIM_MODEL, max_tokens=4, temperature=0.7,
                messages=[{"role": "user", "content": [
                    {"type": "text", "text": f"describe image {i}"},
                    {"type": "image_url", "image_url": {"url": big if i % 2 else small}}]}])
            stream = client.chat.completions.create(  # same prefix each round: affinity routing
                model=SIM_MODEL, max_tokens=5, temperature=0.7, stream=True,
                stream_options={"include_usage": True},
                messages=[{"role": "system", "content": "You are a careful assistant. " * 20},
                          {"role": "user", "content": f"stream {i}"}])
            assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
            sent += 3
        client.chat.completions.create(  # grounding: coordinates mapped between frames
            model=SIM_MODEL, max_tokens=12, temperature=0.7,
            messages=[{"role": "user", "content": [
                {"type": "image_url", "image_url": {"url": window}},
                {"type": "text", "text": '{"point_2d": [500, 500]}'}]}])
        sent += 1
        clip = video_corpus.motion_clip(1, 160, 96, 10, seed=rnd)  # a new clip each round: rewritten
        client.chat.completions.create(
            model=SIM_MODEL, max_tokens=4, temperature=0.7,
            messages=[{"role": "user", "content": [
                {"type": "video_url", "video_url": {"url": "data:video/mp4;base64," + base64.b64encode(clip).decode()}},
                {"type": "text", "text": "what happens?"}]}])
        sent += 1
        # errors the dashboard shows: 400, 404, 413, 429, and a retried upstream 5xx
        with pytest.raises(openai.BadRequestError):
            client.chat.completions.create(model=SIM_MODEL, messages=[{"role": "user", "content": [
                {"type": "nonsense"}]}])
        with pytest.raises(openai.NotFoundError):
            client.chat.completions.create(model="no-such-model", messages=[{"role": "user", "content": "x"}])
        r = httpx.post(gw_url + "/v1/chat/completions", headers={"authorization": f"Bearer {KEY}"},
                       json={"model": SIM_MODEL, "messages": [{"role": "user", "content": "x" * 300_000}]})
        assert r.status_code == 413
        tiny = openai.OpenAI(base_url=gw_url + "/v1", api_key=TINY_KEY, max_retries=0)
        tries = 0
        with pytest.raises(openai.RateLimitError):
            for _ in range(3):
                tries += 1
                tiny.chat.completions.create(model=SIM_MODEL, max_tokens=1, temperature=0.5,
                                             messages=[{"role": "user", "content": "tiny"}])
        sent += 3 + tries
        sims[rnd % 2].sim_faults(fail_next=1)
        client.chat.completions.create(model=SIM_MODEL, max_tokens=2, temperature=0.9,
                                       messages=[{"role": "user", "content": f"retry {rnd}"}])
        sent += 1
        _scraped(prom, 1, "after the round")  # the load spreads over several scrapes
    return sent


def test_every_dashboard_query_returns_data_from_a_real_prometheus(servers, tmp_path):
    sims = [servers.sim(), servers.sim()]
    tenants = [{"name": "load", "key_sha256": hashlib.sha256(KEY.encode()).hexdigest()},
               {"name": "tiny", "key_sha256": hashlib.sha256(TINY_KEY.encode()).hexdigest(),
                "requests_per_minute": 1}]
    # two workers share their rate limits through Redis (per-process limits would double)
    redis = RedisServer(str(tmp_path)).start()
    # slo.min_samples 1: the budget controller reads a TTFT percentile from this short load
    gw = servers.gateway({"auth": {"tenants": tenants}, "server": {"max_body_bytes": 256 * 1024},
                          "redis_url": redis.url, "slo": {"min_samples": 1}}, backends=sims, workers=2)
    prom_proc, prom = _prometheus(tmp_path, gw.port, [s.port for s in sims])
    try:
        # both targets up before the load, so every counter's first increase is seen
        deadline = time.time() + 20
        while time.time() < deadline and len([r for r in _query(prom, "up == 1")]) < 3:
            time.sleep(0.25)
        assert len(_query(prom, "up == 1")) == 3, _query(prom, "up")

        sent = _load(gw.url, sims, prom)

        deadline = time.time() + 20
        seen = 0.0
        while time.time() < deadline:
            res = _query(prom, "sum(vlm_gateway_requests_total)")
            seen = float(res[0]["value"][1]) if res else 0.0
            if seen >= sent:
                break
            time.sleep(0.25)
        assert seen == sent, f"Prometheus saw {seen} requests, the load sent {sent}"
        _scraped(prom, 2, "after the last increase")

        problems = []
        queries = build_dashboard.queries(json.loads((ROOT / "grafana/dashboards/vlm-gateway.json").read_text()))
        assert len(queries) >= 30
        for title, expr in queries:
            result = _query(prom, build_dashboard.as_sent(expr, RATE_WINDOW))
            values = [float(r["value"][1]) for r in result]
            if not any(math.isfinite(v) for v in values):
                problems.append(f"{title}: {expr} -> {values or 'no series'}")
        assert not problems, "panels without data:\n" + "\n".join(problems)
        # the model and backend variables: Grafana asks Prometheus for a label's values like this
        for v in build_dashboard.variables():
            if v["type"] == "query":
                metric, label = re.fullmatch(r"label_values\((\w+), (\w+)\)", v["query"]["query"]).groups()
                got = httpx.get(f"{prom}/api/v1/label/{label}/values", params={"match[]": metric}, timeout=10).json()
                assert got["data"], (v["name"], got)

        levels = {r["metric"].get("level") for r in _query(prom, build_dashboard.as_sent(build_dashboard.CACHE_RATIO,
                                                                                         RATE_WINDOW))}
        levels |= {r["metric"].get("level") for r in _query(prom, build_dashboard.as_sent(build_dashboard.L2_AFFINITY,
                                                                                          RATE_WINDOW))}
        assert {"l1", "l2", "l3_exact", "l3_normalized"} <= levels, levels
        statuses = {r["metric"]["status"] for r in _query(prom, "sum by (status) (vlm_gateway_rejections_total)")}
        assert {"400", "404", "413", "429"} <= statuses, statuses

        # alert rules evaluate cleanly against the same data
        rules = httpx.get(prom + "/api/v1/rules", timeout=10).json()["data"]["groups"]
        evaluated = [r for g in rules for r in g["rules"]]
        assert len(evaluated) >= 6
        assert all(r["health"] == "ok" for r in evaluated), [(r["name"], r.get("lastError")) for r in evaluated]
    finally:
        prom_proc.terminate()
        prom_proc.wait(10)
        redis.stop()
