"""Redis clients for the hot path, with a bounded pool.

Every lookup (caches, rate limits, L1 images) has a short timeout; the pool is
bounded too, so a burst waits at most that timeout for a connection (then counts
as a Redis failure and degrades like one) instead of opening sockets without end.
"""

from __future__ import annotations

from typing import Any

MAX_CONNECTIONS = 64


def async_client(url: str, timeout_s: float, max_connections: int = MAX_CONNECTIONS, **kw: Any):
    import redis.asyncio as aredis
    pool = aredis.BlockingConnectionPool.from_url(url, max_connections=max_connections, timeout=timeout_s,
                                                  socket_timeout=timeout_s, socket_connect_timeout=timeout_s,
                                                  **kw)
    return aredis.Redis(connection_pool=pool)
