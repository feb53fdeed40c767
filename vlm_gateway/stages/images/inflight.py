"""Media bytes counted per request and bounded per process.

Per request (``ChatRequest.media_bytes``): every data: payload and every fetched
body counts by kind against ``limits.max_total_<kind>_bytes`` (image embeddings
count as images), so a small request naming many large URLs is refused with
413 naming the part and the key, however its bytes arrive.

Per process: the bytes held for requests (fetched bodies as they stream in,
decoded data: payloads) are reserved from one bound, and the buffers image decodes
hold while they run (their estimate, ``memory.py``, reserved from the pool's threads
with ``decoding``) from another,

    held bytes of the requests in flight <= limits.max_media_bytes_in_flight
    decode buffers of the rewrites running <= images.max_decode_bytes_in_flight

and a reservation past either answers 503 with ``Retry-After``. A request gives its
holdings back when it ends, however it ends (the chain's ``finish`` calls ``release``);
a decode gives its buffers back when its rewrite returns or raises (``decoded``).
The counts are kept under a lock: decodes reserve from the pool's threads.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from ... import metrics
from ...core.errors import PayloadTooLarge, Unavailable

if TYPE_CHECKING:
    from ...config import ImagesConfig, LimitsConfig
    from ...core.request import ChatRequest, MediaPart

# the per-request total that each kind counts against
TOTAL_KEY = {"image": "max_total_image_bytes", "embeds": "max_total_image_bytes",
             "video": "max_total_video_bytes", "audio": "max_total_audio_bytes"}
_BUCKET = {"embeds": "image"}


class MediaBudget:
    def __init__(self, limits: "LimitsConfig", images: "ImagesConfig | None" = None) -> None:
        self.limits = limits
        self.limit = limits.max_media_bytes_in_flight
        self.used = 0
        self.decode_limit = images.max_decode_bytes_in_flight if images is not None else 0
        self.decode_used = 0
        self._lock = threading.Lock()

    def count(self, req: "ChatRequest", part: "MediaPart", n: int) -> None:
        """Count ``n`` bytes of ``part`` against its request's total for the kind."""
        bucket = _BUCKET.get(part.kind, part.kind)
        key = TOTAL_KEY.get(part.kind)
        cap = getattr(self.limits, key) if key else 0
        tally = req.media_bytes.by_kind
        total = tally.get(bucket, 0) + n
        tally[bucket] = total
        if cap and total > cap:
            raise PayloadTooLarge(f"The request's {bucket} bytes (data: payloads and fetched bodies) reach {total}, "
                                  f"above the limit limits.{key} ({cap}) at {part.param}", param=part.param,
                                  code=f"{bucket}_bytes_too_large", reason=f"{bucket}_bytes_too_large")

    def hold(self, req: "ChatRequest", part: "MediaPart", n: int) -> None:
        """Reserve ``n`` bytes held in memory for ``req`` (503 past the process bound)."""
        if n <= 0:
            return
        self.reserve(n, part.param)
        req.media_bytes.held += n

    def reserve(self, n: int, param: str | None = None) -> None:
        """Take ``n`` bytes from the process bound (any thread); 503 past it."""
        with self._lock:
            if self.limit and self.used + n > self.limit:
                raise Unavailable(f"The gateway holds its limit of media bytes in flight "
                                  f"(limits.max_media_bytes_in_flight = {self.limit}) and cannot take "
                                  f"{param or 'this media'} now; retry shortly", param=param,
                                  code="media_bytes_in_flight", headers={"retry-after": "1"},
                                  reason="media_bytes_in_flight")
            self.used += n
        metrics.MEDIA_BYTES_IN_FLIGHT.inc(n)

    def unreserve(self, n: int) -> None:
        with self._lock:
            self.used -= n
        metrics.MEDIA_BYTES_IN_FLIGHT.dec(n)

    def decoding(self, n: int, param: str | None = None) -> None:
        """Take ``n`` bytes of decode buffers from their bound (any thread); 503 past it."""
        with self._lock:
            if self.decode_limit and self.decode_used + n > self.decode_limit:
                raise Unavailable(f"The gateway's image decodes hold their limit of memory "
                                  f"(images.max_decode_bytes_in_flight = {self.decode_limit}) and cannot decode "
                                  f"{param or 'this image'} now; retry shortly", param=param,
                                  code="decode_bytes_in_flight", headers={"retry-after": "1"},
                                  reason="decode_bytes_in_flight")
            self.decode_used += n
        metrics.DECODE_BYTES_IN_FLIGHT.inc(n)

    def decoded(self, n: int) -> None:
        with self._lock:
            self.decode_used -= n
        metrics.DECODE_BYTES_IN_FLIGHT.dec(n)

    def fetched(self, req: "ChatRequest", part: "MediaPart"):
        """``on_chunk`` for a fetch of ``part``: count and hold every chunk."""
        def on_chunk(n: int) -> None:
            self.count(req, part, n)
            self.hold(req, part, n)
        return on_chunk

    def release(self, req: "ChatRequest") -> None:
        n = req.media_bytes.held
        if n:
            req.media_bytes.held = 0
            self.unreserve(n)
