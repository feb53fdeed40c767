"""Where a request's time goes inside the gateway, from the first byte of the request
to the first byte sent upstream:

    receive  first byte of the request -> last byte of its body
    parse    body -> the typed request (JSON parse, validation)
    queue    wall time some media job waited for a pool thread while none of the request's ran
    media    wall time at least one of the request's media jobs ran (decode/resize/encode,
             hashing, probing): several images rewritten in parallel count once
    route    picking a backend and handing the body to its connection, pool time excluded
    other    the rest of the stages (auth, limits, caches), what no phase above counts

``gateway`` = first byte -> first byte upstream; the phases add up to it (``other`` is the
remainder, never negative). The active request's timing is found through
a context variable, so a pool counts its jobs without being told whose they are.
"""

from __future__ import annotations

import time
from contextvars import ContextVar
from dataclasses import dataclass, field

PHASES = ("receive", "parse", "queue", "media", "route", "other")


@dataclass(slots=True)
class Timing:
    first_byte: float  # perf_counter() when the request's first byte arrived
    body_done: float = 0.0
    parsed: float = 0.0
    queue_s: float = 0.0
    media_s: float = 0.0
    route_s: float = 0.0
    sent: float = 0.0  # handed to the upstream connection (the first attempt)
    # (submitted, started, ended) of each media job, perf_counter() seconds
    jobs: list[tuple[float, float, float]] = field(default_factory=list)

    def job(self, waited: float, ran: float, end: float | None = None) -> None:
        """A pool job that waited ``waited`` s and ran ``ran`` s, ending at ``end`` (default
        now, when its result is taken); queue and media become wall times over all jobs."""
        end = time.perf_counter() if end is None else end
        start = end - ran
        self.jobs.append((start - waited, start, end))
        self.media_s = _covered([(s, e) for _, s, e in self.jobs])
        self.queue_s = max(0.0, _covered([(q, e) for q, _, e in self.jobs]) - self.media_s)

    def gateway_s(self, now: float | None = None) -> float:
        end = self.sent or (now if now is not None else time.perf_counter())
        return max(0.0, end - self.first_byte)

    def phases(self, now: float | None = None) -> dict[str, float]:
        """Seconds per phase (``PHASES``) and ``gateway``, up to the upstream send (or ``now``)."""
        total = self.gateway_s(now)
        receive = max(0.0, (self.body_done or self.first_byte) - self.first_byte)
        parse = max(0.0, self.parsed - self.body_done) if self.parsed and self.body_done else 0.0
        out = {"receive": receive, "parse": parse, "queue": self.queue_s, "media": self.media_s,
               "route": self.route_s}
        out["other"] = max(0.0, total - sum(out.values()))
        out["gateway"] = total
        return out

    def server_timing(self, now: float | None = None) -> bytes:
        """The ``Server-Timing`` header value (milliseconds)."""
        return ", ".join(f"{k};dur={v * 1000.0:.2f}" for k, v in self.phases(now).items()).encode()


def _covered(spans: list[tuple[float, float]]) -> float:
    """Length of the union of ``spans``."""
    total, reach = 0.0, float("-inf")
    for a, b in sorted(spans):
        if b > reach:
            total += b - max(a, reach)
            reach = b
    return total


CURRENT: ContextVar[Timing | None] = ContextVar("vlm_gateway_timing", default=None)
