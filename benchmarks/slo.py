#!/usr/bin/env python3
"""SLO-aware image budgets on the simulator: a step load 0.5x -> 2x -> 0.5x of the
fixed-budget capacity of four simulated H200s, mixed traffic, three ways of meeting it:

    fixed       every image at its own budget (768 px long side), nothing refused
    admission   fixed budgets, and a request is refused with 429 when every engine already
                has ``--admit`` requests in flight (what a concurrency cap alone can do)
    controller  the gateway's budget controller (backends/slo.py, default settings but the
                target) picks a level every 0.5 s from the TTFT it measures and the engines'
                queue; each image's long side comes from stages/images/pressure.long_side
    controller+admission   both: pixels first, 429 for what smaller images cannot absorb

Two peaks: 2x (the goal; above what the deepest level can carry with this mix, which the
run measures: capacity per level, closed loop) and 1.4x (within it).

Everything runs on a virtual clock (backends/sim/vclock.py) in one process: the engines are
the simulator's own (backends/sim/engine.py, profile ``h200``: API-server CPU per megapixel,
ViT and prefill per visual token, chunked prefill, continuous batching), so the time model is
the calibrated one and a 150 s run takes seconds of CPU, deterministic for a seed. Not
modelled: the gateway's own rewrite CPU (it runs on the gateway's cores, beside the engines)
and network time.

Traffic (open loop, Poisson arrivals):
    45 %  screenshots 1280x800 with text of line height 20/24/32/40/48 px; legibility floor =
          the long side at which a line is still 10 px high, on the 32 px grid
          (1280 x 10 / line height: 640, 544, 416, 320, 288 px), class text
    35 %  photos 4032x3024 (12 MP), class photo (no floor)
    20 %  text only, ~300 prompt tokens
    64 output tokens each; every image is new (no processor or prefix cache hit).

    python benchmarks/slo.py --out docs/benchmarks/slo.json --plot docs/benchmarks/slo.png
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from vlm_gateway.backends.sim.engine import SimEngine  # noqa: E402
from vlm_gateway.backends.sim.profiles import get_profile  # noqa: E402
from vlm_gateway.backends.sim.prompt import synthetic_prompt  # noqa: E402
from vlm_gateway.backends.sim.vclock import run_virtual  # noqa: E402
from vlm_gateway.backends.slo import PoolLoad, SloController, percentile  # noqa: E402
from vlm_gateway.config import SloConfig  # noqa: E402
from vlm_gateway.stages.images.pressure import long_side  # noqa: E402
from vlm_gateway.vision_tokens import target_size  # noqa: E402

BUDGET = 768
GRID = 32
LINE_HEIGHTS = (20, 24, 32, 40, 48)
LEGIBLE_LINE_PX = 10
OUTPUT_TOKENS = 64
ENGINES = 4
PROFILE = "h200"


def floor_for(src_long: int, line_px: int) -> int:
    return min(BUDGET, math.ceil(src_long * LEGIBLE_LINE_PX / line_px / GRID) * GRID)


@dataclass
class Req:
    t: float            # arrival (s)
    kind: str           # screenshot | photo | text
    w: int = 0
    h: int = 0
    floor: int = 0
    # results
    level: int = 0
    side: int = 0       # long side sent (0: no image)
    ttft: float | None = None
    rejected: bool = False


def arrivals(rate_at, duration: float, seed: int) -> list[Req]:
    rng = random.Random(seed)
    out, t = [], 0.0
    peak = max(rate_at(x) for x in range(int(duration) + 1))
    while True:
        t += rng.expovariate(peak)  # thinning: exact for a piecewise-constant rate
        if t >= duration:
            return out
        if rng.random() * peak > rate_at(t):
            continue
        u = rng.random()
        if u < 0.45:
            lh = rng.choice(LINE_HEIGHTS)
            out.append(Req(t, "screenshot", 1280, 800, floor_for(1280, lh)))
        elif u < 0.80:
            out.append(Req(t, "photo", 4032, 3024))
        else:
            out.append(Req(t, "text"))


@dataclass
class Result:
    mode: str
    reqs: list[Req]
    levels: list[tuple[float, int, float | None]] = field(default_factory=list)  # (t, level, p)


def simulate(mode: str, reqs: list[Req], slo: SloConfig, admit: int, seed: int) -> Result:
    """Run ``reqs`` (fresh copies) through four engines in ``mode``."""
    reqs = [Req(r.t, r.kind, r.w, r.h, r.floor) for r in reqs]
    res = Result(mode, reqs)

    async def main():
        loop = asyncio.get_running_loop()
        engines = [SimEngine(get_profile(PROFILE)) for _ in range(ENGINES)]
        inflight = [0] * ENGINES
        ctl = SloController(slo, loop.time) if "controller" in mode else None
        done = asyncio.Event()
        refused = [0]  # 429s since the last decision: what the gateway could not place
        left = [len(reqs)]

        async def one(i: int, r: Req) -> None:
            try:
                level = ctl.level if ctl is not None else 0
                if "admission" in mode and min(inflight) >= admit:
                    r.rejected = True
                    refused[0] += 1
                    return
                r.level = level
                images = []
                if r.kind != "text":
                    cls = "text" if r.kind == "screenshot" else "photo"
                    r.side = long_side(BUDGET, r.floor, cls, level, slo.photo_scales, slo.text_scales,
                                       slo.photo_floor_long_side)
                    w, h = target_size(r.w, r.h, r.side, GRID)
                    images.append((w, h, f"{seed}/{i}".encode()))
                    text = "Describe this image."
                else:
                    text = "Summarise the following notes. " + "x" * 1170
                k = min(range(ENGINES), key=lambda j: (inflight[j], j))
                inflight[k] += 1
                handle = ctl.sent() if ctl is not None else None
                t0 = loop.time()
                job = engines[k].submit(synthetic_prompt(text, images), OUTPUT_TOKENS)
                first = True
                try:
                    async for _ in job.run():
                        if first:
                            r.ttft = loop.time() - t0
                            if ctl is not None:
                                ctl.answered(handle, r.ttft)
                            first = False
                finally:
                    inflight[k] -= 1
            finally:
                left[0] -= 1
                if not left[0]:
                    done.set()

        async def ticker():
            while not done.is_set():
                await asyncio.sleep(slo.interval_s)
                if ctl is not None:
                    load = PoolLoad(waiting=float(sum(len(e.waiting) for e in engines)),
                                    running=float(sum(len(e.running) for e in engines)),
                                    kv_usage=max(e.cache.usage() for e in engines), gateway_queue=refused[0])
                    refused[0] = 0
                    ctl.update(load)
                    res.levels.append((loop.time(), ctl.level, ctl.last_p))

        tick = asyncio.ensure_future(ticker())
        t_start = loop.time()
        for i, r in enumerate(reqs):
            loop.call_at(t_start + r.t, lambda i=i, r=r: asyncio.ensure_future(one(i, r)))
        await done.wait()
        tick.cancel()
        for e in engines:
            e.close()

    run_virtual(main())
    return res


def capacity(seed: int, concurrency: int = 16, seconds: float = 30.0, level: int = 0,
             slo: SloConfig | None = None) -> float:
    """Requests/s the four engines complete with the images of budget ``level`` (0 = fixed
    budgets), the traffic mix and
    ``concurrency`` requests kept in flight per engine (closed loop: saturated without the
    unbounded queue of an open-loop overload), over the second half of the run."""
    cfg = slo or SloConfig()
    rng = random.Random(seed + 7)
    mix = arrivals(lambda t: 1000.0, 10.0, seed + 7)  # only the kinds are used

    async def main():
        loop = asyncio.get_running_loop()
        engines = [SimEngine(get_profile(PROFILE)) for _ in range(ENGINES)]
        t_end = loop.time() + seconds
        done: list[float] = []
        n = [0]

        async def worker(k: int):
            while loop.time() < t_end:
                r = mix[rng.randrange(len(mix))]
                n[0] += 1
                side = BUDGET
                if level and r.kind != "text":
                    side = long_side(BUDGET, r.floor, "text" if r.kind == "screenshot" else "photo", level,
                                     cfg.photo_scales, cfg.text_scales, cfg.photo_floor_long_side)
                images = [] if r.kind == "text" else [(*target_size(r.w, r.h, side, GRID), f"c{n[0]}".encode())]
                text = "Describe this image." if images else "Summarise the following notes. " + "x" * 1170
                async for _ in engines[k].submit(synthetic_prompt(text, images), OUTPUT_TOKENS).run():
                    pass
                done.append(loop.time())

        t0 = loop.time()
        await asyncio.gather(*(worker(k) for k in range(ENGINES) for _ in range(concurrency)))
        for e in engines:
            e.close()
        return len([t for t in done if t0 + seconds / 2 <= t < t0 + seconds]) / (seconds / 2)

    return run_virtual(main())


def summarise(res: Result, phases: list[tuple[str, float, float]], target_s: float) -> dict:
    out = {"mode": res.mode, "phases": {}}
    for name, a, b in phases:
        ph = [r for r in res.reqs if a <= r.t < b]
        ok = [r for r in ph if r.ttft is not None]
        ttfts = [r.ttft for r in ok]
        imgs = [r for r in ok if r.kind != "text"]
        row = {"sent": len(ph), "offered_rps": round(len(ph) / (b - a), 1),
               "answered_rps": round(len(ok) / (b - a), 1),
               "rejected_share": round(sum(r.rejected for r in ph) / max(1, len(ph)), 4),
               "ttft_p50_ms": round(statistics.median(ttfts) * 1000, 1) if ttfts else None,
               "ttft_p99_ms": round(percentile(ttfts, 0.99) * 1000, 1) if ttfts else None}
        row["p99_over_slo"] = round(row["ttft_p99_ms"] / (target_s * 1000), 2) if ttfts else None
        for kind in ("screenshot", "photo"):
            k = [r for r in imgs if r.kind == kind]
            deg = [r for r in k if r.side < BUDGET]
            row[f"{kind}_degraded_share"] = round(len(deg) / max(1, len(k)), 3)
            row[f"{kind}_mean_scale_of_degraded"] = round(statistics.mean(r.side / BUDGET for r in deg), 3) \
                if deg else None
        shots = [r for r in imgs if r.kind == "screenshot"]
        row["text_below_floor"] = sum(1 for r in shots if r.side < r.floor)
        out["phases"][name] = row
    return out


def timeline(res: Result, duration: float, target_s: float, bin_s: float = 2.0) -> list[dict]:
    rows = []
    n = int(math.ceil(duration / bin_s))
    for i in range(n):
        a, b = i * bin_s, (i + 1) * bin_s
        ph = [r for r in res.reqs if a <= r.t < b]
        tt = [r.ttft for r in ph if r.ttft is not None]
        imgs = [r for r in ph if r.kind != "text" and not r.rejected]
        lv = [lvl for t, lvl, _ in res.levels if a <= t < b]
        rows.append({"t": a, "offered_rps": len(ph) / bin_s, "answered_rps": len(tt) / bin_s,
                     "rejected_rps": sum(r.rejected for r in ph) / bin_s,
                     "ttft_p99_ms": round(percentile(tt, 0.99) * 1000, 1) if tt else None,
                     "level": max(lv) if lv else 0,
                     "degraded_share": round(sum(r.side < BUDGET for r in imgs) / len(imgs), 3) if imgs else 0.0})
    return rows


def recovery_s(res: Result, t_fall: float) -> float | None:
    """Seconds from the load falling until the level is 0 and stays 0."""
    after = [(t, lv) for t, lv, _ in res.levels if t >= t_fall]
    last_nonzero = max((t for t, lv in after if lv), default=None)
    if last_nonzero is None:
        return 0.0
    zero = next((t for t, lv in after if t > last_nonzero and lv == 0), None)
    return None if zero is None else round(zero - t_fall, 1)


def plot(lines: dict, target_ms: float, phases, peak: float, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(4, 1, figsize=(10, 11), sharex=True)
    colors = {"fixed": "tab:red", "admission": "tab:orange", "controller": "tab:blue",
              "controller+admission": "tab:green"}
    for mode, rows in lines.items():
        t = [r["t"] for r in rows]
        axes[0].plot(t, [r["ttft_p99_ms"] or float("nan") for r in rows], label=mode, color=colors[mode])
        axes[1].plot(t, [r["answered_rps"] for r in rows], label=f"{mode} answered", color=colors[mode])
        if "admission" in mode:
            axes[1].plot(t, [r["rejected_rps"] for r in rows], "--", label=f"{mode} 429", color=colors[mode])
        if "controller" in mode:
            axes[2].step(t, [r["level"] for r in rows], where="post", color=colors[mode], label=mode)
            axes[3].plot(t, [r["degraded_share"] for r in rows], color=colors[mode], label=mode)
    axes[1].plot([r["t"] for r in lines["fixed"]], [r["offered_rps"] for r in lines["fixed"]], ":", color="grey",
                 label="offered")
    axes[0].axhline(target_ms, color="k", ls=":", label="SLO (p99)")
    axes[0].set_yscale("log")
    axes[0].set_ylabel("TTFT p99 (ms, by send time)")
    axes[1].set_ylabel("req/s")
    axes[2].set_ylabel("budget level")
    axes[3].set_ylabel("images degraded (share)")
    axes[3].set_xlabel("simulated seconds")
    for ax in axes:
        _, a, b = phases[1]
        ax.axvspan(a, b, color="grey", alpha=0.1)
        ax.legend(loc="upper right", fontsize=7)
    fig.suptitle(f"Step load 0.5x -> {peak:g}x -> 0.5x of fixed-budget capacity, 4 simulated H200")
    fig.tight_layout()
    fig.savefig(path, dpi=80)


MODES = ("fixed", "admission", "controller", "controller+admission")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--slo-ms", type=float, default=2000.0, help="slo.ttft_ms (p99)")
    ap.add_argument("--phases", default="30,60,60", help="seconds at 0.5x, peak, 0.5x")
    ap.add_argument("--peaks", default="2,1.4", help="peak load(s), x fixed-budget capacity")
    ap.add_argument("--admit", type=int, default=0, help="admission: in-flight cap per engine "
                    "(0 = 0.8 x capacity x SLO / engines, Little's law with a margin)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", default="", help="JSON results")
    ap.add_argument("--plot", default="", help="PNG path prefix: <prefix>-<peak>x.png")
    args = ap.parse_args(argv)
    p1, p2, p3 = (float(x) for x in args.phases.split(","))
    slo = SloConfig(ttft_ms=args.slo_ms)
    target_s = slo.ttft_ms / 1000.0
    by_level = {lv: round(capacity(args.seed, level=lv, slo=slo), 1) for lv in range(len(slo.photo_scales) + 1)}
    cap = by_level[0]
    admit = args.admit or max(1, int(0.8 * cap * target_s / ENGINES))
    phases = [("0.5x", 0.0, p1), ("peak", p1, p1 + p2), ("0.5x after", p1 + p2, p1 + p2 + p3)]
    duration = p1 + p2 + p3
    print(f"capacity by level (req/s, {ENGINES} x {PROFILE}, closed loop): {by_level}; SLO p99 "
          f"{slo.ttft_ms:g} ms; admission cap {admit}/engine", flush=True)
    out = {"profile": PROFILE, "engines": ENGINES, "capacity_rps": cap, "capacity_by_level_rps": by_level,
           "slo_ttft_ms": slo.ttft_ms, "percentile": slo.percentile, "phases_s": [p1, p2, p3],
           "admission_inflight_per_engine": admit, "seed": args.seed, "slo_config": dict(slo.__dict__),
           "runs": {}}
    for peak in (float(x) for x in args.peaks.split(",")):
        def rate_at(t: float, peak=peak) -> float:
            return cap * (peak if p1 <= t < p1 + p2 else 0.5)
        reqs = arrivals(rate_at, duration, args.seed)
        run = {"peak": peak, "requests": len(reqs), "modes": {}, "timeline": {}}
        print(f"-- peak {peak:g}x: {len(reqs)} requests over {duration:g} s", flush=True)
        for mode in MODES:
            res = simulate(mode, reqs, slo, admit, args.seed)
            s = summarise(res, phases, target_s)
            if "controller" in mode:
                s["recovery_s"] = recovery_s(res, p1 + p2)
                s["max_level"] = max((lv for _, lv, _ in res.levels), default=0)
                s["level_changes"] = sum(1 for a, b in zip(res.levels, res.levels[1:]) if a[1] != b[1])
            run["modes"][mode] = s
            run["timeline"][mode] = timeline(res, duration, target_s)
            pk = s["phases"]["peak"]
            print(f"{mode:>22}: peak p99 {pk['ttft_p99_ms']} ms ({pk['p99_over_slo']}x SLO), answered "
                  f"{pk['answered_rps']}/s, 429 {pk['rejected_share']:.1%}, degraded screenshots "
                  f"{pk['screenshot_degraded_share']:.0%} photos {pk['photo_degraded_share']:.0%}, text below "
                  f"floor {pk['text_below_floor']}, after p99 {s['phases']['0.5x after']['ttft_p99_ms']} ms"
                  + (f", recovery {s['recovery_s']} s, max level {s['max_level']}, changes {s['level_changes']}"
                     if "controller" in mode else ""), flush=True)
        out["runs"][f"{peak:g}x"] = run
        if args.plot:
            plot(run["timeline"], slo.ttft_ms, phases, peak, f"{args.plot}-{peak:g}x.png")
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
