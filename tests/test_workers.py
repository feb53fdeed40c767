"""Several workers: each its own listening socket under the supervisor. Connections spread
over the workers, a killed worker is started again in its slot, pid files name the
processes and go away when the gateway stops."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import httpx

from conftest import SIM_MODEL
from waiting import wait_until


def _read_pid(path: Path) -> int:
    return int(path.read_text().strip())


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _fd_targets(pid: int) -> list[str]:
    """What a live process's descriptors point at; one closed between the listing and the
    read (a worker's client connection ending) is simply gone."""
    out = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            out.append(os.readlink(f"/proc/{pid}/fd/{fd}"))
        except FileNotFoundError:
            pass
    return out


def test_workers_each_listen_restart_and_keep_pid_files(servers, tmp_path):
    pid_dir = tmp_path / "run"
    sim = servers.sim()
    gw = servers.gateway({"server": {"pid_dir": str(pid_dir)}}, backends=[sim], workers=3)
    sup = _read_pid(pid_dir / "gateway.pid")
    assert sup == gw.proc.pid
    pids = [_read_pid(pid_dir / f"worker-{i}.pid") for i in range(3)]
    assert len(set(pids)) == 3 and all(_alive(p) for p in pids)
    # each worker has a listening socket of its own on the port (SO_REUSEPORT group)
    for p in pids:
        inodes = {s[8:-1] for s in _fd_targets(p) if s.startswith("socket:")}
        listening = [line.split() for line in open("/proc/net/tcp").read().splitlines()[1:]]
        ours = [f for f in listening if int(f[1].split(":")[1], 16) == gw.port and f[3] == "0A" and f[9] in inodes]
        assert len(ours) == 1, f"worker {p} listens on {len(ours)} sockets of the port"

    body = {"model": SIM_MODEL, "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]}
    assert httpx.post(gw.base_url + "/chat/completions", json=body, timeout=10).status_code == 200

    # a killed worker is started again in its slot; the others keep serving meanwhile
    os.kill(pids[1], signal.SIGKILL)
    deadline = time.time() + 15
    new = pids[1]
    while time.time() < deadline:
        try:
            new = _read_pid(pid_dir / "worker-1.pid")
        except (FileNotFoundError, ValueError):
            pass
        if new != pids[1] and _alive(new):
            break
        time.sleep(0.1)
    assert new != pids[1] and _alive(new)
    assert _alive(pids[0]) and _alive(pids[2])
    for _ in range(12):
        assert httpx.post(gw.base_url + "/chat/completions", json=body, timeout=10).status_code == 200
    assert "worker 1 (pid %d) exited with -9" % pids[1] in gw.output()

    # SIGTERM: every worker stops, then the supervisor, and the pid files go
    gw.proc.send_signal(signal.SIGTERM)
    gw.proc.wait(20)
    assert gw.proc.returncode == 0
    assert not any(_alive(p) for p in (pids[0], new, pids[2]))
    assert not list(pid_dir.glob("*.pid"))


def test_address_in_use_fails_before_any_worker(servers, tmp_path):
    import socket
    import subprocess
    import sys
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(1)
    port = s.getsockname()[1]
    try:
        r = subprocess.run([sys.executable, "-m", "vlm_gateway", "serve", "--port", str(port), "--workers", "2",
                            "--backend", "http://127.0.0.1:9/v1"], capture_output=True, text=True, timeout=60)
    finally:
        s.close()
    assert r.returncode == 2 and f"cannot listen on 127.0.0.1:{port}" in r.stderr, r.stderr
    assert "listening on" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


def _worker_connections(port: int, pids: list[int]) -> list[int]:
    est = {f[9] for f in (line.split() for line in open("/proc/net/tcp").read().splitlines()[1:])
           if int(f[1].split(":")[1], 16) == port and f[3] == "01"}
    out = []
    for p in pids:
        inodes = set()
        for fd in os.listdir(f"/proc/{p}/fd"):
            try:
                link = os.readlink(f"/proc/{p}/fd/{fd}")
            except OSError:
                continue
            if link.startswith("socket:["):
                inodes.add(link[8:-1])
        out.append(len(inodes & est))
    return out


def http_get_health(s) -> bytes:
    """One GET /health on a raw keep-alive socket; the whole response read; its head returned."""
    s.sendall(b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n")
    buf = b""
    while b"\r\n\r\n" not in buf:
        chunk = s.recv(65536)
        if not chunk:
            raise ConnectionError("closed before the response head")
        buf += chunk
    head, _, body = buf.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        k, _, v = line.partition(b":")
        if k.strip().lower() == b"content-length":
            length = int(v)
    while len(body) < length:
        chunk = s.recv(65536)
        if not chunk:
            raise ConnectionError("closed before the response body")
        body += chunk
    return head.lower()


def test_keep_alive_connections_even_out_over_the_workers(servers, tmp_path):
    """The kernel's hash spreads connections unevenly by chance; a worker above its share
    closes connections after a response (Connection: close) until every worker holds the
    same number, and then nothing more is closed."""
    import socket
    pid_dir = tmp_path / "run"
    gw = servers.gateway({"server": {"pid_dir": str(pid_dir)}}, backends=[servers.sim()], workers=4)
    pids = [_read_pid(pid_dir / f"worker-{i}.pid") for i in range(4)]
    socks = [socket.create_connection(("127.0.0.1", gw.port)) for _ in range(32)]

    def one_round() -> int:
        closed = 0
        for i, s in enumerate(socks):
            head = http_get_health(s)
            assert head.startswith(b"http/1.1 200"), head
            if b"connection: close" in head:
                closed += 1
                s.close()
                socks[i] = socket.create_connection(("127.0.0.1", gw.port))
        return closed

    def all_accepted() -> bool:
        # every client connection is held by a worker, and no closed one is still counted
        return sum(_worker_connections(gw.port, pids)) == len(socks)

    try:
        for _ in range(12):
            if one_round() == 0:
                break
        wait_until(all_accepted, "the workers hold the 32 connections and no more")
        assert one_round() == 0  # balanced: nothing more to close
        wait_until(all_accepted, "the workers hold the 32 connections and no more")
        assert _worker_connections(gw.port, pids) == [8, 8, 8, 8]
        text = httpx.get(gw.url + "/metrics").text
        assert 'vlm_gateway_client_connections_closed_total{reason="rebalance"}' in text
    finally:
        for s in socks:
            s.close()
