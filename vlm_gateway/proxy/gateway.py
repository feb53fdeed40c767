"""The running gateway's state: configuration, backend pool, stage chain, relay.
One instance per worker process, created in the app's lifespan."""

from __future__ import annotations

import logging
from ..backends.backend import Backend
from ..backends.pool import Pool
from ..backends.profiles import load_profiles
from ..backends.transport import TransportFactory
from ..config import GatewayConfig
from ..core import headers as H
from ..core.clock import Clock, monotonic
from ..core.request import ChatRequest
from ..stages.auth import Auth, KeyTable
from ..stages.chain import Chain
from .relay import Relay
from .summary import backend_name, overhead_s

log = logging.getLogger("vlm_gateway")


class Gateway:
    """``clock`` and ``transport`` are the seams for in-process tests (core/clock.py,
    backends/transport.py); production uses the defaults."""

    def __init__(self, cfg: GatewayConfig, clock: Clock = monotonic, transport: TransportFactory | None = None) -> None:
        self.cfg = cfg
        profiles = load_profiles(cfg.profiles)
        backends = [Backend.from_config(b, i, profiles.get(b.profile)) for i, b in enumerate(cfg.backends)]
        self.pool = Pool(cfg, backends, clock, transport)
        self.discovery = None
        if cfg.discovery:
            from ..backends.discovery.reconcile import Reconciler
            self.discovery = Reconciler(cfg, self.pool)
        self.chain = Chain(cfg, self.pool.slo, self.pool)
        self.relay = Relay(self.pool, cfg, self.chain, self.response_headers)
        auth = self.chain.find(Auth)
        # the tenant key table (/v1/models shows a key its models); empty with auth off
        self.keys: KeyTable = auth.table if auth is not None else KeyTable([])

    async def start(self) -> None:
        await self.pool.start()
        if self.discovery is not None:
            await self.discovery.start()
        await self.chain.start()

    async def close(self) -> None:
        await self.chain.close()
        if self.discovery is not None:
            await self.discovery.close()
        await self.pool.close()

    @staticmethod
    def response_headers(req: ChatRequest, content_type: bytes) -> list[tuple[bytes, bytes]]:
        b = backend_name(req)
        h = [(b"content-type", content_type),
             (H.OVERHEAD.raw, b"%.3f" % (overhead_s(req) * 1000.0)),
             (H.BACKEND.raw, b.encode() if b is not None else b"none"),
             (H.REQUEST_ID.raw, req.request_id.encode())]
        if req.timing is not None:
            h.append((H.SERVER_TIMING.raw, req.timing.server_timing()))
        if content_type == b"text/event-stream":
            h += [(b"cache-control", b"no-cache"), (H.STREAM_NO_BUFFER.raw, b"no")]
        for k, v in req.response_headers.items():
            h.append((k.encode(), v.encode()))
        return h
