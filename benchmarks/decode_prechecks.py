"""What the decode pre-checks of #32 cost per image and per video.

    PYTHONPATH=. python benchmarks/decode_prechecks.py [--rounds 31] [--out docs/benchmarks/hardening-prechecks.json]

Images (1920x1080 photo JPEG, screenshot PNG, AVIF and HEIC): the checks alone
(``memory.need`` with libjpeg's coefficient count; for AVIF/HEIF the structural scan with
``isobmff.check`` less the scan without it), and the whole rewrite with the checks against the same rewrite with them
taken out (``memory.need`` returning 0, ``isobmff.check`` a no-op), alternating in one
run, each round in the other order. Video (a 10 s 1280x720 30 fps H.264 clip with AAC, as MP4, and the same frames as
Matroska and MJPEG/AVI): ``tables.check`` alone, and ``open_video`` with and without it
and with and without the decoders' max_pixels (the table walk, the codec option and the
log capture); the whole video rewrite with everything against without. Medians of
``--rounds`` rounds of CPU time (thread_time), p99 where a round is many calls.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from contextlib import contextmanager

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

import image_corpus as C  # noqa: E402
import video_corpus as V  # noqa: E402
from vlm_gateway.stages.images import isobmff, memory  # noqa: E402
from vlm_gateway.stages.images import decode as D  # noqa: E402
from vlm_gateway.stages.images.rewrite import rewrite_bytes  # noqa: E402
from vlm_gateway.stages.video import decode as VD, probe, tables  # noqa: E402
from vlm_gateway.stages.video.rewrite import rewrite_video  # noqa: E402
from vlm_gateway.stages.video.settings import VideoSettings  # noqa: E402


def cpu(fn, n: int = 1) -> float:
    """CPU seconds per call of ``fn`` over ``n`` calls."""
    t = time.thread_time()
    for _ in range(n):
        fn()
    return (time.thread_time() - t) / n


@contextmanager
def without_image_checks():
    need, check = memory.need, isobmff.check
    memory.need = lambda *a, **k: 0
    isobmff.check = lambda *a, **k: None
    try:
        yield
    finally:
        memory.need, isobmff.check = need, check


@contextmanager
def without_video_checks():
    check, mp = tables.check, probe.max_pixels
    tables.check = lambda *a, **k: None
    probe.max_pixels = VD.max_pixels = lambda s: 2**31 - 1  # FFmpeg's own default, INT_MAX
    try:
        yield
    finally:
        tables.check, probe.max_pixels, VD.max_pixels = check, mp, mp


def med(xs: list[float]) -> float:
    return statistics.median(xs)


def p99(xs: list[float]) -> float:
    return sorted(xs)[min(len(xs) - 1, int(0.99 * len(xs)))]


def images(rounds: int) -> dict:
    photo = C.save(C.Image.fromarray(C.photo_array(1920, 1080)), "JPEG", quality=90)
    cases = {"jpeg_1080p": photo, "png_1080p": C.desktop_screenshot_png(1920, 1080),
             "avif_1080p": C.avif(1920, 1080), "heic_1080p": C.heic(1920, 1080)}
    out = {}
    for name, data in cases.items():
        fmt = D.sniff(data)
        op = D.open_checked(data, fmt, 64_000_000)
        checks = []

        def one():
            memory.need(fmt, op.im, op.nclx, after="rewrite",
                        coefficients=memory.jpeg_coefficients(op.im, op.scans) if fmt == "jpeg" else 0)
        for _ in range(rounds):
            checks.append(cpu(one, 200))
            if fmt in ("avif", "heif"):  # the item boxes' walk, beside the scan's own
                scan = cpu(lambda: D.structure.scan(data, fmt, 64_000_000, crc=False), 200)
                with without_image_checks():
                    scan0 = cpu(lambda: D.structure.scan(data, fmt, 64_000_000, crc=False), 200)
                checks[-1] += max(0.0, scan - scan0)
        with_, without = [], []
        rewrite_bytes(data)
        for i in range(rounds):  # alternating, in both orders: the machine's load falls on both alike
            for checked in ((True, False) if i % 2 else (False, True)):
                if checked:
                    with_.append(cpu(lambda: rewrite_bytes(data)))
                else:
                    with without_image_checks():
                        without.append(cpu(lambda: rewrite_bytes(data)))
        out[name] = {"bytes": len(data), "checks_us": round(med(checks) * 1e6, 1),
                     "checks_us_p99": round(p99(checks) * 1e6, 1),
                     "rewrite_ms": round(med(with_) * 1e3, 2), "rewrite_ms_without": round(med(without) * 1e3, 2),
                     "ratio": round(med(with_) / med(without), 3)}
        print(name, out[name], flush=True)
    return out


def videos(rounds: int) -> dict:
    s = VideoSettings()
    clip = V.with_audio(10, w=1280, h=720, fps=30)
    frames = list(V.motion_frames(10, 1280, 720, 30))
    cases = {"mp4_h264_aac_10s": ("mp4", clip), "mkv_h264_10s": ("webm", V.encode(frames, 30, fmt="matroska")),
             "avi_mjpeg_10s": ("avi", V.encode(frames, 30, fmt="avi", codec="mjpeg", pix_fmt="yuvj420p"))}
    del frames
    out = {}
    for name, (kind, data) in cases.items():
        checks = [cpu(lambda: tables.check(data, kind, s), 50) for _ in range(rounds)]

        def opened():
            c, _, _ = probe.open_video(data, s)
            c.close()
        with_, without = [], []
        for i in range(rounds):
            for checked in ((True, False) if i % 2 else (False, True)):
                if checked:
                    with_.append(cpu(opened, 5))
                else:
                    with without_video_checks():
                        without.append(cpu(opened, 5))
        out[name] = {"bytes": len(data), "tables_us": round(med(checks) * 1e6, 1),
                     "tables_us_p99": round(p99(checks) * 1e6, 1),
                     "open_ms": round(med(with_) * 1e3, 3), "open_ms_without": round(med(without) * 1e3, 3),
                     "open_ratio": round(med(with_) / med(without), 3)}
        if kind == "mp4":
            rw, rw0 = [], []
            for i in range(max(4, rounds // 3)):
                for checked in ((True, False) if i % 2 else (False, True)):
                    if checked:
                        rw.append(cpu(lambda: rewrite_video(data, s)))
                    else:
                        with without_video_checks():
                            rw0.append(cpu(lambda: rewrite_video(data, s)))
            out[name].update(rewrite_s=round(med(rw), 3), rewrite_s_without=round(med(rw0), 3),
                             rewrite_ratio=round(med(rw) / med(rw0), 3))
        print(name, out[name], flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=31)
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    res = {"date": time.strftime("%Y-%m-%d"), "rounds": a.rounds, "python": sys.version.split()[0],
           "images": images(a.rounds), "videos": videos(a.rounds)}
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
