"""Find coordinate groups in answer text and rewrite their numbers, whole or incrementally.

A *coordinate group* is one of the grounding formats of the Qwen-VL family:

* JSON keys ``"bbox_2d": [x1, y1, x2, y2]`` and ``"point_2d": [x, y]`` (fenced or bare, any
  surrounding JSON or prose; single quotes accepted too);
* box tokens ``<|box_start|>(x1,y1),(x2,y2)<|box_end|>`` and ``<|quad_start|>(x1,y1),...,
  (x4,y4)<|quad_end|>`` (visible when the engine keeps special tokens);
* XML points ``<points x1="x" y1="y" ... alt="...">`` (Qwen2.5-VL's point format).

Numbers pair up as (x, y) and go through one ``ImageMap`` (``back``: model -> client frame,
``forward``: client -> model frame); everything around them is left byte for byte. A group is
mapped only when every number in it can be: at most ``MAX_NUMBER_CHARS`` characters, finite,
and inside the frame it is read in (0 to the frame's extent); otherwise the whole group stays
as written (``unmappable``). Which image a group belongs to: the request's common map when
every image has the same one, otherwise the image named by the last ``Image N`` / ``Picture N``
/ ``图N`` / ``第N张`` marker before the group (N counts the request's images from 1, in order);
a group with no such marker is left as it is (``unattributed``).

The work is linear in the text and bounded in groups: groups and markers are found where the
literal each must contain occurs (``str.find``, then one anchored match), not by a regex tried
at every quote or letter, and ``Counts.limit`` bounds the groups one answer (or one request's
conversation) has looked at; past it the rest of the text is left as written (``over``).

``Mapper.feed`` does the same on a stream of text deltas: it releases everything
except a tail that could still become a coordinate group (at most ``MAX_HOLD`` chars),
so other text is never delayed by more than one group's span.
"""

from __future__ import annotations

import heapq
import math
import re
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator

import regex

from .frames import ImageMap

MAX_HOLD = 512
# a coordinate longer than this is no coordinate (and would only cost time): left as written
MAX_NUMBER_CHARS = 32
_N = r"-?\d+(?:\.\d+)?"
_PATTERN = (
    r"""(?P<json>(?P<q>["'])(?:bbox_2d|point_2d)(?P=q)\s*:\s*\[\s*N\s*,\s*N(?:\s*,\s*N\s*,\s*N)?\s*\])"""
    r"""|(?P<tok><\|(?P<t>box|quad)_start\|>\s*\(\s*N\s*,\s*N\s*\)(?:\s*,\s*\(\s*N\s*,\s*N\s*\)){1,3}\s*"""
    r"""<\|(?P=t)_end\|>)"""
    r"""|(?P<xml><points\b(?:\s+[A-Za-z_][\w.-]*\s*=\s*"[^"<>]*")+\s*/?>)""").replace("N", _N)
# ``regex`` (not ``re``) for partial matching: is this tail the beginning of a group?
GROUP = regex.compile(_PATTERN)
_WHOLE = re.compile(_PATTERN)  # complete groups: the stdlib engine matches about twice as fast
# every group holds one of these literals, this many characters after its start
_LITERALS = (("bbox_2d", 1), ("point_2d", 1), ("<|box_start|>", 0), ("<|quad_start|>", 0), ("<points", 0))
_TAIL = 1 + max(len(lit) for lit, _ in _LITERALS)  # a group whose literal is still incomplete starts here
_NUM = re.compile(_N)
_XML_ATTR = re.compile(r"""\b([xy])(\d+)\s*=\s*"\s*(""" + _N + r""")\s*\"""")
# characters a group can start with: no group can begin in text without one of them
_TRIGGERS = ('"', "'", "<")
MARKER = re.compile(r"(?i)\b(?:image|img|picture|pic|screenshot|photo)\s*(?:#|no\.?\s*)?\s*(\d{1,3})(?![\d.])"
                    r"|图(?:片|像)?\s*(\d{1,3})(?!\d)|第\s*(\d{1,3})\s*(?:张|幅)")
# where a marker can start (looked for in a copy lowered one character for one character: the
# letters MARKER's IGNORECASE also matches outside ASCII included)
_MARKER_LITERALS = ("image", "img", "pic", "screenshot", "photo", "图", "第")
_LOWER = str.maketrans({**{chr(c): chr(c + 32) for c in range(65, 91)}, "\u0130": "i", "\u0131": "i",
                        "\u017f": "s"})
_MARKER_CTX = 24  # marker text kept to catch a marker split across deltas
_NONE = 1 << 62

PairFn = Callable[[ImageMap, float, float], "tuple[float, float] | None"]

# Mapping a text goes to the text thread (``offload``) when it would hold the event loop more than
# a couple of milliseconds (~25 us a group, ~1 ms per 256 KiB scanned); below INLINE_CHARS it
# stays on the loop uncounted: a thread hop costs more than the work.
INLINE_CHARS = 8192
OFFLOAD_GROUPS = 64
OFFLOAD_CHARS = 256 * 1024
_HITS = ("_2d", "_start|", "<points")  # in every group: bbox_2d/point_2d, <|box_start|>/<|quad_start|>
_HITS_B = tuple(h.encode() for h in _HITS)  # the same in serialised chunks (escaping leaves them whole)


def heavy(text: str | bytes) -> bool:
    """Whether mapping ``text`` (answer or conversation text, or serialised SSE events) is work
    for the text thread rather than the event loop."""
    if len(text) <= INLINE_CHARS:
        return False
    if len(text) > OFFLOAD_CHARS:
        return True
    hits = _HITS_B if isinstance(text, bytes) else _HITS
    return sum(text.count(h) for h in hits) > OFFLOAD_GROUPS


def back(m: ImageMap, x: float, y: float) -> tuple[float, float] | None:
    """Model frame -> client frame; None for a point outside the model's frame."""
    if not (0.0 <= x <= m.limit_x and 0.0 <= y <= m.limit_y):
        return None
    return m.back(x, y)


def forward(m: ImageMap, x: float, y: float) -> tuple[float, float] | None:
    """Client frame -> model frame; None for a point outside the client's frame."""
    if not (0.0 <= x <= m.client_x and 0.0 <= y <= m.client_y):
        return None
    return m.forward(x, y)


@dataclass(slots=True)
class Counts:
    """Coordinate groups of one answer (or of one request's conversation), by outcome.

    ``limit`` (0: none) bounds the groups looked at; the first group past it and all the text
    after it are left as written, and ``over`` is set."""

    mapped: int = 0
    unattributed: int = 0
    unmappable: int = 0
    limit: int = 0
    over: bool = False

    @property
    def seen(self) -> int:
        return self.mapped + self.unattributed + self.unmappable


@dataclass(slots=True)
class Attribution:
    """Which map a group uses: ``common`` when all candidate images share one, else by marker."""

    common: ImageMap | None
    maps: list[ImageMap | None] = field(default_factory=list)

    def by_marker(self, n: int) -> ImageMap | None:
        return self.maps[n - 1] if 1 <= n <= len(self.maps) else None


# -- finding ----------------------------------------------------------------------------------------

def _next_start(s: str, k: int, pos: int) -> int:
    lit, back_ = _LITERALS[k]
    i = s.find(lit, pos + back_)
    return i - back_ if i >= 0 else _NONE


def _scan(s: str, partial: bool = False) -> Iterator["re.Match | regex.Match"]:
    """The complete groups of ``s`` in order (what ``GROUP.finditer(s)`` finds), tried only where a
    group's literal occurs (the next start of each literal kept in a heap). With ``partial``, a
    candidate that is the beginning of a group running to the end of ``s`` is yielded last (a
    ``regex`` match with ``partial`` set)."""
    heap = [(st, k) for k in range(len(_LITERALS)) if (st := _next_start(s, k, 0)) != _NONE]
    heapq.heapify(heap)
    end = 0
    while heap:
        st, k = heap[0]
        if st >= end:  # not inside the group found last
            m = _WHOLE.match(s, st)
            if m is not None:
                yield m
                end = m.end()
            elif partial:
                p = GROUP.match(s, st, partial=True)
                if p is not None and p.partial:
                    yield p
                    return
        nxt = _next_start(s, k, max(end, st + 1))
        if nxt == _NONE:
            heapq.heappop(heap)
        else:
            heapq.heapreplace(heap, (nxt, k))


def groups(s: str) -> Iterator[re.Match]:
    """The coordinate groups of a whole text, in order."""
    if not any(t in s for t in _TRIGGERS):
        return iter(())
    return _scan(s)


def count_groups(texts: Iterable[str], limit: int = 0) -> int:
    """How many coordinate groups ``texts`` hold, counting no further than ``limit + 1``."""
    n = 0
    for s in texts:
        for _ in groups(s):
            n += 1
            if limit and n > limit:
                return n
    return n


# below this a stream's text is searched with the partial regex itself (one call is cheaper than
# the literal search's bookkeeping on a delta of a few characters); above it by literal
_SHORT = 2 * MAX_HOLD


def _stream_split(s: str) -> tuple[list, int]:
    """A stream's text so far: its complete groups, and where the tail that could still become
    a group starts (``len(s)`` when none could, or when it would be held past ``MAX_HOLD``)."""
    out: list = []
    if len(s) <= _SHORT:
        for g in GROUP.finditer(s, partial=True):
            if g.partial:
                return out, g.start() if len(s) - g.start() <= MAX_HOLD else len(s)
            out.append(g)
        return out, len(s)
    for g in _scan(s, partial=True):  # long: search by literal
        if getattr(g, "partial", False):
            return out, g.start() if len(s) - g.start() <= MAX_HOLD else len(s)
        out.append(g)
    # a group whose literal is not complete yet ('"bbox_', '<|box_st') starts near the end
    for t in range(max(out[-1].end() if out else 0, len(s) - _TAIL), len(s)):
        if s[t] in _TRIGGERS:
            p = GROUP.match(s, t, partial=True)
            if p is not None and p.partial:
                return out, t
    return out, len(s)


def markers(text: str) -> Iterator[re.Match]:
    """The image markers of ``text`` in order (what ``MARKER.finditer(text)`` finds), tried only
    where a marker's first word occurs."""
    low = text.translate(_LOWER) if not text.isascii() else text.lower()
    found = [low.find(lit) for lit in _MARKER_LITERALS]
    found = [f if f >= 0 else _NONE for f in found]
    while True:
        st = min(found)
        if st == _NONE:
            return
        k = found.index(st)
        m = MARKER.match(text, st)
        if m is not None:
            yield m
            end = m.end()
            for j, f in enumerate(found):
                if f < end:
                    i = low.find(_MARKER_LITERALS[j], end)
                    found[j] = i if i >= 0 else _NONE
            continue
        i = low.find(_MARKER_LITERALS[k], st + 1)
        found[k] = i if i >= 0 else _NONE


# -- rewriting ------------------------------------------------------------------------------------

def _fmt(v: float, like: str) -> str:
    if "." not in like:
        return str(math.floor(v + 0.5))
    d = len(like) - like.index(".") - 1
    return f"{v:.{d}f}"


def _pairs_json_tok(g: str, start: int) -> list[list[re.Match]]:
    nums = list(_NUM.finditer(g, start))
    return [nums[i:i + 2] for i in range(0, len(nums) - 1, 2)]


def rewrite_group(m: "re.Match", imap: ImageMap, fn: PairFn) -> str | None:
    """The text of one matched group with its coordinates mapped; None when a number of it
    cannot be (too long, not finite, outside the frame it is read in): the group stays as is."""
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
        if len(sx) > MAX_NUMBER_CHARS or len(sy) > MAX_NUMBER_CHARS:
            return None
        xy = fn(imap, float(sx), float(sy))
        if xy is None or not (math.isfinite(xy[0]) and math.isfinite(xy[1])):
            return None
        edits.append((mx.span(value_group), _fmt(xy[0], sx)))
        edits.append((my.span(value_group), _fmt(xy[1], sy)))
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
        for mk in markers(text):
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

    def _map(self, s: str, found: Iterable) -> str:
        counts = self.counts
        room = counts.limit - counts.seen if counts.limit else -1
        taken = []
        stop = len(s)
        for g in found:
            if len(taken) == room:  # the limit: this group and the rest stay as written
                counts.over = True
                stop = g.start()
                break
            taken.append(g)
        if not taken and self.attr.common is not None:
            return s
        marks = self._markers(s[:stop])
        out = []
        pos = 0
        mi = 0
        for g in taken:
            while mi < len(marks) and marks[mi][0] <= g.start():
                self.current = marks[mi][1]
                mi += 1
            imap = self.attr.common or self.current
            out.append(s[pos:g.start()])
            text = rewrite_group(g, imap, self.fn) if imap is not None else None
            if text is not None:
                counts.mapped += 1
            elif imap is None:
                counts.unattributed += 1
            else:
                counts.unmappable += 1
            out.append(text if text is not None else g.group(0))
            pos = g.end()
        for _, imap in marks[mi:]:
            self.current = imap
        out.append(s[pos:])
        return "".join(out)

    @property
    def idle(self) -> bool:
        """Feeding text without '"', "'" or '<' returns it unchanged and changes nothing."""
        return not self.pending and (self.attr.common is not None or self.counts.over)

    # -- whole text ------------------------------------------------------------------------
    def text(self, s: str) -> str:
        if self.counts.over or (self.attr.common is not None and not any(t in s for t in _TRIGGERS)):
            return s
        return self._map(s, groups(s))

    # -- stream ------------------------------------------------------------------------------
    def feed(self, delta: str) -> str:
        if self.counts.over:  # past the limit: everything passes as it is, held text first
            s, self.pending = self.pending + delta, ""
            return s
        s = self.pending + delta if self.pending else delta
        if not s:
            return ""
        if not self.pending and not any(t in s for t in _TRIGGERS):
            return self._map(s, ()) if self.attr.common is None else s
        found, hold = _stream_split(s)
        self.pending = s[hold:]
        out = self._map(s[:hold], found) if found or self.attr.common is None else s[:hold]
        if self.counts.over and self.pending:
            out, self.pending = out + self.pending, ""
        return out

    def flush(self) -> str:
        """The held tail at the end of the text (mapped if it completed, which it cannot: as is)."""
        s, self.pending = self.pending, ""
        return self._map(s, groups(s)) if s and not self.counts.over else s
