"""Streaming decode with hard bounds: ``frames(container, stream, header, settings)``
yields ``(t, frame)`` for every decoded frame, ``t`` in seconds from the first frame
(a frame without a timestamp, or one that goes backwards, takes the previous time).

Bounds, checked on what is decoded, each a VideoError with its code:
- frames decoded <= max_source_frames                    video_too_many_frames
- every frame's pixels <= max_frame_pixels (a stream may change size mid-way)
                                                          video_frame_too_large
- sum of decoded pixels <= max_decoded_pixels            video_too_many_pixels
- t <= max_duration_s                                    video_too_long
- wall clock since ``started`` <= max_decode_s           video_decode_timeout
- a frame the decoder refuses to allocate (its codec context's max_pixels, probe.py)
                                                          video_frame_too_large
- FFmpeg demux/decode errors                              video_corrupt
- fewer frames than the container declares (nb_frames)   video_truncated

Memory: one decoded frame at a time plus FFmpeg's reference frames; the caller keeps
only what it samples. Codec threads: ``threads`` (1 by default: the pool gives the
parallelism, one decode per worker).

``skip_nonref``: FFmpeg skips frames no other frame references (B-frames of H.264/HEVC
streams: about half the frames of a typical encode, 40% of the decode time measured on
the benchmark clips). The caller asks for it only when it samples far below the source
rate, so every sampling interval still holds decoded frames. The frame count limits and
the truncation check then count demuxed packets (one a frame), and the duration limit
reads packet timestamps too, so skipped frames are bounded like decoded ones.
"""

from __future__ import annotations

import time
import errno
from typing import Iterator

from .errors import VideoError
from .probe import VideoHeader, max_pixels, oversized_frame
from .settings import VideoSettings


def frames(container, stream, header: VideoHeader, settings: VideoSettings, started: float | None = None,
           threads: int = 1, skip_nonref: bool = False) -> Iterator[tuple[float, object]]:
    import av

    started = time.monotonic() if started is None else started
    cc = stream.codec_context
    # FFmpeg refuses (EINVAL) a frame above this before allocating it: a stream that declares
    # 64x64 may carry a 16000x16000 frame mid-way (MJPEG: every frame has its own header)
    cc.options = {**(cc.options or {}), "max_pixels": str(max_pixels(settings))}
    cc.thread_count = max(1, threads)   # PyAV's default (0) would start a thread per core
    if threads > 1:
        cc.thread_type = "AUTO"
    if skip_nonref:
        cc.skip_frame = "NONREF"
    logs = av.logging.Capture(local=True)  # FFmpeg's messages while this thread decodes
    try:
        with logs:
            yield from _bounded(container, stream, header, settings, started, skip_nonref)
    except av.FFmpegError as e:
        too_large = oversized_frame(logs.logs, settings)
        if too_large is not None:
            raise too_large from None
        if e.errno == errno.EINVAL:
            raise VideoError(f"a frame of the video is larger than the limit of "
                             f"{settings.max_frame_pixels / 1e6:.1f} megapixels (the decoder refused it)",
                             "video_frame_too_large") from None
        raise VideoError(f"the video stream is corrupt ({str(e).split(':')[0][:80]})", "video_corrupt") from None


def _bounded(container, stream, header: VideoHeader, settings: VideoSettings, started: float,
             skip_nonref: bool) -> Iterator[tuple[float, object]]:
    """``frames`` without the error mapping (FFmpeg's errors propagate)."""
    n = 0          # frames decoded
    packets = 0    # frames in the stream (one packet each), decoded or skipped
    pixels = 0
    t0: float | None = None
    p0: float | None = None
    last_t = 0.0
    for packet in container.demux(stream):
        if time.monotonic() - started > settings.max_decode_s:
            raise VideoError(f"decoding the video took more than {settings.max_decode_s:.0f} s",
                             "video_decode_timeout")
        if packet.size:
            packets += 1
            if packets > settings.max_source_frames:
                raise VideoError(f"the video has more than {settings.max_source_frames} frames",
                                 "video_too_many_frames")
            if skip_nonref and packet.pts is not None and packet.time_base:
                pt = float(packet.pts * packet.time_base)
                p0 = pt if p0 is None else min(p0, pt)
                if pt - p0 > settings.max_duration_s:
                    raise VideoError(f"the video runs longer than {settings.max_duration_s:.0f} s",
                                     "video_too_long")
        for frame in packet.decode():
            n += 1
            if n > settings.max_source_frames:
                raise VideoError(f"the video has more than {settings.max_source_frames} frames",
                                 "video_too_many_frames")
            fp = frame.width * frame.height
            if fp > settings.max_frame_pixels:
                raise VideoError(f"a frame of the video is {frame.width}x{frame.height}, above the limit of "
                                 f"{settings.max_frame_pixels / 1e6:.1f} megapixels", "video_frame_too_large")
            pixels += fp
            if pixels > settings.max_decoded_pixels:
                raise VideoError(f"the video decodes to more than {settings.max_decoded_pixels / 1e9:.1f} "
                                 "gigapixels in all", "video_too_many_pixels")
            ft = frame.time
            if ft is not None:
                if t0 is None:
                    t0 = ft
                t = max(last_t, ft - t0)
            else:
                t = last_t if n > 1 else 0.0
            if t > settings.max_duration_s:
                raise VideoError(f"the video runs longer than {settings.max_duration_s:.0f} s",
                                 "video_too_long")
            last_t = t
            yield t, frame
    if n == 0:
        raise VideoError("the video stream has no decodable frame", "video_corrupt")
    declared = header.nb_frames
    got = packets if skip_nonref else n
    if declared and got + max(2, declared // 100) < declared:
        raise VideoError(f"the video is truncated: {got} of the {declared} frames it declares could be read",
                         "video_truncated")
