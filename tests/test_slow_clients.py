"""Slow and numerous clients against a real gateway process: header and body read
deadlines (slowloris), a header size cap, the per-worker connection cap that evicts
the connections not being served, a reserve that keeps the probes answering when
every connection is busy, and a gateway under a small descriptor limit that keeps
working (and keeps its own backend healthy) under a flood of idle connections."""

from __future__ import annotations

import os
import re
import resource
import select
import signal
import socket
import subprocess
import sys
import time

import httpx
import pytest
import yaml

from conftest import SIM_MODEL, Proc, free_port, wait_http
from waiting import wait_until

BODY = b'{"model": "%s", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}' % SIM_MODEL.encode()


def connect(port: int) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    s.setblocking(False)
    return s


def closed_by_server(s: socket.socket) -> tuple[bool, bytes]:
    """(the server closed it, what it sent) without blocking."""
    got = b""
    while True:
        r, _, _ = select.select([s], [], [], 0)
        if not r:
            return False, got
        try:
            data = s.recv(65536)
        except (ConnectionResetError, BrokenPipeError):
            return True, got
        if not data:
            return True, got
        got += data


def wait_closed(socks: list[socket.socket], timeout: float) -> list[bytes]:
    """Wait until the server closed every socket; what each received. Fails on timeout."""
    answers: dict[int, bytes] = {}
    deadline = time.time() + timeout
    while len(answers) < len(socks) and time.time() < deadline:
        for i, s in enumerate(socks):
            if i not in answers:
                done, got = closed_by_server(s)
                if done:
                    answers[i] = got
        time.sleep(0.05)
    assert len(answers) == len(socks), f"{len(socks) - len(answers)} of {len(socks)} connections still open"
    return [answers[i] for i in range(len(socks))]


@pytest.fixture(scope="module")
def env(module_servers):
    sim = module_servers.sim(token_rate=50)
    gw = module_servers.gateway({"server": {"header_timeout_s": 1.0, "body_timeout_s": 1.0,
                                            "body_min_bytes_per_s": 1000, "max_header_bytes": 8192}},
                                backends=[sim])
    return sim, gw


def test_slowloris_headers_are_cut_at_the_deadline(env):
    _, gw = env
    silent = [connect(gw.port) for _ in range(50)]             # connect and say nothing
    partial = [connect(gw.port) for _ in range(50)]            # start a request and stall
    for s in partial:
        s.send(b"GET /ui/api/status HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
    t0 = time.time()
    trickle = connect(gw.port)                                 # one byte at a time, forever
    trickle.send(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
    for i in range(12):
        try:
            trickle.send(b"a")
        except OSError:
            break
        time.sleep(0.2)  # behaviour: a header trickled one byte per 0.2 s, never silent for the 1 s deadline
    answers = wait_closed(silent + partial + [trickle], timeout=5)
    assert time.time() - t0 < 5
    assert all(a.startswith(b"HTTP/1.1 408") for a in answers[50:]), answers[50][:80]
    assert b"request_timeout" in answers[60] and b"server.header_timeout_s" in answers[60]
    for s in silent + partial + [trickle]:
        s.close()
    # the gateway kept serving meanwhile
    assert httpx.post(gw.base_url + "/chat/completions", content=BODY,
                      headers={"content-type": "application/json"}).status_code == 200


def test_a_keep_alive_connection_gets_a_deadline_per_request(env):
    _, gw = env
    s = connect(gw.port)
    s.setblocking(True)
    s.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    assert s.recv(65536).startswith(b"HTTP/1.1 200")
    s.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # the second request stalls
    s.setblocking(False)
    (answer,) = wait_closed([s], timeout=4)
    assert answer.startswith(b"HTTP/1.1 408")
    s.close()


def test_huge_headers_get_431(env):
    _, gw = env
    s = connect(gw.port)
    s.setblocking(True)
    s.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: " + b"a" * 20000)
    s.setblocking(False)
    (answer,) = wait_closed([s], timeout=4)
    assert answer.startswith(b"HTTP/1.1 431") and b"server.max_header_bytes" in answer
    s.close()


def _post_head(length: int) -> bytes:
    return (b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n" % length)


def test_a_stalled_or_trickling_body_gets_408(env):
    _, gw = env
    stalled = connect(gw.port)
    stalled.send(_post_head(len(BODY)) + BODY[:10])
    trickle = connect(gw.port)
    trickle.send(_post_head(len(BODY)))
    t0 = time.time()
    for i in range(len(BODY)):  # 5 bytes/s: far below body_min_bytes_per_s, but never silent for 1 s
        try:
            trickle.send(BODY[i:i + 1])
        except OSError:
            break
        if closed_by_server(trickle)[0]:
            break
        time.sleep(0.2)  # behaviour: a body trickled at 5 bytes/s
        if time.time() - t0 > 6:
            break
    answers = wait_closed([stalled, trickle], timeout=5)
    assert time.time() - t0 < 5
    assert answers[0].startswith(b"HTTP/1.1 408") and b"server.body_timeout_s" in answers[0]
    assert answers[1] == b"" or answers[1].startswith(b"HTTP/1.1 408")


def test_a_slow_but_steady_upload_is_served(env):
    _, gw = env
    pad = b" " * 6000  # JSON allows whitespace: 6 KB sent at ~4 KB/s over 1.5 s, above the minimum rate
    body = BODY[:-1] + pad + b"}"
    s = connect(gw.port)
    s.setblocking(True)
    s.sendall(_post_head(len(body)))
    for i in range(0, len(body), 600):
        s.sendall(body[i:i + 600])
        time.sleep(0.15)  # behaviour: a slow but steady upload, ~4 KB/s
    s.settimeout(10)
    assert s.recv(65536).startswith(b"HTTP/1.1 200")
    s.close()


def test_the_connection_cap_evicts_idle_connections_not_served_ones(servers):
    sim = servers.sim(token_rate=20)
    gw = servers.gateway({"server": {"max_connections": 40, "header_timeout_s": 60}}, backends=[sim])
    # a request being served on its connection: a long stream
    with httpx.Client(timeout=30) as hc, hc.stream("POST", gw.base_url + "/chat/completions", json={
            "model": SIM_MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": 100,
            "stream": True}) as served:
        lines = served.iter_lines()
        assert next(lines).startswith("data: ")
        idle = [connect(gw.port) for _ in range(150)]
        # the oldest idle ones are evicted
        wait_until(lambda: sum(not closed_by_server(s)[0] for s in idle) <= 40, "at most 40 connections open")
        # new clients are served, the probes answer, and the stream goes on
        for _ in range(3):
            assert httpx.get(gw.url + "/health", timeout=5).status_code == 200
            assert httpx.post(gw.base_url + "/chat/completions", content=BODY, timeout=10,
                              headers={"content-type": "application/json"}).status_code == 200
        text = "".join(lines)
        assert "[DONE]" in text
        for s in idle:
            s.close()
    assert re.search(r'vlm_gateway_client_connections_closed_total\{reason="evicted"\} [1-9]',
                     httpx.get(gw.url + "/metrics").text)


def test_probes_answer_when_every_connection_is_busy(servers):
    sim = servers.sim(token_rate=10)
    gw = servers.gateway({"server": {"max_connections": 16}, "routing": {"queue_timeout_s": 30}}, backends=[sim])
    body = {"model": SIM_MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": 60, "stream": True}
    clients = [httpx.Client(timeout=30) for _ in range(16)]
    streams = [c.stream("POST", gw.base_url + "/chat/completions", json=body) for c in clients]
    try:
        its = []
        for st in streams:
            r = st.__enter__()
            its.append(r.iter_lines())
            assert next(its[-1]).startswith("data: ")
        assert httpx.get(gw.url + "/health", timeout=5).status_code == 200
        assert httpx.get(gw.url + "/ready", timeout=5).status_code == 200
        r = httpx.post(gw.base_url + "/chat/completions", content=BODY, timeout=5,
                       headers={"content-type": "application/json"})
        assert r.status_code == 503 and r.json()["error"]["code"] == "too_many_connections"
        assert r.headers["retry-after"] == "1" and r.headers["x-request-id"]
    finally:
        for st in streams:
            st.__exit__(None, None, None)
        for c in clients:
            c.close()


def _spawn_limited(tmp_path, sim, nofile: int, extra: dict | None = None) -> Proc:
    port = free_port()
    cfg = {"backends": [{"url": sim.base_url, "name": "sim0", "engine": "sim"}],
           "routing": {"health_interval_s": 0.5}, **(extra or {})}
    path = tmp_path / "gw.yaml"
    path.write_text(yaml.safe_dump(cfg))
    log = str(tmp_path / "gw.log")

    def limit():
        resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))
    with open(log, "w") as f:
        proc = subprocess.Popen([sys.executable, "-m", "vlm_gateway", "serve", "--config", str(path),
                                 "--port", str(port)], stdout=f, stderr=subprocess.STDOUT,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"}, start_new_session=True,
                                preexec_fn=limit)
    p = Proc(proc, port, log, "gateway")
    try:
        wait_http(f"http://127.0.0.1:{port}/ready", proc, 30, log)
    except Exception:
        p.kill()
        raise
    return p


def test_a_small_descriptor_limit_holds_under_an_idle_flood(servers, tmp_path):
    sim = servers.sim()
    gw = _spawn_limited(tmp_path, sim, 256)
    try:
        assert "up to 80 client connections" in gw.output()
        flood = []
        for _ in range(400):
            try:
                flood.append(connect(gw.port))
            except OSError:
                break
        # several probe rounds of the gateway's own backend while the flood holds its descriptors
        probes = sim.sim_stats()["health_checks"]
        wait_until(lambda: sim.sim_stats()["health_checks"] >= probes + 3, "three probe rounds under the flood")
        assert httpx.get(gw.url + "/health", timeout=5).status_code == 200
        assert httpx.get(gw.url + "/ready", timeout=5).status_code == 200  # its backend still looks healthy
        r = httpx.post(gw.base_url + "/chat/completions", content=BODY, timeout=10,
                       headers={"content-type": "application/json"})
        assert r.status_code == 200
        assert "unhealthy" not in gw.output() and "Too many open files" not in gw.output()
        for s in flood:
            s.close()
    finally:
        gw.kill(signal.SIGTERM)


def test_an_explicit_cap_the_descriptor_limit_cannot_hold_is_a_config_error(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("server: {max_connections: 5000}\n")

    def limit():
        resource.setrlimit(resource.RLIMIT_NOFILE, (1024, 1024))
    r = subprocess.run([sys.executable, "-m", "vlm_gateway", "serve", "--config", str(path), "--port", "1"],
                       capture_output=True, text=True, timeout=30, preexec_fn=limit)
    assert r.returncode == 2 and "server.max_connections" in r.stderr and "ulimit" in r.stderr, r.stderr


def test_keep_alive_timeout_is_configurable(servers):
    """Behind a load balancer that reuses connections, the gateway's idle timeout must
    outlast the balancer's: server.keep_alive_timeout_s sets it."""
    sim = servers.sim()
    gw = servers.gateway({"server": {"keep_alive_timeout_s": 3}}, backends=[sim])
    s = connect(gw.port)
    s.setblocking(True)
    s.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    assert s.recv(65536).startswith(b"HTTP/1.1 200")
    s.setblocking(False)
    t0 = time.monotonic()
    wait_closed([s], timeout=4)
    idle = time.monotonic() - t0
    # closed at about 3 s: not at once, nor at uvicorn's default (5 s)
    assert 2.5 <= idle < 4.0, idle
    s.close()


def test_a_client_that_stops_reading_is_disconnected_and_the_upstream_freed(servers):
    """A stream whose client takes no bytes: after server.send_timeout_s the gateway drops
    the client, which cancels the upstream request (the backend's write fails)."""
    import asyncio

    from aiohttp import web

    from hostile import HostileBackend

    seen: dict = {}

    async def firehose(request):
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await resp.prepare(request)
        event = b'data: {"choices": [{"index": 0, "delta": {"content": "' + b"y" * 16000 + b'"}}]}\n\n'
        try:
            for _ in range(100000):  # 1.6 GB if nobody stops it
                await resp.write(event)
        except (ConnectionError, RuntimeError, asyncio.CancelledError):
            seen["upstream_closed_at"] = time.time()
        return resp
    backend = HostileBackend(firehose).start()
    try:
        gw = servers.gateway({"backends": [{"url": backend.base_url, "name": "fire", "models": [SIM_MODEL]}],
                              "server": {"send_timeout_s": 1.0}})
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.connect(("127.0.0.1", gw.port))
        body = BODY.replace(b'"max_tokens": 2', b'"max_tokens": 2, "stream": true')
        s.sendall(_post_head(len(body)) + body)
        t0 = time.time()
        # never read: the stream fills the socket buffers, then the gateway's
        deadline = time.time() + 20
        while "upstream_closed_at" not in seen and time.time() < deadline:
            time.sleep(0.1)
        assert "upstream_closed_at" in seen, "the gateway kept the stream (and its upstream) open"
        assert seen["upstream_closed_at"] - t0 < 10
        s.close()
        assert re.search(r'vlm_gateway_client_connections_closed_total\{reason="send_timeout"\} 1',
                         httpx.get(gw.url + "/metrics").text)
        assert httpx.get(gw.url + "/ready").status_code == 200
    finally:
        backend.stop()


def test_upgrade_requests_neither_leak_connection_slots_nor_flood_the_log(servers):
    """The gateway has no WebSocket route: an Upgrade request is answered as plain HTTP,
    and a stream of them leaves the connection cap as it was."""
    sim = servers.sim()
    gw = servers.gateway({"server": {"max_connections": 16}}, backends=[sim])
    for _ in range(40):
        s = socket.create_connection(("127.0.0.1", gw.port), timeout=5)
        s.sendall(b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                  b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n")
        assert s.recv(200).startswith(b"HTTP/1.1 200")
        s.close()
    for _ in range(3):
        r = httpx.post(gw.base_url + "/chat/completions", content=BODY, timeout=10,
                       headers={"content-type": "application/json"})
        assert r.status_code == 200, r.text
    assert "Upgrade" not in gw.output() and "WebSocket" not in gw.output()


def test_protocol_level_answers_have_the_openai_shape_and_the_common_headers(env):
    _, gw = env
    s = connect(gw.port)
    s.setblocking(True)
    s.sendall(b"NOT HTTP AT ALL\r\n\r\n")
    s.settimeout(5)
    raw = s.recv(65536)
    s.close()
    head, _, body = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400")
    assert b"x-request-id: " in head and b"x-vlm-gateway-overhead-ms: " in head
    import orjson
    err = orjson.loads(body)["error"]
    assert err["code"] == "invalid_http" and err["type"] == "invalid_request_error"
    s = connect(gw.port)
    s.send(b"GET /health HTTP/1.1\r\n")
    (answer,) = wait_closed([s], timeout=4)  # the header deadline's 408 carries them too
    assert answer.startswith(b"HTTP/1.1 408") and b"x-request-id: " in answer
    s.close()
