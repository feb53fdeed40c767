"""Deterministic constant-rate H.264 in MP4, the form vLLM's OpenCV loader reads exactly.

``encode_mp4(frames, rate, crf, preset)``: frames (uint8 H x W x 3 RGB, all one size,
both sides even) at ``rate`` frames per second (a Fraction: the MP4 time base is
``1 / rate``, frame ``j`` has pts ``j``), libx264 in one thread (x264's output is a
function of its input and settings), yuv420p, no container timestamps or metadata that
vary between runs: the same frames and settings give the same bytes, so the engine's
multimodal cache and the gateway's L1 hit on a repeat. The preset (``ultrafast``: no
B-frames, CAVLC, no deblocking) is what costs least to encode here and to decode in the
engine's loader (docs/benchmarks/video.md).

What OpenCV (FFmpeg backend) then reports, checked in tests with OpenCV itself:
``CAP_PROP_FRAME_COUNT`` = len(frames) (the MP4 sample table), ``CAP_PROP_FPS`` = rate,
and every frame grabs.
"""

from __future__ import annotations

import io
from fractions import Fraction

import numpy as np

MIME = "video/mp4"


def encode_mp4(frames: list[np.ndarray], rate: Fraction, crf: int = 20, preset: str = "ultrafast") -> bytes:
    import av

    if not frames:
        raise ValueError("no frames to encode")
    h, w = frames[0].shape[:2]
    if w % 2 or h % 2:
        raise ValueError("frame sides must be even for yuv420p")
    rate = Fraction(rate)
    buf = io.BytesIO()
    with av.open(buf, mode="w", format="mp4") as out:
        s = out.add_stream("libx264", rate=rate,
                           options={"crf": str(crf), "preset": preset, "threads": "1",
                                    "x264-params": "keyint=600:min-keyint=1"})
        s.width, s.height, s.pix_fmt = w, h, "yuv420p"
        s.time_base = 1 / rate
        s.codec_context.thread_count = 1
        for j, arr in enumerate(frames):
            if arr.shape[:2] != (h, w):
                raise ValueError("all frames must have one size")
            vf = av.VideoFrame.from_ndarray(np.ascontiguousarray(arr), format="rgb24")
            vf.pts = j   # in the stream's time base (setting the frame's own breaks B-frame muxing)
            for p in s.encode(vf):
                out.mux(p)
        for p in s.encode():
            out.mux(p)
    return buf.getvalue()
