"""The processes a local benchmark starts (simulators, gateways): each in a session of its
own, so that stopping its pid's group stops its workers too; stopped by pid, never by name.

    with Procs(tmp) as procs:
        sim = procs.vlm_gateway(["sim", "--port", "18310"], "sim.log")
        wait_ready("http://127.0.0.1:18310/health", sim, "the simulator")
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx


def wait_ready(url: str, proc: subprocess.Popen, what: str = "the process", timeout: float = 60) -> None:
    """Until ``url`` answers 200; raises when ``proc`` exits first or the time is up."""
    end = time.time() + timeout
    while time.time() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}")
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{what} was not ready at {url} within {timeout:g} s")


class Procs:
    def __init__(self, logs: Path) -> None:
        self.logs = logs
        self.procs: list[subprocess.Popen] = []

    def start(self, cmd: list[str], log: str, env: dict | None = None, cwd: str | Path | None = None,
              pid_file: Path | None = None) -> subprocess.Popen:
        p = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=open(self.logs / log, "w"), stderr=subprocess.STDOUT,
                             start_new_session=True)
        if pid_file is not None:
            pid_file.write_text(str(p.pid))
        self.procs.append(p)
        return p

    def vlm_gateway(self, args: list[str], log: str, pythonpath: str = "", cwd: str | Path | None = None):
        """``python -m vlm_gateway ARGS``; with ``pythonpath``, that package copy (run from
        ``cwd`` outside the checkout: ``python -m`` puts the cwd first on sys.path)."""
        env = dict(os.environ, PYTHONPATH=pythonpath) if pythonpath else None
        return self.start([sys.executable, "-m", "vlm_gateway", *args], log, env=env, cwd=cwd)

    def stop(self) -> None:
        for p in self.procs:
            try:
                os.killpg(p.pid, signal.SIGTERM)
                p.wait(10)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                pass
        self.procs.clear()

    def __enter__(self) -> "Procs":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
