"""Small hostile or broken backends for tests: an aiohttp server in a thread of the
test process, on a loopback port, that behaves like an OpenAI-compatible engine
(``/health``, ``/v1/models``) and answers the completion routes with whatever the
test's handler does. No tests here."""

from __future__ import annotations

import asyncio
import threading
from typing import Awaitable, Callable

from aiohttp import web

from conftest import SIM_MODEL, free_port

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class HostileBackend:
    def __init__(self, handler: Handler, health_status: int = 200, model: str = SIM_MODEL,
                 health_location: str = "", models_handler: Handler | None = None) -> None:
        self.handler = handler
        self.models_handler = models_handler  # replaces the /v1/models answer
        self.health_status = health_status
        self.health_location = health_location  # with a 3xx health_status: where /health redirects
        self.model = model
        self.port = free_port()
        self.hits = 0            # completion requests received
        self.bytes_written = 0   # body bytes a streaming handler managed to write (handlers update it)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def _run(self) -> None:
        self._loop = asyncio.new_event_loop()
        asyncio.set_event_loop(self._loop)

        async def health(request):
            headers = {"location": self.health_location} if self.health_location else None
            return web.Response(status=self.health_status, text="", headers=headers)

        async def models(request):
            if self.models_handler is not None:
                return await self.models_handler(request)
            return web.json_response({"object": "list", "data": [{"id": self.model, "object": "model"}]})

        async def completion(request):
            self.hits += 1
            return await self.handler(request)

        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_get("/health", health)
        app.router.add_get("/v1/models", models)
        app.router.add_post("/v1/chat/completions", completion)
        app.router.add_post("/v1/completions", completion)

        async def start():
            # handlers still running at stop() (a stalled answer) are cut after a second
            self._runner = web.AppRunner(app, shutdown_timeout=1.0)
            await self._runner.setup()
            await web.TCPSite(self._runner, "127.0.0.1", self.port).start()
            self._ready.set()

        self._loop.run_until_complete(start())
        self._loop.run_forever()

    def start(self) -> "HostileBackend":
        self._thread.start()
        assert self._ready.wait(10), "hostile backend did not start"
        return self

    def stop(self) -> None:
        if self._loop is None:
            return

        async def down():
            if self._runner is not None:
                await self._runner.cleanup()
        asyncio.run_coroutine_threadsafe(down(), self._loop).result(20)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
