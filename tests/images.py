"""Small image helpers for tests."""

from __future__ import annotations

import base64
import io

from PIL import Image


def image_bytes(width: int = 64, height: int = 48, color=(200, 30, 30), fmt: str = "PNG", **kw) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (width, height), color).save(buf, fmt, **kw)
    return buf.getvalue()


def data_uri(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64," + base64.b64encode(data).decode()


def image_part(width: int = 64, height: int = 48, color=(200, 30, 30)) -> dict:
    return {"type": "image_url", "image_url": {"url": data_uri(image_bytes(width, height, color))}}
