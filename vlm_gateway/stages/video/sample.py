"""Frames on a fixed-rate grid, at most ``max_frames`` of them.

Sample ``k`` (time ``k / rate``) is the last decoded frame whose time is <= ``k / rate``:
what was on screen at that instant. Grid times run up to the last frame's time. A source
slower than the grid repeats frames (the dedupe marks them duplicates); a faster one is
thinned.

When one more sample would exceed ``max_frames`` (even), every other stored sample is
dropped and the rate halves: ``2k / rate == k / (rate / 2)`` keeps the remaining ones on
the new grid, so a video longer than ``max_frames / fps`` is sampled at the highest rate
``fps / 2^j`` that fits. Only the samples (converted by ``store``) are kept; the sampler
holds one decoded frame at a time.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any, Callable

_EPS = 1e-6   # float frame times vs exact grid times: 0.4999999 s is the 0.5 s frame


class GridSampler:
    def __init__(self, rate: Fraction, max_frames: int, store: Callable[[Any, float], Any]) -> None:
        if max_frames < 2:
            raise ValueError("max_frames must be at least 2")
        self.rate = Fraction(rate)
        self.max_frames = max_frames - max_frames % 2
        self.store = store
        self.items: list[Any] = []
        self.halvings = 0
        self._prev: tuple[float, Any] | None = None
        self._prev_item: Any = None

    def _emit_until(self, t_excl: float | None, t_incl: float | None) -> None:
        t, frame = self._prev
        while True:
            k = len(self.items)
            gt = float(k / self.rate)
            if t_excl is not None and gt >= t_excl - _EPS:
                return
            if t_incl is not None and gt > t_incl + _EPS and k > 0:
                return
            if k >= self.max_frames:
                self.items = self.items[::2]
                self.rate /= 2
                self.halvings += 1
                continue
            if self._prev_item is None:
                self._prev_item = self.store(frame, t)
            self.items.append(self._prev_item)

    def offer(self, t: float, frame: Any) -> None:
        if self._prev is not None:
            self._emit_until(t_excl=t, t_incl=None)
        self._prev, self._prev_item = (t, frame), None

    def finish(self) -> list[Any]:
        if self._prev is not None:
            self._emit_until(t_excl=None, t_incl=self._prev[0])
        self._prev = self._prev_item = None
        return self.items
