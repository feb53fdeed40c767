"""CPU cost of the video rewrite, and threads vs processes for decoding.

    python benchmarks/video.py [--reps 3] [--cache DIR]

Clips (generated, deterministic; cached in --cache): (i) 10 s 1280x720 at 30 fps with
motion in every frame, (ii) 60 s 1920x1080 at 30 fps screen recording changing every
3-6 s. Per clip: decode only with PyAV and with OpenCV (the alternative library), then
the whole rewrite; CPU seconds (time.thread_time, one thread: one core) per second of
video, medians over --reps. Then 4 rewrites of clip (i) on a pool of 2 threads vs 2
processes: wall time, to see whether PyAV's decode runs in parallel under the GIL.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the synthetic corpus
import video_corpus as corpus  # noqa: E402
from vlm_gateway.stages.video.rewrite import rewrite_video  # noqa: E402
from vlm_gateway.stages.video.settings import VideoSettings  # noqa: E402


def clips(cache: Path) -> dict[str, tuple[bytes, float]]:
    cache.mkdir(parents=True, exist_ok=True)
    out = {}
    for name, seconds, make in [("motion_10s_720p30", 10, lambda: corpus.motion_clip(10, 1280, 720, 30)),
                                ("screen_60s_1080p30", 60, lambda: corpus.screen_recording(60, 1920, 1080, 30)[0])]:
        p = cache / f"{name}.mp4"
        if not p.exists():
            p.write_bytes(make())
        out[name] = (p.read_bytes(), seconds)
    return out


def pyav_decode(data: bytes) -> int:
    import av
    n = 0
    with av.open(io.BytesIO(data)) as c:
        s = c.streams.video[0]
        s.codec_context.thread_count = 1
        for _ in c.decode(s):
            n += 1
    return n


def opencv_decode(data: bytes) -> int:
    import cv2
    import cv2.videoio_registry as vr
    cv2.setNumThreads(1)
    cap = cv2.VideoCapture(io.BytesIO(data), vr.getStreamBufferedBackends()[0],
                           [cv2.CAP_PROP_N_THREADS, 1])
    n = 0
    while cap.grab():
        n += 1
    return n


def cpu(fn, *args) -> tuple[float, float, object]:
    c, w = time.thread_time(), time.perf_counter()
    r = fn(*args)
    return time.thread_time() - c, time.perf_counter() - w, r


def rewrite(data: bytes):
    return rewrite_video(data, VideoSettings())


def _job(data: bytes) -> float:
    return rewrite(data).cpu_s


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--cache", default="/tmp/vlmgw-video-bench")
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    res = {"machine": os.uname().nodename, "cpus": os.cpu_count(), "clips": {}}
    for name, (data, seconds) in clips(Path(a.cache)).items():
        row = {"bytes": len(data), "seconds": seconds}
        for label, fn in [("pyav_decode", pyav_decode), ("opencv_decode", opencv_decode), ("rewrite", rewrite)]:
            cs, ws = [], []
            for _ in range(a.reps):
                c, w, r = cpu(fn, data)
                cs.append(c)
                ws.append(w)
            row[label] = {"cpu_s": statistics.median(cs), "wall_s": statistics.median(ws),
                          "cpu_s_per_video_s": statistics.median(cs) / seconds}
            if label == "rewrite":
                row["rewrite_out"] = {"bytes": len(r.data), "frames": r.frames, "rate": str(r.plan.rate),
                                      "size": f"{r.width}x{r.height}", "states": r.plan.states,
                                      "tokens_before": r.before.total if r.before else None,
                                      "tokens_after": r.after.total,
                                      "visual_before": r.before.visual if r.before else None,
                                      "visual_after": r.after.visual}
        res["clips"][name] = row
        print(name, json.dumps(row), flush=True)
    data = clips(Path(a.cache))["motion_10s_720p30"][0]
    for label, ex in [("threads", ThreadPoolExecutor(2)), ("processes", ProcessPoolExecutor(2))]:
        with ex:
            list(ex.map(_job, [data] * 2))            # warm (process start, imports)
            w = time.perf_counter()
            list(ex.map(_job, [data] * 4))
            res[f"pool_{label}_4_jobs_wall_s"] = time.perf_counter() - w
        print(label, res[f"pool_{label}_4_jobs_wall_s"], flush=True)
    w = time.perf_counter()
    for _ in range(4):
        _job(data)
    res["serial_4_jobs_wall_s"] = time.perf_counter() - w
    print("serial", res["serial_4_jobs_wall_s"], flush=True)
    if a.out:
        Path(a.out).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
