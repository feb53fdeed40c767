"""Worker processes with a listening socket each (SO_REUSEPORT), under a small supervisor.

One listening socket shared by every worker lets whichever event loop wakes first accept
a burst of connections, and keep-alive pins them there: under load one worker ran at
136-320% CPU while the others idled. With a socket per worker in one SO_REUSEPORT group,
the kernel hashes each new connection (its 4-tuple) to one of the listening sockets, so
connections, and the image work they bring, spread evenly over the workers
(docs/benchmarks/speed.md).

Contract of the supervisor:
- it binds the address first (SO_REUSEPORT, never listening, so no connection is routed
  to it): an address in use fails before any worker starts;
- it starts ``n`` workers (spawned, not forked: no event loop or thread is inherited),
  each its own uvicorn server on its own socket, sharing an array of open connections per
  worker (``rebalance.py``: a worker above its share closes connections after a response);
- a worker that dies is started again in its slot (after 0.5 s, doubling to 10 s while
  it keeps dying within 5 s of its start); its live metrics files are reaped by the next
  scrape (``metrics.reap_dead_workers``);
- SIGTERM/SIGINT stop the workers (each finishes its requests within uvicorn's graceful
  timeout) and then the supervisor;
- with ``pid_dir``, ``gateway.pid`` holds the supervisor's pid and ``worker-<i>.pid`` each
  worker's; they are removed on exit.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import socket
import threading
import time
from pathlib import Path

log = logging.getLogger("vlm_gateway")

RESTART_MIN_S = 0.5
RESTART_MAX_S = 10.0
STABLE_AFTER_S = 5.0


def listening_socket(host: str, port: int, listen: bool = True) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    if listen:
        sock.listen(2048)
        sock.set_inheritable(False)
    return sock


def _worker_main(index: int, uvicorn_kwargs: dict, counts) -> None:
    import uvicorn

    from . import rebalance
    rebalance.install(index, counts)
    sock = listening_socket(uvicorn_kwargs["host"], uvicorn_kwargs["port"])
    config = uvicorn.Config(**uvicorn_kwargs)
    uvicorn.Server(config).run(sockets=[sock])


class Supervisor:
    def __init__(self, n: int, uvicorn_kwargs: dict, pid_dir: str = "") -> None:
        self.n = n
        self.kwargs = uvicorn_kwargs
        self.pid_dir = Path(pid_dir) if pid_dir else None
        self.ctx = multiprocessing.get_context("spawn")
        self.procs: list[multiprocessing.process.BaseProcess | None] = [None] * n
        self.started = [0.0] * n
        self.backoff = [RESTART_MIN_S] * n
        self.stopping = threading.Event()
        # open client connections per worker (rebalance.py): each worker writes its own slot
        self.counts = self.ctx.RawArray("i", n)
        self.hold: socket.socket | None = None

    def bind(self) -> None:
        """Hold the address (bound, never listening); ``OSError`` when it cannot be had."""
        if self.hold is None:
            self.hold = listening_socket(self.kwargs["host"], self.kwargs["port"], listen=False)

    def _pid_file(self, name: str, pid: int | None) -> None:
        if self.pid_dir is None:
            return
        p = self.pid_dir / name
        if pid is None:
            p.unlink(missing_ok=True)
        else:
            p.write_text(f"{pid}\n")

    def _start(self, i: int) -> None:
        self.counts[i] = 0  # a dead worker's connections died with it
        p = self.ctx.Process(target=_worker_main, args=(i, self.kwargs, self.counts),
                             name=f"vlm-gateway-worker-{i}")
        p.start()
        self.procs[i], self.started[i] = p, time.monotonic()
        self._pid_file(f"worker-{i}.pid", p.pid)

    def _stop(self, sig=None, _frame=None) -> None:
        if sig is not None and not self.stopping.is_set():
            log.info("shutting down (%s): stopping %d workers, each finishing its requests in flight",
                     signal.Signals(sig).name, self.n)
        self.stopping.set()

    def run(self) -> int:
        try:
            self.bind()
        except OSError as e:
            log.error("cannot bind %s:%s: %s", self.kwargs["host"], self.kwargs["port"], e.strerror or e)
            return 1
        if self.pid_dir is not None:
            self.pid_dir.mkdir(parents=True, exist_ok=True)
        self._pid_file("gateway.pid", os.getpid())
        signal.signal(signal.SIGTERM, self._stop)
        signal.signal(signal.SIGINT, self._stop)
        try:
            for i in range(self.n):
                self._start(i)
            due = [0.0] * self.n  # when a dead worker's slot is started again
            while not self.stopping.wait(0.2):
                now = time.monotonic()
                for i, p in enumerate(self.procs):
                    if p is not None and not p.is_alive():
                        lived = now - self.started[i]
                        self.backoff[i] = (RESTART_MIN_S if lived > STABLE_AFTER_S
                                           else min(RESTART_MAX_S, self.backoff[i] * 2))
                        log.warning("worker %d (pid %d) exited with %s after %.1f s; starting it again in %.1f s",
                                    i, p.pid, p.exitcode, lived, self.backoff[i])
                        self.procs[i], due[i] = None, now + self.backoff[i]
                    elif p is None and now >= due[i]:
                        self._start(i)
        finally:
            self._shutdown()
            self.hold.close()
        return 0

    def _shutdown(self) -> None:
        live = [p for p in self.procs if p is not None and p.is_alive()]
        for p in live:
            os.kill(p.pid, signal.SIGTERM)
        deadline = time.monotonic() + float(self.kwargs.get("timeout_graceful_shutdown") or 5) + 5
        for p in live:
            p.join(max(0.0, deadline - time.monotonic()))
            if p.is_alive():
                p.kill()
                p.join(2)
        for i in range(self.n):
            self._pid_file(f"worker-{i}.pid", None)
        self._pid_file("gateway.pid", None)
