"""Container sniffing and header limits, before any frame is decoded.

``sniff(data)`` names the container from magic bytes only (never from a declared MIME
type or a file name): MP4/MOV, Matroska/WebM, AVI, MPEG-TS. Anything else is refused
with a message that says what it looks like (a zip, an HTML page, an image, HEIC/AVIF).

``open_video(data, settings)`` first reads the container's own tables (tables.py: sample
counts, indexes, declared frame sizes) and refuses what exceeds the limits before FFmpeg
builds anything from them; then opens it with PyAV (FFmpeg) forcing that one demuxer, a
bounded probe, no external references, and the decoders' own bound on frame size
(``max_pixels``: FFmpeg refuses to allocate a larger frame, also while probing the
streams), and checks the first video stream's codec against an allow-list and its
declared size, duration and frame count against the limits. The declared values are only
a first gate: decode.py enforces the same limits on what is actually decoded.
"""

from __future__ import annotations

import io
import math
import re
from dataclasses import dataclass
from fractions import Fraction

from . import tables
from .errors import VideoError
from .settings import VideoSettings

# FFmpeg demuxer per sniffed container
DEMUXERS = {"mp4": "mov", "webm": "matroska", "avi": "avi", "mpegts": "mpegts"}
# decoders the gateway accepts (FFmpeg's native or bundled ones in PyAV's wheels)
CODECS = {"h264", "hevc", "vp8", "vp9", "av1", "libdav1d", "mpeg4", "mjpeg", "mpeg2video", "mpeg1video"}
_IMAGE_BRANDS = (b"heic", b"heix", b"heim", b"heis", b"hevc", b"hevx", b"mif1", b"msf1", b"avif", b"avis")


def sniff(data: bytes) -> str:
    if not data:
        raise VideoError("the video is empty (0 bytes)", "video_empty")
    h = data[:64]
    if h[4:8] == b"ftyp":
        if h[8:12] in _IMAGE_BRANDS:
            raise VideoError("this is a HEIC/AVIF image, not a video; send it as an image_url part",
                             "unsupported_video_format")
        return "mp4"
    if h[4:8] in (b"moov", b"mdat", b"free", b"wide", b"skip"):
        return "mp4"
    if h[:4] == b"\x1a\x45\xdf\xa3":
        return "webm"
    if h[:4] == b"RIFF" and h[8:12] == b"AVI ":
        return "avi"
    if len(data) >= 3 * 188 and data[0] == 0x47 and data[188] == 0x47 and data[376] == 0x47:
        return "mpegts"
    if h[:4] == b"PK\x03\x04":
        what = "a zip archive"
    elif h[:3] == b"\xff\xd8\xff" or h[:8] == b"\x89PNG\r\n\x1a\n" or h[:6] in (b"GIF87a", b"GIF89a"):
        what = "an image (send it as an image_url part)"
    else:
        text = h.lstrip().lower()
        if text.startswith((b"<!doctype", b"<html", b"<?xml", b"<head", b"<body")):
            what = "an HTML/XML document"
        elif text[:1] in (b"{", b"["):
            what = "JSON"
        else:
            what = "not a supported video"
    raise VideoError(f"the data is {what}; send MP4/MOV, WebM/MKV, AVI or MPEG-TS video",
                     "unsupported_video_format")


@dataclass(frozen=True)
class VideoHeader:
    container: str
    codec: str
    width: int
    height: int
    rate: Fraction             # FFmpeg's guessed frame rate (what OpenCV reports as CAP_PROP_FPS)
    nb_frames: int             # declared frame count (0 when the container has none)
    duration_s: float          # declared duration (container, else stream)

    @property
    def opencv_frames(self) -> int:
        """CAP_PROP_FRAME_COUNT as OpenCV's FFmpeg backend computes it."""
        if self.nb_frames:
            return self.nb_frames
        return int(math.floor(self.duration_s * float(self.rate) + 0.5)) if self.rate else 0


def _av():
    try:
        import av
    except ImportError:  # pragma: no cover - the extra is not installed
        raise VideoError("video input needs PyAV on the gateway (pip install -e . in the gateway's checkout)",
                         "video_unavailable") from None
    if av.logging.get_level() is None:
        # FFmpeg's errors reach Python, where each decode captures its own (oversized_frame)
        av.logging.set_level(av.logging.ERROR)
    return av


_OVERSIZED = re.compile(r"Picture size (\d+)x(\d+) exceeds")


def oversized_frame(logs, settings: VideoSettings) -> VideoError | None:
    """The refusal for a frame a decoder would not allocate (its max_pixels), from the
    messages FFmpeg logged (``av.logging.Capture``): the size it named, when it did."""
    for _, _, message in logs:
        m = _OVERSIZED.search(message)
        if m:
            w, h = int(m.group(1)), int(m.group(2))
            return VideoError(f"a frame of the video is {w}x{h}, above the limit of "
                              f"{settings.max_frame_pixels / 1e6:.1f} megapixels", "video_frame_too_large")
    return None


def max_pixels(settings: VideoSettings) -> int:
    """The decoders' own frame bound (AVCodecContext.max_pixels), with room for the stride
    alignment FFmpeg adds to the width before comparing; decode.py checks the exact limit."""
    return settings.max_frame_pixels * 5 // 4


def _open(av, data: bytes, kind: str, settings: VideoSettings):
    # max_pixels reaches the decoders avformat_find_stream_info opens to probe the streams
    opts = {"probesize": str(8 * 2**20), "analyzeduration": "5000000", "enable_drefs": "0",
            "max_pixels": str(max_pixels(settings))}
    try:  # PyAV < 19: undecodable metadata raises unless told to ignore it
        return av.open(io.BytesIO(data), mode="r", format=DEMUXERS[kind], options=opts, metadata_errors="ignore")
    except TypeError:  # PyAV 19 dropped the argument (metadata is read leniently)
        return av.open(io.BytesIO(data), mode="r", format=DEMUXERS[kind], options=opts)


def open_video(data: bytes, settings: VideoSettings):
    """(container, stream, header) of the first video stream; the caller closes the container."""
    if len(data) > settings.max_bytes:
        raise VideoError(f"the video is {len(data) / 2**20:.1f} MiB, above the limit of "
                         f"{settings.max_bytes / 2**20:.0f} MiB", "video_too_large")
    kind = sniff(data)
    tables.check(data, kind, settings)
    av = _av()
    try:
        with av.logging.Capture(local=True):  # probing refusals are FFmpeg's business, not the log's
            container = _open(av, data, kind, settings)
    except (av.FFmpegError, ValueError, OSError) as e:
        raise VideoError(f"the {kind.upper()} container is corrupt or truncated ({_short(e)})",
                         "video_corrupt") from None
    try:
        if not container.streams.video:
            raise VideoError(f"the {kind.upper()} container has no video stream", "video_no_stream")
        stream = container.streams.video[0]
        codec = stream.codec_context.name if stream.codec_context else ""
        if codec not in CODECS:
            raise VideoError(f"the video codec {codec or 'unknown'!r} is not supported; send H.264, HEVC, "
                             "VP8/VP9, AV1, MPEG-4 or MJPEG", "unsupported_video_codec")
        w, h = int(stream.codec_context.width or 0), int(stream.codec_context.height or 0)
        if w <= 0 or h <= 0:
            raise VideoError(f"the video declares an empty frame size ({w}x{h})", "video_corrupt")
        if w * h > settings.max_frame_pixels:
            raise VideoError(f"the video's frames are {w}x{h} = {w * h / 1e6:.1f} megapixels, above the "
                             f"limit of {settings.max_frame_pixels / 1e6:.1f}", "video_frame_too_large")
        if max(w, h) / min(w, h) > 200:
            raise VideoError(f"the video aspect ratio {w}x{h} is above 200:1", "video_aspect_ratio")
        rate = stream.guessed_rate or stream.average_rate or Fraction(0)
        dur = (container.duration or 0) / 1_000_000
        if dur <= 0 and stream.duration and stream.time_base:
            dur = float(stream.duration * stream.time_base)
        header = VideoHeader(kind, codec, w, h, Fraction(rate), int(stream.frames or 0), float(dur))
        if header.duration_s > settings.max_duration_s:
            raise VideoError(f"the video declares {header.duration_s:.0f} s, above the limit of "
                             f"{settings.max_duration_s:.0f} s", "video_too_long")
        if header.nb_frames > settings.max_source_frames:
            raise VideoError(f"the video declares {header.nb_frames} frames, above the limit of "
                             f"{settings.max_source_frames}", "video_too_many_frames")
    except BaseException:
        container.close()
        raise
    return container, stream, header


def _short(e: BaseException) -> str:
    return str(e).split(":")[0][:80] or type(e).__name__
