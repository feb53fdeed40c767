"""The one ``data:`` URI decoder (RFC 2397), used by the media stages, the /ui
playground and the LiteLLM hook.

    data:[<mime>][;param]*[;base64],<payload>

A base64 payload is decoded strictly first; on failure, once more with whitespace and
newlines removed and the padding completed (clients wrap and trim base64). Any other
payload is percent-decoded. ``payload_bytes`` gives the decoded size from the length
alone, so limits can be checked before anything is decoded.
"""

from __future__ import annotations

import binascii
import re
from urllib.parse import unquote_to_bytes

import pybase64


class DataUriError(ValueError):
    """Not a usable data: URI; ``code`` names why."""

    def __init__(self, message: str, code: str) -> None:
        super().__init__(message)
        self.code = code


# a base64 data: URI as the /ui playground takes it: data:[type/subtype][;params];base64,
BASE64_URI = re.compile(r"^data:(?P<mime>[\w.+-]+/[\w.+-]+)?(?:;[^,]*)?;base64,", re.I)


def is_base64(url: str) -> bool:
    comma = url.find(",")
    return comma >= 0 and url[:comma].lower().endswith(";base64")


def decode_base64(payload: str) -> bytes:
    try:
        return pybase64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        pass
    cleaned = "".join(payload.split())
    try:
        return pybase64.b64decode(cleaned + "=" * (-len(cleaned) % 4), validate=True)
    except (binascii.Error, ValueError):
        raise DataUriError("the data: URI is not valid base64", "invalid_image_base64") from None


def decode(url: str) -> bytes:
    """The bytes of a ``data:`` URI."""
    head, sep, payload = url.partition(",")
    if not sep:
        raise DataUriError("the data: URI has no ',' separating the header from the data", "invalid_image_data")
    if head.lower().endswith(";base64"):
        return decode_base64(payload)
    return unquote_to_bytes(payload)


def payload_bytes(url: str) -> int:
    """Decoded size of a ``data:`` URI's payload, from its length (no decoding)."""
    comma = url.find(",")
    if comma < 0:
        return 0
    n = len(url) - comma - 1
    return n * 3 // 4 if ";base64" in url[:comma].lower() else n
