"""Coordinate conventions: in which frame a model writes the coordinates of its
grounding answers (boxes and points), so the gateway can map them.

* ``qwen3-vl``: relative, 0-1000 of the image the model received (x / width * 1000);
  a uniform rescale keeps it, a crop does not.
* ``qwen2-vl``: relative 0-1000 too (its box tokens).
* ``qwen2.5-vl``: absolute pixels of the image *after the processor's* ``smart_resize``
  (factor 28 = 14 px patches merged 2x2, ``min_pixels`` 3136, ``max_pixels`` 12845056
  unless the engine was started with others); neither a rescale nor a crop keeps it.
* ``none``: unknown; the gateway never crops such a model's images.

``auto`` picks one from the served model name (``Qwen/Qwen3-VL-2B-Instruct``,
``qwen2.5-vl-7b``, ...). Sources are listed in docs/GROUNDING.md.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

QWEN25_MIN_PIXELS = 3136
QWEN25_MAX_PIXELS = 12845056


@dataclass(frozen=True, slots=True)
class Convention:
    name: str
    # 1000 for 0-1000 relative coordinates; 0 for absolute pixels of the processor's frame
    relative: int = 0
    # absolute conventions: the processor's smart_resize (grid factor and pixel bounds)
    factor: int = 28
    min_pixels: int = QWEN25_MIN_PIXELS
    max_pixels: int = QWEN25_MAX_PIXELS

    @property
    def known(self) -> bool:
        return self.name != "none"


NONE = Convention("none")
BUILTIN: dict[str, Convention] = {
    "qwen3-vl": Convention("qwen3-vl", relative=1000),
    "qwen2-vl": Convention("qwen2-vl", relative=1000),
    "qwen2.5-vl": Convention("qwen2.5-vl", relative=0, factor=28),
    "none": NONE,
}
NAMES = ("auto", *BUILTIN)

_ALNUM = re.compile(r"[^a-z0-9]+")


def detect(model: str) -> Convention:
    """The convention a served model name implies (``none`` when it names no known family)."""
    flat = _ALNUM.sub("", model.lower())  # "Qwen/Qwen2.5-VL-7B" -> "qwenqwen25vl7b"
    for key, name in (("qwen3vl", "qwen3-vl"), ("qwen25vl", "qwen2.5-vl"), ("qwen2vl", "qwen2-vl")):
        if key in flat:
            return BUILTIN[name]
    return NONE


def resolve(name: str, model: str, min_pixels: int = 0, max_pixels: int = 0) -> Convention:
    """``name`` from config (``auto`` = detect from ``model``); pixel bounds of an
    absolute convention's processor override the built-in ones when non-zero."""
    conv = detect(model) if name == "auto" else BUILTIN[name]
    if conv.relative or not conv.known or not (min_pixels or max_pixels):
        return conv
    return Convention(conv.name, 0, conv.factor, min_pixels or conv.min_pixels, max_pixels or conv.max_pixels)
