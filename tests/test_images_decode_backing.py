"""A decode above images.max_decode_bytes is read only when its file backs it: at most
max_decode_bytes_per_source_byte bytes of decode per byte of file, up to
max_decode_bytes_large. Real decodes through the rewrite, with the caps scaled down so
that small images stand for 48 MP photos (backed) and for bombs (a flat canvas)."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from vlm_gateway.stages.images.errors import ImageError
from vlm_gateway.stages.images.memory import DecodeBudget, DecodeLimits
from vlm_gateway.stages.images.rewrite import rewrite_bytes

MB = 1024 * 1024
LIMITS = DecodeLimits(max_bytes=8 * MB, large_bytes=64 * MB, per_source_byte=256)


def _png(arr: np.ndarray, level: int) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, "PNG", compress_level=level)
    return buf.getvalue()


def test_cap_is_the_plain_limit_unless_the_file_backs_more():
    assert LIMITS.cap(0) == 8 * MB
    assert LIMITS.cap(10 * 1024) == 8 * MB                    # 2.5 MB backed: the plain cap
    assert LIMITS.cap(100 * 1024) == 25 * MB                  # 256 bytes per file byte
    assert LIMITS.cap(10 * MB) == 64 * MB                     # never above the large cap
    assert DecodeLimits(max_bytes=0).cap(5) == 0              # 0: no cap at all


def test_a_photo_whose_file_backs_its_decode_is_rewritten():
    rng = np.random.default_rng(7)
    data = _png(rng.integers(0, 256, (1500, 2000, 3), dtype=np.uint8), 1)   # noise: ~9 MB file
    with DecodeBudget(LIMITS, len(data)) as b:
        assert b.cap > LIMITS.max_bytes
    r = rewrite_bytes(data, limits=LIMITS)
    assert r.tokens_after > 0 and r.tokens_after < r.tokens_before


def test_a_flat_canvas_of_the_same_size_is_refused_before_decoding():
    data = _png(np.full((1500, 2000, 3), 240, dtype=np.uint8), 9)      # a few KB declaring 3 MP
    assert len(data) * LIMITS.per_source_byte < LIMITS.max_bytes
    with pytest.raises(ImageError) as e:
        rewrite_bytes(data, limits=LIMITS)
    assert e.value.code == "image_too_large"
    assert "max_decode_bytes" in str(e.value)
