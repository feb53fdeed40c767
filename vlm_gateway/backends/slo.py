"""SLO-aware image budgets: one controller per model pool (the backends serving a model)
turns load into a budget level, 0 = every image keeps its own budget, 1..N = smaller
images (``stages/images/pressure.py`` applies the level to each image).

Inputs, every ``slo.interval_s``:

    p        the ``slo.percentile`` (p90 | p99) of the gateway's own time to first token
             (client send -> first upstream byte, admission wait included) of the requests
             *sent since the last level change* and answered in the last ``window_s``;
             trusted once ``min_samples`` are in
    late     the oldest request sent since the last change and still without its first
             token has waited >= down_at x T (its TTFT will miss; answers of an overloaded
             pool arrive too late to be the only evidence)
    wait     Little's law on what is in flight: requests waiting for their first token /
             answers per second over the window = the mean time a request sent now will
             wait; it rises as soon as a backlog forms, before any late answer arrives
    queued   the pool's engines queue: the scraped ``waiting`` summed over the pool, averaged
             over the last decisions (weight 0.3 for the newest), is >= 1 (a request that
             arrived between two engine steps waits a moment: one snapshot is no queue), the
             fullest ``kv_usage`` >= ``kv_high``, or requests wait in the gateway for a slot

Decision (T = ``ttft_ms``)::

    step down (level + 1)  when  p >= down_at x T,  or  late,  or  wait >= early_at x T,
                           or  queued and p >= early_at x T
                           and the last step down is >= down_hold_s old
    step up   (level - 1)  when  not queued and (p < up_at x T, or the pool saw fewer than
                           min_samples answers in the whole window: too little traffic to
                           press on anything) and requests are not sent faster than 1.05 x
                           they are answered (a backlog that grows slowly near an engine's
                           knee shows there before it shows in p), uninterrupted for hold[level]
    hold[level]            starts at up_hold_s; a step straight back down within up_hold_max_s
                           of a step up from that level doubles it (<= up_hold_max_s); a step
                           up that stuck for up_hold_max_s resets its level's hold; once the
                           load fell (requests sent per second < 0.75 x what they were at the
                           last step down) every hold is up_hold_s: an engine's TTFT stays
                           flat until its knee, so a low TTFT alone cannot tell a load that
                           fell from one the present level just carries

The band between ``up_at`` and ``down_at`` and the two holds are the hysteresis: a level
that holds the SLO under a steady load is kept, and a step up that proved too much is
retried ever more rarely (tests/test_slo.py shows both on an injected clock).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
import time
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterable, Protocol, Sized

from .. import metrics

if TYPE_CHECKING:
    from ..config import SloConfig


class Pool(Protocol):
    """What the controllers read of the backend pool (``pool.Pool``)."""

    known_models: set[str]
    slots: Sized  # the admission queue

    def serving(self, model: str) -> Iterable[Any]: ...

log = logging.getLogger("vlm_gateway.slo")

QUANTILES = {"p90": 0.90, "p99": 0.99}
_MAX_SAMPLES = 100_000  # per pool: a window of 5 s at 20k req/s


@dataclass(slots=True)
class PoolLoad:
    """What the engines of one pool say about their queue (summed over backends)."""

    waiting: float = 0.0
    running: float = 0.0
    kv_usage: float = 0.0  # the fullest backend's
    gateway_queue: int = 0  # requests waiting in the gateway for a backend slot


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (no interpolation: p99 of 100 samples is the 99th)."""
    s = sorted(values)
    return s[max(0, math.ceil(q * len(s)) - 1)]


class SloController:
    """The level of one pool. ``clock`` is injectable (tests drive it by hand)."""

    def __init__(self, cfg: "SloConfig", clock: Callable[[], float] = time.monotonic) -> None:
        self.cfg = cfg
        self.clock = clock
        self.max_level = len(cfg.photo_scales)
        self.level = 0
        self.changed_at = -math.inf
        self.last_down = -math.inf
        self.calm_since: float | None = None
        self.holds = [cfg.up_hold_s] * (self.max_level + 1)
        self.up_from: dict[int, float] = {}  # level -> when the controller last stepped up from it
        self.last_up: tuple[int, float] | None = None  # the latest step up: (from level, when)
        self.down_rate = 0.0  # requests sent per second at the last step down
        self.sends: deque[float] = deque(maxlen=_MAX_SAMPLES)
        # (answered_at, sent_at, seconds)
        self.samples: deque[tuple[float, float, float]] = deque(maxlen=_MAX_SAMPLES)
        self.last_p: float | None = None
        self.last_wait: float | None = None
        self.last_queued = False
        self.waiting_avg = 0.0
        self.changes = 0
        self.pending: dict[int, float] = {}  # requests sent and waiting for their first token
        self._ids = itertools.count()

    @property
    def target_s(self) -> float:
        return self.cfg.ttft_ms / 1000.0

    def observe(self, ttft_s: float, sent_at: float | None = None) -> None:
        """One answer's time to first token; ``sent_at`` on the controller's clock
        (default: now - ttft_s)."""
        now = self.clock()
        self.samples.append((now, now - ttft_s if sent_at is None else sent_at, ttft_s))

    def sent(self) -> int:
        """A request goes upstream now; returns its handle for ``answered``."""
        i = next(self._ids)
        now = self.clock()
        self.pending[i] = now
        self.sends.append(now)
        return i

    def answered(self, handle: int, ttft_s: float | None) -> None:
        """The first token of ``handle`` came after ``ttft_s`` (None: it ended without one)."""
        sent_at = self.pending.pop(handle, None)
        if ttft_s is not None:
            self.observe(ttft_s, sent_at)

    def _late(self, now: float) -> bool:
        limit = self.cfg.down_at * self.target_s
        return any(now - t >= limit for t in self.pending.values() if t > self.changed_at)

    def _window(self, now: float) -> tuple[list[float], int]:
        """(TTFTs sent since the last change, answers in the whole window)."""
        cut = now - self.cfg.window_s
        while self.samples and self.samples[0][0] < cut:
            self.samples.popleft()
        since = [s for _, sent, s in self.samples if sent > self.changed_at]
        return since, len(self.samples)

    def update(self, load: PoolLoad) -> int:
        """Decide once; returns the level."""
        c = self.cfg
        now = self.clock()
        since, total = self._window(now)
        p = percentile(since, QUANTILES[c.percentile]) if len(since) >= c.min_samples else None
        self.waiting_avg = 0.7 * self.waiting_avg + 0.3 * load.waiting
        queued = self.waiting_avg >= 1.0 or load.kv_usage >= c.kv_high or load.gateway_queue > 0
        self.last_p, self.last_queued = p, queued
        t = self.target_s
        span = min(c.window_s, now - self.samples[0][0]) if self.samples else 0.0
        rate = total / max(span, c.interval_s)
        while self.sends and self.sends[0] < now - c.window_s:
            self.sends.popleft()
        sent_span = min(c.window_s, now - self.sends[0]) if self.sends else 0.0
        sent_rate = len(self.sends) / max(sent_span, c.interval_s)
        wait = len(self.pending) / rate if rate > 0 else None
        self.last_wait = wait
        hot = ((p is not None and (p >= c.down_at * t or (queued and p >= c.early_at * t)))
               or (wait is not None and total >= c.min_samples and wait >= c.early_at * t) or self._late(now))
        if hot:
            self.calm_since = None
            if self.level < self.max_level and now - self.last_down >= c.down_hold_s:
                lu = self.last_up
                if lu is not None and lu[0] == self.level + 1 and now - lu[1] < c.up_hold_max_s:
                    self.holds[lu[0]] = min(c.up_hold_max_s, 2 * self.holds[lu[0]])  # it was too much
                self.last_up = None
                self.down_rate = sent_rate
                self._set(self.level + 1, now)
                self.last_down = now
            return self.level
        for lv, t_up in self.up_from.items():  # a step up that stuck: its hold is reset
            if self.level < lv and now - t_up >= c.up_hold_max_s:
                self.holds[lv] = c.up_hold_s
        growing = total >= c.min_samples and sent_rate > 1.05 * rate
        cool = not queued and not growing and ((p is not None and p < c.up_at * t)
                                               or (p is None and total < c.min_samples))
        if not cool:
            self.calm_since = None
            return self.level
        if self.calm_since is None:
            self.calm_since = now
        fell = p is None or sent_rate < 0.75 * self.down_rate
        hold = c.up_hold_s if fell else self.holds[self.level]
        if self.level > 0 and now - self.calm_since >= hold:
            self.up_from[self.level] = now
            self.last_up = (self.level, now)
            self._set(self.level - 1, now)
            self.calm_since = now
        return self.level

    def _set(self, level: int, now: float) -> None:
        log.info("image budget level %d -> %d (TTFT %s %s ms, target %g ms)", self.level, level,
                 self.cfg.percentile, "n/a" if self.last_p is None else f"{self.last_p * 1000:.0f}",
                 self.cfg.ttft_ms)
        self.level = level
        self.changed_at = now
        self.changes += 1


class SloPools:
    """A controller per model pool, fed by the relay's TTFT measurements and the pool's
    scraped engine figures; ``level(model)`` is what the image stage reads."""

    def __init__(self, cfg: "SloConfig", pool: "Pool", clock: Callable[[], float] = time.monotonic) -> None:
        self.cfg = cfg
        self.pool = pool
        self.clock = clock
        self.controllers: dict[str, SloController] = {}
        self._task: asyncio.Task | None = None
        for cls in ("photo", "text", "unknown"):  # a rate of 0, not an absent series, until one is
            metrics.IMAGES_DEGRADED.labels(cls)

    def controller(self, model: str) -> SloController | None:
        if not self.cfg.enabled or model not in self.pool.known_models:
            return None  # bounded: only models some backend serves get a controller
        c = self.controllers.get(model)
        if c is None:
            c = self.controllers[model] = SloController(self.cfg, self.clock)
            metrics.SLO_TARGET.labels(model).set(self.cfg.ttft_ms / 1000.0)
            metrics.IMAGE_BUDGET_LEVEL.labels(model).set(0)
        return c

    def level(self, model: str) -> int:
        c = self.controllers.get(model) if self.cfg.enabled else None
        return c.level if c is not None else 0

    def sent(self, model: str) -> "Sent":
        """Track one upstream request of ``model`` until its first token (``Sent.first``) or
        its end (``Sent.close``)."""
        c = self.controller(model)
        return Sent(c, c.sent() if c is not None else -1)

    def load(self, model: str) -> PoolLoad:
        out = PoolLoad(gateway_queue=len(self.pool.slots))
        for b in self.pool.serving(model):
            f = b.engine_load
            out.waiting += f.get("waiting", 0.0)
            out.running += f.get("running", 0.0)
            out.kv_usage = max(out.kv_usage, f.get("kv_usage", 0.0))
        return out

    def tick(self) -> None:
        for model in sorted(self.pool.known_models):
            c = self.controller(model)
            if c is None:
                continue
            level = c.update(self.load(model))
            metrics.IMAGE_BUDGET_LEVEL.labels(model).set(level)
            if c.last_p is not None:
                metrics.SLO_TTFT.labels(model).set(c.last_p)

    def status(self) -> list[dict]:
        """For /ui and /admin: each pool's level and what it is based on."""
        return [{"pool": m, "level": c.level, "max_level": c.max_level,
                 "ttft_ms": None if c.last_p is None else round(c.last_p * 1000.0, 1),
                 "target_ms": self.cfg.ttft_ms, "percentile": self.cfg.percentile, "queued": c.last_queued}
                for m, c in sorted(self.controllers.items())]

    def start(self) -> None:
        if self.cfg.enabled and self._task is None:
            self._task = asyncio.create_task(self._loop(), name="slo")

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.cfg.interval_s)
            try:
                self.tick()
            except Exception:  # a bug here must not stop the loop: the level just stays
                log.exception("image budget controller failed")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None


class Sent:
    """One request in flight for a controller: its first token is a TTFT sample."""

    __slots__ = ("c", "handle")

    def __init__(self, c: SloController | None, handle: int) -> None:
        self.c, self.handle = c, handle

    def first(self, ttft_s: float) -> None:
        if self.c is not None:
            self.c.answered(self.handle, ttft_s)
            self.c = None

    def close(self) -> None:
        if self.c is not None:
            self.c.answered(self.handle, None)
            self.c = None
