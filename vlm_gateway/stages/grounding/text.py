"""Find coordinate groups in answer text and rewrite their numbers, whole or incrementally.

A *coordinate group* is one of the grounding formats of the Qwen-VL family:

* JSON keys ``"bbox_2d": [x1, y1, x2, y2]`` and ``"point_2d": [x, y]`` (fenced or bare, any
  surrounding JSON or prose; single quotes accepted too);
* box tokens ``<|box_start|>(x1,y1),(x2,y2)<|box_end|>`` and ``<|quad_start|>(x1,y1),...,
  (x4,y4)<|quad_end|>`` (visible when the engine keeps special tokens);
* XML points ``<points x1="x" y1="y" ... alt="...">`` (Qwen2.5-VL's point format).

Numbers pair up as (x, y) and go through one ``ImageMap`` (``back``: model -> client frame,
``forward``: client -> model frame); everything around them is left byte for byte. Which
image a group belongs to: the request's common map when every image has the same one,
otherwise the image named by the last ``Image N`` / ``Picture N`` / ``图N`` / ``第N张``
marker before the group (N counts the request's images from 1, in order); a group with no
such marker is left as it is (``unattributed``).

``CoordinateStream`` does the same on a stream of text deltas: it releases everything
except a tail that could still become a coordinate group (at most ``MAX_HOLD`` chars),
so other text is never delayed by more than one group's span.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Callable

import regex

from .frames import ImageMap

MAX_HOLD = 512
_N = r"-?\d+(?:\.\d+)?"
# ``regex`` (not ``re``) for partial matching: is this tail the beginning of a group?
GROUP = regex.compile(
    r"""(?P<json>(?P<q>["'])(?:bbox_2d|point_2d)(?P=q)\s*:\s*\[\s*N\s*,\s*N(?:\s*,\s*N\s*,\s*N)?\s*\])"""
    r"""|(?P<tok><\|(?P<t>box|quad)_start\|>\s*\(\s*N\s*,\s*N\s*\)(?:\s*,\s*\(\s*N\s*,\s*N\s*\)){1,3}\s*"""
    r"""<\|(?P=t)_end\|>)"""
    r"""|(?P<xml><points\b(?:\s+[A-Za-z_][\w.-]*\s*=\s*"[^"<>]*")+\s*/?>)""".replace("N", _N))
_NUM = re.compile(_N)
_XML_ATTR = re.compile(r"""\b([xy])(\d+)\s*=\s*"\s*(""" + _N + r""")\s*\"""")
# characters a group can start with: no group can begin in text without one of them
_TRIGGERS = ('"', "'", "<")
MARKER = re.compile(r"(?i)\b(?:image|img|picture|pic|screenshot|photo)\s*(?:#|no\.?\s*)?\s*(\d{1,3})(?![\d.])"
                    r"|图(?:片|像)?\s*(\d{1,3})(?!\d)|第\s*(\d{1,3})\s*(?:张|幅)")
_MARKER_CTX = 24  # marker text kept to catch a marker split across deltas

PairFn = Callable[[ImageMap, float, float], "tuple[float, float]"]


def back(m: ImageMap, x: float, y: float) -> tuple[float, float]:
    return m.back(x, y)


def forward(m: ImageMap, x: float, y: float) -> tuple[float, float]:
    return m.forward(x, y)


@dataclass(slots=True)
class Counts:
    mapped: int = 0
    unattributed: int = 0


@dataclass(slots=True)
class Attribution:
    """Which map a group uses: ``common`` when all candidate images share one, else by marker."""

    common: ImageMap | None
    maps: list[ImageMap | None] = field(default_factory=list)

    def by_marker(self, n: int) -> ImageMap | None:
        return self.maps[n - 1] if 1 <= n <= len(self.maps) else None


def _fmt(v: float, like: str) -> str:
    if "." not in like:
        return str(math.floor(v + 0.5))
    d = len(like) - like.index(".") - 1
    return f"{v:.{d}f}"


def _pairs_json_tok(g: str, start: int) -> list[list[re.Match]]:
    nums = list(_NUM.finditer(g, start))
    return [nums[i:i + 2] for i in range(0, len(nums) - 1, 2)]


def rewrite_group(m: "regex.Match", imap: ImageMap, fn: PairFn) -> str:
    """The text of one matched group with its coordinates mapped."""
    g = m.group(0)
    if m.group("xml") is not None:
        attrs = {(a.group(1), a.group(2)): a for a in _XML_ATTR.finditer(g)}
        pairs = [[attrs[("x", i)], attrs[("y", i)]] for (axis, i) in attrs if axis == "x" and ("y", i) in attrs]
        value_group = 3
    else:
        start = g.index("[") if m.group("json") is not None else 0
        pairs = _pairs_json_tok(g, start)
        value_group = 0
    edits = []
    for mx, my in pairs:
        sx, sy = mx.group(value_group), my.group(value_group)
        x, y = fn(imap, float(sx), float(sy))
        edits.append((mx.span(value_group), _fmt(x, sx)))
        edits.append((my.span(value_group), _fmt(y, sy)))
    out = []
    pos = 0
    for (a, b), s in sorted(edits):
        out.append(g[pos:a])
        out.append(s)
        pos = b
    out.append(g[pos:])
    return "".join(out)


class Mapper:
    """Rewrites the coordinate groups of one text (or one stream of deltas)."""

    __slots__ = ("attr", "fn", "counts", "current", "pending", "ctx", "deferred")

    def __init__(self, attr: Attribution, fn: PairFn = back, counts: Counts | None = None) -> None:
        self.attr = attr
        self.fn = fn
        self.counts = counts if counts is not None else Counts()
        self.current: ImageMap | None = None  # image named by the last marker
        self.pending = ""
        self.ctx = ""
        self.deferred = False

    # -- markers (only when the images do not share one map) ------------------------------
    def _markers(self, released: str) -> list[tuple[int, ImageMap | None]]:
        """(end offset in ``released``, map) of every marker that ends in ``released``."""
        if self.attr.common is not None:
            return []
        text = self.ctx + released
        base = len(self.ctx)
        found = []
        for mk in MARKER.finditer(text):
            end = mk.end()
            if end < base or (end == base and not self.deferred):
                continue
            n = int(next(g for g in mk.groups() if g is not None))
            if 1 <= n <= len(self.attr.maps):
                found.append((end - base, self.attr.by_marker(n)))
        # a marker ending right at the end may still grow ("Image 1" + "2"): look again next time
        self.deferred = bool(text) and text[-1].isdigit()
        if self.deferred and found and found[-1][0] == len(released):
            found.pop()
        self.ctx = text[-_MARKER_CTX:]
        return found

    def _map(self, s: str, groups: list) -> str:
        if not groups and self.attr.common is not None:
            return s
        markers = self._markers(s)
        out = []
        pos = 0
        mi = 0
        for g in groups:
            while mi < len(markers) and markers[mi][0] <= g.start():
                self.current = markers[mi][1]
                mi += 1
            imap = self.attr.common or self.current
            out.append(s[pos:g.start()])
            if imap is None:
                self.counts.unattributed += 1
                out.append(g.group(0))
            else:
                self.counts.mapped += 1
                out.append(rewrite_group(g, imap, self.fn))
            pos = g.end()
        for _, imap in markers[mi:]:
            self.current = imap
        out.append(s[pos:])
        return "".join(out)

    @property
    def idle(self) -> bool:
        return not self.pending and self.attr.common is not None

    # -- whole text ------------------------------------------------------------------------
    def text(self, s: str) -> str:
        if not any(t in s for t in _TRIGGERS) and self.attr.common is not None:
            return s
        return self._map(s, list(GROUP.finditer(s)))

    # -- stream ------------------------------------------------------------------------------
    def feed(self, delta: str) -> str:
        s = self.pending + delta if self.pending else delta
        if not s:
            return ""
        if not self.pending and not any(t in s for t in _TRIGGERS):
            return self._map(s, []) if self.attr.common is None else s
        groups = []
        hold = len(s)
        for g in GROUP.finditer(s, partial=True):
            if g.partial:
                if g.start() < len(s) and len(s) - g.start() <= MAX_HOLD:
                    hold = g.start()
                break
            groups.append(g)
        self.pending = s[hold:]
        return self._map(s[:hold], groups)

    def flush(self) -> str:
        """The held tail at the end of the text (mapped if it completed, which it cannot: as is)."""
        s, self.pending = self.pending, ""
        return self._map(s, list(GROUP.finditer(s))) if s else ""
