"""Calibrate and check a calibrated simulator profile against the real vLLM
measurements it is fitted to (vlm_gateway/backends/sim/profiles.py: MEASUREMENTS;
``h200-qwen3vl-2b``: the first table, ``h200-vllm024-2026-11-30``: the 2026-11-30 run,
``h200-vllm024-2026-12-01``: the 2026-12-01 cells, with the share of TTFT before the headers).

    python benchmarks/sim_calibration.py                 # model vs measured, offline (virtual clock)
    python benchmarks/sim_calibration.py --profile h200-vllm024-2026-11-30
    python benchmarks/sim_calibration.py --profile h200-qwen3vl-2b --rows 2026-11-30-run2
                                                         # a profile against another measured run
                                                         # (table, 2026-11-30-run1, 2026-11-30-run2)
    python benchmarks/sim_calibration.py --live 1        # same rows over HTTP (real JPEGs, OpenAI SDK)
                                                         # against a spawned simulator in real time
    python benchmarks/sim_calibration.py --live 0        # ... at each row's test time scale
    python benchmarks/sim_calibration.py --fit           # refit the timing constants (needs scipy)
    python benchmarks/sim_calibration.py --fit --profile h200-vllm024-2026-11-30
    python benchmarks/sim_calibration.py --profile h200-vllm024-2026-12-01   # + the headers split table
    python benchmarks/sim_calibration.py --fit --profile h200 --rows 2026-12-01 --keys K1,K2 --maxfev 350

The fit minimises the squared log-ratios of TTFT p50 and req/s over all rows,
plus a steep penalty beyond 12% so that no single row is sacrificed.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import socket
import subprocess
import sys
import time
from dataclasses import replace

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from vlm_gateway.backends.sim.profiles import calibration_rows, get_profile, simulate_rows  # noqa: E402
from vlm_gateway.backends.sim.split_run import SplitRow, replay_split  # noqa: E402
from vlm_gateway.backends.sim.workload import run_row_http  # noqa: E402

FIT_KEYS = ["request_latency_s", "cpu_base_s", "cpu_decode_s_per_mpx", "cpu_preproc_s_per_mpx", "cpu_contention",
            "cpu_token_s",
            "ipc_s_per_ktok", "step_base_s", "step_seq_s", "kv_read_s_per_ktok", "prefill_s_per_ktok", "vit_base_s",
            "vit_s_per_ktok", "vit_quad_s_per_ktok2"]


def table(results) -> str:
    lines = ["| row | TTFT p50 ms measured | simulated | ratio | req/s measured | simulated | ratio |",
             "|---|---|---|---|---|---|---|"]
    for row, (ttft, rps) in results:
        lines.append(f"| {row.label} | {row.ttft_p50_ms:.0f} | {ttft:.0f} | {ttft / row.ttft_p50_ms:.2f} | "
                     f"{row.req_per_s:.2f} | {rps:.2f} | {rps / row.req_per_s:.2f} |")
    worst = max(max(abs(math.log(t / r.ttft_p50_ms)), abs(math.log(q / r.req_per_s))) for r, (t, q) in results)
    lines.append(f"\nworst row off by {math.exp(worst) - 1:.1%}")
    return "\n".join(lines)


def split_table(profile, rows) -> str:
    """The 2026-12-01 cells: TTFT, req/s and the share of TTFT before the response headers."""
    lines = ["| cell | TTFT p50 ms measured | simulated | ratio | req/s measured | simulated | ratio | "
             "before the headers measured | simulated |", "|---|---|---|---|---|---|---|---|---|"]
    for row, (ttft, rps, share, _) in zip(rows, replay_split(profile, rows)):
        meas = f"{row.before_headers:.1%}" if row.before_headers else ""
        lines.append(f"| {row.label} | {row.ttft_p50_ms:.0f} | {ttft:.0f} | {ttft / row.ttft_p50_ms:.2f} | "
                     f"{row.req_per_s:.2f} | {rps:.2f} | {rps / row.req_per_s:.2f} | {meas} | {share:.1%} |")
    return "\n".join(lines)


def loss(profile, rows) -> float:
    total = 0.0
    if rows and all(isinstance(r, SplitRow) for r in rows):
        sims = replay_split(profile, rows)
    else:
        sims = [(t, q, None, None) for t, q in simulate_rows(profile, rows)]
    for row, (ttft, rps, share, _) in zip(rows, sims):
        for e in (math.log(ttft / row.ttft_p50_ms), math.log(rps / row.req_per_s)):
            total += e * e + 20 * max(0.0, abs(e) - math.log(1.12)) ** 2
        if share is not None and getattr(row, "before_headers", None):
            # the engine's share (after the headers), as a log-ratio: 2 % vs 1 % weighs as 20 % vs 10 %
            e = math.log(max(1e-4, 1.0 - share) / (1.0 - row.before_headers))
            total += 0.5 * e * e
    return total


def fit(base, rows, keys=FIT_KEYS, maxfev: int = 900, rounds: int = 3) -> None:
    import numpy as np
    from scipy.optimize import minimize

    best = [math.inf, None]

    def f(x):
        prof = replace(base, **{k: float(math.exp(v)) for k, v in zip(keys, x)})
        val = loss(prof, rows)
        if val < best[0]:
            best[:] = [val, prof]
            print(f"loss {val:.4f}", {k: round(getattr(prof, k), 7) for k in keys}, flush=True)
        return val

    for _ in range(rounds):
        minimize(f, np.log([max(getattr(best[1] or base, k), 1e-7) for k in keys]),
                 method="Nelder-Mead", options={"maxfev": maxfev, "xatol": 1e-3, "fatol": 1e-5})
    print(table(list(zip(rows, simulate_rows(best[1], rows)))))
    if rows and all(isinstance(r, SplitRow) for r in rows):
        print(split_table(best[1], rows))
    print("\n".join(f"  {k}: {getattr(best[1], k):.4g}" for k in keys))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def live(scale: float, profile: str, rows) -> None:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "vlm_gateway", "sim", "--port", str(port), "--profile", profile,
                             "--time-scale", str(scale)], start_new_session=True)
    try:
        import httpx
        for _ in range(200):
            try:
                httpx.get(f"http://127.0.0.1:{port}/health")
                break
            except httpx.HTTPError:
                time.sleep(0.05)
        results = []
        url = f"http://127.0.0.1:{port}"
        for row in rows:
            t = time.perf_counter()
            # this machine's own per-request cost, which a time scale would magnify
            httpx.post(url + "/sim/config", json={"time_scale": 1e-4, "reset_cache": True})
            probe = replace(row, concurrency=1, same_image=False)
            overhead_ms, _ = asyncio.run(run_row_http(url + "/v1", "qwen3vl-sim", probe, n=3))
            ts = scale or row.time_scale()
            httpx.post(url + "/sim/config", json={"time_scale": ts, "reset_cache": True})
            res = asyncio.run(run_row_http(url + "/v1", "qwen3vl-sim", row, time_scale=ts,
                                           overhead_s=overhead_ms / 1000.0 if ts < 1 else 0.0))
            results.append((row, res))
            print(f"{row.label}: {res[0]:.0f} ms, {res[1]:.2f} req/s (time scale {ts:.2f}, loopback overhead "
                  f"{overhead_ms:.1f} ms{' subtracted' if ts < 1 else ''}, {time.perf_counter() - t:.1f} s wall)",
                  flush=True)
        print(table(results))
    finally:
        proc.terminate()
        proc.wait(10)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--profile", default="h200-qwen3vl-2b")
    ap.add_argument("--rows", metavar="RUN",
                    help="a measured run, or the one PROFILE is fitted to (default: --profile's)")
    ap.add_argument("--fit", action="store_true")
    ap.add_argument("--keys", help="comma-separated constants to fit (default: all timing constants)")
    ap.add_argument("--maxfev", type=int, default=900, help="--fit: evaluations per Nelder-Mead round")
    ap.add_argument("--rounds", type=int, default=3, help="--fit: Nelder-Mead rounds")
    ap.add_argument("--live", type=float, metavar="TIME_SCALE",
                    help="run over HTTP at this time scale (0 = each row's test scale)")
    args = ap.parse_args()
    base = get_profile(args.profile)
    rows = calibration_rows(args.rows or args.profile)
    if args.fit:
        fit(base, rows, args.keys.split(",") if args.keys else FIT_KEYS, args.maxfev, args.rounds)
    elif args.live is not None:
        live(args.live, args.profile, rows)
    else:
        print(table(list(zip(rows, simulate_rows(base, rows)))))
        if rows and all(isinstance(r, SplitRow) for r in rows):
            print(split_table(base, rows))


if __name__ == "__main__":
    main()
