"""Small image helpers for tests."""

from __future__ import annotations

import base64
import io

from PIL import Image, ImageDraw


def image_bytes(width: int = 64, height: int = 48, color=(200, 30, 30), fmt: str = "PNG", **kw) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (width, height), color).save(buf, fmt, **kw)
    return buf.getvalue()


def data_uri(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64," + base64.b64encode(data).decode()


def image_part(width: int = 64, height: int = 48, color=(200, 30, 30)) -> dict:
    return {"type": "image_url", "image_url": {"url": data_uri(image_bytes(width, height, color))}}


def photo_jpeg(width: int, height: int) -> bytes:
    """A non-uniform picture (gradient + shapes), so no border trim applies."""
    im = Image.linear_gradient("L").resize((width, height)).convert("RGB")
    d = ImageDraw.Draw(im)
    for i in range(0, width, max(1, width // 8)):
        d.rectangle([i, height // 4, i + width // 16, height // 2], fill=(30, 120, 200))
    buf = io.BytesIO()
    im.save(buf, "JPEG", quality=85)
    return buf.getvalue()
