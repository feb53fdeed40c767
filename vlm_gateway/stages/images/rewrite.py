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
from . import vips
from .policy import Policy
from .resize import downscale, prescale_size, reduce_factor
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


def needs_rewrite(header: Header, policy: Policy) -> bool:
    return policy.enabled and max(header.width, header.height) > policy.max_long_side


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
    target = target_size(header.width, header.height, policy.max_long_side, f, policy.min_pixels)
    gap = policy.prescale_gap
    d = decode_opened(op, prescale_size(target, gap))
    full, scale = d.image, d.scale
    view = _full_view(full, scale, header)
    # target from the upright size in source pixels (EXIF orientation may have turned it)
    target = target_size(max(1, round(full.width * scale)), max(1, round(full.height * scale)),
                         policy.max_long_side, f, policy.min_pixels)
    # Trim on a reduced image (box averages keep a uniform border exactly uniform); the
    # resize then starts from the full decode when the content needs more of its pixels.
    k = reduce_factor(full.size, target, gap)
    im = vips.rgb(full.reduce(k) if k >= 2 else full)
    trimmed = False
    if policy.trim_borders:
        box = content_box(im, policy.trim_tolerance, min_side=max(2, int(f / (scale * k))))
        if box is not None:
            kx, ky = view[0] / im.width, view[1] / im.height
            view = (view[0], view[1], box[0] * kx, box[1] * ky, box[2] * kx, box[3] * ky)
            trimmed = True
            fbox = (box[0] * k, box[1] * k, min(full.width, box[2] * k), min(full.height, box[3] * k))
            cw, ch = max(1, round((fbox[2] - fbox[0]) * scale)), max(1, round((fbox[3] - fbox[1]) * scale))
            target = target_size(cw, ch, policy.max_long_side, f, policy.min_pixels)
            k2 = reduce_factor((fbox[2] - fbox[0], fbox[3] - fbox[1]), target, gap)
            if k2 == k:
                im = im.crop(box)
            else:
                im = vips.rgb(full.reduce(k2, box=fbox) if k2 >= 2 else full.crop(fbox))
    im = downscale(im, target, policy.resample, gap)
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
