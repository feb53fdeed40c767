"""Trim solid uniform borders (letterbox bars, white screenshot margins).

The border colour is taken from the four corners, which must agree within the
tolerance; the crop is the bounding box of every pixel that differs from that
colour by more than the tolerance in any channel, so content is never cut.

``uniform_corners(im, k, tolerance)`` asks the corner question of ``im.reduce(k)`` from
the four corner blocks alone (the same box averages, partial edge blocks included):
when it says no, ``content_box`` of the reduced image is None, so a screenshot without
a uniform border (a menu bar, a sidebar) costs four pixels, not a reduction of the image.
"""

from __future__ import annotations

from PIL import Image, ImageChops


def _agree(corners: list, tolerance: int) -> bool:
    bg = corners[0]
    return all(max(abs(a - b) for a, b in zip(c, bg)) <= tolerance for c in corners[1:])


def _rgb(p) -> tuple:
    """A pixel as ``vips.rgb`` of its image shows it: RGBX without the padding band, L as one value."""
    return (p,) if isinstance(p, int) else tuple(p[:3])


def uniform_corners(im: Image.Image, k: int, tolerance: int) -> bool:
    """Whether the corners of ``im.reduce(k)`` (``im`` itself for k < 2) agree within
    ``tolerance``, without reducing the image: the four corner k x k blocks (partial at the
    right and bottom edges, as ``reduce`` takes them) reduced alone give the same pixels."""
    w, h = im.size
    if k < 2:
        return _agree([_rgb(im.getpixel(p)) for p in ((0, 0), (w - 1, 0), (0, h - 1), (w - 1, h - 1))], tolerance)
    xl, yl = ((w - 1) // k) * k, ((h - 1) // k) * k
    return _agree([_rgb(im.reduce(k, box=(x, y, min(w, x + k), min(h, y + k))).getpixel((0, 0)))
                   for x, y in ((0, 0), (xl, 0), (0, yl), (xl, yl))], tolerance)


def content_box(im: Image.Image, tolerance: int, min_side: int = 32) -> tuple[int, int, int, int] | None:
    """Box (left, top, right, bottom) to keep, or None when there is nothing to trim."""
    w, h = im.size
    if w < 3 or h < 3:
        return None
    corners = [im.getpixel(p) for p in ((0, 0), (w - 1, 0), (0, h - 1), (w - 1, h - 1))]
    bg = corners[0]
    if not _agree(corners, tolerance):
        return None  # not a uniform border
    diff = ImageChops.difference(im, Image.new(im.mode, im.size, bg))
    if tolerance > 0:
        diff = diff.point(([0] * (tolerance + 1) + [255] * (255 - tolerance)) * len(diff.getbands()))
    box = diff.getbbox()
    if box is None or box == (0, 0, w, h):
        return None  # blank image or no border
    left, top, right, bottom = box
    # a sliver of content (one dot on a page) is not worth an extreme aspect ratio
    if right - left < min_side or bottom - top < min_side:
        return None
    cw, ch = right - left, bottom - top
    if max(cw, ch) / min(cw, ch) > 50:
        return None
    return box


def trim(im: Image.Image, tolerance: int, min_side: int = 32) -> Image.Image:
    box = content_box(im, tolerance, min_side)
    return im if box is None else im.crop(box)
