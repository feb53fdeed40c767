"""Run the simulator in a background thread of the gateway process (the default
backend when none is configured)."""

from __future__ import annotations

import asyncio
import socket
import threading

from .app import create_sim_app
from .engine import SimEngine, SimProfile
from .serve import make_server

SIM_MODEL = "qwen3vl-sim"


def start_in_thread(profile: SimProfile, port: int | None = None) -> str:
    """Start the simulator on 127.0.0.1 (``port`` 0/None: a free one); returns its base URL
    once it answers. A port that cannot be bound raises ``OSError`` here, in the caller."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(("127.0.0.1", port or 0))
    except OSError:
        sock.close()
        raise
    port = sock.getsockname()[1]
    ready = threading.Event()

    def run() -> None:
        async def main() -> None:
            engine = SimEngine(profile)
            server = make_server(create_sim_app(engine, SIM_MODEL), "127.0.0.1", port)
            server.install_signal_handlers = lambda: None  # the main thread owns signals
            task = asyncio.ensure_future(server.serve(sockets=[sock]))
            while not server.started:
                await asyncio.sleep(0.01)
            ready.set()
            await task

        asyncio.run(main())

    threading.Thread(target=run, name="vlm-gateway-simulator", daemon=True).start()
    if not ready.wait(15):
        raise RuntimeError("the embedded simulator did not start")
    return f"http://127.0.0.1:{port}/v1"
