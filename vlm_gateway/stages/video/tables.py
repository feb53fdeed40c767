"""The counts a video container declares, read from its own tables before FFmpeg parses it.

FFmpeg's demuxers build their packet index from what a file declares, before a frame is
decoded: the MP4 demuxer writes one entry (about 35 bytes with its timing tables) per
sample that a track's sample tables or a fragment's track run declare, whether or not the
file holds those samples. A 1.4 KB MP4 declaring 20 million one-byte samples cost +700 MB
and 3 s inside ``av.open``, with the video track or with a subtitle track beside it; a
track run of 20 million samples without per-sample fields costs no bytes either. So
``check(data, kind, settings)`` reads, per container:

- MP4/MOV: every track's samples (the ``stsz`` count, the ``stts`` total, and for an
  uncompressed audio track, which FFmpeg indexes by chunk, chunks x samples per chunk
  / 160), plus every ``moof``'s ``trun`` counts added to their track. A video track's
  against ``max_source_frames`` (``video_too_many_frames``), any other track's against
  ``track_samples(settings)``, and all of them together against ``4 x track_samples``;
- AVI: the main header's and each video stream header's frame counts against
  ``max_source_frames``, the entries of the ``idx1`` index and of the OpenDML indexes
  (``indx`` -> ``ix##``) against ``4 x track_samples``; the declared frame size
  (``strf``) against ``max_frame_pixels`` (``video_frame_too_large``);
- Matroska/WebM: each video track's PixelWidth x PixelHeight against ``max_frame_pixels``
  (its frame count is not declared; decode.py counts what is decoded).

The walk visits at most ``MAX_BOXES`` boxes or elements (``video_corrupt`` beyond: 262,144,
where a 10-minute fragmented MP4 with a fragment per half second has about 8,400). What
the decoder then allocates is bounded by the codec's ``max_pixels`` (probe.py) and by
decode.py on every decoded frame.
"""

from __future__ import annotations

import struct

import numpy as np

from .errors import VideoError
from .settings import VideoSettings

MAX_BOXES = 1 << 18
# samples per second a track beside the video may declare: AAC at 48 kHz has 47, Opus in
# 20 ms frames 50, uncompressed audio is indexed per 1024 samples (192 kHz: 188)
TRACK_SAMPLES_PER_S = 512
_CONTAINERS = {b"moov", b"trak", b"mdia", b"minf", b"stbl", b"moof", b"traf", b"edts", b"dinf", b"mvex"}


def track_samples(settings: VideoSettings) -> int:
    """The most samples a track beside the video may declare."""
    return max(settings.max_source_frames, int(TRACK_SAMPLES_PER_S * settings.max_duration_s))


def check(data: bytes, kind: str, settings: VideoSettings) -> None:
    try:
        if kind == "mp4":
            _mp4(data, settings)
        elif kind == "avi":
            _avi(data, settings)
        elif kind == "webm":
            _matroska(data, settings)
    except (struct.error, IndexError, ValueError) as e:
        if isinstance(e, VideoError):
            raise
        raise VideoError(f"the {kind.upper()} container's tables are truncated", "video_corrupt") from None


def _corrupt(kind: str, what: str) -> VideoError:
    return VideoError(f"the {kind.upper()} container {what}", "video_corrupt")


def _too_many(what: str, n: int, limit: int) -> VideoError:
    return VideoError(f"{what} declares {n} samples, above the limit of {limit}", "video_too_many_frames")


def _frame_size(w: int, h: int, settings: VideoSettings) -> None:
    if w * h > settings.max_frame_pixels:
        raise VideoError(f"the video declares {w}x{h} frames = {w * h / 1e6:.1f} megapixels, above the limit of "
                         f"{settings.max_frame_pixels / 1e6:.1f}", "video_frame_too_large")


# -- MP4 / QuickTime -------------------------------------------------------------------------

class _Walk:
    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.left = MAX_BOXES

    def boxes(self, data: bytes, start: int, end: int):
        """(type, payload start, box end) of the boxes in data[start:end]."""
        i = start
        while i + 8 <= end:
            self.left -= 1
            if self.left < 0:
                raise _corrupt(self.kind, f"has more than {MAX_BOXES} boxes")
            size, box = struct.unpack_from(">I4s", data, i)
            head = 8
            if size == 1:
                (size,) = struct.unpack_from(">Q", data, i + 8)
                head = 16
            elif size == 0:
                size = end - i
            if size < head:
                raise _corrupt(self.kind, f"has a {box.decode('latin-1')!r} box shorter than its header")
            yield box, i + head, min(end, i + size)
            i += size


def _u32s(data: bytes, start: int, count: int, end: int) -> np.ndarray:
    """``count`` big-endian u32 from ``start``, as many as data[start:end] holds (a view)."""
    count = max(0, min(count, (min(end, len(data)) - start) // 4))
    return np.frombuffer(data, dtype=">u4", count=count, offset=start)


class _Track:
    def __init__(self) -> None:
        self.id = 0
        self.handler = b""
        self.stsz = 0           # samples the sample size box declares
        self.stts = 0           # samples the time-to-sample table declares
        self.stts_runs: np.ndarray = np.zeros(0, ">u4")  # (count, delta) pairs, flat
        self.stsc: np.ndarray = np.zeros(0, ">u4")       # (first chunk, samples per chunk, description)
        self.chunks = 0
        self.fragments = 0      # samples of this track's track runs

    def indexed(self) -> int:
        """Index entries FFmpeg's mov demuxer makes for this track (an upper bound)."""
        if self.handler == b"soun" and len(self.stts_runs) == 2 and int(self.stts_runs[1]) == 1:
            # uncompressed audio: indexed by chunk, one entry per >= 160 samples of a chunk
            runs = self.stsc[:len(self.stsc) // 3 * 3].reshape(-1, 3).astype(np.int64)
            first, per = runs[:, 0], runs[:, 1]
            nxt = np.append(first[1:], self.chunks + 1)
            return int((np.maximum(0, nxt - first) * -(-per // 160)).sum()) + self.fragments
        return max(self.stsz, self.stts) + self.fragments


def _mp4(data: bytes, settings: VideoSettings) -> None:
    walk = _Walk("mp4")
    tracks: dict[int, _Track] = {}
    order: list[_Track] = []
    runs: dict[int, int] = {}
    for box, p, e in walk.boxes(data, 0, len(data)):
        if box == b"moov":
            for b2, p2, e2 in walk.boxes(data, p, e):
                if b2 == b"trak":
                    t = _trak(data, p2, e2, walk)
                    tracks[t.id] = t
                    order.append(t)
        elif box == b"moof":
            for b2, p2, e2 in walk.boxes(data, p, e):
                if b2 != b"traf":
                    continue
                track = 0
                for b3, p3, e3 in walk.boxes(data, p2, e2):
                    if b3 == b"tfhd":
                        (track,) = struct.unpack_from(">I", data, p3 + 4)
                    elif b3 == b"trun":
                        runs[track] = runs.get(track, 0) + struct.unpack_from(">I", data, p3 + 4)[0]
    for track, n in runs.items():
        if track in tracks:
            tracks[track].fragments += n
        else:
            t = _Track()
            t.id, t.fragments = track, n
            order.append(t)
    per_track = track_samples(settings)
    total = 0
    for t in order:
        n = t.indexed()
        total += n
        if t.handler == b"vide":
            frames = max(t.stsz, t.stts) + t.fragments
            if frames > settings.max_source_frames:
                raise _too_many(f"the video's track {t.id}", frames, settings.max_source_frames)
        elif n > per_track:
            name = t.handler.decode("latin-1") or "unknown"
            raise _too_many(f"the video's track {t.id} ({name})", n, per_track)
    if total > 4 * per_track:
        raise _too_many("the video's tracks together", total, 4 * per_track)


def _trak(data: bytes, p: int, e: int, walk: _Walk) -> _Track:
    t = _Track()

    def visit(start: int, end: int) -> None:
        for box, q, f in walk.boxes(data, start, end):
            if box in _CONTAINERS:
                visit(q, f)
            elif box == b"tkhd":
                t.id = struct.unpack_from(">I", data, q + (20 if data[q] == 1 else 12))[0]
            elif box == b"hdlr" and not t.handler:  # mdia's (QuickTime's minf has a data handler too)
                t.handler = data[q + 8:q + 12]
            elif box in (b"stsz", b"stz2"):
                t.stsz = max(t.stsz, struct.unpack_from(">I", data, q + 8)[0])
            elif box == b"stts":
                (n,) = struct.unpack_from(">I", data, q + 4)
                t.stts_runs = _u32s(data, q + 8, 2 * n, f)
                t.stts = int(t.stts_runs[0::2].sum(dtype=np.uint64))
            elif box == b"stsc":
                (n,) = struct.unpack_from(">I", data, q + 4)
                t.stsc = _u32s(data, q + 8, 3 * n, f)
            elif box in (b"stco", b"co64"):
                (n,) = struct.unpack_from(">I", data, q + 4)
                t.chunks = min(n, (f - q - 8) // (4 if box == b"stco" else 8))  # FFmpeg reads what is there
    visit(p, e)
    return t


# -- AVI -------------------------------------------------------------------------------------

def _riff(data: bytes, start: int, end: int, walk: _Walk):
    """(fourcc, payload start, payload end, list type or b"") of the RIFF chunks in data[start:end]."""
    i = start
    while i + 8 <= end:
        walk.left -= 1
        if walk.left < 0:
            raise _corrupt("avi", f"has more than {MAX_BOXES} chunks")
        cc, size = struct.unpack_from("<4sI", data, i)
        body = i + 8
        if cc in (b"LIST", b"RIFF"):
            yield cc, body + 4, min(end, body + size), data[body:body + 4]
        else:
            yield cc, body, min(end, body + size), b""
        i = body + size + (size & 1)


def _avi(data: bytes, settings: VideoSettings) -> None:
    walk = _Walk("avi")
    per_track = track_samples(settings)
    entries = 0
    supers: list[int] = []
    for cc, p, e, kind in _riff(data, 12, len(data), walk):
        if cc == b"LIST" and kind == b"hdrl":
            for c2, p2, e2, k2 in _riff(data, p, e, walk):
                if c2 == b"avih":
                    (frames,) = struct.unpack_from("<I", data, p2 + 16)
                    if frames > settings.max_source_frames:
                        raise _too_many("the AVI main header", frames, settings.max_source_frames)
                elif c2 == b"LIST" and k2 == b"strl":
                    supers += _strl(data, p2, e2, walk, settings)
        elif cc == b"idx1":
            entries += (e - p) // 16
    for at in supers[:65536]:  # OpenDML: each super index entry names a standard index chunk
        if at + 16 <= len(data) and data[at:at + 2] == b"ix":
            entries += struct.unpack_from("<I", data, at + 12)[0]
    if entries > 4 * per_track:
        raise _too_many("the AVI index", entries, 4 * per_track)


def _strl(data: bytes, p: int, e: int, walk: _Walk, settings: VideoSettings) -> list[int]:
    video = False
    supers: list[int] = []
    for cc, q, f, _ in _riff(data, p, e, walk):
        if cc == b"strh":
            video = data[q:q + 4] == b"vids"
            (length,) = struct.unpack_from("<I", data, q + 32)
            if video and length > settings.max_source_frames:
                raise _too_many("the AVI video stream header", length, settings.max_source_frames)
        elif cc == b"strf" and video and f - q >= 12:
            w, h = struct.unpack_from("<ii", data, q + 4)
            _frame_size(abs(w), abs(h), settings)
        elif cc == b"indx" and f - q >= 24:
            longs, _, index_type, n = struct.unpack_from("<HBBI", data, q)
            if index_type == 0 and longs == 4:  # AVI_INDEX_OF_INDEXES: (offset u64, size, duration)
                count = min(n, (f - q - 24) // 16)
                supers += [struct.unpack_from("<Q", data, q + 24 + 16 * j)[0] for j in range(min(count, 65536))]
    return supers


# -- Matroska / WebM ---------------------------------------------------------------------------

_SEGMENT, _TRACKS, _ENTRY, _TYPE, _VIDEO = 0x18538067, 0x1654AE6B, 0xAE, 0x83, 0xE0
_WIDTH, _HEIGHT, _CLUSTER = 0xB0, 0xBA, 0x1F43B675


def _vint(data: bytes, i: int, is_id: bool) -> tuple[int, int, bool]:
    """(value, next offset, unknown size) of an EBML variable-length integer."""
    b = data[i]
    n = 1
    while n <= 8 and not b & (0x80 >> (n - 1)):
        n += 1
    if n > 8:
        raise ValueError("bad vint")
    v = int.from_bytes(data[i:i + n], "big")
    if is_id:
        return v, i + n, False
    v &= (1 << (7 * n)) - 1
    return v, i + n, v == (1 << (7 * n)) - 1


def _elements(data: bytes, start: int, end: int, walk: _Walk):
    i = start
    while i + 2 <= end:
        walk.left -= 1
        if walk.left < 0:
            raise _corrupt("webm", f"has more than {MAX_BOXES} elements")
        eid, j, _ = _vint(data, i, True)
        size, k, unknown = _vint(data, j, False)
        stop = end if unknown else min(end, k + size)
        yield eid, k, stop
        if unknown:
            return
        i = k + size


def _uint(data: bytes, p: int, e: int) -> int:
    return int.from_bytes(data[p:e][:8], "big")


def _matroska(data: bytes, settings: VideoSettings) -> None:
    walk = _Walk("webm")
    for eid, p, e in _elements(data, 0, len(data), walk):
        if eid != _SEGMENT:
            continue
        for e2, p2, f2 in _elements(data, p, e, walk):
            if e2 == _CLUSTER:
                return  # the tracks come before the first cluster
            if e2 != _TRACKS:
                continue
            for e3, p3, f3 in _elements(data, p2, f2, walk):
                if e3 != _ENTRY:
                    continue
                video, w, h = False, 0, 0
                for e4, p4, f4 in _elements(data, p3, f3, walk):
                    if e4 == _TYPE:
                        video = _uint(data, p4, f4) == 1
                    elif e4 == _VIDEO:
                        for e5, p5, f5 in _elements(data, p4, f4, walk):
                            if e5 == _WIDTH:
                                w = _uint(data, p5, f5)
                            elif e5 == _HEIGHT:
                                h = _uint(data, p5, f5)
                if video:
                    _frame_size(w, h, settings)
        return
