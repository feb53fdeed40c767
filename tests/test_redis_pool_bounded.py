"""Hot-path Redis clients hold at most a bounded number of connections: a burst of
concurrent lookups waits for a pooled connection instead of opening one each."""

from __future__ import annotations

import asyncio
import uuid

import redis

from vlm_gateway.redis_clients import MAX_CONNECTIONS, async_client

URL = "redis://127.0.0.1:6379/0"


async def test_burst_of_lookups_stays_within_the_pool():
    name = "vlmgw-pool-" + uuid.uuid4().hex[:8]
    client = async_client(URL, timeout_s=2.0, client_name=name)
    admin = redis.Redis.from_url(URL)
    try:
        async def lookup(i: int):
            # a slow-ish server-side call keeps connections busy, so the burst overlaps
            return await client.eval("local t = redis.call('TIME') return 1", 0)

        peak = 0

        async def watch():
            nonlocal peak
            for _ in range(50):
                peak = max(peak, sum(1 for c in admin.client_list() if c.get("name") == name))
                await asyncio.sleep(0.005)

        results = await asyncio.gather(*(lookup(i) for i in range(5 * MAX_CONNECTIONS)), watch())
        assert results[:-1] == [1] * (5 * MAX_CONNECTIONS)
        assert 0 < peak <= MAX_CONNECTIONS
        assert sum(1 for c in admin.client_list() if c.get("name") == name) <= MAX_CONNECTIONS
    finally:
        await client.aclose()
        admin.close()
