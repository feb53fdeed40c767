"""round_robin: rotate through the candidates.

    pick = candidates[(n + k) mod len(candidates)]   for attempt k of request n

No parameters, no score (the ``Policy`` base's rotation alone). Ignores load and
prefix caches; the baseline the others beat.
"""

from __future__ import annotations

from .policy import Policy, register


@register("round_robin")
class RoundRobin(Policy):
    name = "round_robin"
