"""Synthetic videos (generated with PyAV's bundled FFmpeg, nothing downloaded), for the
tests, the CPU benchmark and the GPU load generator:

- ``motion_clip``: every frame differs (moving gradient, moving boxes, a frame counter);
- ``screen_recording``: a desktop-like UI at 1920x1080 whose content changes at given
  times (a new document, a dialog, a scroll) with a blinking caret in between; returns
  the change times so a test can check that every state reached the output;
- hostile inputs: truncated, huge declared frame size, a pixel bomb, thousands of tiny
  frames, a stream running past the duration limit, plus non-video bytes.

Deterministic: the same arguments give the same bytes (x264 in one thread).
"""

from __future__ import annotations

import functools
import io
import random
import struct
from fractions import Fraction
from typing import Callable, Iterable

import numpy as np
from PIL import Image, ImageDraw, ImageFont


def encode(frames: Iterable[np.ndarray], fps: Fraction | int, fmt: str = "mp4", codec: str = "libx264",
           crf: int = 23, preset: str = "veryfast", gop: int = 60, pix_fmt: str = "yuv420p") -> bytes:
    import av

    buf = io.BytesIO()
    with av.open(buf, mode="w", format=fmt) as out:
        s = None
        for j, arr in enumerate(frames):
            if s is None:
                opts = {"threads": "1"}
                if codec == "libx264":
                    opts.update(crf=str(crf), preset=preset, **{"x264-params": f"keyint={gop}"})
                s = out.add_stream(codec, rate=Fraction(fps), options=opts)
                s.height, s.width = arr.shape[:2]
                s.pix_fmt = pix_fmt
                s.codec_context.thread_count = 1
            vf = av.VideoFrame.from_ndarray(np.ascontiguousarray(arr), format="rgb24")
            vf.pts = j
            for p in s.encode(vf):
                out.mux(p)
        for p in s.encode():
            out.mux(p)
    return buf.getvalue()


def _font(size: int):
    for path in ("/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
                 "/usr/share/fonts/TTF/DejaVuSans.ttf"):
        try:
            return ImageFont.truetype(path, size)
        except OSError:
            continue
    return ImageFont.load_default()


def motion_frames(seconds: float = 10, w: int = 1280, h: int = 720, fps: int = 30, seed: int = 0):
    rng = random.Random(seed)
    boxes = [(rng.randrange(w), rng.randrange(h), rng.choice((-9, -5, 5, 9)), rng.choice((-7, -3, 3, 7)),
              tuple(rng.randrange(256) for _ in range(3))) for _ in range(12)]
    y, x = np.mgrid[0:h, 0:w]
    font = _font(48)
    for i in range(int(seconds * fps)):
        base = ((x + 6 * i) % 256).astype(np.uint8)
        arr = np.stack([base, ((y + 3 * i) % 256).astype(np.uint8), ((x + y - 4 * i) % 256).astype(np.uint8)], -1)
        im = Image.fromarray(arr)
        d = ImageDraw.Draw(im)
        for bx, by, vx, vy, col in boxes:
            cx, cy = (bx + vx * i) % w, (by + vy * i) % h
            d.rectangle([cx, cy, cx + 120, cy + 80], fill=col)
        d.text((40, 40), f"frame {i:04d}", fill=(255, 255, 255), font=font)
        yield np.asarray(im)


def motion_clip(seconds: float = 10, w: int = 1280, h: int = 720, fps: int = 30, seed: int = 0) -> bytes:
    """Motion in every frame (the case where only sampling and downscale save tokens)."""
    return encode(motion_frames(seconds, w, h, fps, seed), fps, crf=23)


def screen_states(w: int, h: int, n: int, seed: int) -> list[np.ndarray]:
    """``n`` distinct desktop screens: title bar, sidebar, a document of text lines."""
    rng = random.Random(seed)
    body, small, big = _font(22), _font(18), _font(40)
    out = []
    for s in range(n):
        im = Image.new("RGB", (w, h), (246, 246, 248))
        d = ImageDraw.Draw(im)
        d.rectangle([0, 0, w, 48], fill=(40, 44, 52))
        d.text((20, 12), f"Report editor - document {s + 1} of {n}", fill=(230, 230, 230), font=small)
        d.rectangle([0, 48, 280, h], fill=(228, 230, 235))
        for j in range(18):
            d.text((20, 70 + 44 * j), f"folder {j + 1:02d}", fill=(60, 60, 70), font=body)
        d.text((330, 80), f"Section {s + 1}: quarterly figures", fill=(20, 20, 30), font=big)
        for j in range(22):
            words = " ".join(rng.choice(("revenue", "margin", "region", "total", "forecast", "units",
                                         "growth", "cost", "target", "north", "south")) for _ in range(7))
            d.text((330, 150 + 38 * j), f"{j + 1:02d}. {words} {rng.randrange(10000):5d}.{rng.randrange(100):02d}",
                   fill=(30, 30, 30), font=body)
        if s % 3 == 2:   # a dialog over the document
            d.rectangle([w // 2 - 300, h // 2 - 120, w // 2 + 300, h // 2 + 120], fill=(255, 255, 255),
                        outline=(0, 90, 200), width=4)
            d.text((w // 2 - 260, h // 2 - 60), f"Save changes to document {s + 1}?", fill=(0, 0, 0), font=big)
        out.append(np.asarray(im))
    return out


def screen_change_times(seconds: float, seed: int = 1, lo: float = 3.0, hi: float = 6.0) -> list[float]:
    """Start times of each state: 0, then every ``lo``-``hi`` s (rounded to 0.1 s)."""
    rng = random.Random(seed)
    times = [0.0]
    while True:
        t = round(times[-1] + rng.uniform(lo, hi), 1)
        if t >= seconds - 1.0:
            return times
        times.append(t)


def screen_frames(seconds: float, w: int, h: int, fps: int, times: list[float], seed: int = 1):
    states = screen_states(w, h, len(times), seed)
    for i in range(int(seconds * fps)):
        t = i / fps
        s = max(j for j, st in enumerate(times) if st <= t + 1e-9)
        arr = states[s]
        if int(t * 2) % 2 == 0:      # caret blinking at 1 Hz
            arr = arr.copy()
            arr[160:186, 1500:1502] = 0
        yield arr


def screen_recording(seconds: float = 60, w: int = 1920, h: int = 1080, fps: int = 30,
                     seed: int = 1) -> tuple[bytes, list[float]]:
    """A screen recording whose screen changes every 3-6 s; returns (bytes, state start times)."""
    times = screen_change_times(seconds, seed)
    return encode(screen_frames(seconds, w, h, fps, times, seed), fps, crf=23, gop=300), times


# -- hostile inputs ------------------------------------------------------------------------

def truncated(data: bytes, keep: float = 0.6) -> bytes:
    return data[: int(len(data) * keep)]


def blank_frames(n: int, w: int, h: int) -> Iterable[np.ndarray]:
    arr = np.zeros((h, w, 3), np.uint8)
    for _ in range(n):
        yield arr


@functools.lru_cache(maxsize=None)
def huge_frame_size() -> bytes:
    """A few KB declaring 8192x8192 frames (67 megapixels each)."""
    return encode(blank_frames(2, 8192, 8192), 1, preset="ultrafast")


def pixel_bomb(frames: int = 3000, w: int = 3840, h: int = 2160, fmt: str = "matroska") -> bytes:
    """Black 4K frames: tiny file, tens of gigapixels decoded; Matroska declares no frame count."""
    return encode(blank_frames(frames, w, h), 30, fmt=fmt, preset="ultrafast", gop=frames)


def tiny_frames(frames: int = 40_000, fps: int = 1000, fmt: str = "matroska") -> bytes:
    """Thousands of 16x16 frames."""
    return encode(blank_frames(frames, 16, 16), fps, fmt=fmt, preset="ultrafast", gop=frames)


def long_stream(seconds: int = 2000, fmt: str = "mpegts") -> bytes:
    """A stream that runs past any duration limit (1 fps, 32x32), without a useful header."""
    return encode(blank_frames(seconds, 32, 32), 1, fmt=fmt, preset="ultrafast", gop=seconds)


def zip_bytes() -> bytes:
    import zipfile
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("movie.mp4", b"\x00" * 1000)
    return buf.getvalue()


HTML = b"<!DOCTYPE html><html><head><title>404</title></head><body>Not found</body></html>"


def cached(fn: Callable[..., bytes]):
    """Memoise a generator in-process (tests build the same clip many times)."""
    import functools
    return functools.lru_cache(maxsize=None)(fn)


# -- containers whose own tables declare more than their bytes hold ---------------------------
# (FFmpeg builds an index entry per declared sample, or allocates a frame of the declared
# size, before a single frame is decoded: these must be refused from the tables themselves)

_ISO_CONTAINERS = {b"moov", b"trak", b"mdia", b"minf", b"stbl", b"dinf", b"edts", b"udta", b"mvex", b"moof",
                   b"traf"}


def iso_tree(data: bytes, start: int = 0, end: int | None = None) -> list:
    """ISOBMFF boxes as ``[kind, payload bytes | children]`` (32-bit sizes, as PyAV writes)."""
    end = len(data) if end is None else end
    out, i = [], start
    while i + 8 <= end:
        size, kind = struct.unpack_from(">I4s", data, i)
        size = size or end - i
        out.append([kind, iso_tree(data, i + 8, i + size) if kind in _ISO_CONTAINERS else data[i + 8:i + size]])
        i += size
    return out


def iso_bytes(tree: list) -> bytes:
    out = b""
    for kind, body in tree:
        payload = iso_bytes(body) if isinstance(body, list) else body
        out += struct.pack(">I", 8 + len(payload)) + kind + payload
    return out


def iso_find(tree: list, *path: bytes) -> list:
    """The first box at ``path`` (its ``[kind, body]`` list, edited in place)."""
    for box in tree:
        if box[0] == path[0]:
            return box if len(path) == 1 else iso_find(box[1], *path[1:])
    raise KeyError(path)


def _full_box(version: int, flags: int, body: bytes) -> bytes:
    return bytes([version]) + flags.to_bytes(3, "big") + body


def _small_mp4(frames: int = 2, side: int = 16, **kw) -> bytes:
    return encode(blank_frames(frames, side, side), 1, preset="ultrafast", **kw)


def mp4_declared_samples(n: int = 20_000_000, track: str = "video") -> bytes:
    """A ~1.8 KB MP4 whose sample tables declare ``n`` samples of one byte (constant size:
    no table behind the count). ``track="second"``: the video track is honest and a second
    (subtitle) track carries the count, which the demuxer indexes all the same."""
    tree = iso_tree(_small_mp4())
    moov = iso_find(tree, b"moov")
    trak = iso_find(moov[1], b"trak")
    target = trak
    if track == "second":
        import copy
        target = copy.deepcopy(trak)
        tkhd = iso_find(target[1], b"tkhd")
        body = bytearray(tkhd[1])
        struct.pack_into(">I", body, 12 if body[0] == 0 else 20, 2)  # track_ID 2
        tkhd[1] = bytes(body)
        hdlr = iso_find(target[1], b"mdia", b"hdlr")
        hdlr[1] = hdlr[1][:8] + b"sbtl" + hdlr[1][12:]
        moov[1].insert(moov[1].index(trak) + 1, target)
    stbl = iso_find(target[1], b"mdia", b"minf", b"stbl")
    offset = struct.unpack_from(">I", iso_find(stbl[1], b"stco")[1], 8)[0]
    keep = [b for b in stbl[1] if b[0] == b"stsd"]
    stbl[1] = keep + [
        [b"stts", _full_box(0, 0, struct.pack(">III", 1, n, 512))],
        [b"stsc", _full_box(0, 0, struct.pack(">IIII", 1, 1, n, 1))],
        [b"stsz", _full_box(0, 0, struct.pack(">II", 1, n))],
        [b"stco", _full_box(0, 0, struct.pack(">II", 1, offset))],
    ]
    return iso_bytes(tree)


def mp4_huge_stts(n: int = 20_000_000) -> bytes:
    """An honest two-sample MP4 whose time-to-sample table declares ``n`` samples."""
    tree = iso_tree(_small_mp4())
    stts = iso_find(tree, b"moov", b"trak", b"mdia", b"minf", b"stbl", b"stts")
    stts[1] = _full_box(0, 0, struct.pack(">III", 1, n, 512))
    return iso_bytes(tree)


def mp4_fragmented_trun(n: int = 20_000_000) -> bytes:
    """A fragmented MP4 (empty_moov + moof) whose track run declares ``n`` samples and no
    per-sample fields: every sample takes the defaults, so ``n`` costs no bytes."""
    import av
    buf = io.BytesIO()
    with av.open(buf, mode="w", format="mp4", options={"movflags": "frag_keyframe+empty_moov"}) as out:
        s = out.add_stream("libx264", rate=1, options={"threads": "1", "preset": "ultrafast"})
        s.width = s.height = 16
        s.pix_fmt = "yuv420p"
        for j, arr in enumerate(blank_frames(2, 16, 16)):
            vf = av.VideoFrame.from_ndarray(arr, format="rgb24")
            vf.pts = j
            for p in s.encode(vf):
                out.mux(p)
        for p in s.encode():
            out.mux(p)
    data = buf.getvalue()
    tree = iso_tree(data)
    traf = iso_find(tree, b"moof", b"traf")
    tfhd = iso_find(traf[1], b"tfhd")
    track_id = struct.unpack_from(">I", tfhd[1], 4)[0]
    # defaults for every sample: duration 512, size 1, flags "sync"; base offset = the moof
    tfhd[1] = _full_box(0, 0x020000 | 0x08 | 0x10 | 0x20, struct.pack(">IIII", track_id, 512, 1, 0))
    trun = iso_find(traf[1], b"trun")
    trun[1] = _full_box(0, 0x000001, struct.pack(">Ii", n, 0))
    moof_size = len(iso_bytes([iso_find(tree, b"moof")]))  # data offset: past the moof and mdat header
    trun[1] = _full_box(0, 0x000001, struct.pack(">Ii", n, moof_size + 8))
    return iso_bytes(tree)


def mjpeg_growing_frame(fmt: str = "avi", w: int = 16000, h: int = 16000, at: int = 3, frames: int = 5) -> bytes:
    """An MJPEG stream (AVI or Matroska) declaring 64x64 frames whose frame ``at`` is a
    real ``w``x``h`` JPEG (1 MB at 16000x16000: flat grey blocks). The decoder allocates
    (and zero-fills) a frame of that size when it meets it."""
    import av
    from image_corpus import flat_jpeg
    buf = io.BytesIO()
    with av.open(buf, mode="w", format=fmt) as out:
        s = out.add_stream("mjpeg", rate=5)
        s.width = s.height = 64
        s.pix_fmt = "yuvj420p"
        s.time_base = Fraction(1, 5)
        small = None
        for j, arr in enumerate(blank_frames(frames, 64, 64)):
            vf = av.VideoFrame.from_ndarray(arr, format="rgb24")
            vf.pts = j
            for p in s.encode(vf):
                if j == at:
                    p = av.Packet(flat_jpeg(w, h))
                    p.stream, p.pts, p.dts, p.time_base, p.is_keyframe = s, j, j, Fraction(1, 5), True
                out.mux(p)
        for p in s.encode():
            out.mux(p)
    return buf.getvalue()


def mp4_audio_chunks(chunks: int = 40, per_chunk: int = 0xFFFFFFFF) -> bytes:
    """An honest 16x16 video track beside an uncompressed audio track ('sowt', indexed by
    chunk) of ``chunks`` chunks that each declare ``per_chunk`` samples: FFmpeg makes an
    index entry per 1024 samples of every chunk (40 x 4 million for 1.5 KB)."""
    import copy
    tree = iso_tree(_small_mp4())
    moov = iso_find(tree, b"moov")
    trak = iso_find(moov[1], b"trak")
    audio = copy.deepcopy(trak)
    tkhd = iso_find(audio[1], b"tkhd")
    body = bytearray(tkhd[1])
    struct.pack_into(">I", body, 12 if body[0] == 0 else 20, 2)
    tkhd[1] = bytes(body)
    hdlr = iso_find(audio[1], b"mdia", b"hdlr")
    hdlr[1] = hdlr[1][:8] + b"soun" + hdlr[1][12:]
    minf = iso_find(audio[1], b"mdia", b"minf")
    minf[1] = [[b"smhd", _full_box(0, 0, b"\0" * 4)] if b[0] == b"vmhd" else b for b in minf[1]]
    stbl = iso_find(minf[1], b"stbl")
    offset = struct.unpack_from(">I", iso_find(stbl[1], b"stco")[1], 8)[0]
    sowt = b"\0" * 6 + struct.pack(">HHHIHHHHI", 1, 0, 0, 0, 2, 16, 0, 0, 48000 << 16)
    stbl[1] = [
        [b"stsd", _full_box(0, 0, struct.pack(">I", 1) + struct.pack(">I4s", 8 + len(sowt), b"sowt") + sowt)],
        [b"stts", _full_box(0, 0, struct.pack(">III", 1, 48000, 1))],
        [b"stsc", _full_box(0, 0, struct.pack(">IIII", 1, 1, per_chunk, 1))],
        [b"stsz", _full_box(0, 0, struct.pack(">II", 4, 48000))],
        [b"stco", _full_box(0, 0, struct.pack(">I", chunks) + struct.pack(">I", offset) * chunks)],
    ]
    moov[1].insert(moov[1].index(trak) + 1, audio)
    return iso_bytes(tree)


def mp4_fragments(fragments: int = 200, per_run: int = 200_000) -> bytes:
    """A fragmented MP4 whose ``fragments`` moof boxes each declare ``per_run`` samples:
    every run alone within any limit, together 40 million."""
    data = mp4_fragmented_trun(per_run)
    tree = iso_tree(data)
    moof = iso_find(tree, b"moof")
    i = tree.index(moof)
    return iso_bytes(tree[:i] + [moof, tree[i + 1]] * fragments + tree[i + 2:])


def growing_h264(fmt: str = "mpegts") -> bytes:
    """64x64 H.264 with an 8192x8192 keyframe in the middle (two streams end to end in
    MPEG-TS: a new sequence parameter set mid-stream)."""
    small = encode(blank_frames(10, 64, 64), 5, fmt=fmt, preset="ultrafast")
    return small + encode(blank_frames(1, 8192, 8192), 5, fmt=fmt, preset="ultrafast") + small


@functools.lru_cache(maxsize=None)
def hostile_tables() -> dict[str, tuple[bytes, set[str]]]:
    """name -> (bytes, acceptable codes): containers that declare more than they hold,
    and frames larger than the stream declared (#32). Before the fixes each cost FFmpeg
    0.15-1.4 GB before the limit was checked."""
    many, large = {"video_too_many_frames"}, {"video_frame_too_large"}
    return {
        "mp4_20m_samples": (mp4_declared_samples(), many),
        "mp4_20m_samples_on_a_second_track": (mp4_declared_samples(track="second"), many),
        "mp4_stts_20m_samples": (mp4_huge_stts(), many),
        "mp4_fragment_run_of_20m_samples": (mp4_fragmented_trun(), many),
        "mp4_200_fragments_of_200k_samples": (mp4_fragments(), many),
        "mp4_audio_track_of_huge_chunks": (mp4_audio_chunks(), many),
        "mp4_8192x8192_frames": (huge_frame_size(), large),
        "avi_mjpeg_16000x16000_fourth_frame": (mjpeg_growing_frame("avi"), large),
        "mkv_mjpeg_16000x16000_fourth_frame": (mjpeg_growing_frame("matroska"), large),
        "mpegts_h264_8192x8192_mid_stream": (growing_h264(), large),
    }


def with_audio(seconds: float = 10, audio: str = "aac", fmt: str = "mp4", fragmented: bool = False,
               w: int = 160, h: int = 120, fps: int = 30) -> bytes:
    """A real clip with a sound track beside the video (AAC, or uncompressed PCM, which
    the MOV demuxer indexes by chunk), optionally fragmented (moof per keyframe)."""
    import av
    buf = io.BytesIO()
    opts = {"movflags": "frag_keyframe+empty_moov"} if fragmented else {}
    with av.open(buf, mode="w", format=fmt, options=opts) as out:
        v = out.add_stream("libx264", rate=fps, options={"threads": "1", "preset": "ultrafast",
                                                         "x264-params": "keyint=30"})
        v.width, v.height, v.pix_fmt = w, h, "yuv420p"
        a = out.add_stream(audio, rate=48000, layout="stereo")
        n = 1024
        t = 0
        for j, arr in enumerate(motion_frames(seconds, w, h, fps)):
            vf = av.VideoFrame.from_ndarray(np.ascontiguousarray(arr), format="rgb24")
            vf.pts = j
            for p in v.encode(vf):
                out.mux(p)
            while t < (j + 1) * 48000 // fps:
                fmt_name = "fltp" if audio == "aac" else "s16"
                samples = np.zeros((2, n) if fmt_name == "fltp" else (1, 2 * n), np.float32 if fmt_name == "fltp"
                                   else np.int16)
                af = av.AudioFrame.from_ndarray(samples, format=fmt_name, layout="stereo")
                af.sample_rate, af.pts = 48000, t
                for p in a.encode(af):
                    out.mux(p)
                t += n
        for s in (v, a):
            for p in s.encode():
                out.mux(p)
    return buf.getvalue()
