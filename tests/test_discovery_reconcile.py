"""The reconciler's membership rules, in process through the static source (the seam that
pushes lists without DNS or an API server). Backends point at closed loopback ports: the
rules do not depend on their health."""

from __future__ import annotations

from vlm_gateway.backends.discovery.reconcile import Reconciler
from vlm_gateway.backends.discovery.source import Target
from vlm_gateway.backends.discovery.static import StaticDiscovery
from vlm_gateway.backends.pool import Pool
from vlm_gateway.config import BackendConfig, DiscoveryConfig, GatewayConfig
from vlm_gateway.backends.backend import Backend

from conftest import free_port
from transport import ManualClock
from waiting import async_wait_until


def t(name: str, port: int, profile: str = "") -> Target:
    return Target(name=name, url=f"http://127.0.0.1:{port}/v1", engine="openai", profile=profile)


async def settle(rec: Reconciler, rounds: int) -> None:
    await async_wait_until(lambda: rec.applied >= rounds, f"{rounds} rounds applied", 2, 0.01)


async def test_membership_rules():
    static_port = free_port()
    cfg = GatewayConfig(backends=[BackendConfig(url=f"http://127.0.0.1:{static_port}/v1", name="fixed")],
                        discovery=[DiscoveryConfig(kind="dns", dns_name="x", port=1, drain_timeout_s=0.5)])
    pool = Pool(cfg, [Backend.from_config(cfg.backends[0], 0)])
    src = StaticDiscovery([t("a", free_port()), t("b", free_port(), "h200"), t("fixed", free_port())])
    clock = ManualClock()   # the drain timeouts' clock: read by the drain loops alone
    rec = Reconciler(cfg, pool, [src], clock=clock)

    async def drain_looked() -> None:
        """Until the drain loop (one at a time here) has read the clock twice more: it has
        set its deadline, or looked at the backend's in-flight count at least once since."""
        seen = clock.reads
        await async_wait_until(lambda: clock.reads >= seen + 2, "the drain loop looked again")
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
        await drain_looked()
        assert b in pool.backends
        b.inflight = 0
        await async_wait_until(lambda: b not in pool.backends, "b, drained, is removed")
        assert "b" not in rec.members
        # same name, another address: the old one drains, the new one is added
        a_old = rec.members["a"][1]
        a_old.inflight = 1
        src.set([t("a", free_port())])
        await settle(rec, 5)
        a_new = rec.members["a"][1]
        assert a_new is not a_old and a_old.departing and not a_new.departing
        assert {x for x in pool.backends if x.name == "a"} == {a_old, a_new}
        # the drain timeout (0.5 s) closes a backend whose request never ends, not before
        await drain_looked()
        clock.advance(0.25)
        await drain_looked()
        assert a_old in pool.backends
        clock.advance(0.25)
        await async_wait_until(lambda: a_old not in pool.backends, "a_old is closed at its drain timeout")
        assert a_new in pool.backends
    finally:
        await rec.close()
        await pool.close()
