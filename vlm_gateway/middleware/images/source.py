"""Resolve one ``image_url`` part to its source: the bytes (data: URI decoded, or
an http(s) URL fetched safely), a stable content hash and the header size."""

from __future__ import annotations

import binascii
import time
from collections import OrderedDict
from dataclasses import dataclass
from urllib.parse import unquote_to_bytes

import pybase64
import xxhash

from .decode import Header, ImageError


def content_hash(data: bytes) -> str:
    """Fast, seedless (so stable across processes and hosts) 128-bit hash."""
    return xxhash.xxh3_128_hexdigest(data)


def decode_data_uri(url: str) -> bytes:
    """Bytes of a ``data:`` URI; base64 may contain whitespace/newlines."""
    head, sep, payload = url.partition(",")
    if not sep:
        raise ImageError("the data: URI has no ',' separating the header from the data", "invalid_image_data")
    if head.lower().endswith(";base64"):
        try:
            return pybase64.b64decode(payload, validate=True)
        except (binascii.Error, ValueError):
            pass
        cleaned = "".join(payload.split())
        try:
            return pybase64.b64decode(cleaned + "=" * (-len(cleaned) % 4), validate=True)
        except (binascii.Error, ValueError):
            raise ImageError("the data: URI is not valid base64", "invalid_image_base64") from None
    return unquote_to_bytes(payload)


@dataclass(slots=True)
class Source:
    kind: str  # "data" | "url" | "url_passthrough"
    url: str
    hash: str
    header: Header | None
    size: int
    data: bytes | None = None


class UrlMemo:
    """URL -> (hash, header, size) for a short while, so a repeated URL whose
    rewrite is in L1 is neither fetched nor decoded again."""

    def __init__(self, ttl_s: float, max_entries: int = 10_000) -> None:
        self.ttl_s = ttl_s
        self.max_entries = max_entries
        self._d: OrderedDict[str, tuple[float, str, Header, int]] = OrderedDict()

    def get(self, url: str) -> tuple[str, Header, int] | None:
        e = self._d.get(url)
        if e is None:
            return None
        if e[0] < time.monotonic():
            self._d.pop(url, None)
            return None
        return e[1], e[2], e[3]

    def put(self, url: str, h: str, header: Header, size: int) -> None:
        if self.ttl_s <= 0:
            return
        self._d[url] = (time.monotonic() + self.ttl_s, h, header, size)
        self._d.move_to_end(url)
        while len(self._d) > self.max_entries:
            self._d.popitem(last=False)
