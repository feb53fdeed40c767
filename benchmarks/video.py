"""CPU cost of the video rewrite, and threads vs processes for decoding.

    python benchmarks/video.py [--reps 3] [--cache DIR]
    python benchmarks/video.py --threads 1,2 [--reps 3]    # one video's rewrite, decode threads
    python benchmarks/video.py --outputs [--reps 3]        # what the engine's loader reads cheapest

Clips (generated, deterministic; cached in --cache): (i) 10 s 1280x720 at 30 fps with
motion in every frame, (ii) 60 s 1920x1080 at 30 fps screen recording changing every
3-6 s. Per clip: decode only with PyAV and with OpenCV (the alternative library), then
the whole rewrite; CPU seconds (time.thread_time, one thread: one core) per second of
video, medians over --reps. Then 4 rewrites of clip (i) on a pool of 2 threads vs 2
processes: wall time, to see whether PyAV's decode runs in parallel under the GIL.

``--threads 1,2``: wall and process CPU time of one rewrite per clip with that many FFmpeg
decode threads (what ``video.decode_threads: 0`` grants one video on idle cores), the
settings alternating run by run.

``--outputs``: the rewrite's output frames of each clip encoded again by each candidate
(H.264 veryfast as before, with x264's ``fastdecode`` tune, ``ultrafast`` as sent now,
all-intra, the baseline profile; MJPEG), then read as vLLM 0.24's OpenCV loader reads a video (``VideoCapture`` on
the bytes, ``grab`` + ``retrieve`` of every frame, BGR -> RGB), with OpenCV's default codec
threads (what the engine gets) and with one (its CPU), and decoded by PyAV (vLLM's other
video backend) at one thread: the gateway's encode time, the engine's decode wall and CPU
time, bytes, PSNR against the frames encoded, and whether OpenCV still reports the frame
count and rate the token rule needs.
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


def threads_run(clip_set: dict, threads: list[int], reps: int) -> dict:
    """One rewrite per clip, alternating decode threads: wall and process CPU seconds."""
    out = {}
    for name, (data, seconds) in clip_set.items():
        got: dict[int, dict[str, list[float]]] = {n: {"wall": [], "cpu": []} for n in threads}
        for r in range(reps):
            for n in (threads if r % 2 == 0 else threads[::-1]):
                w, c = time.perf_counter(), time.process_time()
                rewrite_video(data, VideoSettings(decode_threads=n))
                got[n]["wall"].append(time.perf_counter() - w)
                got[n]["cpu"].append(time.process_time() - c)
        out[name] = {str(n): {"wall_s": round(statistics.median(v["wall"]), 3), "cpu_s": round(statistics.median(v["cpu"]), 3),
                              "wall_all": [round(x, 3) for x in v["wall"]]} for n, v in got.items()}
        print(name, json.dumps(out[name]), flush=True)
    return out


def output_frames(data: bytes):
    """(frames, rate) the rewrite encodes for ``data``."""
    from vlm_gateway.stages.video import encode as enc
    got = {}
    real = enc.encode_mp4

    def grab(frames, rate, crf=20, preset="veryfast"):
        got["frames"], got["rate"] = frames, rate
        return real(frames, rate, crf, preset)
    enc.encode_mp4 = grab
    try:
        rewrite(data)
    finally:
        enc.encode_mp4 = real
    return got["frames"], got["rate"]


def encode_variant(frames, rate, codec: str, options: dict, fmt: str = "mp4", pix_fmt: str = "yuv420p") -> bytes:
    import av
    import numpy as np
    from fractions import Fraction
    h, w = frames[0].shape[:2]
    rate = Fraction(rate)
    buf = io.BytesIO()
    with av.open(buf, mode="w", format=fmt) as out:
        s = out.add_stream(codec, rate=rate, options=options)
        s.width, s.height, s.pix_fmt = w, h, pix_fmt
        s.time_base = 1 / rate
        s.codec_context.thread_count = 1
        for j, arr in enumerate(frames):
            vf = av.VideoFrame.from_ndarray(np.ascontiguousarray(arr), format="rgb24")
            vf.pts = j
            for p in s.encode(vf):
                out.mux(p)
        for p in s.encode():
            out.mux(p)
    return buf.getvalue()


X264 = {"crf": "20", "preset": "veryfast", "threads": "1", "x264-params": "keyint=600:min-keyint=1"}
VARIANTS = {
    "h264_veryfast (before)": ("libx264", X264),
    "h264_veryfast_fastdecode": ("libx264", {**X264, "tune": "fastdecode"}),
    "h264_ultrafast (sent now)": ("libx264", {**X264, "preset": "ultrafast"}),
    "h264_veryfast_intra": ("libx264", {**X264, "x264-params": "keyint=1"}),
    "h264_veryfast_baseline": ("libx264", {**X264, "profile": "baseline"}),
    "mjpeg_q3": ("mjpeg", {"qmin": "3", "qmax": "3"}),
}


def opencv_read(data: bytes, threads: int | None) -> tuple[int, float, list]:
    """As vLLM's OpenCV loader: open from the bytes, every frame grabbed and retrieved, to RGB."""
    import cv2
    import cv2.videoio_registry as vr
    params = [] if threads is None else [cv2.CAP_PROP_N_THREADS, threads]
    cap = cv2.VideoCapture(io.BytesIO(data), vr.getStreamBufferedBackends()[0], params)
    n, fps = int(cap.get(cv2.CAP_PROP_FRAME_COUNT)), cap.get(cv2.CAP_PROP_FPS)
    frames = []
    while cap.grab():
        ok, f = cap.retrieve()
        frames.append(cv2.cvtColor(f, cv2.COLOR_BGR2RGB))
    return n, fps, frames


def outputs_run(clip_set: dict, reps: int) -> dict:
    import numpy as np
    out = {}
    for name, (data, _seconds) in clip_set.items():
        frames, rate = output_frames(data)
        ref = np.stack(frames).astype(np.float64)
        row = {"frames": len(frames), "size": f"{frames[0].shape[1]}x{frames[0].shape[0]}", "rate": str(rate),
               "variants": {}}
        for vname, (codec, opts) in VARIANTS.items():
            pix = "yuvj420p" if codec == "mjpeg" else "yuv420p"
            fmt = "avi" if codec == "mjpeg" else "mp4"
            enc_s, enc_cpu, wall, cpu1, pyav1 = [], [], [], [], []
            for _ in range(reps):
                t, c = time.perf_counter(), time.thread_time()
                b = encode_variant(frames, rate, codec, opts, fmt, pix)
                enc_s.append(time.perf_counter() - t)
                enc_cpu.append(time.thread_time() - c)  # one encoder thread: all its CPU
                t = time.perf_counter()
                n, fps, got = opencv_read(b, None)
                wall.append(time.perf_counter() - t)
                t = time.thread_time()
                opencv_read(b, 1)
                cpu1.append(time.thread_time() - t)
                t = time.thread_time()
                pyav_decode(b)
                pyav1.append(time.thread_time() - t)
            mse = float(np.mean((np.stack(got).astype(np.float64) - ref) ** 2)) if len(got) == len(frames) else None
            row["variants"][vname] = {
                "bytes": len(b), "gateway_encode_s": round(statistics.median(enc_s), 4),
                "gateway_encode_cpu_s": round(statistics.median(enc_cpu), 4),
                "engine_read_wall_s": round(statistics.median(wall), 4),
                "engine_read_cpu_s_1thread": round(statistics.median(cpu1), 4),
                "pyav_read_cpu_s_1thread": round(statistics.median(pyav1), 4),
                "psnr_db": round(10 * np.log10(255 ** 2 / mse), 2) if mse else None,
                "opencv_frames": n, "opencv_fps": round(fps, 4), "frames_read": len(got),
                "count_and_rate_exact": n == len(frames) == len(got) and abs(fps - float(rate)) < 1e-6}
            print(name, vname, json.dumps(row["variants"][vname]), flush=True)
        out[name] = row
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--cache", default="/tmp/vlmgw-video-bench")
    ap.add_argument("--out", default="")
    ap.add_argument("--threads", default="")
    ap.add_argument("--outputs", action="store_true")
    a = ap.parse_args()
    if a.threads or a.outputs:
        cs = clips(Path(a.cache))
        res = {"machine": os.uname().nodename, "cpus": len(os.sched_getaffinity(0))}
        if a.threads:
            res["threads"] = threads_run(cs, [int(x) for x in a.threads.split(",")], a.reps)
        if a.outputs:
            res["outputs"] = outputs_run(cs, a.reps)
        if a.out:
            Path(a.out).write_text(json.dumps(res, indent=1))
        return
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
