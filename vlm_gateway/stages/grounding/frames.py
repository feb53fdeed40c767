"""The transform from the image the engine received (the *sent* image) to the
client's image, and the per-image coordinate maps derived from it.

A sent image of ``sent_w x sent_h`` pixels shows the box ``(left, top, right, bottom)``
of the client's (upright) ``client_w x client_h`` image, resized: a point ``(u, v)`` of
the sent image is ``(left + u * sx, top + v * sy)`` of the client's image with
``sx = (right - left) / sent_w`` and ``sy = (bottom - top) / sent_h`` (continuous pixel
coordinates: 0 is the left edge of the first pixel).

``ImageMap`` maps a model coordinate to what the model would have answered had it
received the client's image itself: the *same convention* applied to the client's image
(per axis ``out = a + b * value``), so client code written for the model works unchanged:

* relative (0-R of the received image): ``out = (left + value / R * (right - left)) / client_w * R``;
* absolute (pixels of the processor's ``smart_resize`` of the received image, ``P_w x P_h``):
  ``out = (left + value * (right - left) / P_w) * C_w / client_w`` where ``C_w x C_h`` is the
  processor's ``smart_resize`` of the client's image (what the model would have seen).

``forward`` is the inverse (client frame -> the model's frame), clamped to the model's frame.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...core import headers as H
from ...vision_tokens import smart_resize
from .conventions import Convention

HEADER_PREFIX = H.IMAGE_TRANSFORM.nth("")


def _num(v: float, digits: int = 2) -> str:
    r = round(v)
    if abs(v - r) < 10 ** -digits / 2:
        return str(int(r))
    return f"{v:.{digits}f}".rstrip("0").rstrip(".")


@dataclass(frozen=True, slots=True)
class Frame:
    client_w: int
    client_h: int
    left: float
    top: float
    right: float
    bottom: float
    sent_w: int
    sent_h: int

    @classmethod
    def identity(cls, w: int, h: int) -> "Frame":
        return cls(w, h, 0.0, 0.0, float(w), float(h), w, h)

    @property
    def scale(self) -> tuple[float, float]:
        return (self.right - self.left) / self.sent_w, (self.bottom - self.top) / self.sent_h

    @property
    def cropped(self) -> bool:
        return (self.left, self.top, self.right, self.bottom) != (0, 0, self.client_w, self.client_h)

    def model_size(self, conv: Convention) -> tuple[int, int]:
        """(width, height) of the frame an absolute convention's coordinates refer to."""
        h, w = smart_resize(self.sent_h, self.sent_w, conv.factor, conv.min_pixels, conv.max_pixels)
        return w, h

    def answer_size(self, conv: Convention) -> tuple[int, int]:
        """(width, height) of the frame mapped absolute coordinates refer to: the processor's
        resize of the client's image."""
        h, w = smart_resize(self.client_h, self.client_w, conv.factor, conv.min_pixels, conv.max_pixels)
        return w, h

    def header(self, part: str, conv: Convention) -> str:
        sx, sy = self.scale
        v = (f"part={part}; client={self.client_w}x{self.client_h}; crop={_num(self.left)},{_num(self.top)},"
             f"{_num(self.right)},{_num(self.bottom)}; sent={self.sent_w}x{self.sent_h}; "
             f"scale={_num(sx, 6)},{_num(sy, 6)}")
        if conv.known and not conv.relative:
            try:
                (mw, mh), (aw, ah) = self.model_size(conv), self.answer_size(conv)
                v += f"; model={mw}x{mh}; answer={aw}x{ah}"
            except ValueError:
                pass
        return v

    def key(self) -> str:
        return (f"{self.client_w}x{self.client_h}:{self.left:.3f},{self.top:.3f},{self.right:.3f},"
                f"{self.bottom:.3f}:{self.sent_w}x{self.sent_h}")


def parse_header(value: str) -> dict:
    """A transform header as numbers: {part, client: (w, h), crop: (l, t, r, b), sent: (w, h),
    scale: (sx, sy), model: (w, h) | None, answer: (w, h) | None}. ``{"unknown": True, ...}``
    when the gateway did not see the image."""
    out: dict = {"model": None, "answer": None}
    for item in value.split(";"):
        k, _, v = item.strip().partition("=")
        if not v:
            if k == "unknown":
                out["unknown"] = True
            continue
        if k == "part":
            out[k] = v
        elif k in ("client", "sent", "model", "answer"):
            w, h = v.split("x")
            out[k] = (int(w), int(h))
        elif k in ("crop", "scale"):
            out[k] = tuple(float(x) for x in v.split(","))
    return out


@dataclass(frozen=True, slots=True)
class ImageMap:
    ax: float
    bx: float
    ay: float
    by: float
    # extent of the model's frame on each axis (R, or the processor's width/height)
    limit_x: float
    limit_y: float
    # extent of the client's frame the mapped coordinates are in (R, or the processor's
    # width/height of the client's image): what ``forward`` reads
    client_x: float
    client_y: float

    @property
    def identity(self) -> bool:
        return abs(self.ax) < 1e-9 and abs(self.ay) < 1e-9 and abs(self.bx - 1) < 1e-9 and abs(self.by - 1) < 1e-9

    def back(self, x: float, y: float) -> tuple[float, float]:
        """A model coordinate in the client's frame (callers check it lies in the model's frame)."""
        return self.ax + self.bx * x, self.ay + self.by * y

    def forward(self, x: float, y: float) -> tuple[float, float]:
        """A client-frame coordinate in the model's frame (clamped to it)."""
        return (min(self.limit_x, max(0.0, (x - self.ax) / self.bx)),
                min(self.limit_y, max(0.0, (y - self.ay) / self.by)))

    def same(self, other: "ImageMap | None") -> bool:
        if other is None:
            return False
        return all(abs(p - q) <= 1e-9 * max(1.0, abs(p)) for p, q in
                   zip((self.ax, self.bx, self.ay, self.by), (other.ax, other.bx, other.ay, other.by)))


IDENTITY_1000 = ImageMap(0.0, 1.0, 0.0, 1.0, 1000.0, 1000.0, 1000.0, 1000.0)


def image_map(frame: Frame | None, conv: Convention) -> ImageMap | None:
    """Model -> client map of one image; None when it cannot be known (no convention,
    or an absolute convention and an image the gateway did not see)."""
    if not conv.known:
        return None
    r = conv.relative
    if r:
        if frame is None:  # sent as the client's URL: relative coordinates need no map
            return ImageMap(0.0, 1.0, 0.0, 1.0, float(r), float(r), float(r), float(r))
        cw, ch = frame.client_w, frame.client_h
        return ImageMap(frame.left * r / cw, (frame.right - frame.left) / cw,
                        frame.top * r / ch, (frame.bottom - frame.top) / ch, float(r), float(r), float(r), float(r))
    if frame is None:
        return None
    try:
        (mw, mh), (aw, ah) = frame.model_size(conv), frame.answer_size(conv)
    except ValueError:
        return None
    kx, ky = aw / frame.client_w, ah / frame.client_h
    return ImageMap(frame.left * kx, (frame.right - frame.left) / mw * kx, frame.top * ky,
                    (frame.bottom - frame.top) / mh * ky, float(mw), float(mh), float(aw), float(ah))
