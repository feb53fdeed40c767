"""Helpers shared by the security, fault, fuzz and replica tests (no tests here)."""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import subprocess
import time

import redis

from conftest import free_port


def sha(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


class RedisServer:
    """A private redis-server on a free loopback port (no persistence)."""

    def __init__(self, tmp: str) -> None:
        self.port = free_port()
        self.tmp = tmp
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> "RedisServer":
        exe = shutil.which("redis-server")
        assert exe, "redis-server is required (apt-get install redis-server)"
        self.proc = subprocess.Popen([exe, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                                      "--appendonly", "no", "--dir", self.tmp],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        deadline = time.time() + 10
        while time.time() < deadline:
            try:
                if redis.Redis(port=self.port, socket_timeout=0.5).ping():
                    return self
            except redis.RedisError:
                time.sleep(0.05)
        raise RuntimeError("redis-server did not start")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(5)
        self.proc = None

    def client(self) -> redis.Redis:
        return redis.Redis(port=self.port, socket_timeout=2)
