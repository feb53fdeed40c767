"""What a new user meets, over real HTTP: admin endpoints without an admin key, the
root path, OpenAI error types on server-side failures, the probe-failure log line,
the built-in simulator's profile on the status page, and which x-vlm-gateway-*
headers every response carries."""

from __future__ import annotations

import httpx
import pytest
from aiohttp import web

from conftest import SIM_MODEL, free_port, until
from hostile import HostileBackend

BODY = {"model": SIM_MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


@pytest.fixture(scope="module")
def env(module_servers):
    sim = module_servers.sim()
    return sim, module_servers.gateway({}, backends=[sim])


def test_admin_without_an_admin_key_is_403_whatever_is_sent(env):
    _, gw = env
    for headers in ({}, {"authorization": "Bearer anything"}):
        for method, path in (("GET", "/admin/status"), ("POST", "/admin/cache/flush"),
                             ("POST", "/admin/backends/sim0/drain")):
            r = httpx.request(method, gw.url + path, headers=headers)
            assert r.status_code == 403, (path, r.status_code)
            e = r.json()["error"]
            assert e["code"] == "admin_disabled" and "auth.admin_key_sha256" in e["message"]
    assert httpx.get(gw.url + "/ui/api/status").json()["backends"][0]["state"] == "ok"  # nothing was drained


def test_root_points_to_the_playground(env):
    _, gw = env
    r = httpx.get(gw.url + "/", headers={"accept": "text/html,application/xhtml+xml"})
    assert r.status_code == 307 and r.headers["location"] == "/ui/"
    d = httpx.get(gw.url + "/").json()
    assert d["ui"] == "/ui/" and d["openai_base_url"] == "/v1" and d["service"] == "vlm-gateway"


def test_root_without_ui(servers):
    sim = servers.sim()
    gw = servers.gateway({"server": {"ui": False}}, backends=[sim])
    r = httpx.get(gw.url + "/", headers={"accept": "text/html"})
    assert r.status_code == 200 and "ui" not in r.json()


def test_server_side_failures_have_the_openai_type(servers):
    dead = f"http://127.0.0.1:{free_port()}/v1"
    gw = servers.gateway({"backends": [{"url": dead, "models": [SIM_MODEL]}]}, ready_path="/health")
    for r in (httpx.get(gw.url + "/ready"), httpx.post(gw.base_url + "/chat/completions", json=BODY)):
        assert r.status_code == 503
        assert r.json()["error"]["type"] == "server_error"


def test_probe_failure_says_why(servers):
    sick = HostileBackend(lambda r: web.json_response({}), health_status=503).start()
    try:
        dead = f"http://127.0.0.1:{free_port()}/v1"
        gw = servers.gateway({"backends": [{"url": sick.base_url, "name": "sick", "models": [SIM_MODEL]},
                                           {"url": dead, "name": "dead", "models": [SIM_MODEL]}]},
                             ready_path="/health")
        assert until(lambda: "backend sick is unhealthy" in gw.output() and "backend dead is unhealthy" in gw.output())
        lines = [ln for ln in gw.output().splitlines() if "is unhealthy" in ln]
        assert any("sick" in ln and "HTTP 503" in ln for ln in lines), lines
        assert any("dead" in ln and "cannot connect" in ln and "refused" in ln.lower() for ln in lines), lines
    finally:
        sick.stop()


def test_status_page_shows_the_built_in_simulators_profile(servers):
    port = free_port()
    gw = servers._spawn(["serve", "--port", str(port)], port, "gateway", ready_path="/ready")
    (b,) = httpx.get(gw.url + "/ui/api/status").json()["backends"]
    assert b["name"] == "simulator" and b["profile"] == "simulator: h200-qwen3vl-2b"


def _has_gateway_headers(r: httpx.Response) -> None:
    assert r.headers.get("x-request-id"), r.url
    assert float(r.headers["x-vlm-gateway-overhead-ms"]) >= 0, r.url


def test_headers_on_every_response(env):
    _, gw = env
    for path in ("/health", "/ready", "/v1/models", "/metrics", "/ui/api/status", "/nope", "/"):
        _has_gateway_headers(httpx.get(gw.url + path))
    ok = httpx.post(gw.base_url + "/chat/completions", json=BODY)
    _has_gateway_headers(ok)
    assert ok.headers["x-vlm-gateway-backend"] == "sim0"
    # errors of the completion routes carry the backend too (none: no backend was used)
    for body, status in ((b"{", 400), (b'{"model": "nope", "messages": [{"role": "user", "content": "x"}]}', 404)):
        r = httpx.post(gw.base_url + "/chat/completions", content=body, headers={"content-type": "application/json"})
        assert r.status_code == status
        _has_gateway_headers(r)
        assert r.headers["x-vlm-gateway-backend"] == "none"
    r = httpx.post(gw.base_url + "/chat/completions", content=b"{}", headers={"content-type": "text/plain"})
    assert r.status_code == 415 and r.headers["x-vlm-gateway-backend"] == "none"
    _has_gateway_headers(r)


def test_an_upstream_error_names_the_backend_it_came_from(env):
    sim, gw = env
    sim.sim_faults(fail_next=3, fail_status=500)
    try:
        r = httpx.post(gw.base_url + "/chat/completions", json=BODY)
    finally:
        sim.sim_faults(fail_next=0)
    assert r.status_code == 502 and r.json()["error"]["type"] == "server_error"
    assert r.headers["x-vlm-gateway-backend"] == "sim0"
    _has_gateway_headers(r)
