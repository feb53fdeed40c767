"""Redis clients for the hot path: one Redis server or a Redis Cluster, bounded.

``async_client(url, ...)`` returns a ``Client`` that is a plain
``redis.asyncio.Redis`` or a ``redis.asyncio.cluster.RedisCluster``, chosen on
first use from what the server at ``url`` says (``INFO cluster``:
``cluster_enabled:1``), so the URL may name any node of a cluster. The answer is
remembered per URL; a server that cannot be reached yet fails that call (the
caller counts it as a miss or falls back) and is asked again on the next.

Bounds. Every call has a short timeout. One server: a blocking pool of
``max_connections``, so a burst waits at most that timeout for a connection (then
counts as a Redis failure) instead of opening sockets without end. A cluster:
redis-py opens at most ``max_connections`` per node and fails a call beyond that
at once, so the client lets at most ``max_connections`` commands run at a time
(across nodes) and a burst waits for a turn; waiting and running together take at
most the timeout.

Cluster rules the callers keep: every multi-key command and every Lua script
names keys of one hash slot (rate-limit keys share the ``{tenant}`` tag), and a
flush deletes per primary (``delete_matching``). A failover (a replica promoted)
shows as failed or late commands for the slots of the dead primary until the
cluster has promoted its replica; after a failed or late command the client
re-reads the slot map (redis-py on a refused connection, and ``Client`` in the
background at most once per ``REFRESH_S``, which also finds the promotion when
the dead primary never refuses) and the slots are served again.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from typing import Any, AsyncIterator

MAX_CONNECTIONS = 64
# After a failed detection, wait this long before asking the server again.
DETECT_RETRY_S = 0.5
# Cluster mode: re-read the slot map at most this often after failed commands.
REFRESH_S = 1.0

# url -> True (cluster) / False (one server); what a server said once does not change.
_MODE: dict[str, bool] = {}


async def detect_cluster(url: str, timeout_s: float) -> bool:
    """Whether the server at ``url`` runs in cluster mode (``INFO cluster``)."""
    known = _MODE.get(url)
    if known is not None:
        return known
    import redis.asyncio as aredis
    probe = aredis.Redis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s,
                                  single_connection_client=True)
    try:
        info = await probe.info("cluster")
    finally:
        await probe.aclose()
    _MODE[url] = bool(int(info.get("cluster_enabled", 0) or 0))
    return _MODE[url]


def _cluster(url: str, timeout_s: float, max_connections: int, kw: dict):
    from redis.asyncio.cluster import RedisCluster
    from redis.asyncio.retry import Retry
    from redis.backoff import NoBackoff
    kw = dict(kw)
    kw.pop("health_check_interval", None)  # the cluster client takes it, but it is moot with short timeouts
    kw.pop("single_connection_client", None)
    # One retry after a connection error: the client re-reads the slot map first,
    # which is what finds a promoted replica; Client bounds the whole by timeout_s.
    retry = kw.pop("retry", None) or Retry(NoBackoff(), 1)
    # The read timeout is long on purpose: redis-py takes a read timeout for a node
    # failure and re-reads the whole slot map and drops the node's idle connections,
    # which under CPU saturation (replies late, not lost) served a seventh of the
    # commands one server's client did (a starved event loop). A slow reply is cut off by
    # Client's own timeout instead, which costs one connection and no refresh.
    return RedisCluster.from_url(url, max_connections=max_connections, socket_timeout=max(1.0, 10 * timeout_s),
                                 socket_connect_timeout=timeout_s, retry=retry,
                                 # a slot whose primary is down fails alone: the others keep serving
                                 require_full_coverage=False, **kw)


def _single(url: str, timeout_s: float, max_connections: int, kw: dict):
    import redis.asyncio as aredis
    pool = aredis.BlockingConnectionPool.from_url(url, max_connections=max_connections, timeout=timeout_s,
                                                  socket_timeout=timeout_s, socket_connect_timeout=timeout_s,
                                                  **kw)
    return aredis.Redis(connection_pool=pool)


class Client:
    """A Redis or Redis Cluster client, made on first use (see the module docstring).

    Any command of redis-py's async clients can be called on it; ``register_script``,
    ``scan_iter`` and ``pipeline`` work before the first call too."""

    def __init__(self, url: str, timeout_s: float, max_connections: int, kw: dict) -> None:
        self.url = url
        self.timeout_s = timeout_s
        self.max_connections = max_connections
        self._kw = kw
        self._client: Any = None
        self._making: asyncio.Task | None = None
        self._retry_at = 0.0
        self._closed = False
        self._gate: asyncio.Semaphore | None = None  # cluster mode: commands in flight
        self._refresh_at = 0.0
        self._refresh: asyncio.Task | None = None
        try:
            # made at startup (the gateway builds its clients in the app's lifespan): the
            # first lookup does not wait for the detection, which can take longer than
            # a lookup's budget
            self._start_making()
        except RuntimeError:  # no running loop: made on first use
            pass

    @property
    def cluster(self) -> bool | None:
        """True for a cluster, False for one server, None before the first call."""
        return _MODE.get(self.url) if self._client is not None else None

    async def resolve(self):
        """The underlying redis-py client (detecting the mode first if needed)."""
        if self._client is not None:
            return self._client
        if time.monotonic() < self._retry_at:
            import redis.exceptions as rexc
            raise rexc.ConnectionError(f"Redis at {_redact(self.url)} not reached yet")
        if self._making is None or self._making.done():
            self._start_making()
        # shielded: a caller whose lookup budget runs out does not abort the detection
        # (it may take longer than one lookup's budget; it happens once)
        return await asyncio.shield(self._making)

    def _start_making(self) -> None:
        self._making = asyncio.get_running_loop().create_task(self._make())
        # its failure is every waiting caller's; never an unretrieved-exception warning
        self._making.add_done_callback(lambda t: t.cancelled() or t.exception())

    async def _make(self):
        try:
            is_cluster = await detect_cluster(self.url, max(self.timeout_s, 1.0))
            if is_cluster:
                c = _cluster(self.url, self.timeout_s, self.max_connections, self._kw)
                # read the slot map once, here: commands racing a lazy first
                # initialisation see their connections closed under them
                await c.initialize()
                await _warm(c.ping(target_nodes=c.PRIMARIES))
                self._gate = asyncio.Semaphore(self.max_connections)
                self._client = c
            else:
                c = _single(self.url, self.timeout_s, self.max_connections, self._kw)
                await _warm(c.ping())
                self._client = c
        except Exception as e:
            self._retry_at = time.monotonic() + DETECT_RETRY_S
            from redis.exceptions import ConnectionError as RedisConnectionError
            from redis.exceptions import RedisClusterException
            if isinstance(e, RedisClusterException):   # no node reachable: a Redis failure
                raise RedisConnectionError(str(e)) from e
            raise
        return self._client

    def __getattr__(self, name: str):
        if name.startswith("_"):
            raise AttributeError(name)
        c = self.__dict__.get("_client")
        if c is not None:
            attr = getattr(c, name)
            if self._gate is None or not callable(attr):
                return attr

            def gated(*args: Any, **kwargs: Any):
                r = attr(*args, **kwargs)
                return self._gated(r) if inspect.isawaitable(r) else r
            return gated

        async def call(*args: Any, **kwargs: Any):
            await self.resolve()
            return await getattr(self, name)(*args, **kwargs)
        call.__name__ = name
        return call

    async def _gated(self, aw):
        """One command in cluster mode: wait for a turn and run it, all within the timeout."""
        acquired = False
        try:
            async with asyncio.timeout(self.timeout_s):
                await self._gate.acquire()
                acquired = True
                return await aw
        except Exception as e:
            self._refresh_soon()
            from redis.exceptions import ConnectionError as RedisConnectionError
            from redis.exceptions import RedisClusterException
            if isinstance(e, RedisClusterException):
                # no slot map yet, no node for a slot: not a RedisError in redis-py, but a
                # Redis failure to every caller (a miss, or in-process rate limits)
                raise RedisConnectionError(str(e)) from e
            raise
        finally:
            if acquired:
                self._gate.release()
            elif inspect.iscoroutine(aw):
                aw.close()  # never started

    def _refresh_soon(self) -> None:
        """After a failed or late command, re-read the slot map in the background, at
        most once per ``REFRESH_S``: a primary that stopped answering without refusing
        (a dead host) is otherwise never found replaced."""
        now = time.monotonic()
        if now < self._refresh_at or self._client is None:
            return
        self._refresh_at = now + REFRESH_S

        async def refresh() -> None:
            try:
                await self._client.nodes_manager.initialize()
            except Exception:  # noqa: BLE001 - the next failure tries again
                pass
        self._refresh = asyncio.get_running_loop().create_task(refresh())

    def register_script(self, script: str) -> "_Script":
        return _Script(self, script)

    async def scan_iter(self, match: str | None = None, count: int | None = None, **kw: Any) -> AsyncIterator:
        c = await self.resolve()
        async for k in c.scan_iter(match=match, count=count, **kw):
            yield k

    def pipeline(self, transaction: bool = True):
        return _Pipeline(self, transaction)

    async def aclose(self) -> None:
        self._closed = True
        for t in (self._refresh, self._making):
            if t is not None and not t.done():
                t.cancel()
        if self._client is not None:
            await self._client.aclose()


class _Script:
    """``register_script`` before the mode is known: registered on first call."""

    def __init__(self, owner: Client, script: str) -> None:
        self.owner = owner
        self.script = script
        self._real = None

    async def __call__(self, keys=(), args=(), client=None):
        if self._real is None:
            self._real = (await self.owner.resolve()).register_script(self.script)
        if self.owner._gate is None:
            return await self._real(keys=keys, args=args)
        return await self.owner._gated(self._real(keys=keys, args=args))


class _Pipeline:
    """``async with client.pipeline(...) as p``: the real pipeline once resolved."""

    def __init__(self, owner: Client, transaction: bool) -> None:
        self.owner = owner
        self.transaction = transaction
        self._p = None

    async def __aenter__(self):
        c = await self.owner.resolve()
        # a cluster pipeline spans slots only without a transaction
        self._p = c.pipeline(transaction=False if self.owner.cluster else self.transaction)
        return await self._p.__aenter__()

    async def __aexit__(self, *exc):
        return await self._p.__aexit__(*exc)


async def delete_matching(client: Client, pattern: str, batch: int = 500) -> int:
    """Delete every key matching ``pattern`` with SCAN (never KEYS: Redis stays
    responsive), on every primary of a cluster; the number deleted."""
    c = await client.resolve()
    nodes = c.get_primaries() if client.cluster else [None]
    n = 0
    for node in nodes:
        extra = {"target_nodes": node} if node is not None else {}
        keys: list = []
        async for k in c.scan_iter(match=pattern, count=1000, **extra):
            keys.append(k)
            if len(keys) >= batch:
                n += int(await c.delete(*keys))  # a cluster client sends one DEL per slot
                keys = []
        if keys:
            n += int(await c.delete(*keys))  # a cluster client sends one DEL per slot
    return n


async def _warm(ping) -> None:
    """Open a first connection (to every primary of a cluster) before the first lookup,
    whose budget a cold connection's handshake may take on a busy machine."""
    try:
        await asyncio.wait_for(ping, 2.0)
    except Exception:  # noqa: BLE001 - a lookup connects itself then
        pass


def _redact(url: str) -> str:
    """The URL without a password (never in logs)."""
    if "@" in url:
        scheme, _, rest = url.partition("://")
        return f"{scheme}://***@{rest.split('@', 1)[1]}"
    return url


def async_client(url: str, timeout_s: float, max_connections: int = MAX_CONNECTIONS, **kw: Any) -> Client:
    """A bounded client for ``url``: one server or a cluster, detected on first use."""
    return Client(url, timeout_s, max_connections, kw)
