"""Test harness: real gateway and simulator processes on loopback ports.

``servers`` starts processes and stops them at the end of the test (or module);
each helper waits until the process answers before returning.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

import httpx
import pytest
import yaml

from waiting import poll

SIM_MODEL = "qwen3vl-sim"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def until(fn, timeout: float = 5.0):
    """Poll ``fn`` until it returns something truthy or ``timeout`` passes; its last value
    (``waiting.poll``; ``waiting.wait_until`` fails instead, naming what did not happen)."""
    return poll(fn, timeout)


def wait_http(url: str, proc: subprocess.Popen, timeout: float = 20.0, log: str = "") -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            out = open(log).read() if log and os.path.exists(log) else ""
            raise RuntimeError(f"process exited with {proc.returncode} before {url} answered:\n{out}")
        try:
            if httpx.get(url, timeout=0.5).status_code < 500:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    raise RuntimeError(f"{url} did not answer within {timeout}s")


@dataclass
class Proc:
    proc: subprocess.Popen
    port: int
    log: str
    kind: str

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        return self.url + "/v1"

    def output(self) -> str:
        with open(self.log) as f:
            return f.read()

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)

    def stop(self) -> None:
        self.kill(signal.SIGTERM)

    # simulator conveniences
    def sim_requests(self) -> list[dict]:
        return httpx.get(self.url + "/sim/requests", timeout=5).json()

    def sim_stats(self) -> dict:
        return httpx.get(self.url + "/sim/stats", timeout=5).json()

    def sim_faults(self, **kw) -> dict:
        return httpx.post(self.url + "/sim/faults", json=kw, timeout=5).json()


@dataclass
class Servers:
    tmp: str
    procs: list[Proc] = field(default_factory=list)

    def _spawn(self, args: list[str], port: int, kind: str, env: dict | None = None,
               ready_path: str = "/health", timeout: float = 30.0) -> Proc:
        log = os.path.join(self.tmp, f"{kind}-{port}.log")
        e = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        e.pop("PROMETHEUS_MULTIPROC_DIR", None) if "PROMETHEUS_MULTIPROC_DIR" not in (env or {}) else None
        with open(log, "w") as f:
            proc = subprocess.Popen([sys.executable, "-m", "vlm_gateway", *args], stdout=f,
                                    stderr=subprocess.STDOUT, env=e, start_new_session=True)
        p = Proc(proc, port, log, kind)
        self.procs.append(p)
        wait_http(f"http://127.0.0.1:{port}{ready_path}", proc, timeout, log)
        return p

    def sim(self, *, profile: str = "fast", echo: bool = True, time_scale: float = 1.0,
            token_rate: float | None = None, engine: str = "vllm", model: str = SIM_MODEL,
            port: int | None = None, grounding: str | None = None,
            extra_args: list[str] | None = None) -> Proc:
        port = port or free_port()
        args = ["sim", "--port", str(port), "--profile", profile, "--time-scale", str(time_scale),
                "--engine", engine, "--model", model]
        if grounding:
            args += ["--grounding", grounding]
        if echo:
            args.append("--echo")
        if token_rate:
            args += ["--token-rate", str(token_rate)]
        args += list(extra_args or [])
        return self._spawn(args, port, "sim")

    def gateway(self, config: dict | None = None, *, backends: list[Proc] | None = None,
                workers: int = 1, env: dict | None = None, extra_args: list[str] | None = None,
                port: int | None = None, ready_path: str = "/ready") -> Proc:
        port = port or free_port()
        cfg = dict(config or {})
        if backends is not None:
            cfg.setdefault("backends", [
                {"url": b.base_url, "name": f"sim{i}", "engine": "sim", **({"profile": b.profile}
                                                                          if getattr(b, "profile", None) else {})}
                for i, b in enumerate(backends)])
        cfg.setdefault("routing", {}).setdefault("health_interval_s", 0.5)
        path = os.path.join(self.tmp, f"gateway-{port}.yaml")
        with open(path, "w") as f:
            yaml.safe_dump(cfg, f)
        args = ["serve", "--config", path, "--port", str(port), "--workers", str(workers), *(extra_args or [])]
        return self._spawn(args, port, "gateway", env=env, ready_path=ready_path)

    def stop_all(self) -> None:
        for p in reversed(self.procs):
            p.kill(signal.SIGTERM)
        self.procs.clear()


@pytest.fixture
def servers():
    with tempfile.TemporaryDirectory(prefix="vlmgw-test-") as tmp:
        s = Servers(tmp)
        try:
            yield s
        finally:
            s.stop_all()


@pytest.fixture(scope="module")
def module_servers():
    with tempfile.TemporaryDirectory(prefix="vlmgw-test-") as tmp:
        s = Servers(tmp)
        try:
            yield s
        finally:
            s.stop_all()
