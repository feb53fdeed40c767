"""What is sent for one media part: the ``MediaRewrite`` contract of the media stage
(``media.py``), its result ``Sent``, and the plain rewrite ``forward`` (the bytes as
they came). Shared by the media stage and the video rewrite (``stages/video/stage.py``),
which imports it from here rather than from the stage that owns it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from ...core.errors import BadRequest
from ..video.errors import VideoError
from ..video.probe import sniff
from .encode import data_uri
from .source import Source

if TYPE_CHECKING:
    from ...core.request import ChatRequest, MediaPart


@dataclass(slots=True)
class Sent:
    """What goes upstream for a part: its URL (None = the part as the client sent
    it) and the content identity of those bytes."""

    url: str | None
    identity: str


class MediaRewrite(Protocol):
    """What is sent for one media part of a kind (the module docstring)."""

    async def __call__(self, req: "ChatRequest", part: "MediaPart", src: Source) -> Sent: ...

# container signatures -> MIME type, for inlining fetched bodies
_MAGIC = (
    (4, b"ftypqt", "video/quicktime"), (4, b"ftyp", "video/mp4"), (0, b"\x1a\x45\xdf\xa3", "video/webm"),
    (0, b"OggS", "application/ogg"), (0, b"fLaC", "audio/flac"), (0, b"ID3", "audio/mpeg"),
    (0, b"\xff\xfb", "audio/mpeg"), (0, b"\xff\xf3", "audio/mpeg"), (0, b"\xff\xf1", "audio/aac"),
)


def mime_of(data: bytes, declared: str, kind: str) -> str:
    """From the bytes where they say, else the origin's video/* or audio/* type."""
    if data[:4] == b"RIFF":
        return {b"WAVE": "audio/wav", b"AVI ": "video/x-msvideo"}.get(data[8:12], "application/octet-stream")
    for off, sig, mime in _MAGIC:
        if data[off:off + len(sig)] == sig:
            return mime
    d = declared.split(";", 1)[0].strip().lower()
    # video/jpeg would make vLLM read the payload as a list of frames
    if d.startswith(f"{kind}/") and d != "video/jpeg" and all(c.isalnum() or c in "/.+-" for c in d):
        return d
    return "application/octet-stream"


async def forward(req: "ChatRequest", part: "MediaPart", src: Source) -> Sent:
    """The bytes as they came: a data: URI or inline payload untouched, a fetched
    body inlined as a data: URI, a checked pass-through URL unchanged."""
    if part.kind == "video" and src.data is not None:
        _video_container(part, src.data)
    if src.kind == "url":
        assert src.data is not None
        return Sent(data_uri(src.data, mime_of(src.data, src.content_type, part.kind)), src.hash)
    return Sent(None, src.hash)


def _video_container(part: "MediaPart", data: bytes) -> None:
    """A video part must hold a video container (by its magic bytes, whatever its MIME
    type says): engines read ``video/jpeg`` as image frames, which would carry an image
    past every image rule."""
    try:
        sniff(data)
    except VideoError as e:
        raise BadRequest(f"Invalid video at {part.param}: {e}", param=part.param, code=e.code) from None
