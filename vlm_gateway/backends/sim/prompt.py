"""What the simulator knows about a prompt: its token count, its images and the
chained hashes of its 16-token blocks (the keys of the prefix cache).

A prompt is laid out as segments, in order: chat-template text (role markers),
message text and images. Text counts ``ceil(bytes / 4)`` tokens (token ``j`` of a
text segment stands for bytes ``4j..4j+4``); an image counts its Qwen3-VL visual
tokens from the real size in its header plus the two vision markers. The
template overhead (7 tokens a request + 5 a message) makes a one-message "hi"
prompt 13 tokens, as the measured vLLM reported. These are the gateway's own
estimates (vision_tokens.py), laid out exactly here: the simulator needs the bytes
behind every token for its block hashes, the gateway only the counts.

Block hashes follow vLLM's scheme: block ``i`` hashes its parent's hash together
with its content, and the content of a block that covers image tokens includes
the image's content hash and the covered range, so a different image (even of
the same size) changes the hash of every block from the image on. A media part's
``uuid`` replaces that content hash, as in vLLM 0.24, which takes the string itself as
the item's identity in its processor cache, encoder cache and prefix blocks: two parts
with one uuid are one item there, whatever their bytes.

A ``video_url`` part (data: URI) is one such segment keyed by the video's content hash:
its tokens are what vLLM 0.24 makes of it (vlm_gateway/video_tokens.py: the frames its
opencv loader samples, in pairs, each pair with its ``<t seconds>`` text and markers),
read from the container header with PyAV; it also records the frames the engine decodes
(OpenCV grabs every frame up to the last sampled one) and the frames it preprocesses.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
from dataclasses import dataclass, field, replace

from PIL import Image, UnidentifiedImageError

from ...vision_tokens import (TEMPLATE_TOKENS_PER_MESSAGE, TEMPLATE_TOKENS_PER_REQUEST, estimate_text_tokens,
                              visual_tokens)

BLOCK_SIZE = 16


class PromptError(ValueError):
    """The request cannot be turned into a prompt (bad image, bad shape): a 400."""


@dataclass(frozen=True)
class SimImage:
    digest: bytes          # identity (processor and prefix cache): the content hash, or the uuid's
    width: int
    height: int
    tokens: int            # visual tokens incl. the 2 markers
    start: int = 0         # first token index in the prompt
    frames: int = 1        # frames the processor resizes and patchifies (video: sampled frames)
    groups: int = 1        # vision-encoder items: 1 for an image, temporal pairs for a video
    decode_pixels: int = 0  # pixels the loader decodes (video: every frame it grabs); 0 = pixels
    content: bytes = b""   # content hash of the bytes (= digest unless a uuid names the item)
    uuid: str | None = None

    @property
    def pixels(self) -> int:
        return self.width * self.height

    @property
    def decode_mpx(self) -> float:
        return (self.decode_pixels or self.pixels) / 1e6

    @property
    def preproc_mpx(self) -> float:
        return self.frames * self.pixels / 1e6


@dataclass
class PromptSpec:
    num_tokens: int
    images: list[SimImage] = field(default_factory=list)
    block_hashes: list[int] = field(default_factory=list)   # full blocks only


def image_info(data: bytes) -> tuple[int, int, bytes]:
    """(width, height, digest) of encoded image bytes; PIL reads only the header."""
    try:
        with Image.open(io.BytesIO(data)) as im:
            w, h = im.size
    except (UnidentifiedImageError, Image.DecompressionBombError, OSError, ValueError) as e:
        raise PromptError(f"cannot identify image file: {e}") from None
    return w, h, hashlib.sha256(data).digest()


def decode_data_uri(url: str) -> bytes:
    head, sep, payload = url.partition(",")
    if not sep or ";base64" not in head:
        raise PromptError("image data URIs must be base64 encoded")
    try:
        return base64.b64decode(payload, validate=False)
    except (binascii.Error, ValueError):
        raise PromptError("invalid base64 in image data URI") from None


def image_urls(body: dict) -> list[str]:
    """The image URLs of a chat request, in prompt order."""
    out = []
    for msg in body.get("messages") or []:
        content = msg.get("content") if isinstance(msg, dict) else None
        if isinstance(content, list):
            for part in content:
                if isinstance(part, dict) and part.get("type") == "image_url":
                    iu = part.get("image_url")
                    url = iu.get("url") if isinstance(iu, dict) else iu
                    if not isinstance(url, str):
                        raise PromptError("image_url.url must be a string")
                    out.append(url)
    return out


class _Layout:
    """Accumulates segments: ('t', bytes, ntok) or ('i', SimImage)."""

    def __init__(self) -> None:
        self.segments: list[tuple] = []
        self.n = 0
        self.images: list[SimImage] = []

    def text(self, data: bytes, ntok: int | None = None) -> None:
        ntok = estimate_text_tokens(data) if ntok is None else ntok
        if ntok:
            self.segments.append(("t", data, ntok))
            self.n += ntok

    def image(self, img: SimImage) -> None:
        img = replace(img, start=self.n)
        self.segments.append(("i", img, img.tokens))
        self.images.append(img)
        self.n += img.tokens

    def spec(self) -> PromptSpec:
        return PromptSpec(self.n, self.images, block_hashes(self.segments, self.n))


def block_hashes(segments: list[tuple], num_tokens: int, block_size: int = BLOCK_SIZE) -> list[int]:
    """Chained hashes of the full blocks of a segment layout."""
    hashes: list[int] = []
    parent = 0
    content: list = []
    fill = 0
    for seg in segments:
        kind, obj, ntok = seg
        pos = 0
        while pos < ntok:
            take = min(block_size - fill, ntok - pos)
            if kind == "t":
                content.append(obj[4 * pos: 4 * (pos + take)] if pos + take < ntok else obj[4 * pos:])
            else:
                content.append((obj.digest, pos, pos + take))
            pos += take
            fill += take
            if fill == block_size:
                parent = hash((parent, tuple(content)))
                hashes.append(parent)
                content, fill = [], 0
    return hashes


def _named(img: SimImage, uuid) -> SimImage:
    """A media part's ``uuid`` is the item's identity, as in vLLM 0.24 (chat_utils reads it
    beside the url; the processor uses the string itself as the item's hash): two parts with
    one uuid share processor-cache entries and prefix blocks whatever their bytes."""
    content = img.digest
    if uuid is None:
        return replace(img, content=content)
    uuid = str(uuid)
    return replace(img, digest=hashlib.sha256(b"uuid\0" + uuid.encode()).digest(), content=content, uuid=uuid)


def _image_for(url, fetched: dict[str, bytes]) -> SimImage:
    if not isinstance(url, str):
        raise PromptError("image_url.url must be a string")
    data = decode_data_uri(url) if url.startswith("data:") else fetched.get(url)
    if data is None:
        raise PromptError(f"image URL was not fetched: {url[:80]}")
    w, h, digest = image_info(data)
    try:
        tokens = visual_tokens(w, h, markers=True)
    except ValueError as e:
        raise PromptError(str(e)) from None
    return SimImage(digest, w, h, tokens)


def _video_for(url: str, fetched: dict[str, bytes]) -> SimImage:
    data = decode_data_uri(url) if url.startswith("data:") else fetched.get(url)
    if data is None:
        raise PromptError(f"video URL was not fetched: {url[:80]}")
    from ...video_tokens import video_tokens
    try:
        from ...stages.video.errors import VideoError
        from ...stages.video.rewrite import probe_video
        from ...stages.video.settings import VideoSettings
        h = probe_video(data, VideoSettings())
        n, rate = h.opencv_frames, float(h.rate)
        v = video_tokens(n, rate, h.width, h.height)
    except (VideoError, ValueError) as e:
        raise PromptError(f"cannot read video: {e}") from None
    # the loader grabs (decodes) every frame up to its last sampled index, which is the last frame
    return SimImage(hashlib.sha256(data).digest(), h.width, h.height, v.total, frames=v.frames,
                    groups=v.groups, decode_pixels=n * h.width * h.height)


def build_prompt(body: dict, fetched: dict[str, bytes] | None = None) -> PromptSpec:
    """PromptSpec of a chat (``messages``) or completions (``prompt``) body.

    ``fetched`` maps http(s) image URLs to their bytes (fetched by the caller)."""
    fetched = fetched or {}
    lay = _Layout()
    msgs = body.get("messages")
    if msgs is None:
        prompt = body.get("prompt", "")
        if isinstance(prompt, list):
            # one prompt here (the simulator answers one choice); the gateway's estimate
            # (vision_tokens.estimate_prompt_tokens) sums a list as the batch it is
            prompt = " ".join(p for p in prompt if isinstance(p, str))
        lay.text(str(prompt).encode())
        return lay.spec()
    if not isinstance(msgs, list):
        raise PromptError("messages must be a list")
    for msg in msgs:
        if not isinstance(msg, dict):
            raise PromptError("each message must be an object")
        role = str(msg.get("role", ""))
        lay.text(f"<|im_start|>{role}\n".encode(), 3)
        content = msg.get("content")
        if isinstance(content, str):
            lay.text(content.encode())
        elif isinstance(content, list):
            for part in content:
                if not isinstance(part, dict):
                    continue
                if part.get("type") == "text":
                    lay.text(str(part.get("text", "")).encode())
                elif part.get("type") == "image_url":
                    iu = part.get("image_url")
                    lay.image(_named(_image_for(iu.get("url") if isinstance(iu, dict) else iu, fetched),
                                     part.get("uuid")))
                elif part.get("type") == "video_url":
                    vu = part.get("video_url")
                    url = vu.get("url") if isinstance(vu, dict) else vu
                    if not isinstance(url, str):
                        raise PromptError("video_url.url must be a string")
                    lay.image(_named(_video_for(url, fetched), part.get("uuid")))
        lay.text(b"<|im_end|>\n", TEMPLATE_TOKENS_PER_MESSAGE - 3)
    lay.text(b"<|im_start|>assistant\n<think>\n\n</think>\n\n", TEMPLATE_TOKENS_PER_REQUEST)
    return lay.spec()


def synthetic_prompt(text: str, images: list[tuple[int, int, bytes]]) -> PromptSpec:
    """PromptSpec of one user message with ``images`` (w, h, digest) then ``text``,
    without encoding any image (for the offline calibration)."""
    lay = _Layout()
    lay.text(b"<|im_start|>user\n", 3)
    for w, h, digest in images:
        lay.image(SimImage(digest, w, h, visual_tokens(w, h, markers=True), content=digest))
    lay.text(text.encode())
    lay.text(b"<|im_end|>\n", TEMPLATE_TOKENS_PER_MESSAGE - 3)
    lay.text(b"<|im_start|>assistant\n<think>\n\n</think>\n\n", TEMPLATE_TOKENS_PER_REQUEST)
    return lay.spec()
