"""Screen recordings: visual tokens of the raw video vs the two output plans, and the bound.

    python benchmarks/video_plans.py [--cache DIR] [--seeds 10] [--out result.json]

1. The benchmark clip (60 s 1920x1080 at 30 fps, screen changing every 3-6 s, seed 1;
   cached in --cache like benchmarks/video.py) rewritten with each plan: frames sent,
   engine groups, visual tokens, groups that pair two different screens, and whether every
   screen state reached the output (each output frame matched to the nearest true state
   on 128-px thumbnails).
2. For --seeds change schedules of the same generator (analytic: the states on the 2 fps
   sampling grid, no video encoded): the same counts per plan, and the bound of any plan
   that gives each state an engine group of its own at the frame size sent,
   ``S x tokens_per_group``, against the raw request's ``60 x 190`` (vLLM gives 120 frames
   of a 60 s video 608x320 each: one pixel budget for all frames).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from fractions import Fraction
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the synthetic corpus
from vlm_gateway import video_tokens as vt  # noqa: E402
import video_corpus as corpus  # noqa: E402
from vlm_gateway.stages.video import dedupe  # noqa: E402
from vlm_gateway.stages.video.plan import plan_frames, plan_groups  # noqa: E402
from vlm_gateway.stages.video.rewrite import rewrite_video  # noqa: E402
from vlm_gateway.stages.video.settings import VideoSettings  # noqa: E402

SECONDS, W, H, FPS = 60, 1920, 1080, 30


def states_shown(data: bytes, times: list[float], seed: int) -> list[int]:
    """The true state each output frame shows (nearest thumbnail of the generated screens)."""
    import av
    import io
    states = corpus.screen_states(W, H, len(times), seed)
    thumbs = [dedupe.thumbnail(av.VideoFrame.from_ndarray(s, format="rgb24"), 128).astype(int) for s in states]
    out = []
    with av.open(io.BytesIO(data)) as c:
        for f in c.decode(video=0):
            big = f.reformat(width=W, height=H, format="rgb24").to_ndarray()
            t = dedupe.thumbnail(av.VideoFrame.from_ndarray(big, format="rgb24"), 128).astype(int)
            out.append(int(np.argmin([np.abs(t - u).mean() for u in thumbs])))
    return out


def mixed(shown: list[int]) -> int:
    return sum(1 for j in range(0, len(shown) - 1, 2) if shown[j] != shown[j + 1])


def clip(cache: Path) -> tuple[bytes, list[float]]:
    cache.mkdir(parents=True, exist_ok=True)
    p = cache / "screen_60s_1080p30.mp4"
    times = corpus.screen_change_times(SECONDS, 1)
    if not p.exists():
        p.write_bytes(corpus.screen_recording(SECONDS, W, H, FPS)[0])
    return p.read_bytes(), times


def analytic(seed: int, tpg: int) -> dict:
    times = corpus.screen_change_times(SECONDS, seed)
    f = 2
    K = SECONDS * f + 1
    st = [max(j for j, t in enumerate(times) if t <= k / f + 1e-9) for k in range(K)]
    kept = [k == 0 or st[k] != st[k - 1] for k in range(K)]
    raw = vt.video_tokens(SECONDS * FPS, FPS, W, H)
    row = {"seed": seed, "states": len(times),
           "shortest_state_s": round(min(b - a for a, b in zip(times, times[1:])), 1), "raw_visual": raw.visual}
    for name, fn in (("frames", plan_frames), ("groups", plan_groups)):
        p = fn(kept, Fraction(f), Fraction(1, 5))
        groups = -(-len(p.sources) // 2)
        row[name] = {"frames": len(p.sources), "groups": groups, "visual": groups * tpg,
                     "ratio": round(raw.visual / (groups * tpg), 2), "mixed_groups": p.mixed_groups,
                     "states_shown": len(set(p.sources))}
    row["bound_one_group_per_state"] = round(raw.visual / (len(times) * tpg), 2)
    row["bound_at_raw_frame_size"] = round(raw.visual / (len(times) * raw.tokens_per_group), 2)
    row["tokens_per_group_for_5x"] = raw.visual // (5 * len(times))
    return row


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cache", default="/tmp/vlmgw-video-bench")
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    data, times = clip(Path(a.cache))
    res: dict = {"clip": {}, "schedules": []}
    raw = vt.video_tokens(SECONDS * FPS, FPS, W, H)
    res["raw"] = {"frames": raw.frames, "size": f"{raw.width}x{raw.height}", "groups": raw.groups,
                  "tokens_per_group": raw.tokens_per_group, "visual": raw.visual, "total": raw.total}
    print("raw", json.dumps(res["raw"]), flush=True)
    tpg = None
    for plan in ("frames", "groups"):
        r = rewrite_video(data, VideoSettings(plan=plan))
        shown = states_shown(r.data, times, 1)
        tpg = r.after.tokens_per_group
        row = {"frames": r.frames, "rate": str(r.plan.rate), "size": f"{r.width}x{r.height}",
               "groups": r.after.groups, "visual": r.after.visual, "total": r.after.total,
               "ratio_visual": round(raw.visual / r.after.visual, 2), "states": len(times),
               "states_kept": len(set(shown)), "every_state_kept": set(shown) == set(range(len(times))),
               "mixed_groups_seen": mixed(shown), "mixed_groups_planned": r.plan.mixed_groups,
               "cpu_s": round(r.cpu_s, 2), "bytes": len(r.data)}
        res["clip"][plan] = row
        print(plan, json.dumps(row), flush=True)
    for seed in range(1, a.seeds + 1):
        row = analytic(seed, tpg)
        res["schedules"].append(row)
        print(json.dumps(row), flush=True)
    sch = res["schedules"]
    res["summary"] = {k: {"ratio_median": statistics.median(r[k]["ratio"] for r in sch),
                          "ratio_min": min(r[k]["ratio"] for r in sch), "ratio_max": max(r[k]["ratio"] for r in sch),
                          "mixed_groups_median": statistics.median(r[k]["mixed_groups"] for r in sch)}
                      for k in ("frames", "groups")}
    res["summary"]["bound_median"] = statistics.median(r["bound_one_group_per_state"] for r in sch)
    print(json.dumps(res["summary"]), flush=True)
    if a.out:
        Path(a.out).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
