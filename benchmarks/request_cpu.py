"""Gateway CPU per image request, two versions side by side in one run: each workload's
distinct images (benchmarks/gpu/variants.py: no cache serves one from another) go through
two one-worker gateways, the package at ``--before`` (a copy of an earlier version, e.g.
``git archive <commit> vlm_gateway | tar -x -C /tmp/before``) and this checkout, both in
front of one simulator with the h200 profile (images capped at 1280 px, as on the GPU
machine). Batches alternate between the two, so load changes on a shared machine hit both
alike; CPU is the gateway process's user + system time over each batch (/proc), divided
by its requests. Reports the median and p90 over batches and the after/before ratio.

    python benchmarks/request_cpu.py --before /tmp/before [--batches 7 --per-batch 4] [--out FILE]
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "benchmarks"), str(ROOT / "benchmarks" / "gpu")]

import loadgen  # noqa: E402
from variants import variants  # noqa: E402

from localprocs import Procs, wait_ready  # noqa: E402

WORKLOADS = ["jpeg1080", "jpeg12mp", "png1080", "png1800"]


def cpu_s(pid: int) -> float:
    f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


def body(img: bytes, kind: str) -> dict:
    mime = "image/png" if kind.startswith("png") else "image/jpeg"
    return {"model": "qwen3vl", "max_tokens": 4, "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": f"data:{mime};base64," + base64.b64encode(img).decode()}},
        {"type": "text", "text": "hi"}]}]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", required=True, help="directory holding the earlier vlm_gateway package")
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    ap.add_argument("--batches", type=int, default=7)
    ap.add_argument("--per-batch", type=int, default=4)
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="request-cpu-"))
    ports = {"before": 18311, "after": 18312}
    with Procs(tmp) as procs:
        sim = procs.vlm_gateway(["sim", "--port", "18310", "--model", "qwen3vl", "--time-scale", "0.01"], "sim.log")
        wait_ready("http://127.0.0.1:18310/health", sim, "the simulator")
        gws = {}
        for name, port in ports.items():
            (tmp / f"{name}.yaml").write_text(
                f"server: {{port: {port}, workers: 1}}\nbackends:\n"
                "  - {url: 'http://127.0.0.1:18310/v1', name: s, engine: sim, profile: h200, models: [qwen3vl]}\n")
            path = a.before if name == "before" else str(ROOT)
            gws[name] = procs.vlm_gateway(["serve", "--config", str(tmp / f"{name}.yaml")], f"{name}.log",
                                          pythonpath=path, cwd=tmp)
            wait_ready(f"http://127.0.0.1:{port}/ready", gws[name], f"the {name} gateway")
        for name in ports:  # each gateway runs the package it was given
            assert (Path(a.before if name == "before" else ROOT) / "vlm_gateway").is_dir()
        out = {"before": a.before, "batches": a.batches, "per_batch": a.per_batch, "workloads": {}}
        with httpx.Client(timeout=120) as c:
            for kind in a.workloads.split(","):
                raw = loadgen.base_image(kind)
                vary = variants(raw)
                n = 0
                per = {name: [] for name in ports}
                header = {}
                for b in range(a.batches + 1):            # batch 0 warms both up, not counted
                    for name in (("before", "after") if b % 2 else ("after", "before")):
                        bodies = [body(vary(n + i), kind) for i in range(a.per_batch)]
                        n += a.per_batch
                        pid = gws[name].pid
                        c0 = cpu_s(pid)
                        for bd in bodies:
                            r = c.post(f"http://127.0.0.1:{ports[name]}/v1/chat/completions", json=bd)
                            if r.status_code != 200:
                                raise SystemExit(f"{name} gateway answered {r.status_code}: {r.text[:300]}")
                            header[name] = r.headers.get("x-vlm-gateway-image-budget", "")
                        if b:
                            per[name].append(1000 * (cpu_s(pid) - c0) / a.per_batch)
                row = {"raw_bytes": len(raw), "header": header}
                for name, xs in per.items():
                    xs.sort()
                    row[name] = {"cpu_ms_p50": round(statistics.median(xs), 1),
                                 "cpu_ms_p90": round(xs[min(len(xs) - 1, int(0.9 * len(xs)))], 1)}
                row["ratio_p50"] = round(row["after"]["cpu_ms_p50"] / row["before"]["cpu_ms_p50"], 3)
                out["workloads"][kind] = row
                print(f"{kind:9s} before {row['before']['cpu_ms_p50']:6.1f} ms (p90 {row['before']['cpu_ms_p90']:6.1f})"
                      f"   after {row['after']['cpu_ms_p50']:6.1f} ms (p90 {row['after']['cpu_ms_p90']:6.1f})"
                      f"   after/before {row['ratio_p50']:.2f}", flush=True)
        if a.out:
            Path(a.out).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
