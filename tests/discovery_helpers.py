"""Helpers of the discovery tests: simulators on other loopback addresses, the gateway's
admin status and metrics, streamed answers read to their end."""

from __future__ import annotations

import hashlib
import os
import socket
import subprocess
import sys
import uuid

import httpx
import openai

from conftest import SIM_MODEL, Proc, wait_http

ADMIN = "admin-" + uuid.uuid4().hex
TOKENS = 40          # a stream lasts 2 s at 20 tokens/s


class HostProc(Proc):
    host: str = "127.0.0.1"

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"


def port_free_on(hosts: list[str]) -> int:
    """A TCP port free on every one of ``hosts``."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind((hosts[0], 0))
            port = s.getsockname()[1]
        try:
            for h in hosts[1:]:
                with socket.socket() as s:
                    s.bind((h, port))
            return port
        except OSError:
            continue
    raise RuntimeError("no common free port")


def sim_at(servers, host: str, port: int) -> HostProc:
    log = os.path.join(servers.tmp, f"sim-{host}-{port}.log")
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with open(log, "w") as f:
        proc = subprocess.Popen([sys.executable, "-m", "vlm_gateway", "sim", "--host", host, "--port", str(port),
                                 "--profile", "fast", "--echo", "--token-rate", "20", "--model", SIM_MODEL],
                                stdout=f, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    p = HostProc(proc, port, log, "sim")
    p.host = host
    servers.procs.append(p)
    wait_http(f"http://{host}:{port}/health", proc, 30, log)
    return p


def status(gw) -> dict[str, dict]:
    r = httpx.get(gw.url + "/admin/status", headers={"authorization": f"Bearer {ADMIN}"}, timeout=5)
    assert r.status_code == 200, r.text
    return {b["name"]: b for b in r.json()["backends"]}


def served(sim: HostProc) -> int:
    return len(sim.sim_requests())


def metric(gw, name: str, **labels) -> float:
    text = httpx.get(gw.url + "/metrics", timeout=5).text
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name + "{"):
            continue
        if all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def gateway(servers, entries: list[dict]) -> Proc:
    cfg = {"discovery": entries, "routing": {"health_interval_s": 0.3, "policy": "least_loaded"},
           "auth": {"admin_key_sha256": hashlib.sha256(ADMIN.encode()).hexdigest()}, "cache": {"enabled": False}}
    return servers.gateway(cfg)


async def stream(client: openai.AsyncOpenAI, tag: str) -> tuple[str, str, str]:
    """(backend, text, finish_reason) of one streamed answer, read to its end."""
    raw = await client.chat.completions.with_raw_response.create(
        model=SIM_MODEL, messages=[{"role": "user", "content": tag}], max_tokens=TOKENS, stream=True)
    backend = raw.headers.get("x-vlm-gateway-backend", "")
    text, finish = [], ""
    async for ch in raw.parse():
        if ch.choices and ch.choices[0].delta.content:
            text.append(ch.choices[0].delta.content)
        if ch.choices and ch.choices[0].finish_reason:
            finish = ch.choices[0].finish_reason
    return backend, "".join(text), finish
