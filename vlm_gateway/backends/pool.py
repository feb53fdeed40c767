"""The backend pool: which upstreams exist, which are usable now, and which one a
request goes to (filter -> policy rank -> first with a free slot).

Health: an active probe of each backend's ``/health`` every
``routing.health_interval_s`` (which also refreshes served models when they are
not configured), and passive ejection by each backend's circuit breaker
(``breaker.py``: ``eject_after_failures`` consecutive failures open it for
``eject_base_s * 2^k`` capped at ``eject_max_s``, then half-open).

Load: each engine's load endpoint is scraped every ``routing.scrape_interval_s``
(``scrape.py``: Prometheus text or trtllm-serve's iteration statistics) into
``Backend.stats`` (``stats.EngineStats``), one loop per backend so that a slow endpoint (trtllm-serve's
``/metrics`` answers late while the engine is busy) delays no other backend's figures;
``router.least_loaded.load`` turns them into the normalised load the policies rank by.

Membership: the static ``backends`` are there from the start; discovery
(``discovery/``) calls ``add`` for a backend that appeared (started, probed, scraped
like the others) and ``remove`` for one that left, once its in-flight requests ended.

Admission: the profile filter (``admission.ProfileFilter``) drops backends that
cannot take the request; a backend whose in-flight count reached its profile's
``max_num_seqs`` is full; when every candidate is full the request waits in
``admission.Slots`` (bounded, with timeout -> 429 + Retry-After). A slot taken is owned
by a ``Lease`` (``Pool.lease``), which gives it back exactly once whatever ends the request.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from typing import TYPE_CHECKING

import aiohttp
import orjson

from .. import metrics
from ..config import GatewayConfig
from ..core.clock import Clock, monotonic
from ..core.errors import BadRequest, GatewayError, NotFound, Unavailable
from . import scrape
from .admission import ProfileFilter, Slots
from .backend import Backend
from .breaker import CircuitBreaker
from .stats import FIGURES, EngineStats
from .transport import TransportFactory
from .router import get_policy
from .router.least_loaded import load
from .slo import SloPools

if TYPE_CHECKING:
    from ..core.request import ChatRequest

log = logging.getLogger("vlm_gateway.pool")

STATES = ("closed", "open", "half_open", "down")


# A probe reads at most this much of an answer: a model list or a config, never a flood.
PROBE_MAX_BYTES = 1 << 20


async def _read_small(r: aiohttp.ClientResponse) -> bytes:
    data = await r.content.read(PROBE_MAX_BYTES + 1)
    while len(data) <= PROBE_MAX_BYTES and not r.content.at_eof():
        more = await r.content.read(PROBE_MAX_BYTES + 1 - len(data))
        if not more:
            break
        data += more
    if len(data) > PROBE_MAX_BYTES:
        raise aiohttp.ClientPayloadError(f"answer larger than {PROBE_MAX_BYTES} bytes")
    return data


class Lease:
    """One slot taken on one backend for one attempt, given back exactly once: ``release`` may
    be called on every path (``finally`` included), only the first call counts. ``failed``
    counts the attempt against the backend's circuit breaker, ``ok`` for it; neither (a
    client that went away, a refusal of the gateway's own) leaves the breaker as it is."""

    __slots__ = ("pool", "backend", "held")

    def __init__(self, pool: "Pool", backend: Backend) -> None:
        self.pool = pool
        self.backend = backend
        self.held = True

    def release(self, failed: bool = False, ok: bool = False) -> None:
        if not self.held:
            return
        self.held = False
        self.pool.release(self.backend)
        if failed:
            self.pool.record_failure(self.backend)
        elif ok:
            self.pool.record_success(self.backend)


class Pool:
    def __init__(self, cfg: GatewayConfig, backends: list[Backend], clock: Clock = monotonic,
                 transport: TransportFactory | None = None) -> None:
        self.cfg = cfg
        self.clock = clock
        self.transport = transport  # None: aiohttp
        self.backends = backends
        for b in backends:
            self._adopt(b)
        # model names served anywhere in the pool (bounded label set for metrics)
        self.known_models: set[str] = set()
        self._refresh_known_models()
        self.policy = get_policy(cfg.routing.policy, cfg.routing)
        # Extra filters (profile admission, ...) added by routing modules: (req, backend) -> reason|None
        self.filters: list = [ProfileFilter(cfg)]
        r = cfg.routing
        self.slots = Slots(r.queue_timeout_s, r.max_queue, clock)
        self._tasks: list[asyncio.Task] = []
        self._scrapers: dict[Backend, asyncio.Task] = {}
        # SLO-aware image budgets: a budget level per model pool (slo.py)
        self.slo = SloPools(cfg.slo, self)
        for bc, b in zip(cfg.backends, backends):
            if bc.profile and not b.profile:
                log.error("backend %s names GPU profile %r, which is not defined (backends/profiles.yaml or "
                          "config `profiles`): it is routed without profile limits", b.name, bc.profile)

    def _adopt(self, b: Backend) -> None:
        r = self.cfg.routing
        b.breaker = CircuitBreaker(r.eject_after_failures, r.eject_base_s, r.eject_max_s, self.clock)

    # -- lifecycle ---------------------------------------------------------------------
    async def start(self) -> None:
        for b in self.backends:
            await b.start(self.cfg.upstream, self.transport)
        await asyncio.gather(*(self.probe(b) for b in self.backends))
        self._tasks.append(asyncio.create_task(self._health_loop(), name="health"))
        for b in self.backends:
            self._start_scraper(b)
        self.slo.start()

    def _start_scraper(self, b: Backend) -> None:
        if b.scrape_state.sources:
            self._scrapers[b] = asyncio.create_task(self._scrape_loop(b), name=f"scrape-{b.name}")

    async def add(self, b: Backend) -> None:
        """Admit a backend found at run time: routed to once its first probe succeeds."""
        self._adopt(b)
        await b.start(self.cfg.upstream, self.transport)
        b.healthy = False
        await self.probe(b)
        self.backends.append(b)
        self._refresh_known_models()
        self._start_scraper(b)

    async def remove(self, b: Backend) -> None:
        """Forget a backend (discovery: it left and its in-flight requests ended)."""
        task = self._scrapers.pop(b, None)
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        if b in self.backends:
            self.backends.remove(b)
        self._refresh_known_models()
        await b.close()
        if not any(x.name == b.name for x in self.backends):
            metrics.forget_backend(b.name)

    async def close(self) -> None:
        await self.slo.close()
        tasks = self._tasks + list(self._scrapers.values())
        for t in tasks:
            t.cancel()
        for t in tasks:
            try:
                await t
            except (asyncio.CancelledError, Exception):
                pass
        for b in self.backends:
            await b.close()

    async def _health_loop(self) -> None:
        while True:
            await asyncio.sleep(self.cfg.routing.health_interval_s)
            await asyncio.gather(*(self.probe(b) for b in self.backends), return_exceptions=True)

    async def _scrape_loop(self, b: Backend) -> None:
        interval = max(0.05, self.cfg.routing.scrape_interval_s)
        while True:
            t0 = time.monotonic()
            try:
                await self.scrape(b)
            except Exception:  # a scrape bug must not stop the loop; the figures just go stale
                log.exception("scrape of backend %s failed", b.name)
            await asyncio.sleep(max(0.0, interval - (time.monotonic() - t0)))

    async def scrape(self, b: Backend) -> None:
        figures = await scrape.scrape(b, timeout_s=max(0.2, 2 * self.cfg.routing.scrape_interval_s))
        if figures is not None:
            # the gateway's in-flight count now: requests sent/finished after this shift the figure
            b.stats = EngineStats.from_figures(figures, b.inflight, time.monotonic())
            for k in FIGURES:
                if k in figures:
                    metrics.ENGINE_METRIC.labels(b.name, k).set(figures[k])
        metrics.BACKEND_LOAD.labels(b.name).set(load(b))

    async def probe(self, b: Backend) -> None:
        limit = max(1.0, self.cfg.routing.health_interval_s)
        timeout = aiohttp.ClientTimeout(total=limit)
        why = ""
        try:
            # a redirect is not a healthy answer, and is never followed (nor for requests: relay.py)
            async with b.session.get(f"{b.origin}/health", timeout=timeout, allow_redirects=False) as r:
                if r.status != 200:
                    why = f"GET /health answered HTTP {r.status}"
            if not why and not b.models_configured:
                async with b.session.get(f"{b.base_url}/models", timeout=timeout, allow_redirects=False) as r:
                    if r.status == 200:
                        data = orjson.loads(await _read_small(r))
                        models = {m["id"] for m in data.get("data", []) if isinstance(m, dict) and "id" in m}
                        if models != b.models:
                            b.models = models
                            self._refresh_known_models()
            if not why and b.engine == "sim" and not b.sim_profile:
                async with b.session.get(f"{b.origin}/sim/config", timeout=timeout, allow_redirects=False) as r:
                    if r.status == 200:
                        b.sim_profile = str(orjson.loads(await _read_small(r)).get("profile") or "")
        except asyncio.TimeoutError:
            why = f"no answer within {limit:g}s"
        except aiohttp.ClientConnectorError as e:
            code = getattr(e.os_error, "errno", None)
            why = f"cannot connect: {os.strerror(code) if code and code > 0 else str(e)[:160]}"
        except (aiohttp.ClientError, OSError) as e:
            why = f"{type(e).__name__}: {str(e)[:120]}" if str(e) else type(e).__name__
        except (orjson.JSONDecodeError, AttributeError, TypeError):
            why = "GET /v1/models answered something that is not a model list"
        ok = not why
        if ok != b.healthy:
            if ok:
                log.warning("backend %s is healthy again", b.name)
            else:
                log.warning("backend %s is unhealthy: probe failed (%s)", b.name, why)
        b.healthy = ok
        if ok:
            b.breaker.probe_succeeded()
        self._export(b)
        if ok:
            self.slots.wake()

    def _export(self, b: Backend) -> None:
        metrics.BACKEND_HEALTHY.labels(b.name).set(1 if b.available else 0)
        state = "down" if not b.healthy else b.breaker.state()
        for s in STATES:
            metrics.BACKEND_STATE.labels(b.name, s).set(1 if s == state else 0)

    # -- outcome bookkeeping -----------------------------------------------------------
    def record_success(self, b: Backend) -> None:
        if b.breaker.failures:
            b.breaker.record_outcome(True)
            self._export(b)

    def record_failure(self, b: Backend) -> None:
        delay = b.breaker.record_outcome(False)
        if delay is not None:
            log.warning("backend %s ejected for %.1fs after %d consecutive failures",
                        b.name, delay, b.breaker.failures)
        self._export(b)

    # -- choice ------------------------------------------------------------------------
    def models(self) -> list[str]:
        seen: dict[str, None] = {}
        for b in self.backends:
            for m in sorted(b.models):
                seen.setdefault(m, None)
        return list(seen)

    def _refresh_known_models(self) -> None:
        self.known_models = set().union(*(b.models for b in self.backends))

    def serving(self, model: str) -> list[Backend]:
        return [b for b in self.backends if model in b.models]

    def image_caps(self, model: str) -> tuple[int, int] | None:
        """The (``image_max_long_side``, ``image_max_pixels``) all backends serving ``model``
        share (0: no limit), None when they differ or none serves it: the image stage then
        caps per chosen backend."""
        caps = {(b.image_cap, b.image_pixels) for b in self.serving(model)}
        return caps.pop() if len(caps) == 1 else None

    def candidates(self, req: "ChatRequest", exclude: set[Backend] = frozenset()) -> list[Backend]:
        serving = self.serving(req.model)
        if not serving:
            raise NotFound(f"The model '{req.model}' does not exist or is not served by any backend",
                           param="model", code="model_not_found")
        usable = [b for b in serving if b.available and b not in exclude]
        if not usable:
            raise Unavailable("No healthy backend is available for this model; retry shortly",
                              code="no_healthy_backend", headers={"retry-after": "1"})
        for f in self.filters:
            kept, reasons = [], []
            for b in usable:
                why = f(req, b)
                (reasons.append(why) if why else kept.append(b))
            if not kept:
                raise BadRequest(f"No backend can serve this request: {reasons[0]}", code="no_backend_admits",
                                 param="messages")
            usable = kept
        return usable

    @staticmethod
    def full(b: Backend) -> bool:
        cap = b.capacity
        return bool(cap) and b.inflight >= cap

    def _take(self, req: "ChatRequest", exclude) -> Backend | None:
        """Best-ranked candidate with a free slot, slot taken; None when all are full."""
        for b in self.policy.rank(req, self.candidates(req, exclude)):
            if not self.full(b):
                b.inflight += 1
                metrics.BACKEND_INFLIGHT.labels(b.name).inc()
                return b
        return None

    async def acquire(self, req: "ChatRequest", exclude: set[Backend] = frozenset()) -> Backend:
        """Pick the best candidate and take a slot on it, waiting in the admission queue
        (then 429) when every candidate is at its profile's concurrency."""
        b = self._take(req, exclude)
        if b is not None:
            return b
        name = self.policy.name
        metrics.ROUTING.labels(name, "queued").inc()
        try:
            return await self.slots.wait(lambda: self._take(req, exclude),
                                         self.clock() + self.cfg.routing.queue_timeout_s)
        except GatewayError as e:
            if e.status == 429:
                metrics.ROUTING.labels(name, "rejected").inc()
            raise

    async def lease(self, req: "ChatRequest", exclude: set[Backend] = frozenset()) -> Lease:
        """``acquire``, the slot owned by a ``Lease`` (nothing can come between the two)."""
        return Lease(self, await self.acquire(req, exclude))

    def release(self, b: Backend) -> None:
        b.inflight -= 1
        metrics.BACKEND_INFLIGHT.labels(b.name).dec()
        self.slots.wake()
