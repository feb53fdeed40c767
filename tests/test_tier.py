"""vlm_gateway/tier.py: the one local + Redis cache tier, in process, against the real
Redis on 127.0.0.1:6379 under a prefix of its own (and a closed port for a Redis that
is down): hits and misses through both tiers, the byte bound, TTLs, a blob the codec
refuses, a dead Redis, flush."""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass

import orjson
import pytest
import redis

from vlm_gateway.tier import Codec, Tier

from conftest import free_port
from transport import ManualClock

URL = "redis://127.0.0.1:6379/0"


@dataclass(frozen=True, slots=True)
class Item:
    name: str
    data: bytes
    expires: float = 0.0


def pack(i: Item) -> bytes:
    return orjson.dumps([i.name, i.expires]) + b"\n" + i.data


def unpack(blob: bytes) -> Item:
    head, _, data = blob.partition(b"\n")
    name, expires = orjson.loads(head)
    return Item(name, data, float(expires))


CODEC = Codec(pack, unpack)


def size(i: Item) -> int:
    return len(i.data)


@pytest.fixture
def prefix():
    p = f"vlmgw-test-tier-{uuid.uuid4().hex[:12]}:"
    yield p
    r = redis.Redis.from_url(URL)
    keys = list(r.scan_iter(match=p + "*"))
    if keys:
        r.delete(*keys)
    r.close()


@pytest.fixture
def admin():
    r = redis.Redis.from_url(URL)
    yield r
    r.close()


async def test_local_hit_and_miss_without_redis():
    t: Tier[Item] = Tier("test tier", CODEC, 1 << 20, size)
    assert not t.shared
    assert await t.get("a") is None
    await t.put("a", Item("a", b"x"))
    assert await t.get("a") == Item("a", b"x") == t.get_local("a")
    assert await t.get_shared("a") is None   # no Redis: the shared half is always a miss
    assert len(t) == 1 and t.bytes == 1


async def test_a_fill_in_one_process_is_a_hit_in_another_through_redis(prefix, admin):
    one: Tier[Item] = Tier("test tier", CODEC, 1 << 20, size, redis_url=URL, prefix=prefix, timeout_s=1.0)
    other: Tier[Item] = Tier("test tier", CODEC, 1 << 20, size, redis_url=URL, prefix=prefix, timeout_s=1.0)
    try:
        await one.put("k", Item("k", b"bytes"))
        assert admin.get(prefix + "k") == pack(Item("k", b"bytes"))   # written through
        assert other.get_local("k") is None
        assert await other.get("k") == Item("k", b"bytes")            # from Redis ...
        assert other.get_local("k") == Item("k", b"bytes")            # ... and now held here
        assert await other.get("missing") is None
        assert one.backoff.failures == other.backoff.failures == 0
    finally:
        await one.close()
        await other.close()


async def test_the_local_map_is_bounded_by_bytes_least_recently_used_first():
    t: Tier[Item] = Tier("test tier", CODEC, 1000, size)
    for i in range(10):
        t.put_local(f"k{i}", Item(f"k{i}", b"v" * 300))
    assert len(t) == 3 and t.bytes == 900
    assert [t.get_local(f"k{i}") is not None for i in (6, 7, 8, 9)] == [False, True, True, True]
    t.get_local("k7")                              # touched: k8 is now the oldest
    t.put_local("k10", Item("k10", b"v" * 300))
    assert t.get_local("k8") is None and t.get_local("k7") is not None
    t.put_local("huge", Item("huge", b"v" * 1001))   # larger than the whole map: never held
    assert t.get_local("huge") is None and len(t) == 3
    nothing: Tier[Item] = Tier("test tier", CODEC, 0, size)   # 0 bytes: holds nothing here
    nothing.put_local("a", Item("a", b"x"))
    assert nothing.get_local("a") is None


async def test_ttls_in_redis_and_lifetimes_here(prefix, admin):
    clock = ManualClock()
    t: Tier[Item] = Tier("test tier", CODEC, 1 << 20, size, redis_url=URL, prefix=prefix, ttl_s=30,
                         timeout_s=1.0, lifetime=lambda i: i.expires - clock(), clock=clock)
    try:
        await t.put("k", Item("k", b"x", expires=clock() + 10))
        assert 0 < admin.ttl(prefix + "k") <= 30
        clock.advance(9.9)
        assert t.get_local("k") is not None
        clock.advance(0.2)
        assert t.get_local("k") is None                 # past its lifetime here
        assert await t.get("k") is None                 # and Redis's copy has expired too: a miss
        t.put_local("gone", Item("gone", b"x", expires=clock() - 1))
        assert t.get_local("gone") is None
        # a Redis hit is held here for what is left of its lifetime
        admin.set(prefix + "late", pack(Item("late", b"y", expires=clock() + 5)), ex=30)
        assert await t.get("late") == Item("late", b"y", clock() + 5)
        clock.advance(4.9)
        assert t.get_local("late") is not None
        clock.advance(0.2)
        assert t.get_local("late") is None
    finally:
        await t.close()


async def test_a_blob_the_codec_refuses_is_a_miss_not_a_failure(prefix, admin):
    t: Tier[Item] = Tier("test tier", CODEC, 1 << 20, size, redis_url=URL, prefix=prefix, timeout_s=1.0)
    try:
        for key, blob in (("garbage", b"\xff\xfe"), ("short", b"[1]\nx"), ("other", b'{"v": 2}\nx')):
            admin.set(prefix + key, blob)
            assert await t.get(key) is None
            assert t.get_local(key) is None
        assert t.backoff.failures == 0 and t.backoff.up()
    finally:
        await t.close()


async def test_a_redis_that_is_down_leaves_the_local_tier_with_one_warning(caplog):
    url = f"redis://127.0.0.1:{free_port()}/0"   # nothing listens there
    t: Tier[Item] = Tier("test tier", CODEC, 1 << 20, size, redis_url=url, prefix="vlmgw-test-tier-down:",
                         timeout_s=0.2, retry_s=60.0)
    try:
        with caplog.at_level(logging.WARNING, "vlm_gateway.redis"):
            await t.put("a", Item("a", b"x"))          # the write fails: held here anyway
            assert await t.get("a") == Item("a", b"x")
            assert await t.get("b") is None            # backed off: Redis is not asked
            await t.put("c", Item("c", b"y"))
            assert await t.get_shared("c") is None
            assert await t.flush() == 2                # the local tier is flushed regardless
        assert t.backoff.failures >= 1 and not t.backoff.up()
        lines = [r.getMessage() for r in caplog.records if r.name == "vlm_gateway.redis"]
        assert len(lines) == 1 and lines[0].startswith("test tier: Redis failed"), lines
        assert "using the in-process tier only" in lines[0]
    finally:
        await t.close()


async def test_flush_clears_both_tiers_and_nothing_else(prefix, admin):
    t: Tier[Item] = Tier("test tier", CODEC, 1 << 20, size, redis_url=URL, prefix=prefix, timeout_s=1.0)
    bystander = prefix[:-1] + "-other:k"   # another namespace: not this tier's to flush
    admin.set(bystander, b"keep", ex=60)
    try:
        for k in ("a", "b", "c"):
            await t.put(k, Item(k, b"x"))
        other: Tier[Item] = Tier("test tier", CODEC, 1 << 20, size, redis_url=URL, prefix=prefix,
                                 timeout_s=1.0)
        await other.put("d", Item("d", b"y"))          # in Redis, and in the other process only
        await other.close()
        assert await t.flush() == 3 + 4                # 3 here, 4 keys in Redis
        assert len(t) == 0 and t.bytes == 0
        assert list(admin.scan_iter(match=prefix + "*")) == []
        assert await t.get("a") is None and await t.get("d") is None
        assert admin.get(bystander) == b"keep"
    finally:
        admin.delete(bystander)
        await t.close()
