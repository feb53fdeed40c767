"""One image request at a time (concurrency 1, the GUI agent's step): the gateway's added
latency, two package versions side by side, on one core and on several idle cores.

    python benchmarks/image_latency.py --before /tmp/before [--requests 12] [--cores 1,2]
                                       [--workloads jpeg1080,png1080,png1800,jpeg12mp] [--out FILE]

Four one-worker gateways (``--before``'s package and this checkout, each with the defaults
and with the shipped h200 profile on its backend) in front of one simulator. Each
workload's distinct images (benchmarks/gpu/variants.py) go one request at a time to each
gateway in turn, the gateways' threads pinned (sched_setaffinity on every thread) to the
first N cores for a batch, N from ``--cores``, batches alternating. Per request: the
gateway's own time from its ``Server-Timing`` header (``gateway``: first byte of the
request -> the first byte sent upstream; ``media``: its image work) and the client's wall
time to the full answer. Reports medians and p99 and the ratios after/before and N cores /
1 core.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "benchmarks"), str(ROOT / "benchmarks" / "gpu")]

import loadgen  # noqa: E402
from variants import variants  # noqa: E402

from localprocs import Procs, wait_ready  # noqa: E402

WORKLOADS = ["jpeg1080", "png1080", "png1800", "jpeg12mp"]
TIMING = re.compile(r"(\w+);dur=([\d.]+)")


def pin(pid: int, cpus: set[int]) -> None:
    """Every thread of ``pid`` (threads started later inherit their creator's set)."""
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            os.sched_setaffinity(int(tid), cpus)
        except OSError:
            pass
    for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split():
        pin(int(child), cpus)


def body(img: bytes, kind: str) -> dict:
    mime = "image/png" if kind.startswith("png") else "image/jpeg"
    return {"model": "qwen3vl", "max_tokens": 4, "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": f"data:{mime};base64," + base64.b64encode(img).decode()}},
        {"type": "text", "text": "hi"}]}]}


def stats(xs: list[float]) -> dict:
    xs = sorted(xs)
    return {"p50": round(statistics.median(xs), 2), "p99": round(xs[min(len(xs) - 1, int(0.99 * len(xs)))], 2),
            "n": len(xs)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", required=True)
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    ap.add_argument("--requests", type=int, default=12, help="per cell (workload x config x version x cores)")
    ap.add_argument("--batch", type=int, default=3)
    ap.add_argument("--cores", default="1,2")
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    allowed = sorted(os.sched_getaffinity(0))
    core_sets = {int(n): set(allowed[:int(n)]) for n in a.cores.split(",")}
    tmp = Path(tempfile.mkdtemp(prefix="image-latency-"))
    gws = {}
    with Procs(tmp) as procs:
        sim = procs.vlm_gateway(["sim", "--port", "18320", "--model", "qwen3vl", "--time-scale", "0.01"], "sim.log")
        wait_ready("http://127.0.0.1:18320/health", sim, "the simulator")
        port = 18321
        for version in ("before", "after"):
            for config in ("default", "h200"):
                prof = ", profile: h200" if config == "h200" else ""
                (tmp / f"{version}-{config}.yaml").write_text(
                    f"server: {{port: {port}, workers: 1}}\nbackends:\n"
                    f"  - {{url: 'http://127.0.0.1:18320/v1', name: s, engine: sim{prof}, models: [qwen3vl]}}\n"
                    "cache: {enabled: false}\n")
                path = a.before if version == "before" else str(ROOT)
                p = procs.vlm_gateway(["serve", "--config", str(tmp / f"{version}-{config}.yaml")],
                                      f"{version}-{config}.log", pythonpath=path, cwd=tmp)
                gws[(version, config)] = (p, port)
                port += 1
        for (version, config), (p, port) in gws.items():
            wait_ready(f"http://127.0.0.1:{port}/ready", p, f"the {version} {config} gateway")
        res = {"before": a.before, "cores": {str(k): sorted(v) for k, v in core_sets.items()},
               "requests_per_cell": a.requests, "cells": {}}
        with httpx.Client(timeout=120) as c:
            for kind in a.workloads.split(","):
                vary = variants(loadgen.base_image(kind))
                n = 0
                cells: dict = {}
                rounds = max(1, a.requests // a.batch)
                order = [(cores, key) for cores in core_sets for key in gws]
                for r in range(rounds + 1):  # round 0 warms every gateway up, not counted
                    for cores, key in (order if r % 2 else order[::-1]):
                        for p, _ in gws.values():
                            pin(p.pid, core_sets[cores])
                        time.sleep(0.3)  # an idle window for the spare-core reading
                        p, port = gws[key]
                        for _ in range(a.batch):
                            bd = body(vary(n), kind)
                            n += 1
                            t = time.perf_counter()
                            resp = c.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=bd)
                            wall = (time.perf_counter() - t) * 1000
                            if resp.status_code != 200:
                                raise SystemExit(f"{key} answered {resp.status_code}: {resp.text[:300]}")
                            if not r:
                                continue
                            st = dict((k, float(v)) for k, v in TIMING.findall(resp.headers.get("server-timing", "")))
                            cell = cells.setdefault(f"{key[1]}/{key[0]}/{cores}", {"gateway": [], "media": [], "wall": []})
                            cell["gateway"].append(st.get("gateway", 0.0))
                            cell["media"].append(st.get("media", 0.0))
                            cell["wall"].append(wall)
                            cell["budget"] = resp.headers.get("x-vlm-gateway-image-budget", "")
                out = {k: {m: stats(v[m]) for m in ("gateway", "media", "wall")} | {"budget": v["budget"]}
                       for k, v in cells.items()}
                for config in ("default", "h200"):
                    for cores in core_sets:
                        b, f = out[f"{config}/before/{cores}"], out[f"{config}/after/{cores}"]
                        f["after_over_before_gateway_p50"] = round(f["gateway"]["p50"] / b["gateway"]["p50"], 3)
                    for version in ("before", "after"):
                        one = out[f"{config}/{version}/{min(core_sets)}"]
                        for cores in core_sets:
                            x = out[f"{config}/{version}/{cores}"]
                            x["over_one_core_gateway_p50"] = round(x["gateway"]["p50"] / one["gateway"]["p50"], 3)
                res["cells"][kind] = out
                for k, v in sorted(out.items()):
                    print(f"{kind:9s} {k:18s} gateway p50 {v['gateway']['p50']:7.1f} p99 {v['gateway']['p99']:7.1f}  "
                          f"media p50 {v['media']['p50']:7.1f}  wall p50 {v['wall']['p50']:7.1f}  "
                          f"after/before {v.get('after_over_before_gateway_p50', '-')}  "
                          f"vs 1 core {v.get('over_one_core_gateway_p50', '-')}", flush=True)
        if a.out:
            Path(a.out).write_text(json.dumps(res, indent=1) + "\n")


if __name__ == "__main__":
    main()
