"""round_robin: rotate through the candidates.

    pick = candidates[(n + k) mod len(candidates)]   for attempt k of request n

No parameters. Ignores load and prefix caches; the baseline the others beat.
"""

from __future__ import annotations

import itertools

from . import register


@register("round_robin")
class RoundRobin:
    name = "round_robin"

    def __init__(self, cfg=None) -> None:
        self._counter = itertools.count()

    def rank(self, req, candidates):
        if len(candidates) <= 1:
            return candidates
        i = next(self._counter) % len(candidates)
        return candidates[i:] + candidates[:i]

    def served(self, req, backend) -> None:
        pass
