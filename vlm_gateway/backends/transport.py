"""The seam between the gateway and an engine's HTTP API (httpx's transports are the
model). A backend talks to its engine only through ``Backend.session``, an object
of this shape: an ``aiohttp.ClientSession`` in production, a scripted transport in
the in-process tests (tests/transport.py), so retry, breaker and queue logic can be
driven without processes, sockets or sleeps.

    await session.post(url, data=, headers=, timeout=, allow_redirects=) -> Response
    async with session.get(url, timeout=, allow_redirects=) as response: ...
    await session.close()

Failures are raised as aiohttp's exceptions (``ClientConnectionError``,
``ConnectionTimeoutError``, ...) or ``asyncio.TimeoutError``, as aiohttp raises them.
"""

from __future__ import annotations

from typing import Any, AsyncContextManager, AsyncIterator, Awaitable, Callable, Protocol

from ..config import UpstreamConfig


class Body(Protocol):
    async def read(self, n: int = -1) -> bytes: ...
    def iter_any(self) -> AsyncIterator[bytes]: ...
    def at_eof(self) -> bool: ...


class Response(Protocol):
    status: int
    content_type: str
    content_length: int | None
    content: Body
    headers: Any  # a case-insensitive str -> str mapping

    async def read(self) -> bytes: ...
    def close(self) -> None: ...


class Transport(Protocol):
    def post(self, url: str, *, data: bytes, headers: dict[str, str], timeout: Any,
             allow_redirects: bool) -> Awaitable[Response]: ...
    def get(self, url: str, *, timeout: Any, allow_redirects: bool) -> AsyncContextManager[Response]: ...
    async def close(self) -> None: ...


# (backend, upstream config) -> the transport it sends through
TransportFactory = Callable[[Any, UpstreamConfig], Transport]
