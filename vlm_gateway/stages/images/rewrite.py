"""The CPU pipeline for one image: header probe -> open with the real size checked
-> (within budget: verify, then pass through, or convert what engines would read
differently | over budget: decode with DCT scaling -> trim -> downscale) -> encode.
Synchronous and pure: the stage runs it in the bounded pool; the playground and
the benchmark call it directly."""

from __future__ import annotations

import time
from dataclasses import dataclass

from ...vision_tokens import target_size, visual_tokens
from .decode import MIME, Header, decode_opened, open_checked, probe, verify
from .encode import data_uri, encode
from .policy import Policy
from .pressure import long_side
from .resize import downscale, prescale_size
from .trim import content_box

DEFAULT_MAX_SOURCE_PIXELS = 64_000_000


@dataclass(slots=True)
class Rewritten:
    """Result for one image. ``url`` is None for a pass-through (send the original)."""

    url: str | None
    data: bytes  # bytes sent: the rewritten image, or the source on pass-through
    mime: str
    width: int
    height: int
    source_width: int
    source_height: int
    source_bytes: int
    tokens_before: int
    tokens_after: int
    trimmed: bool = False
    seconds: float = 0.0
    # what was converted so the engine reads what a viewer shows (decode.Decoded.conversions)
    conversions: tuple[str, ...] = ()
    # What the output shows of the source, for mapping coordinates back: (client_w, client_h,
    # left, top, right, bottom) in pixels of the upright source; () = the source as it is.
    view: tuple[float, ...] = ()

    @property
    def passthrough(self) -> bool:
        return self.url is None


def tokens(width: int, height: int, policy: Policy) -> int:
    return visual_tokens(width, height, policy.grid_factor, policy.min_pixels, policy.max_pixels)


def budget_long_side(policy: Policy) -> int:
    """The long side this image is sent at: its budget under the SLO budget level. No
    legibility estimate yet: every image is of class "unknown" (floor 0)."""
    return long_side(policy.max_long_side, 0, "unknown", policy.level, policy.photo_scales, policy.text_scales,
                     policy.photo_floor, policy.below_floor)


def needs_rewrite(header: Header, policy: Policy) -> bool:
    return policy.enabled and max(header.width, header.height) > budget_long_side(policy)


def rewrite(data: bytes, header: Header, policy: Policy,
            max_source_pixels: int = DEFAULT_MAX_SOURCE_PIXELS) -> Rewritten:
    """Rewrite ``data`` (already probed) for ``policy``. Within budget the original
    bytes pass through once they are verified and need no conversion."""
    t0 = time.perf_counter()
    op = open_checked(data, header.format, max_source_pixels)
    header = Header(header.format, *op.size)  # the real size, whatever the header declared
    before = tokens(header.width, header.height, policy)
    if not needs_rewrite(header, policy):
        d = verify(op)
        if d is None:
            return Rewritten(None, data, MIME[header.format], header.width, header.height, header.width,
                             header.height, len(data), before, before, seconds=time.perf_counter() - t0)
        im = d.image  # converted at its own size: no trim, no resize
        out, mime = encode(im, policy.jpeg_quality)
        return Rewritten(data_uri(out, mime), out, mime, im.width, im.height, header.width, header.height,
                         len(data), before, tokens(im.width, im.height, policy), False,
                         time.perf_counter() - t0, conversions=tuple(d.conversions),
                         view=(im.width, im.height, 0.0, 0.0, float(im.width), float(im.height)))
    f = policy.grid_factor
    side = budget_long_side(policy)
    target = target_size(header.width, header.height, side, f, policy.min_pixels)
    d = decode_opened(op, prescale_size(target, policy.prescale_gap))
    im, scale = d.image, d.scale
    view = _full_view(im, scale, header)
    trimmed = False
    if policy.trim_borders:
        box = content_box(im, policy.trim_tolerance, min_side=max(2, int(f / scale)))
        if box is not None:
            kx, ky = view[0] / im.width, view[1] / im.height
            view = (view[0], view[1], box[0] * kx, box[1] * ky, box[2] * kx, box[3] * ky)
            im = im.crop(box)
            trimmed = True
    # target from the upright content size in source pixels
    cw, ch = max(1, round(im.width * scale)), max(1, round(im.height * scale))
    target = target_size(cw, ch, side, f, policy.min_pixels)
    im = downscale(im, target, policy.resample, policy.prescale_gap)
    out, mime = encode(im, policy.jpeg_quality)
    return Rewritten(data_uri(out, mime), out, mime, im.width, im.height, header.width, header.height,
                     len(data), before, tokens(im.width, im.height, policy), trimmed, time.perf_counter() - t0,
                     view=view, conversions=tuple(d.conversions))


def _full_view(im, scale: float, header: Header) -> tuple[float, ...]:
    """The whole upright source as a view: the header's size, swapped when the decode
    turned the image (EXIF orientation)."""
    w, h = header.width, header.height
    if w != h and abs(im.width * scale - h) < abs(im.width * scale - w):
        w, h = h, w
    return (w, h, 0.0, 0.0, float(w), float(h))


def rewrite_bytes(data: bytes, policy: Policy | None = None,
                  max_source_pixels: int = DEFAULT_MAX_SOURCE_PIXELS) -> Rewritten:
    """Probe and rewrite raw image bytes (CPU-bound: call it off the event loop).
    Raises ``decode.ImageError`` (with ``.code``) for refused or broken images."""
    policy = policy or Policy()
    return rewrite(data, probe(data, max_source_pixels), policy, max_source_pixels)
