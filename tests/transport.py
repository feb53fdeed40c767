"""A scripted upstream for in-process tests: the gateway's ``backends/transport.py``
seam, answered by a Python handler instead of an engine behind a socket.

    def handler(backend_name, method, path, body) -> Answer | Exception
    gw = Gateway(cfg, clock=clock, transport=ScriptedTransport.factory(handler))

An ``Answer`` may wait on an event before answering (``hold``), to keep a request in
flight for as long as a test needs; an exception is raised as aiohttp would. A streamed
answer's ``chunks`` may hold, between the bytes, an ``asyncio.Event`` (the body waits for it)
or an exception (the read raises it there: an engine that breaks off mid-answer).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import orjson


class ManualClock:
    """A clock the test moves: ``clock()`` reads it, ``advance(s)`` moves it; ``reads``
    counts the readings, so a test can wait until a loop on the clock has looked again."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start
        self.reads = 0

    def __call__(self) -> float:
        self.reads += 1
        return self.now

    def advance(self, s: float) -> None:
        self.now += s


@dataclass
class Answer:
    status: int = 200
    body: bytes = b""
    content_type: str = "application/json"
    chunks: list | None = None  # a stream, chunk by chunk (bytes, an Event to wait for, an exception)
    hold: asyncio.Event | None = None  # answer only once it is set


def completion(text: str = "ok", model: str = "m") -> Answer:
    return Answer(body=orjson.dumps({
        "id": "c1", "object": "chat.completion", "created": 0, "model": model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}}))


class _Body:
    def __init__(self, chunks: list[bytes]) -> None:
        self._chunks = list(chunks)

    async def read(self, n: int = -1) -> bytes:
        data = b"".join(c for c in self._chunks if isinstance(c, bytes))
        out, rest = (data, b"") if n < 0 else (data[:n], data[n:])
        self._chunks = [rest] if rest else []
        return out

    async def iter_any(self):
        while self._chunks:
            c = self._chunks.pop(0)
            if isinstance(c, BaseException):
                raise c
            if isinstance(c, asyncio.Event):
                await c.wait()
                continue
            yield c

    def at_eof(self) -> bool:
        return not self._chunks


class _Response:
    def __init__(self, a: Answer) -> None:
        self.status = a.status
        self.content_type = a.content_type
        self.content = _Body(a.chunks if a.chunks is not None else [a.body])
        self.content_length = None if a.chunks is not None else len(a.body)
        self.headers = {"content-type": a.content_type}
        self.closed = False

    async def read(self) -> bytes:
        return await self.content.read()

    def close(self) -> None:
        self.closed = True

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc) -> None:
        self.close()


class _Get:
    def __init__(self, coro) -> None:
        self._coro = coro

    async def __aenter__(self):
        self._r = await self._coro
        return self._r

    async def __aexit__(self, *exc) -> None:
        self._r.close()


@dataclass
class ScriptedTransport:
    name: str
    handler: object
    calls: list[tuple[str, str]] = field(default_factory=list)

    @classmethod
    def factory(cls, handler, made: dict | None = None):
        def make(backend, cfg):
            t = cls(backend.name, handler)
            if made is not None:
                made[backend.name] = t
            return t
        return make

    async def _answer(self, method: str, url: str, body: bytes) -> _Response:
        path = urlsplit(url).path
        self.calls.append((method, path))
        a = self.handler(self.name, method, path, body)
        if isinstance(a, BaseException):
            raise a
        if a.hold is not None:
            await a.hold.wait()
        return _Response(a)

    async def post(self, url, *, data=b"", headers=None, timeout=None, allow_redirects=True):
        return await self._answer("POST", url, data)

    def get(self, url, *, timeout=None, allow_redirects=True):
        return _Get(self._answer("GET", url, b""))

    async def close(self) -> None:
        pass
