"""The circuit breaker of one backend (a component of ``Backend``).

    closed    --eject_after_failures consecutive failures-->  open for
              d_k = min(eject_max_s, eject_base_s * 2^k), k = times opened since the last success
    open      --d_k passed, or a health probe succeeded-->     half_open (requests go through)
    half_open --a success--> closed (k = 0)     --a failure--> open again for d_(k+1)

``is_available`` says whether requests may go to the backend now; ``record_outcome``
takes the result of each attempt. Time comes from an injectable clock.
"""

from __future__ import annotations

from ..core.clock import Clock, monotonic


class CircuitBreaker:
    __slots__ = ("after", "base_s", "max_s", "clock", "failures", "opened", "open_until")

    def __init__(self, after: int = 3, base_s: float = 5.0, max_s: float = 60.0, clock: Clock = monotonic) -> None:
        self.after = after
        self.base_s = base_s
        self.max_s = max_s
        self.clock = clock
        self.failures = 0      # consecutive failures
        self.opened = 0        # times opened since the last success (k)
        self.open_until = 0.0  # clock time before which no request goes

    def is_available(self) -> bool:
        return self.clock() >= self.open_until

    def record_outcome(self, ok: bool) -> float | None:
        """Count one attempt's outcome; returns the open time when this failure opened it."""
        if ok:
            self.failures = 0
            self.opened = 0
            self.open_until = 0.0
            return None
        self.failures += 1
        if self.failures < self.after:
            return None
        delay = min(self.max_s, self.base_s * (2 ** self.opened))
        self.opened += 1
        self.open_until = self.clock() + delay
        return delay

    def probe_succeeded(self) -> None:
        """A health probe answered: let the next request through (half-open)."""
        if self.open_until and self.failures >= self.after:
            self.open_until = min(self.open_until, self.clock())

    def state(self) -> str:
        """closed | open | half_open."""
        if self.clock() < self.open_until:
            return "open"
        return "half_open" if self.failures >= self.after else "closed"
