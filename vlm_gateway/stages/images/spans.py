"""Where one image's rewrite spends its time, step by step (the profile benchmark,
benchmarks/image_profile.py, reads it; the rewrite records it only when asked).

    spans.mark(step)   charges the wall time since the previous mark to ``step``

``NONE`` records nothing (the default: a method call per step, no clock read).
"""

from __future__ import annotations

import time


class Spans:
    __slots__ = ("t", "steps")

    def __init__(self) -> None:
        self.t = time.perf_counter()
        self.steps: dict[str, float] = {}

    def mark(self, step: str) -> None:
        now = time.perf_counter()
        self.steps[step] = self.steps.get(step, 0.0) + (now - self.t)
        self.t = now


class _NoSpans(Spans):
    __slots__ = ()

    def __init__(self) -> None:  # noqa: D107 - nothing to keep
        pass

    def mark(self, step: str) -> None:
        return None


NONE: Spans = _NoSpans()
