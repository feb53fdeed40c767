"""Serving the simulator with uvicorn, plus the one fault an ASGI app cannot do
on its own: refusing connections (the listening socket is closed for a while,
open connections are cut, then it listens again on the same port)."""

from __future__ import annotations

import asyncio
import logging

import uvicorn

log = logging.getLogger("vlm_gateway.sim")


class ListenControl:
    """Closes and reopens a uvicorn server's listening sockets."""

    def __init__(self, server: uvicorn.Server) -> None:
        self.server = server
        self.refusing = False

    async def refuse_for(self, seconds: float) -> None:
        if self.refusing:
            return
        self.refusing = True
        loop = asyncio.get_running_loop()
        old = list(self.server.servers)
        config = self.server.config
        for srv in old:
            srv.close()
        await asyncio.sleep(0.05)          # let the /sim/faults answer leave first
        for conn in list(self.server.server_state.connections):
            transport = getattr(conn, "transport", None)
            if transport is not None:
                transport.abort()
        log.warning("simulator fault: refusing connections for %.2f s", seconds)
        await asyncio.sleep(seconds)

        def factory(_loop=None):           # what uvicorn's Server.startup builds
            return config.http_protocol_class(config=config, server_state=self.server.server_state,
                                              app_state=self.server.lifespan.state, _loop=_loop)

        new = [await loop.create_server(factory, host=config.host, port=config.port, reuse_address=True,
                                        backlog=config.backlog)]
        self.server.servers = new
        self.refusing = False
        log.warning("simulator fault: listening again")


def make_server(app, host: str, port: int, **kw) -> uvicorn.Server:
    config = uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False, lifespan="off", **kw)
    server = uvicorn.Server(config)
    app.state.listen_control = ListenControl(server)
    return server


def serve(app, host: str, port: int) -> None:
    """Run until interrupted (the ``vlm-gateway sim`` command)."""
    try:
        import uvloop  # noqa: F401
        kw = {"loop": "uvloop", "http": "httptools"}
    except ImportError:
        kw = {}
    make_server(app, host, port, **kw).run()
