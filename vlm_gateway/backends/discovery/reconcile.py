"""Apply the discovery sources' lists to the pool.

    wanted      = union over sources of their last published lists, by target name
                  (first source wins a name; a static backend's name is never taken)
    appeared    = wanted - current        -> Pool.add (start, probe, scrape; routed once healthy)
    changed     = same name, other target -> drain the old one, add the new one
    departed    = current - wanted        -> departing: no new requests; in-flight ones finish,
                                             then Pool.remove (or after drain_timeout_s)
    returned    = departing and wanted again with the same target -> taken back as it is

Changes are applied one at a time under a lock, so a burst of publishes is coalesced into
the latest lists. Affinity moves with membership on its own: ``home`` is a rendezvous
hash over the candidates' names, so only the conversations homed on a departed backend
move (about 1/N of them; docs/benchmarks/discovery.md).
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from ... import metrics
from ...core.clock import Clock
from ..backend import Backend
from ..profiles import load_profiles
from . import build
from .source import Discovery, Target

if TYPE_CHECKING:
    from ...config import GatewayConfig
    from ..pool import Pool

log = logging.getLogger("vlm_gateway.discovery")

DRAIN_POLL_S = 0.05


class Reconciler:
    def __init__(self, cfg: "GatewayConfig", pool: "Pool", sources: list[Discovery] | None = None,
                 clock: Clock | None = None) -> None:
        self.cfg = cfg
        self.pool = pool
        self.profiles = load_profiles(cfg.profiles)
        if sources is None:
            sources = [build(e) for e in cfg.discovery]
        self.sources = sources
        self.drain_timeouts = [e.drain_timeout_s for e in cfg.discovery]
        self.clock = clock or pool.clock  # the drain timeouts run on it
        self._lists: dict[int, list[Target]] = {}
        self._static = {b.name for b in pool.backends}
        # discovered backends now in the pool, by name, with the target they were built from
        self.members: dict[str, tuple[Target, Backend, int]] = {}
        self._draining: dict[Backend, asyncio.Task] = {}
        self._dirty = asyncio.Event()
        self._tasks: list[asyncio.Task] = []
        self.applied = 0  # rounds applied (tests wait on it)

    async def start(self) -> None:
        for i, s in enumerate(self.sources):
            self._tasks.append(asyncio.create_task(self._run_source(i, s), name=f"discovery-{s.label}"))
        self._tasks.append(asyncio.create_task(self._apply_loop(), name="discovery-apply"))

    async def close(self) -> None:
        tasks = self._tasks + list(self._draining.values())
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _run_source(self, i: int, source: Discovery) -> None:
        def publish(targets: list[Target]) -> None:
            self._lists[i] = list(targets)
            metrics.DISCOVERY_BACKENDS.labels(source.label).set(len(targets))
            self._dirty.set()
        while True:
            try:
                await source.run(publish)
                return
            except asyncio.CancelledError:
                raise
            except Exception:  # a source bug must not stop discovery: its last list stands
                metrics.DISCOVERY_ERRORS.labels(source.label).inc()
                log.exception("discovery %s failed; restarting it in 5 s", source.label)
                await asyncio.sleep(5.0)

    async def _apply_loop(self) -> None:
        while True:
            await self._dirty.wait()
            self._dirty.clear()
            try:
                await self.apply()
            except Exception:
                log.exception("applying discovered backends failed")

    def wanted(self) -> dict[str, tuple[Target, int]]:
        out: dict[str, tuple[Target, int]] = {}
        for i in sorted(self._lists):
            for t in self._lists[i]:
                if t.name in self._static:
                    log.warning("discovery %s: %s has the name of a static backend; ignored",
                                self.sources[i].label, t.name)
                    continue
                out.setdefault(t.name, (t, i))
        return out

    async def apply(self) -> None:
        wanted = self.wanted()
        for name, (t, b, i) in list(self.members.items()):
            w = wanted.get(name)
            if w is not None and w[0] == t:
                if b.departing:
                    self._take_back(b, i)
                continue
            if not b.departing:
                self._depart(name, b, i)
            if w is not None:          # same name, new address or template: replaced
                del self.members[name]
        for name, (t, i) in wanted.items():
            if name in self.members:
                continue
            b = Backend.from_config(t.backend_config(), 0, self.profiles.get(t.profile))
            if t.profile and not b.profile:
                log.error("discovered backend %s names GPU profile %r, which is not defined: it is routed "
                          "without profile limits", name, t.profile)
            await self.pool.add(b)
            self.members[name] = (t, b, i)
            metrics.DISCOVERY_CHANGES.labels(self.sources[i].label, "added").inc()
            log.info("discovery %s: backend %s at %s added (%s)", self.sources[i].label, name, t.url,
                     "healthy" if b.healthy else "waiting for its health probe")
        self.applied += 1

    def _depart(self, name: str, b: Backend, i: int) -> None:
        b.departing = True
        metrics.DISCOVERY_CHANGES.labels(self.sources[i].label, "drained").inc()
        log.info("discovery %s: backend %s left; draining %d in-flight request(s)", self.sources[i].label,
                 name, b.inflight)
        self._draining[b] = asyncio.create_task(self._drain(name, b, i), name=f"drain-{name}")

    def _take_back(self, b: Backend, i: int) -> None:
        task = self._draining.pop(b, None)
        if task is not None:
            task.cancel()
        b.departing = False
        log.info("discovery %s: backend %s is back", self.sources[i].label, b.name)

    async def _drain(self, name: str, b: Backend, i: int) -> None:
        timeout = self.drain_timeouts[i] if i < len(self.drain_timeouts) else 900.0
        deadline = self.clock() + timeout
        while b.inflight > 0 and self.clock() < deadline:
            await asyncio.sleep(DRAIN_POLL_S)
        if b.inflight > 0:
            log.warning("discovery: backend %s still had %d request(s) after the drain timeout; closing it",
                        name, b.inflight)
        self._draining.pop(b, None)
        if self.members.get(name, (None, None))[1] is b:
            del self.members[name]
        await self.pool.remove(b)
        metrics.DISCOVERY_CHANGES.labels(self.sources[i].label, "removed").inc()
        log.info("discovery %s: backend %s removed", self.sources[i].label, name)
