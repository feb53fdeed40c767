"""The image matrix on one GPU machine: for each workload (1080p JPEG, 12 MP JPEG, PNG
screenshots at 1920x1080 and 2880x1800) and concurrency (1, 16, 64), (b) images the client
already rewrote, straight to the engine on :8000, beside (c) the raw images through the
gateway on :8080, with CPU per process (gateway workers, engine) over each cell. Writes
JSON to the given path (after every cell, so a cut-short run keeps what it measured).

    bash benchmarks/gpu/start_engines.sh STAGE 1
    bash benchmarks/gpu/start_gateway.sh 1 affinity 8
    python3 benchmarks/gpu/image_matrix.py --out matrix.json                   # whole matrix
    python3 benchmarks/gpu/image_matrix.py --out m1.json --workloads jpeg1080,jpeg12mp --cell-s 30
    python3 benchmarks/gpu/image_matrix.py --out m2.json --workloads png1080,png1800 --cell-s 30

Time: 24 cells of ``cell_s`` + warm-up + drain, and a cell at concurrency 64 runs until 640
requests are measured (about 26 s at 25 req/s). With the default budget of 540 s the whole
matrix gets cells of about 12 s at concurrency 1 and 16 (the concurrency-64 cells last as
long as their 640 requests take); 30 s cells take two runs of two workloads each (about 7
minutes each).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import loadgen  # noqa: E402

PER_CELL_EXTRA_S = 5.0  # warm-up (3 s) + drain of the last requests + CPU snapshots
SETUP_S = 15.0          # base images and their rewrites, per run
ASSUMED_RPS = 25.0      # for the time 10 x concurrency requests take (one H200, 768 px images)


def planned_s(cell_s: float, concs: list[int], per_conc: int) -> float:
    return sum(per_conc * (max(cell_s, 10 * c / ASSUMED_RPS) + PER_CELL_EXTRA_S) for c in concs)


def fit_cell_s(budget_s: float, concs: list[int], per_conc: int) -> float:
    """The longest cell (<= 30 s) that keeps the whole run within the budget."""
    cell = 30.0
    while cell > 5.0 and planned_s(cell, concs, per_conc) + SETUP_S > budget_s:
        cell -= 0.5
    return cell


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--workloads", default=",".join(loadgen.WORKLOADS))
    ap.add_argument("--concurrencies", default="1,16,64")
    ap.add_argument("--cell-s", type=float, default=None,
                    help="measured seconds per cell (default: the most that fits --budget-s, at most 30)")
    ap.add_argument("--budget-s", type=float, default=540.0, help="whole run, seconds")
    ap.add_argument("--warm-s", type=float, default=3.0)
    ap.add_argument("--modes", default="b_direct_prerewritten,c_gateway_raw")
    ap.add_argument("--gateway-pid-file", default="/root/gateway.pid")
    ap.add_argument("--engine-pid-file", default="/root/vllm-8000.pid")
    a = ap.parse_args()
    workloads = a.workloads.split(",")
    concs = [int(c) for c in a.concurrencies.split(",")]
    modes = a.modes.split(",")
    cells = len(workloads) * len(concs) * len(modes)
    per_conc = len(workloads) * len(modes)
    cell_s = a.cell_s if a.cell_s is not None else fit_cell_s(a.budget_s, concs, per_conc)
    planned = planned_s(cell_s, concs, per_conc) + SETUP_S
    print(f"{cells} cells of {cell_s:.0f} s (+ {a.warm_s:.0f} s warm-up): about {planned / 60:.1f} minutes", flush=True)
    if cell_s < 30:
        print("note: cells are shorter than 30 s to fit the budget; for 30 s cells run the workloads in two "
              "halves with --cell-s 30", flush=True)
    out_path = Path(a.out)

    def log(line: str, flush: bool = True) -> None:
        print(line, flush=flush)

    res = loadgen.run_matrix(workloads, concs, modes, cell_s, a.warm_s,
                             {"gateway": a.gateway_pid_file, "engine": a.engine_pid_file}, log=log,
                             on_cell=lambda partial: out_path.write_text(json.dumps(partial, indent=1)))
    by = {(c["kind"], c["conc"], c["mode"]): c for c in res["cells"]}
    res["ratios"] = []
    for kind in workloads:
        for conc in concs:
            b, c = by.get((kind, conc, "b_direct_prerewritten")), by.get((kind, conc, "c_gateway_raw"))
            if b and c and b["ttft_p50_ms"] and c["ttft_p50_ms"] and b["rps"]:
                row = {"kind": kind, "conc": conc, "ttft_ratio": round(c["ttft_p50_ms"] / b["ttft_p50_ms"], 3),
                       "rps_ratio": round(c["rps"] / b["rps"], 3),
                       "ttft_gap_ms": round(c["ttft_p50_ms"] - b["ttft_p50_ms"], 1),
                       "gateway_cpu_pct": c["cpu"]["group_cpu_pct"].get("gateway"),
                       "workers": c["cpu"].get("gateway_workers"),
                       "machine_busy_pct": c["cpu"]["machine_busy_pct"]}
                res["ratios"].append(row)
                print(f"{kind:8s} conc {conc:3d}: (c)/(b) TTFT {row['ttft_ratio']:.2f}x  req/s {row['rps_ratio']:.2f}x"
                      f"  gap {row['ttft_gap_ms']} ms", flush=True)
    out_path.write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
