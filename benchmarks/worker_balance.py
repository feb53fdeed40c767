"""Worker balance: CPU of each gateway worker under a concurrency-64 image load, with one
listening socket shared by every worker (uvicorn's multi-worker mode, as before) beside a
socket per worker (SO_REUSEPORT, proxy/workers.py), in one run.

64 clients, each on its own keep-alive connection, send 1920x1080 JPEGs never sent before
(benchmarks/gpu/variants.py) through the gateway to the simulator for ``--seconds``; CPU
per process comes from /proc over the whole cell (benchmarks/gpu/procs.py).

    python benchmarks/worker_balance.py [--workers 4] [--seconds 20] [--out docs/benchmarks/worker-balance.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import subprocess
import sys
import tempfile
from pathlib import Path


ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks" / "gpu"))
import loadgen  # noqa: E402
from procs import Sampler  # noqa: E402

sys.path.insert(0, str(ROOT / "benchmarks"))
from localprocs import wait_ready  # noqa: E402

SHARED = """
import os, uvicorn
uvicorn.run("vlm_gateway.proxy.app:create_app", factory=True, host="127.0.0.1", port={port}, workers={workers},
            log_level="warning", access_log=False, loop="uvloop",
            http="vlm_gateway.proxy.connection_guard:GuardedHttpToolsProtocol", ws="none", timeout_graceful_shutdown=5)
"""


def start(cmd: list[str], env: dict, log: Path, pid_file: Path) -> subprocess.Popen:
    p = subprocess.Popen(cmd, env=env, stdout=open(log, "w"), stderr=subprocess.STDOUT, start_new_session=True)
    pid_file.write_text(str(p.pid))
    return p


def stop(p: subprocess.Popen) -> None:
    if p.poll() is None:
        os.killpg(p.pid, 15)
        try:
            p.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, 9)
            p.wait(5)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--out", default=str(ROOT / "docs" / "benchmarks" / "worker-balance.json"))
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="vlmgw-balance-"))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    sport = random.randint(20000, 40000)
    sim = start([sys.executable, "-m", "vlm_gateway", "sim", "--port", str(sport), "--profile", "fast",
                 "--model", "qwen3vl"], env, tmp / "sim.log", tmp / "sim.pid")
    wait_ready(f"http://127.0.0.1:{sport}/health", sim)
    imgs = loadgen.Images("jpeg1080")
    results = {}
    try:
        for mode in ("shared_socket", "socket_per_worker"):
            port = random.randint(40001, 60000)
            cfg = {"server": {"port": port, "workers": a.workers},
                   "backends": [{"url": f"http://127.0.0.1:{sport}/v1", "name": "sim", "engine": "sim",
                                 "models": ["qwen3vl"]}]}
            (tmp / "gw.yaml").write_text(json.dumps(cfg))
            if mode == "socket_per_worker":
                cmd = [sys.executable, "-m", "vlm_gateway", "serve", "--config", str(tmp / "gw.yaml")]
                e = env
            else:
                from vlm_gateway import load_config
                import orjson
                c = load_config(str(tmp / "gw.yaml"))
                e = {**env, "VLM_GATEWAY_CONFIG_JSON": orjson.dumps(c.to_dict()).decode(),
                     "PROMETHEUS_MULTIPROC_DIR": tempfile.mkdtemp(prefix="vlmgw-mp-")}
                cmd = [sys.executable, "-c", SHARED.format(port=port, workers=a.workers)]
            gw = start(cmd, e, tmp / f"gw-{mode}.log", tmp / "gw.pid")
            try:
                wait_ready(f"http://127.0.0.1:{port}/ready", gw)
                sampler = Sampler({"gateway": str(tmp / "gw.pid")})
                s0 = sampler.snapshot()
                loadgen.MODEL = "qwen3vl"
                res = asyncio.run(loadgen.timed_cell(f"http://127.0.0.1:{port}/v1",
                                                     lambda: loadgen.chat(imgs.next("raw"), max_tokens=16),
                                                     a.concurrency, a.seconds, 2.0))
                cpu = Sampler.delta(s0, sampler.snapshot())
                workers = [r for r in cpu["procs"] if r["group"] == "gateway" and "spawn" in r["cmd"]]
                res["workers_cpu_pct"] = sorted((r["cpu_pct"] for r in workers), reverse=True)
                res["cpu"] = cpu
                results[mode] = res
                w = res["workers_cpu_pct"]
                print(f"{mode:18s} {res['rps']:6.1f} req/s  TTFT p50 {res['ttft_p50_ms']:.0f} ms  workers CPU % "
                      f"{w}  busiest/quietest {w[0] / max(w[-1], 0.1):.2f}x  machine {cpu['machine_busy_pct']}%",
                      flush=True)
            finally:
                stop(gw)
    finally:
        stop(sim)
    Path(a.out).write_text(json.dumps({"workers": a.workers, "concurrency": a.concurrency, "seconds": a.seconds,
                                       "results": results}, indent=1))


if __name__ == "__main__":
    main()
