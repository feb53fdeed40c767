"""Observability and deployment: access log lines, secrets kept out of logs, the
request id sent upstream, metrics across two workers, and the deployment files
(dashboard freshness, promtool, docker compose config)."""

from __future__ import annotations

import concurrent.futures
import hashlib
import http.server
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import openai
import pytest
import yaml

from conftest import SIM_MODEL
from images import data_uri, image_bytes

ROOT = Path(__file__).resolve().parent.parent
SECRET_KEY = "sk-obs-SECRET-7f3a9c1e5d"
WRONG_KEY = "sk-obs-WRONG-0b8e2d4a6c"
MARKER = "PROMPT-MARKER-q8z7x6"


def access_lines(output: str) -> list[dict]:
    lines = []
    for line in output.splitlines():
        if line.startswith("{"):
            obj = json.loads(line)
            if obj.get("logger") == "vlm_gateway.access":
                lines.append(obj)
    return lines


def test_json_access_log_one_line_per_request_and_no_secrets(servers):
    sim = servers.sim()
    tenant_cfg = {"name": "team-a", "key_sha256": hashlib.sha256(SECRET_KEY.encode()).hexdigest()}
    gw = servers.gateway({"auth": {"tenants": [tenant_cfg]}}, backends=[sim],
                         extra_args=["--log-format", "json"])
    client = openai.OpenAI(base_url=gw.base_url, api_key=SECRET_KEY, max_retries=0)
    png = image_bytes(96, 64, (10, 120, 200))
    image_b64_head = data_uri(png).split(",", 1)[1][:40]

    r1 = client.chat.completions.with_raw_response.create(
        model=SIM_MODEL, max_tokens=4, extra_headers={"x-request-id": "obs-nonstream-1"},
        messages=[{"role": "user", "content": [{"type": "text", "text": f"{MARKER} describe"},
                                               {"type": "image_url", "image_url": {"url": data_uri(png)}}]}])
    assert r1.headers["x-request-id"] == "obs-nonstream-1"
    stream = client.chat.completions.create(
        model=SIM_MODEL, max_tokens=3, stream=True, stream_options={"include_usage": True},
        extra_headers={"x-request-id": "obs-stream-2"},
        messages=[{"role": "user", "content": f"{MARKER} stream please"}])
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=SIM_MODEL, extra_headers={"x-request-id": "obs-bad-3"},
                                       messages=[{"role": "user", "content": [{"type": "bogus", "x": MARKER}]}])
    bad = openai.OpenAI(base_url=gw.base_url, api_key=WRONG_KEY, max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.chat.completions.create(model=SIM_MODEL, extra_headers={"x-request-id": "obs-401-4"},
                                    messages=[{"role": "user", "content": MARKER}])

    deadline = time.time() + 5
    while time.time() < deadline and len(access_lines(gw.output())) < 4:
        time.sleep(0.05)
    out = gw.output()
    lines = {l["request_id"]: l for l in access_lines(out) if l.get("path") == "/v1/chat/completions"}
    assert set(lines) == {"obs-nonstream-1", "obs-stream-2", "obs-bad-3", "obs-401-4"}, out[-3000:]

    ok = lines["obs-nonstream-1"]
    assert ok["status"] == 200 and ok["method"] == "POST" and ok["model"] == SIM_MODEL
    assert ok["backend"] == "sim0" and ok["stream"] is False
    assert ok["tenant"] == hashlib.sha256(b"team-a").hexdigest()[:12]
    assert ok["prompt_tokens"] > 0 and ok["completion_tokens"] == 4
    assert ok["images"] == 1 and "visual_tokens_saved" in ok and "cache" in ok
    for k in ("duration_ms", "ttfb_ms", "overhead_ms", "upstream_ms"):
        assert isinstance(ok[k], (int, float)) and ok[k] >= 0, k
    assert ok["upstream_ms"] <= ok["duration_ms"]

    st = lines["obs-stream-2"]
    assert st["status"] == 200 and st["stream"] is True and st["completion_tokens"] == 3
    assert lines["obs-bad-3"]["status"] == 400 and lines["obs-bad-3"]["error"]
    assert lines["obs-401-4"]["status"] == 401 and lines["obs-401-4"]["error"]

    # Keys, prompts and image bytes never reach the log, whatever the outcome.
    for needle in (SECRET_KEY, WRONG_KEY, MARKER, image_b64_head, "team-a"):
        assert needle not in out, needle


def test_text_log_format_has_the_same_fields(servers):
    sim = servers.sim()
    gw = servers.gateway(backends=[sim])
    r = httpx.post(gw.base_url + "/chat/completions", headers={"x-request-id": "text-log-1"},
                   json={"model": SIM_MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": MARKER}]})
    assert r.status_code == 200
    deadline = time.time() + 5
    while time.time() < deadline and "request_id=text-log-1" not in gw.output():
        time.sleep(0.05)
    line = next(l for l in gw.output().splitlines() if "request_id=text-log-1" in l)
    assert "vlm_gateway.access" in line and "status=200" in line and "backend=sim0" in line
    assert "completion_tokens=2" in line and MARKER not in gw.output()


class _Capture(http.server.BaseHTTPRequestHandler):
    """A minimal OpenAI-shaped upstream that records the headers it receives."""

    seen: list[dict] = []

    def log_message(self, *a) -> None:  # keep test output quiet
        pass

    def _send(self, code: int, obj) -> None:
        body = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        if self.path.endswith("/models"):
            self._send(200, {"object": "list", "data": [{"id": "capture-model", "object": "model"}]})
        else:
            self._send(200, {})

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length", 0)))
        type(self).seen.append({k.lower(): v for k, v in self.headers.items()})
        self._send(200, {"id": "c1", "object": "chat.completion", "created": 0, "model": "capture-model",
                         "choices": [{"index": 0, "finish_reason": "stop",
                                      "message": {"role": "assistant", "content": "ok"}}],
                         "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}})


def test_request_id_is_passed_upstream(servers):
    _Capture.seen = []
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Capture)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        gw = servers.gateway({"backends": [{"url": f"http://127.0.0.1:{srv.server_port}/v1",
                                            "name": "capture"}]})
        body = {"model": "capture-model", "messages": [{"role": "user", "content": "hi"}]}
        r = httpx.post(gw.base_url + "/chat/completions", headers={"x-request-id": "client-rid-42"}, json=body)
        assert r.status_code == 200 and r.headers["x-request-id"] == "client-rid-42"
        r2 = httpx.post(gw.base_url + "/chat/completions", json=body)
        generated = r2.headers["x-request-id"]
        # an unusable id (spaces, too long) is replaced, not forwarded
        r3 = httpx.post(gw.base_url + "/chat/completions", headers={"x-request-id": "bad id " + "x" * 200},
                        json=body)
        assert r3.headers["x-request-id"] != "bad id " + "x" * 200
        assert [h.get("x-request-id") for h in _Capture.seen] == ["client-rid-42", generated,
                                                                   r3.headers["x-request-id"]]
        assert re.fullmatch(r"[0-9a-f]{32}", generated)
    finally:
        srv.shutdown()
        srv.server_close()


def _scrape(url: str) -> str:
    return httpx.get(url + "/metrics", timeout=5).text


def _sample(text: str, name: str, **labels) -> float:
    """Sum of the samples of ``name`` whose labels include ``labels``."""
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        head, value = line.rsplit(" ", 1)
        if all(f'{k}="{v}"' in head for k, v in labels.items()):
            total += float(value)
    return total


def _pids(mp_dir: str, prefix: str) -> set[int]:
    return {int(n[:-3].rsplit("_", 1)[1]) for n in os.listdir(mp_dir) if n.startswith(prefix) and n.endswith(".db")}


def test_two_workers_metrics_add_up_and_dead_worker_files_are_reaped(servers, tmp_path):
    mp_dir = str(tmp_path / "prom-mp")
    os.mkdir(mp_dir)
    sim = servers.sim()
    gw = servers.gateway(backends=[sim], workers=2, env={"PROMETHEUS_MULTIPROC_DIR": mp_dir})
    body = {"model": SIM_MODEL, "max_tokens": 1, "messages": [{"role": "user", "content": "count me"}]}

    def one(_):
        # a fresh connection each time so the kernel spreads them over both workers' accepts
        with httpx.Client(timeout=10) as c:
            return c.post(gw.base_url + "/chat/completions", json=body).status_code

    sent = 0
    with concurrent.futures.ThreadPoolExecutor(8) as ex:
        for _ in range(10):
            codes = list(ex.map(one, range(16)))
            assert codes == [200] * 16
            sent += 16
            if len(_pids(mp_dir, "counter_")) >= 2:
                break
    workers = _pids(mp_dir, "counter_")
    assert len(workers) == 2, f"requests reached only workers {workers}"

    text = _scrape(gw.url)
    assert _sample(text, "vlm_gateway_requests_total", route="chat", status="200") == sent
    assert _sample(text, "vlm_gateway_overhead_seconds_count", route="chat") == sent
    assert _sample(text, "vlm_gateway_upstream_ttft_seconds_count", backend="sim0") == sent
    assert _sample(text, "vlm_gateway_tokens_total", kind="completion") == sent
    assert _sample(text, "vlm_gateway_backend_inflight", backend="sim0") == 0
    assert _sample(text, "vlm_gateway_backend_healthy", backend="sim0") == 1
    assert "pid=" not in text  # live gauges are aggregated, not reported per worker
    # each worker sets up logging itself: one access line per request from both
    deadline = time.time() + 5
    while time.time() < deadline and gw.output().count("POST /v1/chat/completions 200") < sent:
        time.sleep(0.05)
    assert gw.output().count("POST /v1/chat/completions 200") == sent

    # A worker that dies keeps its counted requests but its live gauges must go.
    victim = sorted(workers)[0]
    assert victim in _pids(mp_dir, "gauge_live")
    os.kill(victim, signal.SIGKILL)
    deadline = time.time() + 15
    while time.time() < deadline:
        try:
            text = _scrape(gw.url)
            if victim not in _pids(mp_dir, "gauge_live"):
                break
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    assert victim not in _pids(mp_dir, "gauge_live")
    assert _sample(text, "vlm_gateway_requests_total", route="chat", status="200") == sent
    assert _sample(text, "vlm_gateway_backend_healthy", backend="sim0") == 1


def test_rejections_are_counted_once_by_status_and_reason(servers):
    sim = servers.sim()
    gw = servers.gateway({"server": {"max_body_bytes": 4096}}, backends=[sim])
    base = gw.base_url + "/chat/completions"
    assert httpx.post(base, content=b"{not json", headers={"content-type": "application/json"}).status_code == 400
    assert httpx.post(base, json={"model": "nope", "messages": [{"role": "user", "content": "x"}]}).status_code == 404
    big = {"model": SIM_MODEL, "messages": [{"role": "user", "content": "x" * 8000}]}
    assert httpx.post(base, json=big).status_code == 413
    text = _scrape(gw.url)
    assert _sample(text, "vlm_gateway_rejections_total", status="400", reason="invalid_json") == 1
    assert _sample(text, "vlm_gateway_rejections_total", status="404", reason="model_not_found") == 1
    assert _sample(text, "vlm_gateway_rejections_total", status="413", reason="body_too_large") == 1
    assert _sample(text, "vlm_gateway_requests_total", status="413") == 1


# -- deployment files ----------------------------------------------------------------------

def test_dashboard_json_matches_its_generator():
    r = subprocess.run([sys.executable, str(ROOT / "grafana" / "build_dashboard.py"), "--check"])
    assert r.returncode == 0, "grafana/dashboards/vlm-gateway.json is stale: run python grafana/build_dashboard.py"
    dash = json.loads((ROOT / "grafana" / "dashboards" / "vlm-gateway.json").read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    # engine load panels read what the gateway scraped, so they cover vLLM and TensorRT-LLM alike
    for needed in ('vlm_gateway_engine_metric{metric="running"', 'vlm_gateway_engine_metric{metric="waiting"',
                   'vlm_gateway_engine_metric{metric="kv_usage"', 'vlm_gateway_engine_metric{metric="prefix_hits"',
                   "vlm_gateway_upstream_ttft_seconds_bucket",
                   "vlm_gateway_overhead_seconds_bucket", "vlm_gateway_cache_hits_total",
                   "vlm_gateway_rejections_total", "vlm_gateway_queue_depth", "vlm_gateway_backend_healthy"):
        assert any(needed in e for e in exprs), needed
    # no metric name TensorRT-LLM never exported
    for invented in ("trtllm:", "trtllm_prefix_cache"):
        assert not any(invented in e for e in exprs), invented
    # no data source uid to match on import: every panel and query reads the datasource variable
    assert all(p["datasource"]["uid"] == "${datasource}" for p in dash["panels"] if p["type"] != "row")


def test_promtool_accepts_config_and_rules():
    promtool = shutil.which("promtool")
    assert promtool, "promtool missing: apt-get install prometheus (listed in .ci/run)"
    r = subprocess.run([promtool, "check", "config", str(ROOT / "prometheus" / "prometheus.yml")],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    r = subprocess.run([promtool, "check", "rules", str(ROOT / "prometheus" / "alerts.yml")],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    r = subprocess.run([promtool, "test", "rules", str(ROOT / "prometheus" / "alerts_test.yml")],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    names = {rule["alert"] for g in yaml.safe_load((ROOT / "prometheus/alerts.yml").read_text())["groups"]
             for rule in g["rules"]}
    assert {"VlmGatewayBackendDown", "VlmGatewayTTFTP99OverBudget", "VlmGatewayCacheHitRatioCollapse",
            "VlmGateway5xxRate"} <= names


def _compose_cmd() -> list[str] | None:
    if shutil.which("docker"):
        if subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0:
            return ["docker", "compose"]
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    return None


def test_docker_compose_config_is_valid():
    if not shutil.which("docker") and not shutil.which("docker-compose"):
        pytest.skip("no docker CLI on this machine")
    cmd = _compose_cmd()
    assert cmd, "docker CLI present but no compose: apt-get install docker-compose (listed in .ci/run)"
    env = {**os.environ, "COMPOSE_PROJECT_NAME": "vlm-gateway"}
    rendered = {}
    for profile in ("gpu", "sim"):
        r = subprocess.run([*cmd, "-f", str(ROOT / "docker-compose.yml"), "--profile", profile, "config"],
                           capture_output=True, text=True, cwd=ROOT, env=env)
        assert r.returncode == 0, r.stdout + r.stderr
        rendered[profile] = yaml.safe_load(r.stdout)["services"]
    gpu, sim = rendered["gpu"], rendered["sim"]
    for svc in ("gateway", "vllm", "redis", "prometheus", "grafana"):
        assert svc in gpu, svc
    # every measured claim (docs/benchmarks/gpu.md) is for vLLM 0.24.0: the image is that release
    assert gpu["vllm"]["image"] == "vllm/vllm-openai:v0.24.0"
    devices = gpu["vllm"]["deploy"]["resources"]["reservations"]["devices"]
    assert devices[0]["capabilities"] == ["gpu"]
    assert {"gateway-sim", "sim0", "sim1"} <= set(sim)
    assert sim["sim0"]["command"][0] == "sim"
    mounts = " ".join(str(v) for v in gpu["grafana"]["volumes"])
    assert "grafana/provisioning" in mounts and "grafana/dashboards" in mounts
    # vllm's flags are those `vlm-gateway launch` derives from the h200 profile.
    model = gpu["vllm"]["command"][0]
    launch = subprocess.run([sys.executable, "-m", "vlm_gateway", "launch", "--profile", "h200", "--model", model,
                             "--host", "0.0.0.0", "--dry-run"], capture_output=True, text=True)
    assert launch.returncode == 0, launch.stderr
    argv = shlex.split(launch.stdout.strip().splitlines()[-1])
    assert argv[:2] == ["vllm", "serve"] and gpu["vllm"]["entrypoint"] == ["vllm", "serve"]
    assert gpu["vllm"]["command"] == argv[2:]


def _server_timing(value: str) -> dict[str, float]:
    out = {}
    for item in value.split(","):
        name, _, dur = item.strip().partition(";dur=")
        out[name] = float(dur)
    return out


def test_overhead_counts_from_the_first_byte_and_is_split_by_phase(servers):
    """A body that arrives slowly is the gateway's time (receive), and so is the image
    rewrite (media): the overhead header, Server-Timing, the histograms and the access
    line all count from the request's first byte to its first byte upstream."""
    sim = servers.sim()
    gw = servers.gateway(backends=[sim], extra_args=["--log-format", "json"])
    import image_corpus as C
    body = json.dumps({"model": SIM_MODEL, "max_tokens": 1, "messages": [{"role": "user", "content": [
        {"type": "text", "text": "time me"},
        {"type": "image_url", "image_url": {"url": data_uri(C.desktop_screenshot_png(1920, 1080))}}]}]}).encode()

    def slow_body():
        yield body[: len(body) // 2]
        time.sleep(0.4)  # behaviour: the client pauses mid-body: time the gateway spends receiving
        yield body[len(body) // 2:]

    r = httpx.post(gw.base_url + "/chat/completions", content=slow_body(), timeout=30,
                   headers={"content-type": "application/json", "x-request-id": "timing-1"})
    assert r.status_code == 200, r.text
    st = _server_timing(r.headers["server-timing"])
    assert set(st) == {"receive", "parse", "queue", "media", "route", "other", "gateway"}
    assert st["receive"] >= 400.0
    assert st["media"] > 0.5  # the 1920x1080 PNG was decoded and resized in the pool
    overhead = float(r.headers["x-vlm-gateway-overhead-ms"])
    assert overhead >= st["gateway"] >= 400.0 + st["media"]
    parts = sum(v for k, v in st.items() if k != "gateway")
    assert abs(parts - st["gateway"]) < 0.05 + 0.01 * len(st)  # the phases add up (one image: no parallel jobs)

    text = _scrape(gw.url)
    assert _sample(text, "vlm_gateway_overhead_phase_seconds_count", route="chat", phase="receive") == 1
    assert _sample(text, "vlm_gateway_overhead_phase_seconds_sum", route="chat", phase="receive") >= 0.4
    assert _sample(text, "vlm_gateway_overhead_seconds_sum", route="chat") >= 0.4
    deadline = time.time() + 5
    line = None
    while time.time() < deadline and line is None:
        line = next((x for x in access_lines(gw.output()) if x.get("request_id") == "timing-1"), None)
        time.sleep(0.05)
    assert line is not None
    assert line["receive_ms"] == pytest.approx(st["receive"], abs=0.01)
    assert line["media_ms"] == pytest.approx(st["media"], abs=0.01)
    assert line["gateway_ms"] == pytest.approx(st["gateway"], abs=0.01)
