"""The command line as a new user meets it: config mistakes with their place, a port in
use, the start and stop lines, the built-in simulator's port, `serve --help`. Each through
the real `vlm-gateway` process."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys

import httpx
import pytest

from conftest import free_port
from waiting import wait_until


def _run(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("VLM_GATEWAY_CONFIG", None)
    return subprocess.run([sys.executable, "-m", "vlm_gateway", *args], capture_output=True, text=True,
                          timeout=timeout, env=env)


@pytest.mark.parametrize("text, line", [
    ("server:\n  port: [8080\nimages: {}\n", "invalid YAML at line 3, column 7"),
    ("server:\n\tport: 1\n", "invalid YAML at line 2, column 1: found character '\\t'"),
    ("images:\n  enabled: true\n  budget: legible\n   max_long_side: 3\n", "invalid YAML at line 4, column 17"),
])
def test_yaml_syntax_error_names_line_and_column(tmp_path, text, line):
    cfg = tmp_path / "g.yaml"
    cfg.write_text(text)
    r = _run("serve", "--config", str(cfg))
    assert r.returncode == 2
    err = r.stderr.strip().splitlines()
    assert len(err) == 1 and line in err[0], r.stderr
    assert str(cfg) in err[0]


@pytest.mark.parametrize("text, line", [
    ("server:\n  prot: 9000\n", "server.prot: unknown key; did you mean port?"),
    ("imgaes:\n  enabled: false\n", "imgaes: unknown key; did you mean images?"),
    ("cache:\n  semantic_treshold: 0.97\n", "cache.semantic_treshold: unknown key; did you mean semantic_threshold?"),
    ("server:\n  frobnicate: 1\n", "server.frobnicate: unknown key"),
])
def test_misspelt_key_suggests_the_right_one(tmp_path, text, line):
    cfg = tmp_path / "g.yaml"
    cfg.write_text(text)
    r = _run("serve", "--config", str(cfg))
    assert r.returncode == 2
    assert r.stderr.strip() == f"vlm-gateway: config error: {line}"


def test_port_in_use_is_one_line_before_anything_listens_or_starts():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        for workers in ("1", "2"):
            r = _run("serve", "--port", str(port), "--workers", workers)
            assert r.returncode == 2, r.stderr
            out = (r.stdout + r.stderr).strip().splitlines()
            assert out == [f"vlm-gateway: server.port: cannot listen on 127.0.0.1:{port} (Address already in use); "
                           "choose another with --port or server.port"], out
            # nothing was started: no simulator banner, no 'listening on'


def test_simulator_port_is_settable_and_checked(tmp_path):
    gw_port, sim_port = free_port(), free_port()
    cfg = tmp_path / "g.yaml"
    cfg.write_text(f"simulator:\n  port: {sim_port}\n  time_scale: 0.01\n")
    log = tmp_path / "gw.log"
    with open(log, "w") as f:
        proc = subprocess.Popen([sys.executable, "-m", "vlm_gateway", "serve", "--config", str(cfg),
                                 "--port", str(gw_port)], stdout=f, stderr=subprocess.STDOUT,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"}, start_new_session=True)
    try:
        wait_until(lambda: "listening on" in log.read_text(), "the gateway says it listens", 30)
        text = log.read_text()
        assert f"SIMULATOR (profile h200-qwen3vl-2b) at http://127.0.0.1:{sim_port}/v1" in text
        # it is the simulator, answering on that port
        assert httpx.get(f"http://127.0.0.1:{sim_port}/v1/models", timeout=5).json()["data"][0]["id"] == "qwen3vl-sim"
        assert re.search(rf"listening on http://127\.0\.0\.1:{gw_port} \(1 worker, 1 backend", text)
        # the simulator's port is now taken: a second gateway with the same setting refuses in one line
        r = _run("serve", "--config", str(cfg), "--port", str(free_port()))
        assert r.returncode == 2
        assert r.stderr.strip().splitlines()[-1] == (
            f"vlm-gateway: simulator.port: cannot listen on 127.0.0.1:{sim_port} (Address already in use); "
            "choose another or 0 for a free one")
        assert "listening on" not in r.stderr
        os.killpg(proc.pid, signal.SIGTERM)
        assert proc.wait(20) == -signal.SIGTERM  # uvicorn re-raises the signal once it has stopped
        lines = log.read_text().splitlines()
        assert any("shutting down (SIGTERM): finishing requests in flight, at most 5 s" in ln for ln in lines)
        assert lines[-1].endswith(f"vlm-gateway stopped (http://127.0.0.1:{gw_port})"), lines[-3:]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
    cfg.write_text("simulator:\n  port: 70000\n")
    r = _run("serve", "--config", str(cfg))
    assert r.returncode == 2 and r.stderr.startswith("vlm-gateway: config error: simulator.port:")


def test_workers_say_when_they_stop(tmp_path):
    port = free_port()
    log = tmp_path / "gw.log"
    with open(log, "w") as f:
        proc = subprocess.Popen([sys.executable, "-m", "vlm_gateway", "serve", "--port", str(port), "--workers", "2"],
                                stdout=f, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"},
                                start_new_session=True)
    try:
        def answers() -> bool:
            try:
                return httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200
            except httpx.HTTPError:
                return False
        wait_until(answers, "the workers answer", 60)
        proc.send_signal(signal.SIGTERM)  # the supervisor only: it stops its workers
        assert proc.wait(30) == 0
        text = log.read_text()
        assert "shutting down (SIGTERM): stopping 2 workers" in text
        assert text.rstrip().endswith(f"vlm-gateway stopped (http://127.0.0.1:{port})")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


def test_serve_help_describes_every_option():
    r = _run("serve", "--help")
    assert r.returncode == 0
    options = re.findall(r"^  (-[-\w]+(?:, --[\w-]+)?)(?: [A-Z{][^ ]*)?(.*)$", r.stdout, re.M)
    names = {o.split(",")[0] for o, _ in options}
    assert {"--config", "--host", "--port", "--backend", "--workers", "--log-format"} <= names
    # every option has a description: on its line or on the next, indented
    lines = r.stdout.splitlines()
    for i, ln in enumerate(lines):
        m = re.match(r"^  (--[\w-]+)", ln)
        if m:
            rest = ln[len(m.group(0)):].strip()
            described = (len(rest.split(None, 1)) > 1) or (i + 1 < len(lines) and lines[i + 1].startswith(" " * 10))
            assert described, f"{m.group(1)} has no description"
    for default in ("server.host, default 127.0.0.1", "server.port, default 8080", "server.workers, default 1"):
        assert default in " ".join(r.stdout.split())
