"""The running gateway's state: configuration, backend pool, stage chain, relay.
One instance per worker process, created in the app's lifespan."""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from ..backends.backend import Backend
from ..backends.pool import Pool
from ..backends.profiles import load_profiles
from ..config import GatewayConfig
from ..stages import Stage
from .relay import Relay

if TYPE_CHECKING:
    from ..core.request import ChatRequest

log = logging.getLogger("vlm_gateway")


class Gateway:
    def __init__(self, cfg: GatewayConfig) -> None:
        self.cfg = cfg
        profiles = load_profiles(cfg.profiles)
        backends = [Backend.from_config(b, i, profiles.get(b.profile)) for i, b in enumerate(cfg.backends)]
        self.pool = Pool(cfg, backends)
        self.discovery = None
        if cfg.discovery:
            from ..backends.discovery.reconcile import Reconciler
            self.discovery = Reconciler(cfg, self.pool)
        self.relay = Relay(self)
        self.stages: list[Stage] = []
        self.closers: list = []
        # async () -> count|None, called by POST /admin/cache/flush (L1 images, L3 responses)
        self.cache_flushers: list = []
        self._build_stages()

    def _build_stages(self) -> None:
        """auth/rate-limit -> image rewrite (L1) -> L3 lookup (DESIGN.md order)."""
        from ..stages import chain
        self.stages = chain.build(self)

    async def start(self) -> None:
        await self.pool.start()
        if self.discovery is not None:
            await self.discovery.start()
        from ..stages import chain
        await chain.start(self)

    async def close(self) -> None:
        for c in reversed(self.closers):
            try:
                await c()
            except Exception:  # pragma: no cover - best effort on shutdown
                log.exception("error while closing")
        if self.discovery is not None:
            await self.discovery.close()
        await self.pool.close()

    def response_headers(self, req: "ChatRequest", content_type: bytes) -> list[tuple[bytes, bytes]]:
        overhead = (time.perf_counter() - req.t_start - req.upstream_s) * 1000.0
        b = req.state.get("backend")
        h = [(b"content-type", content_type),
             (b"x-vlm-gateway-overhead-ms", b"%.3f" % overhead),
             (b"x-vlm-gateway-backend", b.name.encode() if b is not None else b"none"),
             (b"x-request-id", req.request_id.encode())]
        if req.timing is not None:
            h.append((b"server-timing", req.timing.server_timing()))
        if content_type == b"text/event-stream":
            h += [(b"cache-control", b"no-cache"), (b"x-accel-buffering", b"no")]
        for k, v in req.response_headers.items():
            h.append((k.encode(), v.encode()))
        return h
