"""The reconciler's membership rules, in process through the static source (the seam that
pushes lists without DNS or an API server). Backends point at closed loopback ports: the
rules do not depend on their health."""

from __future__ import annotations

import asyncio

from vlm_gateway.backends.discovery.reconcile import Reconciler
from vlm_gateway.backends.discovery.source import Target
from vlm_gateway.backends.discovery.static import StaticDiscovery
from vlm_gateway.backends.pool import Pool
from vlm_gateway.config import BackendConfig, DiscoveryConfig, GatewayConfig
from vlm_gateway.backends.backend import Backend

from conftest import free_port


def t(name: str, port: int, profile: str = "") -> Target:
    return Target(name=name, url=f"http://127.0.0.1:{port}/v1", engine="openai", profile=profile)


async def settle(rec: Reconciler, rounds: int) -> None:
    for _ in range(200):
        if rec.applied >= rounds:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{rec.applied} rounds applied, expected {rounds}")


async def test_membership_rules():
    static_port = free_port()
    cfg = GatewayConfig(backends=[BackendConfig(url=f"http://127.0.0.1:{static_port}/v1", name="fixed")],
                        discovery=[DiscoveryConfig(kind="dns", dns_name="x", port=1, drain_timeout_s=0.5)])
    pool = Pool(cfg, [Backend.from_config(cfg.backends[0], 0)])
    src = StaticDiscovery([t("a", free_port()), t("b", free_port(), "h200"), t("fixed", free_port())])
    rec = Reconciler(cfg, pool, [src])
    await rec.start()
    try:
        await settle(rec, 1)
        names = [b.name for b in pool.backends]
        # a discovered name never takes a static backend's place
        assert names == ["fixed", "a", "b"]
        b = next(x for x in pool.backends if x.name == "b")
        assert b.profile.get("max_num_seqs"), "the named GPU profile applies"
        # b leaves with a request in flight: departing (not available), still in the pool
        b.inflight = 1
        src.set([rec.members["a"][0]])
        await settle(rec, 2)
        assert b.departing and not b.available and b in pool.backends
        # ... and comes back before it drained: the same object, taken back
        src.set([rec.members["a"][0], rec.members["b"][0]])
        await settle(rec, 3)
        assert not b.departing and b in pool.backends
        # leaves again and its request ends: removed
        src.set([rec.members["a"][0]])
        await settle(rec, 4)
        await asyncio.sleep(0.1)
        assert b in pool.backends
        b.inflight = 0
        for _ in range(100):
            if b not in pool.backends:
                break
            await asyncio.sleep(0.02)
        assert b not in pool.backends and "b" not in rec.members
        # same name, another address: the old one drains, the new one is added
        a_old = rec.members["a"][1]
        a_old.inflight = 1
        src.set([t("a", free_port())])
        await settle(rec, 5)
        a_new = rec.members["a"][1]
        assert a_new is not a_old and a_old.departing and not a_new.departing
        assert {x for x in pool.backends if x.name == "a"} == {a_old, a_new}
        # the drain timeout closes a backend whose request never ends
        await asyncio.sleep(0.8)
        assert a_old not in pool.backends and a_new in pool.backends
    finally:
        await rec.close()
        await pool.close()
