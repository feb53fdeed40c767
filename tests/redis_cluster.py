"""A private Redis Cluster on loopback for tests and benchmarks: three primaries
with one replica each, Debian's ``redis-server`` (cluster mode, no persistence,
its own temp dir and pid files) joined by ``redis-cli --cluster create``.
Every process is stopped by its pid."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import redis
from redis.cluster import RedisCluster as SyncCluster

NODE_TIMEOUT_MS = 1000


def _free_ports(n: int) -> list[int]:
    """``n`` free loopback ports whose cluster-bus ports (port + 10000) are free too."""
    out: list[int] = []
    while len(out) < n:
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()
        if port + 10000 > 65535 or port in out:
            continue
        b = socket.socket()
        try:
            b.bind(("127.0.0.1", port + 10000))
        except OSError:
            continue
        finally:
            b.close()
        out.append(port)
    return out


class LocalCluster:
    def __init__(self, tmp: str | Path, primaries: int = 3, replicas: int = 1) -> None:
        self.tmp = Path(tmp)
        self.ports = _free_ports(primaries * (1 + replicas))
        self.replicas = replicas
        self.procs: dict[int, subprocess.Popen] = {}
        self.paused: set[int] = set()

    @property
    def url(self) -> str:
        """A URL naming one node (any node works)."""
        return f"redis://127.0.0.1:{self.ports[0]}/0"

    def url_of(self, port: int) -> str:
        return f"redis://127.0.0.1:{port}/0"

    def _start_node(self, port: int) -> None:
        exe = shutil.which("redis-server")
        assert exe, "redis-server is required (apt-get install redis-server)"
        d = self.tmp / str(port)
        d.mkdir(parents=True, exist_ok=True)
        self.procs[port] = subprocess.Popen(
            [exe, "--port", str(port), "--bind", "127.0.0.1", "--cluster-enabled", "yes",
             "--cluster-config-file", str(d / "nodes.conf"), "--cluster-node-timeout", str(NODE_TIMEOUT_MS),
             "--save", "", "--appendonly", "no", "--repl-diskless-sync-delay", "0",
             "--dir", str(d), "--pidfile", str(d / "redis.pid"),
             "--daemonize", "no"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)

    def start(self) -> "LocalCluster":
        for p in self.ports:
            self._start_node(p)
        for p in self.ports:
            self._wait_ping(p)
        cli = shutil.which("redis-cli")
        assert cli, "redis-cli is required (apt-get install redis-tools)"
        subprocess.run([cli, "--cluster", "create", *[f"127.0.0.1:{p}" for p in self.ports],
                        "--cluster-replicas", str(self.replicas), "--cluster-yes"],
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=30)
        self.wait_ok()
        return self

    def _wait_ping(self, port: int, timeout: float = 10.0) -> None:
        deadline = time.time() + timeout
        while time.time() < deadline:
            try:
                if redis.Redis(port=port, socket_timeout=0.5).ping():
                    return
            except redis.RedisError:
                time.sleep(0.02)
        raise RuntimeError(f"redis-server on {port} did not start")

    def wait_ok(self, timeout: float = 20.0) -> None:
        """Until every live node says the cluster is ok and each of them has replicas in sync."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            try:
                if all(redis.Redis(port=p, socket_timeout=0.5).cluster("info")["cluster_state"] == "ok"
                       for p in self.alive()):
                    if self._replicas_in_sync():
                        return
            except (redis.RedisError, KeyError):
                pass
            time.sleep(0.05)
        raise RuntimeError("the Redis Cluster did not become ok")

    def _replicas_in_sync(self) -> bool:
        for p in self.alive():
            info = redis.Redis(port=p, socket_timeout=0.5).info("replication")
            if info.get("role") == "slave" and info.get("master_link_status") != "up":
                return False
        return True

    def alive(self) -> list[int]:
        """Nodes running and not paused."""
        return [p for p, pr in self.procs.items() if pr.poll() is None and p not in self.paused]

    def client(self) -> SyncCluster:
        return SyncCluster(host="127.0.0.1", port=self.alive()[0], socket_timeout=2)

    def primaries(self) -> list[int]:
        out = []
        for p in self.alive():
            if redis.Redis(port=p, socket_timeout=1).info("replication").get("role") == "master":
                out.append(p)
        return out

    def pid(self, port: int) -> int:
        return int((self.tmp / str(port) / "redis.pid").read_text())

    def kill(self, port: int) -> None:
        """SIGKILL one node (by the pid in its pid file)."""
        pr = self.procs[port]
        os.kill(self.pid(port), signal.SIGKILL)
        pr.wait(5)

    def pause(self, port: int) -> None:
        """SIGSTOP one node: it keeps its connections open and answers nothing."""
        os.kill(self.pid(port), signal.SIGSTOP)
        self.paused.add(port)

    def replica_of(self, primary: int) -> int:
        info = redis.Redis(port=primary, socket_timeout=1).info("replication")
        return int(info["slave0"]["port"])

    def wait_promoted(self, replica: int, timeout: float = 15.0) -> float:
        """Seconds until ``replica`` is a primary and the cluster is ok again."""
        t0 = time.time()
        while time.time() - t0 < timeout:
            try:
                r = redis.Redis(port=replica, socket_timeout=0.5)
                if r.info("replication").get("role") == "master" and r.cluster("info")["cluster_state"] == "ok":
                    return time.time() - t0
            except redis.RedisError:
                pass
            time.sleep(0.05)
        raise RuntimeError("the replica was not promoted")

    def stop(self) -> None:
        for port, pr in list(self.procs.items()):
            if pr.poll() is None:
                os.kill(pr.pid, signal.SIGKILL)
                pr.wait(5)
        self.procs.clear()
