"""Client connections per worker: how the kernel's SO_REUSEPORT hash places N keep-alive
connections over the workers, and how the rebalancing (proxy/rebalance.py) evens them out.

Starts a gateway with ``--workers`` workers (pid files in a temporary directory) in front of
the simulator, opens ``--connections`` keep-alive connections, sends one request on each per
round (a connection answered with ``Connection: close`` is reopened), and after each round
counts the established connections each worker process holds (/proc/<pid>/fd against
/proc/net/tcp).

    python benchmarks/worker_connections.py [--workers 8] [--connections 64] [--rounds 6] [--runs 3]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import socket
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "tests"))
from test_workers import http_get_health  # noqa: E402  (the test's raw keep-alive client)
from worker_balance import start, stop, wait_ready  # noqa: E402


def per_worker(port: int, pids: list[int]) -> list[int]:
    est = {f[9] for f in (line.split() for line in Path("/proc/net/tcp").read_text().splitlines()[1:])
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
    return sorted(out, reverse=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--connections", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--out", default=str(ROOT / "docs" / "benchmarks" / "worker-connections.json"))
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="vlmgw-conns-"))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    sport, port = random.randint(20000, 40000), random.randint(40001, 60000)
    sim = start([sys.executable, "-m", "vlm_gateway", "sim", "--port", str(sport), "--profile", "fast"], env,
                tmp / "sim.log", tmp / "sim.pid")
    cfg = {"server": {"port": port, "workers": a.workers, "pid_dir": str(tmp / "run")},
           "backends": [{"url": f"http://127.0.0.1:{sport}/v1", "name": "sim", "engine": "sim"}]}
    (tmp / "gw.yaml").write_text(json.dumps(cfg))
    gw = start([sys.executable, "-m", "vlm_gateway", "serve", "--config", str(tmp / "gw.yaml")], env,
               tmp / "gw.log", tmp / "gw.pid")
    runs = []
    try:
        wait_ready(f"http://127.0.0.1:{sport}/health", sim)
        wait_ready(f"http://127.0.0.1:{port}/ready", gw)
        pids = [int((tmp / "run" / f"worker-{i}.pid").read_text()) for i in range(a.workers)]
        for run in range(a.runs):
            socks = [socket.create_connection(("127.0.0.1", port)) for _ in range(a.connections)]
            time.sleep(0.2)
            rounds = [{"round": "opened", "per_worker": per_worker(port, pids), "closed": 0}]
            for r in range(a.rounds):
                closed = 0
                for i, s in enumerate(socks):
                    if b"connection: close" in http_get_health(s):
                        closed += 1
                        s.close()
                        socks[i] = socket.create_connection(("127.0.0.1", port))
                time.sleep(0.2)
                rounds.append({"round": r + 1, "per_worker": per_worker(port, pids), "closed": closed})
            for s in socks:
                s.close()
            runs.append(rounds)
            for x in rounds:
                print(f"run {run} round {x['round']}: {x['per_worker']}  closed {x['closed']}", flush=True)
            time.sleep(0.5)
    finally:
        stop(gw)
        stop(sim)
    Path(a.out).write_text(json.dumps({"workers": a.workers, "connections": a.connections, "runs": runs}, indent=1))


if __name__ == "__main__":
    main()
