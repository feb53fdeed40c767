"""What a web page can make a browser do to the gateway, over real HTTP: JSON-only
POST routes (415), foreign Origins refused before any route runs (403), Host names
limited to the ones the gateway knows (DNS rebinding, 400), CORS for configured
origins, and the /ui playground (same origin) untouched. Also the /ui rewrite API's
streaming body limit."""

from __future__ import annotations

import json
import re
import select
import socket
import time

import httpx
import pytest

from conftest import SIM_MODEL

BODY = {"model": SIM_MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


@pytest.fixture(scope="module")
def env(module_servers):
    sim = module_servers.sim()
    gw = module_servers.gateway({}, backends=[sim])
    return sim, gw


def received(sim) -> int:
    return len(sim.sim_requests())


def err(r: httpx.Response) -> dict:
    e = r.json()["error"]
    assert set(e) == {"message", "type", "param", "code"}
    return e


@pytest.mark.parametrize("ctype", ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x",
                                   None, "text/json"])
def test_json_routes_refuse_other_media_types(env, ctype):
    sim, gw = env
    n = received(sim)
    headers = {"content-type": ctype} if ctype else {}
    for path in ("/v1/chat/completions", "/v1/completions", "/ui/api/rewrite", "/ui/api/rewrite-video"):
        r = httpx.post(gw.url + path, content=json.dumps(BODY), headers=headers)
        assert r.status_code == 415, (path, r.status_code, r.text)
        e = err(r)
        assert e["type"] == "invalid_request_error" and e["code"] == "unsupported_media_type"
        assert "application/json" in e["message"]
    assert received(sim) == n  # nothing went upstream


def test_json_with_parameters_is_fine(env):
    _, gw = env
    r = httpx.post(gw.base_url + "/chat/completions", content=json.dumps(BODY),
                   headers={"content-type": "Application/JSON; charset=utf-8"})
    assert r.status_code == 200, r.text


def test_a_foreign_origin_is_refused_before_any_route(env):
    sim, gw = env
    n = received(sim)
    evil = {"origin": "https://evil.example"}
    r = httpx.post(gw.base_url + "/chat/completions", json=BODY, headers=evil)
    assert r.status_code == 403 and err(r)["code"] == "origin_not_allowed" and err(r)["type"] == "permission_error"
    for path in ("/ui/api/status", "/v1/models", "/metrics"):
        assert httpx.get(gw.url + path, headers=evil).status_code == 403, path
    for origin in ("null", "file://", f"http://127.0.0.1:{gw.port + 1}", f"https://127.0.0.1:{gw.port}x"):
        assert httpx.post(gw.base_url + "/chat/completions", json=BODY, headers={"origin": origin}).status_code == 403
    assert received(sim) == n
    # no CORS headers that would let the page read anything
    assert "access-control-allow-origin" not in r.headers


def test_the_playground_origin_is_its_own(env):
    _, gw = env
    same = {"origin": gw.url}
    assert httpx.post(gw.base_url + "/chat/completions", json=BODY, headers=same).status_code == 200
    assert httpx.get(gw.url + "/ui/api/status", headers=same).status_code == 200
    # also when reached as localhost
    r = httpx.get(f"http://localhost:{gw.port}/ui/api/status", headers={"origin": f"http://localhost:{gw.port}"})
    assert r.status_code == 200


def test_dns_rebinding_host_is_refused_but_probes_answer(env):
    _, gw = env
    for name in ("attacker.example", f"attacker.example:{gw.port}", "127.0.0.1.nip.io"):
        r = httpx.get(gw.url + "/ui/api/status", headers={"host": name})
        assert r.status_code == 400 and err(r)["code"] == "host_not_allowed", name
        r = httpx.post(gw.base_url + "/chat/completions", json=BODY,
                       headers={"host": name, "origin": f"http://{name}"})
        assert r.status_code == 400
    for path in ("/health", "/ready"):
        assert httpx.get(gw.url + path, headers={"host": "attacker.example"}).status_code == 200
    for name in (f"localhost:{gw.port}", f"127.0.0.1:{gw.port}", f"[::1]:{gw.port}", "app.localhost",
                 socket.gethostname()):
        assert httpx.get(gw.url + "/ui/api/status", headers={"host": name}).status_code == 200, name


def test_configured_hosts_and_origins_get_cors(servers):
    sim = servers.sim()
    gw = servers.gateway({"server": {"allowed_hosts": ["gw.example.com", "*.corp.example"],
                                     "allowed_origins": ["https://app.example.com"]}}, backends=[sim])
    for name in ("gw.example.com", "a.corp.example"):
        assert httpx.get(gw.url + "/v1/models", headers={"host": name}).status_code == 200
    assert httpx.get(gw.url + "/v1/models", headers={"host": "corp.example"}).status_code == 400
    app = {"origin": "https://app.example.com"}
    r = httpx.post(gw.base_url + "/chat/completions", json=BODY, headers=app)
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "https://app.example.com"
    assert "x-vlm-gateway-overhead-ms" in r.headers["access-control-expose-headers"]
    pre = httpx.options(gw.base_url + "/chat/completions", headers={
        **app, "access-control-request-method": "POST",
        "access-control-request-headers": "authorization, content-type"})
    assert pre.status_code == 200 and "POST" in pre.headers["access-control-allow-methods"]
    pre = httpx.options(gw.base_url + "/chat/completions", headers={
        "origin": "https://evil.example", "access-control-request-method": "POST"})
    assert pre.status_code == 403


def test_any_host_when_asked(servers):
    sim = servers.sim()
    gw = servers.gateway({"server": {"allowed_hosts": ["*"]}}, backends=[sim])
    assert httpx.get(gw.url + "/ui/api/status", headers={"host": "anything.example"}).status_code == 200


def test_bound_to_all_interfaces_answers_by_address_and_machine_name(servers):
    sim = servers.sim()
    gw = servers.gateway({}, backends=[sim], extra_args=["--host", "0.0.0.0"])
    assert httpx.get(gw.url + "/v1/models").status_code == 200
    assert httpx.get(gw.url + "/v1/models", headers={"host": f"{socket.gethostname()}:{gw.port}"}).status_code == 200
    assert httpx.get(gw.url + "/v1/models", headers={"host": "attacker.example"}).status_code == 400


# -- /ui/api/rewrite reads its body with the same streaming limit as the chat route ----------

def _send_chunked(port: int, path: str, total: int, chunk: int = 256 * 1024) -> tuple[int, bytes]:
    """Send a chunked JSON body of ``total`` bytes until the server answers; returns
    (bytes sent, what came back)."""
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
              "Transfer-Encoding: chunked\r\n\r\n".encode())
    s.setblocking(False)
    frame = b"%x\r\n" % chunk + b" " * chunk + b"\r\n"
    sent, pending, answer = 0, b"", b""
    deadline = time.time() + 60
    try:
        while time.time() < deadline:
            r, w, _ = select.select([s], [s] if sent < total or pending else [], [], 1.0)
            if r:
                data = s.recv(65536)
                if not data:
                    break
                answer += data
                head, sep, body = answer.partition(b"\r\n\r\n")
                length = re.search(rb"content-length: (\d+)", head, re.I) if sep else None
                if length and len(body) >= int(length.group(1)):
                    break
            if w:
                if not pending:
                    pending = frame if sent < total else b"0\r\n\r\n"
                try:
                    n = s.send(pending)
                except (BrokenPipeError, ConnectionResetError):
                    break
                sent += n
                pending = pending[n:]
    finally:
        s.close()
    return sent, answer


def _rss_peak_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))


def test_rewrite_api_stops_reading_at_the_body_limit(servers):
    sim = servers.sim()
    gw = servers.gateway({"server": {"max_body_bytes": 1024 * 1024}}, backends=[sim])
    peak = _rss_peak_kb(gw.proc.pid)
    total = 200 * 1024 * 1024
    sent, answer = _send_chunked(gw.port, "/ui/api/rewrite", total)
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    assert b"body_too_large" in answer
    # it answered after about the limit, not after the whole upload (socket buffers aside)
    assert sent < 32 * 1024 * 1024, sent
    assert _rss_peak_kb(gw.proc.pid) - peak < 64 * 1024
