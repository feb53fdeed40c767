"""The simulator's grounding mode (``vlm-gateway sim --grounding CONVENTION``): a test
instrument that answers like a perfect locator, in a model's coordinate convention.

Targets are solid-colour rectangles of the ``MARKERS`` colours that a test draws; the
simulator decodes every image it *received* and finds each colour's rectangle (pixels
within ``TOLERANCE`` of the colour on every channel, edges at half the peak row/column
count, so JPEG ringing and resampling blur move them by a pixel at most). It answers
for every image of the request, in the frame of the image it received:

* ``qwen3-vl`` / ``qwen2-vl``: relative 0-1000 (``x / width * 1000``);
* ``qwen2.5-vl``: absolute pixels of the processor's ``smart_resize`` (factor 28,
  3136..12845056 pixels) of the received image.

The last user text picks the format: ``box tokens`` -> ``<|box_start|>(x1,y1),(x2,y2)
<|box_end|>``; ``xml`` -> ``<points x1=.. y1=.. alt=..>``; ``point`` -> ``point_2d`` JSON;
otherwise ``bbox_2d`` JSON; fenced in ```json unless it says ``bare``. With several images
each image's answer starts with ``Image N:`` unless the text says ``no image headings``.
A stream sends the answer in pieces of 1 to 5 characters, so groups split anywhere.
"""

from __future__ import annotations

import io
from itertools import cycle

import numpy as np
from PIL import Image

from ...vision_tokens import smart_resize

MARKERS: dict[str, tuple[int, int, int]] = {
    "magenta": (255, 0, 255), "cyan": (0, 255, 255), "yellow": (255, 255, 0), "lime": (0, 255, 0),
    "blue": (0, 0, 255),
}
TOLERANCE = 60
MIN_PIXELS = 4
CONVENTIONS = ("qwen3-vl", "qwen2.5-vl", "qwen2-vl")
QWEN25 = (28, 3136, 12845056)
_PIECES = (1, 3, 2, 5, 4)

Box = tuple[float, float, float, float]


def find_targets(im: Image.Image) -> dict[str, Box]:
    """Each marker colour's rectangle (left, top, right, bottom) in pixels of ``im``."""
    a = np.asarray(im.convert("RGB"), dtype=np.int16)
    out: dict[str, Box] = {}
    for label, colour in MARKERS.items():
        mask = (np.abs(a - np.array(colour, dtype=np.int16)) <= TOLERANCE).all(axis=2)
        if int(mask.sum()) < MIN_PIXELS:
            continue
        cols, rows = mask.sum(axis=0), mask.sum(axis=1)
        xs = np.flatnonzero(cols >= cols.max() / 2)
        ys = np.flatnonzero(rows >= rows.max() / 2)
        out[label] = (float(xs[0]), float(ys[0]), float(xs[-1] + 1), float(ys[-1] + 1))
    return out


def model_frame(width: int, height: int, convention: str) -> tuple[float, float]:
    """Units per pixel of a ``width x height`` received image on each axis."""
    if convention == "qwen2.5-vl":
        h, w = smart_resize(height, width, *QWEN25)
        return w / width, h / height
    return 1000 / width, 1000 / height


def _fmt_items(targets: dict[str, Box], kx: float, ky: float, kind: str) -> list[str]:
    items = []
    for label, (x0, y0, x1, y1) in targets.items():
        b = [round(x0 * kx), round(y0 * ky), round(x1 * kx), round(y1 * ky)]
        c = [round((x0 + x1) / 2 * kx), round((y0 + y1) / 2 * ky)]
        if kind == "tokens":
            items.append(f"<|object_ref_start|>{label}<|object_ref_end|><|box_start|>({b[0]},{b[1]}),"
                         f"({b[2]},{b[3]})<|box_end|>")
        elif kind == "xml":
            items.append(f'<points x1="{c[0]}" y1="{c[1]}" alt="{label}">{label}</points>')
        elif kind == "point":
            items.append(f'{{"point_2d": [{c[0]}, {c[1]}], "label": "{label}"}}')
        else:
            items.append(f'{{"bbox_2d": [{b[0]}, {b[1]}, {b[2]}, {b[3]}], "label": "{label}"}}')
    return items


def answer_for(images: list[bytes], prompt: str, convention: str) -> str:
    """The locator's answer for the images of one request (bytes as received)."""
    p = prompt.lower()
    kind = ("tokens" if "box token" in p else "xml" if "xml" in p else "point" if "point" in p else "bbox")
    fenced = kind in ("bbox", "point") and "bare" not in p
    headings = len(images) > 1 and "no image headings" not in p
    blocks = []
    for n, data in enumerate(images, 1):
        with Image.open(io.BytesIO(data)) as im:
            im.load()
            w, h = im.size
            targets = find_targets(im)
        kx, ky = model_frame(w, h, convention)
        items = _fmt_items(targets, kx, ky, kind)
        if kind in ("bbox", "point"):
            body = "[\n  " + ",\n  ".join(items) + "\n]"
            body = f"```json\n{body}\n```" if fenced else body
        else:
            body = "\n".join(items)
        blocks.append(f"Image {n}:\n{body}" if headings else body)
    return "\n\n".join(blocks)


def pieces(text: str) -> list[str]:
    """The answer as stream deltas of 1-5 characters."""
    out, i = [], 0
    for n in cycle(_PIECES):
        if i >= len(text):
            return out
        out.append(text[i:i + n])
        i += n
    return out


def desktop(width: int, height: int, window: Box, targets: dict[str, Box], fmt: str = "PNG",
            background: tuple[int, int, int] = (38, 66, 99)) -> bytes:
    """A screenshot to test with: one window on a flat desktop (so the gateway trims to
    the window) holding a title bar, lines of "text" and the ``targets`` (label -> box in
    pixels of this image, drawn in that label's marker colour)."""
    from PIL import ImageDraw
    im = Image.new("RGB", (width, height), background)
    d = ImageDraw.Draw(im)
    x0, y0, x1, y1 = window
    d.rectangle([x0, y0, x1 - 1, y1 - 1], fill=(236, 236, 236))
    d.rectangle([x0, y0, x1 - 1, y0 + 27], fill=(64, 64, 72))
    for i, y in enumerate(range(int(y0) + 48, int(y1) - 20, 26)):
        d.rectangle([x0 + 24, y, x0 + 24 + (i * 137) % int(max(60, (x1 - x0) * 0.7)) + 40, y + 9], fill=(90, 90, 96))
    for label, (a, b, c, e) in targets.items():
        d.rectangle([a, b, c - 1, e - 1], fill=MARKERS[label])
    out = io.BytesIO()
    im.save(out, fmt, **({"quality": 92} if fmt == "JPEG" else {}))
    return out.getvalue()
