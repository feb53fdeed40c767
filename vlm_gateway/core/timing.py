"""Where a request's time goes inside the gateway, from the first byte of the request
to the first byte sent upstream:

    receive  first byte of the request -> last byte of its body
    parse    body -> the typed request (JSON parse, validation)
    queue    waiting for a thread of a media pool (summed over jobs)
    media    decode/resize/encode, hashing and probing in those threads (summed over jobs)
    route    picking a backend and handing the body to its connection, pool time excluded
    other    the rest of the stages (auth, limits, caches), what no phase above counts

``gateway`` = first byte -> first byte upstream (the phases add up to it, except that
jobs of one request may run in parallel). The active request's timing is found through
a context variable, so a pool counts its jobs without being told whose they are.
"""

from __future__ import annotations

import time
from contextvars import ContextVar
from dataclasses import dataclass

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

    def job(self, waited: float, ran: float) -> None:
        self.queue_s += waited
        self.media_s += ran

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


CURRENT: ContextVar[Timing | None] = ContextVar("vlm_gateway_timing", default=None)
