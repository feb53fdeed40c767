"""Where one image's rewrite spends its time, step by step (the profile benchmark,
benchmarks/image_profile.py, reads it; the rewrite records it only when asked).

    spans.mark(step)   charges the wall time since the previous mark to ``step`` (``steps``),
                       and the process's CPU time (``cpu``: every thread of it, libvips' too)

``NONE`` records nothing (the default: a method call per step, no clock read).
"""

from __future__ import annotations

import time


class Spans:
    __slots__ = ("t", "c", "steps", "cpu")

    def __init__(self) -> None:
        self.t = time.perf_counter()
        self.c = time.process_time()
        self.steps: dict[str, float] = {}
        self.cpu: dict[str, float] = {}

    def mark(self, step: str) -> None:
        now, c = time.perf_counter(), time.process_time()
        self.steps[step] = self.steps.get(step, 0.0) + (now - self.t)
        self.cpu[step] = self.cpu.get(step, 0.0) + (c - self.c)
        self.t, self.c = now, c


class _NoSpans(Spans):
    __slots__ = ()

    def __init__(self) -> None:  # noqa: D107 - nothing to keep
        pass

    def mark(self, step: str) -> None:
        return None


NONE: Spans = _NoSpans()
