"""Per-request CPU of the gateway process with uvicorn's plain httptools protocol vs the
guarded one (proxy/connection_guard.py), side by side in one run: a keep-alive client
sends GET /health (where the protocol's share is largest) and non-streamed chat
requests to a simulator; CPU time of each gateway process (/proc utime+stime) per
request, median of 7 rounds.

    PYTHONPATH=. python benchmarks/connection_guard_cost.py
"""
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from conftest import Servers, free_port, wait_http  # noqa: E402

RUNNER = r'''
import os, sys, uvicorn, orjson
from vlm_gateway import load_config
cfg = load_config(None, environ={}, overrides={"backends": [{"url": sys.argv[3], "name": "sim0", "engine": "sim"}], "server": {"log_level": "warning"}})
os.environ["VLM_GATEWAY_CONFIG_JSON"] = orjson.dumps(cfg.to_dict()).decode()
uvicorn.run("vlm_gateway.proxy.app:create_app", factory=True, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning",
            access_log=False, loop="uvloop", http=sys.argv[2])
'''

def cpu(pid):
    with open(f"/proc/{pid}/stat") as f:
        parts = f.read().rsplit(")", 1)[1].split()
    return (int(parts[11]) + int(parts[12])) / os.sysconf("SC_CLK_TCK")

def main() -> None:
    tmp = tempfile.mkdtemp()
    s = Servers(tmp)
    sim = s.sim(profile="fast")
    procs = {}
    for name, http in (("plain", "httptools"), ("guarded", "vlm_gateway.proxy.connection_guard:GuardedHttpToolsProtocol")):
        port = free_port()
        p = subprocess.Popen([sys.executable, "-c", RUNNER, str(port), http, sim.base_url], env={**os.environ})
        wait_http(f"http://127.0.0.1:{port}/health", p, 30)
        procs[name] = (p, port)
    body = {"model": "qwen3vl-sim", "messages": [{"role": "user", "content": "x"}], "max_tokens": 1}
    results = {k: {"health": [], "chat": []} for k in procs}
    try:
        for rnd in range(7):
            for name, (p, port) in procs.items():
                with httpx.Client(base_url=f"http://127.0.0.1:{port}") as c:
                    for path, n in (("health", 5000), ("chat", 600)):
                        c0 = cpu(p.pid)
                        for _ in range(n):
                            if path == "health":
                                c.get("/health")
                            else:
                                c.post("/v1/chat/completions", json=body)
                        results[name][path].append((cpu(p.pid) - c0) / n * 1e6)
        for name in procs:
            print(name, {k: f"{statistics.median(v):.0f} us CPU/request (median of {len(v)})" for k, v in results[name].items()})
    finally:
        for p, _ in procs.values():
            p.terminate()
            p.wait()
        s.stop_all()
if __name__ == "__main__":
    main()
