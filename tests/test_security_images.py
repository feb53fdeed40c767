"""Image decode bombs against a real gateway process: every case of the hostile corpus
is refused with a 400 naming the part, and the gateway's own peak memory (VmHWM)
and CPU time (utime + stime from /proc) stay bounded while it refuses them all.
Before the structural caps and the real-size check, one 29-byte GIF cost 1.2 GB and
the chunk, fill-byte and IFD floods several seconds of CPU each."""

from __future__ import annotations

import base64
import os

import httpx
import pytest

from conftest import SIM_MODEL
import image_corpus as C


def _status(pid: int, key: str) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])  # kB
    raise KeyError(key)


def _cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def _post(gw, data: bytes) -> httpx.Response:
    url = "data:application/octet-stream;base64," + base64.b64encode(data).decode()
    body = {"model": SIM_MODEL, "max_tokens": 1, "messages": [{"role": "user", "content": [
        {"type": "text", "text": "x"}, {"type": "image_url", "image_url": {"url": url}}]}]}
    return httpx.post(gw.base_url + "/chat/completions", json=body, timeout=60)


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="needs Linux /proc")
def test_decode_bombs_bounded_in_the_gateway_process(servers):
    sim = servers.sim()
    gw = servers.gateway({"images": {"pool_workers": 1}}, backends=[sim])
    pid = gw.proc.pid
    assert _post(gw, C.photo_jpeg(1600, 1200)).status_code == 200  # warm: plugins, pool thread, arenas
    assert _post(gw, C.avif(600, 400)).status_code == 200
    hwm0, cpu0 = _status(pid, "VmHWM"), _cpu_s(pid)
    cases = C.hostile()
    payload = sum(len(d) for d, _ in cases.values())
    for name, (data, codes) in cases.items():
        r = _post(gw, data)
        assert r.status_code == 400, (name, r.text[:200])
        assert r.json()["error"]["code"] in codes, (name, r.json())
        assert r.json()["error"]["param"] == "messages[0].content[1].image_url"
    grew_mb = (_status(pid, "VmHWM") - hwm0) / 1024
    cpu = _cpu_s(pid) - cpu0
    # JSON parsing and base64 of the request bodies (tens of MB in all) are part of the CPU spent
    assert grew_mb < 200, f"peak RSS grew {grew_mb:.0f} MB over {len(cases)} hostile images"
    assert cpu < 2.0 + payload / 20e6, f"{cpu:.2f} s of CPU for {len(cases)} hostile images ({payload} bytes)"
    assert len(sim.sim_requests()) == 2  # only the two warm-up requests reached the engine
