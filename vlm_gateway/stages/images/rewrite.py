"""The CPU pipeline for one image: header probe -> open with the real size checked
-> (within budget: verify, then pass through, or convert what engines would read
differently | over budget: decode with DCT scaling -> trim -> the long side
(``decide``: budget.py from legibility.py's estimate, or the fixed rule) ->
downscale) -> encode. The legible rule measures on the decode the fixed rule pays
for anyway, at least ``ESTIMATE_LONG`` px (a 1080p JPEG decodes in full, a 12 MP
photo at 1/4); text a reduced decode cannot show (under ~3 decoded px) counts as none.
Synchronous and pure: the stage runs it in the bounded pool; the playground and
the benchmark call it directly."""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

import numpy as np

from ...vision_tokens import smart_resize, target_size, visual_tokens
from . import budget as budgets
from .budget import Budget
from .decode import MIME, Decoded, Header, Opened, decode_opened, open_checked, probe, verify
from .encode import data_uri, encode
from .legibility import estimate, strips
from .memory import DecodeBudget, DecodeLimits
from .policy import Policy
from .pressure import long_side as pressed
from . import spare, vips
from .resize import downscale, prescale_size, reduce_factor
from .spans import NONE, Spans
from .trim import content_box, uniform_corners

DEFAULT_MAX_SOURCE_PIXELS = 64_000_000
ESTIMATE_LONG = 1000  # the legible rule estimates on a decode of at least this long side


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
    # the long-side decision (None: within budget before any estimate, or rewriting off)
    budget: Budget | None = None

    @property
    def passthrough(self) -> bool:
        return self.url is None


def tokens(width: int, height: int, policy: Policy) -> int:
    return visual_tokens(width, height, policy.grid_factor, policy.min_pixels, policy.max_pixels)


def needs_rewrite(header: Header, policy: Policy) -> bool:
    """Over the size where a decision is needed (at or under it: sent as it is, unless the
    client opted in to shrinking under engine pressure)."""
    limit = budgets.estimate_side(policy) if policy.legible else policy.max_long_side
    if policy.level > 0:
        limit = pressed(limit, 0, "unknown", policy.level, policy.photo_scales, policy.text_scales,
                        policy.photo_floor, policy.below_floor)
    return policy.enabled and max(header.width, header.height) > limit


# pressure.py's classes for budget.py's
_PRESSURE_CLASS = {"no_text": "none", "text": "text", "dense_text": "text"}


# fewest pixels a helper's band of the estimate's strips is worth (a handoff costs ~0.1 ms; a
# 1080p frame's strips take 2-3 ms on one core, a 12 MP photo's 1/4 decode's well under 1 ms)
BAND_PIXELS = 1_000_000


def estimate_in_bands(im, scale: float, box: tuple[int, int, int, int] | None, n: int):
    """``legibility.estimate(im, scale, box)``, its strips (grayscale column samples) made in
    ``n`` row bands at once, one by this thread and the rest by helpers: the same array, so
    the same estimate (strips are column ranges; rows split freely). A band no helper has
    started when this thread gets to it is taken back and made here: never slower than one
    thread by more than a handoff, whatever the other cores are doing by then."""
    x0, y0, x1, y1 = box or (0, 0, *im.size)
    n = min(n, (x1 - x0) * (y1 - y0) // BAND_PIXELS)
    if n <= 1:
        return estimate(im, scale, box)
    cuts = [y0 + (y1 - y0) * i // n for i in range(n + 1)]
    bands = [(x0, cuts[i], x1, cuts[i + 1]) for i in range(n)]
    futs = [spare.helpers(n).submit(strips, im, b) for b in bands[1:]]
    parts = [strips(im, bands[0])]
    for f, b in zip(futs, bands[1:]):
        parts.append(strips(im, b) if f.cancel() else f.result())
    return estimate(np.concatenate(parts, axis=0), scale)


def decide(policy: Policy, d: Decoded, content_long: int, box: tuple[int, int, int, int] | None = None,
           threads: int = 1) -> Budget:
    """The long side for this image: THE call site of the decision (budget.py), lowered
    under engine pressure by the SLO budget level (pressure.py), never below
    ``legible_floor`` unless the client or tenant opted in."""
    if not policy.legible:
        b = budgets.fixed(policy, content_long, "client" if policy.budget == "client" else "fixed")
    else:
        b = budgets.choose(estimate_in_bands(d.image, d.scale, box, threads), content_long, policy)
    if policy.level <= 0:
        return b
    side = pressed(b.long_side, b.legible_floor, _PRESSURE_CLASS.get(b.cls, "unknown"), policy.level,
                   policy.photo_scales, policy.text_scales, policy.photo_floor, policy.below_floor)
    return b if side >= b.long_side else replace(b, long_side=side, reason="pressure")


def _draft(header: Header, policy: Policy) -> tuple[int, int]:
    f = policy.grid_factor
    floor = budgets.estimate_side(policy) if policy.legible else policy.max_long_side
    target = prescale_size(target_size(header.width, header.height, floor, f, policy.min_pixels),
                           policy.prescale_gap)
    if policy.legible:
        k = min(1.0, ESTIMATE_LONG / max(header.width, header.height))
        target = (max(target[0], int(header.width * k)), max(target[1], int(header.height * k)))
    return target


def _within(data: bytes, header: Header, op: Opened, policy: Policy, t0: float, before: int,
            budget: Budget | None = None, spans: Spans = NONE) -> Rewritten:
    """Sent at its own size: the original bytes once verified, or converted."""
    d = verify(op)
    spans.mark("verify")
    if d is None:
        return Rewritten(None, data, MIME[header.format], header.width, header.height, header.width,
                         header.height, len(data), before, before, seconds=time.perf_counter() - t0, budget=budget)
    im = d.image  # converted at its own size: no trim, no resize
    out, mime = encode(im, policy.jpeg_quality)
    spans.mark("encode")
    uri = data_uri(out, mime)
    spans.mark("base64")
    return Rewritten(uri, out, mime, im.width, im.height, header.width, header.height,
                     len(data), before, tokens(im.width, im.height, policy), False,
                     time.perf_counter() - t0, conversions=tuple(d.conversions),
                     view=(im.width, im.height, 0.0, 0.0, float(im.width), float(im.height)), budget=budget)


def rewrite(data: bytes, header: Header, policy: Policy,
            max_source_pixels: int = DEFAULT_MAX_SOURCE_PIXELS, spans: Spans = NONE,
            limits: DecodeLimits | None = None) -> Rewritten:
    """Rewrite ``data`` (already probed) for ``policy``. Within budget the original
    bytes pass through once they are verified and need no conversion. ``spans``: where
    the time went, step by step (spans.py). ``limits``: the memory its decodes may hold
    (``memory.py``), given back when it returns or raises."""
    with DecodeBudget(limits, len(data)) as held:
        return _rewrite(data, header, policy, max_source_pixels, spans, held)


def _rewrite(data: bytes, header: Header, policy: Policy, max_source_pixels: int, spans: Spans,
             held: DecodeBudget) -> Rewritten:
    t0 = time.perf_counter()
    threads = spare.granted()  # more than 1 only while cores are idle (spare.py): same bytes either way
    vips.threads(1)  # a decode is sequential; the resize below takes the grant
    op = open_checked(data, header.format, max_source_pixels, held)
    header = Header(header.format, *op.size)  # the real size, whatever the header declared
    before = tokens(header.width, header.height, policy)
    spans.mark("open")
    if not needs_rewrite(header, policy):
        return _within(data, header, op, policy, t0, before, spans=spans)
    f = policy.grid_factor
    gap = policy.prescale_gap
    d = decode_opened(op, _draft(header, policy))
    full, scale = d.image, d.scale
    spans.mark("decode")
    view = _full_view(full, scale, header)
    trimmed = False
    fbox = None  # the content box in ``full``'s pixels (None: all of it)
    reduced = None  # (k, full.reduce(k)) made for the trim: the resize reuses it when its k is the same
    if policy.trim_borders:
        # Trim on a reduced image (box averages keep a uniform border exactly uniform),
        # reduced no further than the smallest size this image can be sent at.
        floor = budgets.estimate_side(policy) if policy.legible else policy.max_long_side
        low = target_size(max(1, round(full.width * scale)), max(1, round(full.height * scale)), floor, f,
                          policy.min_pixels)
        k = reduce_factor(full.size, low, gap)
        box = None
        if uniform_corners(full, k, policy.trim_tolerance):  # else no border to find: nothing reduced
            if k >= 2:
                reduced = (k, full.reduce(k))
            small = vips.rgb(reduced[1] if reduced else full)
            box = content_box(small, policy.trim_tolerance, min_side=max(2, int(f / (scale * k))))
        if box is not None:
            kx, ky = view[0] / small.width, view[1] / small.height
            view = (view[0], view[1], box[0] * kx, box[1] * ky, box[2] * kx, box[3] * ky)
            fbox = (box[0] * k, box[1] * k, min(full.width, box[2] * k), min(full.height, box[3] * k))
            trimmed = True
        spans.mark("trim")
    # target from the upright content size in source pixels
    fw, fh = (fbox[2] - fbox[0], fbox[3] - fbox[1]) if fbox else full.size
    cw, ch = max(1, round(fw * scale)), max(1, round(fh * scale))
    budget = decide(policy, Decoded(full, scale, d.conversions, d.frames), max(cw, ch), fbox, threads)
    long_side = budget.long_side
    spans.mark("estimate")
    if not trimmed and long_side >= max(header.width, header.height):
        # the text needs every pixel: sent at its own size, as the fixed rule sends small images.
        # The decode just made read every pixel (a JPEG every coefficient): it is the
        # verification, and with nothing to convert the original bytes go.
        if not d.conversions:
            return Rewritten(None, data, MIME[header.format], header.width, header.height, header.width,
                             header.height, len(data), before, before, seconds=time.perf_counter() - t0,
                             budget=budget)
        return _within(data, header, open_checked(data, header.format, max_source_pixels, held), policy, t0,
                       before, budget, spans)
    target = target_size(cw, ch, long_side, f, policy.min_pixels)
    if target == (cw, ch):  # trimmed content within the budget: on the grid too, as the engine would make it
        sh, sw = smart_resize(ch, cw, f, policy.min_pixels, policy.max_pixels)
        target = (sw, sh)
    need = prescale_size(target, gap)
    if scale > 1 and (fw < need[0] or fh < need[1]):
        # the reduced decode is too small for this text's budget: decode again, finer
        k = max(need[0] / cw, need[1] / ch)  # draft sizes are as stored (before EXIF turns)
        d = decode_opened(open_checked(data, header.format, max_source_pixels, held),
                          (max(1, int(header.width * k)), max(1, int(header.height * k))))
        full, reduced = d.image, None
        if trimmed:  # the same content box, in this decode's pixels
            fbox = (round(view[2] / view[0] * full.width), round(view[3] / view[1] * full.height),
                    round(view[4] / view[0] * full.width), round(view[5] / view[1] * full.height))
        fw, fh = (fbox[2] - fbox[0], fbox[3] - fbox[1]) if fbox else full.size
        spans.mark("decode")
    vips.threads(threads)
    im = downscale(full, target, policy.resample, gap, fbox, reduced)
    vips.threads(1)
    if im.mode not in ("RGB", "RGBX"):  # RGBX (libvips' output) is encoded as it is
        im = vips.rgb(im)
    spans.mark("resize")
    out, mime = encode(im, policy.jpeg_quality)
    spans.mark("encode")
    uri = data_uri(out, mime)
    spans.mark("base64")
    return Rewritten(uri, out, mime, im.width, im.height, header.width, header.height,
                     len(data), before, tokens(im.width, im.height, policy), trimmed, time.perf_counter() - t0,
                     view=view, conversions=tuple(d.conversions), budget=budget)


def _full_view(im, scale: float, header: Header) -> tuple[float, ...]:
    """The whole upright source as a view: the header's size, swapped when the decode
    turned the image (EXIF orientation)."""
    w, h = header.width, header.height
    if w != h and abs(im.width * scale - h) < abs(im.width * scale - w):
        w, h = h, w
    return (w, h, 0.0, 0.0, float(w), float(h))


def rewrite_bytes(data: bytes, policy: Policy | None = None,
                  max_source_pixels: int = DEFAULT_MAX_SOURCE_PIXELS, limits: DecodeLimits | None = None) -> Rewritten:
    """Probe and rewrite raw image bytes (CPU-bound: call it off the event loop).
    Raises ``decode.ImageError`` (with ``.code``) for refused or broken images."""
    policy = policy or Policy()
    return rewrite(data, probe(data, max_source_pixels), policy, max_source_pixels, limits=limits)
