"""Bounded off-loop executor for decode/resize/encode (images, and video in a pool of
its own).

Pillow, hashlib and PyAV release the GIL in their heavy loops, so threads give real
parallelism without copying megabytes between processes. The bound counts jobs
running plus waiting, from submission until the thread is done with the job (a
caller that gives up, e.g. on a client disconnect, does not free its place while the
work still runs or waits to run); past it the request is refused with 503 +
Retry-After rather than letting memory grow with a burst of large inputs.
"""

from __future__ import annotations

import asyncio
import os
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable, TypeVar

from ...core import timing
from ...core.errors import Unavailable

T = TypeVar("T")


class BoundedPool:
    def __init__(self, workers: int = 0, max_queue: int = 64, what: str = "image") -> None:
        self.workers = workers or os.cpu_count() or 1
        self.max_jobs = self.workers + max(0, max_queue)
        self.what = what
        self.jobs = 0
        self._ex = ThreadPoolExecutor(self.workers, thread_name_prefix=f"vlmgw-{what[:5]}")

    def _done(self, _: Future) -> None:
        self.jobs -= 1

    async def run(self, fn: Callable[..., T], *args) -> T:
        if self.jobs >= self.max_jobs:
            raise Unavailable(f"The {self.what} decode queue is full; retry shortly", code=f"{self.what}_queue_full",
                              headers={"retry-after": "1"})
        loop = asyncio.get_running_loop()
        tm = timing.CURRENT.get()
        if tm is not None:  # the request's queue and work time (core/timing.py)
            fn, args = _timed, (fn, time.perf_counter(), *args)
        cf = self._ex.submit(fn, *args)
        self.jobs += 1
        # released when the job ends (or is cancelled before it starts), on the loop's thread
        cf.add_done_callback(lambda f: self._release(loop, f))
        if tm is None:
            return await asyncio.wrap_future(cf)
        out, waited, ran = await asyncio.wrap_future(cf)
        tm.job(waited, ran)
        return out

    def _release(self, loop: asyncio.AbstractEventLoop, f: Future) -> None:
        try:
            loop.call_soon_threadsafe(self._done, f)
        except RuntimeError:  # the loop is closed (shutdown): nobody counts any more
            pass

    def close(self) -> None:
        self._ex.shutdown(wait=False, cancel_futures=True)


def _timed(fn, submitted: float, *args):
    t0 = time.perf_counter()
    out = fn(*args)
    return out, t0 - submitted, time.perf_counter() - t0
