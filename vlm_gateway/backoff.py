"""The one back-off policy for Redis, used by every Redis tier (L1 images and videos,
L3 answers, the semantic index's stream, rate limits):

    a call fails (timeout, refused, reset, protocol error)
        -> Redis is skipped for retry_s:  up() is False until clock() >= failed_at + retry_s
    while skipped: caches miss, rate limits count in process, nothing waits on Redis

so a dead Redis costs one failed call per ``retry_s`` and never one per request. One
warning per outage (when it goes down), naming the part; ``failures`` counts them all.
A tier that reports its successful calls (``succeeded``) also logs the outage's end, once.
"""

from __future__ import annotations

import logging

from .core.clock import Clock, monotonic

log = logging.getLogger("vlm_gateway.redis")

RETRY_S = 1.0


class Backoff:
    __slots__ = ("what", "retry_s", "clock", "down_until", "failures", "outage")

    def __init__(self, what: str, retry_s: float = RETRY_S, clock: Clock = monotonic) -> None:
        self.what = what          # e.g. "L3 cache", for the log line
        self.retry_s = retry_s
        self.clock = clock
        self.down_until = 0.0
        self.failures = 0
        self.outage = False       # failed since the last call that went through

    def up(self) -> bool:
        return self.clock() >= self.down_until

    def failed(self, e: BaseException, fallback: str = "treating lookups as misses") -> None:
        self.failures += 1
        if self.up():
            log.warning("%s: Redis failed (%s); %s for %.1fs", self.what, type(e).__name__, fallback,
                        self.retry_s)
        self.down_until = self.clock() + self.retry_s
        self.outage = True

    def succeeded(self) -> None:
        """A call went through: an outage, if one was on, is over (said once)."""
        if self.outage:
            self.outage = False
            log.warning("%s: Redis answers again", self.what)
