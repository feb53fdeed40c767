"""What the gateway sends is already the size the engine's processor would resize it to
(Qwen's ``smart_resize``: both sides on the 32 px grid, the area within the min/max pixels
the engine runs with), so the engine's resize is a no-op: for every rewrite, under the
defaults and under each shipped profile's caps (the engine started by ``vlm-gateway
launch`` with that profile's ``image_max_pixels``), on the repo's own token rules
(``vision_tokens``)."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

import image_corpus as C
import text_corpus as T
from vlm_gateway.backends.profiles import load_profiles
from vlm_gateway.stages.images.policy import Policy
from vlm_gateway.stages.images.rewrite import rewrite_bytes
from vlm_gateway.vision_tokens import QWEN3_MAX_PIXELS, QWEN3_MIN_PIXELS, send_cap, smart_resize, target_size

PROFILES = {name: p for name, p in load_profiles().items() if p.get("engine") == "vllm"}


def engine_bounds(profile: dict | None) -> tuple[int, int]:
    """(min_pixels, max_pixels) of the engine's image processor (backends/launch.py's rule)."""
    px = int((profile or {}).get("image_max_pixels") or 0)
    return (min(QWEN3_MIN_PIXELS, px), px) if px else (QWEN3_MIN_PIXELS, QWEN3_MAX_PIXELS)


def capped(policy: Policy, w: int, h: int, profile: dict | None) -> Policy:
    if profile is None:
        return policy
    return policy.capped(send_cap(w, h, int(profile.get("image_max_long_side") or 0),
                                  int(profile.get("image_max_pixels") or 0)) or None)


def _png(im: Image.Image) -> bytes:
    buf = io.BytesIO()
    im.save(buf, "PNG")
    return buf.getvalue()


SOURCES = {
    "photo_12mp": lambda: C.photo_jpeg(4032, 3024),
    "photo_portrait": lambda: C.photo_jpeg(1170, 2532),
    "panorama": lambda: C.photo_jpeg(3000, 180),
    "hidpi_screenshot": lambda: C.desktop_screenshot_png(2880, 1800),
    "trimmed_screenshot": lambda: C.screenshot_png(),
    "ui_1440_small_text": lambda: _png(T.ui(2560, 1440, 10, 6)[0]),
    "document": lambda: _png(T.document(1240, 1754, 17, 20)[0]),
    "phone": lambda: _png(T.phone(1170, 2532, 40, 26)[0]),
}


@pytest.fixture(scope="module")
def sources():
    return {k: f() for k, f in SOURCES.items()}


@pytest.mark.parametrize("profile", [None, *sorted(PROFILES)])
def test_every_rewrite_is_a_fixed_point_of_the_engines_resize(sources, profile):
    prof = PROFILES.get(profile) if profile else None
    lo, hi = engine_bounds(prof)
    checked = 0
    for name, data in sources.items():
        im = Image.open(io.BytesIO(data))
        for pol in (Policy(), Policy(budget="fixed"), Policy(max_long_side=1280, budget="client"),
                    Policy(max_long_side=448, budget="client")):
            r = rewrite_bytes(data, capped(pol, im.width, im.height, prof))
            if r.passthrough:
                continue
            out = Image.open(io.BytesIO(r.data)).size
            assert out == (r.width, r.height)
            assert smart_resize(r.height, r.width, 32, lo, hi) == (r.height, r.width), (name, pol, profile, out)
            checked += 1
    assert checked >= 2 * len(sources)


@pytest.mark.parametrize("profile", [None, *sorted(PROFILES)])
def test_the_size_rule_is_a_fixed_point_over_many_sources_and_budgets(profile):
    """``target_size`` under the profile's cap (``send_cap``), as the stage applies it, for
    4000 source sizes and long sides: no size the gateway can choose is resized again."""
    prof = PROFILES.get(profile) if profile else None
    lo, hi = engine_bounds(prof)
    rng = np.random.default_rng(11)
    for _ in range(4000):
        w, h = int(rng.integers(200, 8000)), int(rng.integers(200, 8000))
        if max(w, h) / min(w, h) > 50:
            continue
        side = int(rng.choice([448, 768, 1024, 1280, 1568, 1888, 2560]))
        cap = send_cap(w, h, int((prof or {}).get("image_max_long_side") or 0),
                       int((prof or {}).get("image_max_pixels") or 0)) if prof else 0
        if cap:
            side = min(side, cap)
        if side >= max(w, h):
            continue  # within budget: the original goes
        tw, th = target_size(w, h, side)
        assert smart_resize(th, tw, 32, lo, hi) == (th, tw), (w, h, side, tw, th, profile)
