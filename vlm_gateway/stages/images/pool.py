"""Bounded off-loop executor for decode/resize/encode (images, and video in a pool of
its own).

Pillow, hashlib and PyAV release the GIL in their heavy loops, so threads give real
parallelism without copying megabytes between processes. The bound counts jobs
running plus waiting, from submission until the thread is done with the job (a
caller that gives up, e.g. on a client disconnect, does not free its place while the
work still runs or waits to run); past it the request is refused with 503 +
Retry-After rather than letting memory grow with a burst of large inputs.

A count alone does not bound time: under a load the process's CPU cannot carry (a
steady rate of large images), a queue of 64 jobs per process fills and stays full,
and every request waits its whole length. So a job is also refused while the oldest
job still waiting to start has waited ``max_wait_s`` or more (its sojourn time, as
CoDel reads a queue): a refused client retries later (or elsewhere) at once, instead
of every client waiting ever longer for its first token.

    refuse  when  jobs >= workers + max_queue
            or    max_wait_s > 0  and  now - submitted(oldest job not yet started) >= max_wait_s

A job that starts while cores are idle and no other job waits may use more than its own
thread (``spare.py``: the grant, read by the job with ``spare.granted()``); as soon as
jobs queue, every job gets one, so the pool's throughput under load is what it was.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable, TypeVar

from ...core import timing
from ...core.clock import Clock, monotonic
from ...core.errors import Unavailable
from .spare import Spare, set_granted

T = TypeVar("T")


def cores() -> int:
    """The cores this process may run on (its affinity, e.g. a container's cpuset)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        return os.cpu_count() or 1


class BoundedPool:
    def __init__(self, workers: int = 0, max_queue: int = 64, what: str = "image", max_wait_s: float = 0.0,
                 clock: Clock = monotonic, spare: Spare | None = None) -> None:
        self.workers = workers or os.cpu_count() or 1
        self.max_jobs = self.workers + max(0, max_queue)
        self.max_wait_s = max_wait_s
        self.what = what
        self.clock = clock
        self.spare = spare
        self.jobs = 0
        # jobs submitted and not started yet: seq -> submit time, oldest first (the executor is FIFO)
        self.waiting: dict[int, float] = {}
        self._seq = itertools.count()
        self._ex = ThreadPoolExecutor(self.workers, thread_name_prefix=f"vlmgw-{what[:5]}")

    def oldest_wait_s(self) -> float:
        """How long the oldest job still waiting for a thread has waited (0: none waits)."""
        for t in self.waiting.values():
            return max(0.0, self.clock() - t)
        return 0.0

    async def run(self, fn: Callable[..., T], *args) -> T:
        if self.jobs >= self.max_jobs:
            raise Unavailable(f"The {self.what} decode queue is full; retry shortly", code=f"{self.what}_queue_full",
                              headers={"retry-after": "1"})
        if self.max_wait_s > 0 and self.waiting:
            waited = self.oldest_wait_s()
            if waited >= self.max_wait_s:
                raise Unavailable(f"The {self.what} decode queue is busy (its oldest job has waited {waited:.1f} s, "
                                  f"the limit is {self.max_wait_s:g} s); retry shortly",
                                  code=f"{self.what}_queue_full", headers={"retry-after": "1"})
        loop = asyncio.get_running_loop()
        seq = next(self._seq)
        self.waiting[seq] = self.clock()
        tm = timing.CURRENT.get()
        if tm is not None:  # the request's queue and work time (core/timing.py)
            fn, args = _timed, (fn, time.perf_counter(), *args)
        cf = self._ex.submit(self._started, loop, seq, fn, *args)
        self.jobs += 1
        # released when the job ends (or is cancelled before it starts), on the loop's thread
        cf.add_done_callback(lambda f: self._release(loop, f, seq))
        if tm is None:
            return await asyncio.wrap_future(cf)
        out, waited, ran = await asyncio.wrap_future(cf)
        tm.job(waited, ran)
        return out

    def _started(self, loop: asyncio.AbstractEventLoop, seq: int, fn, *args):
        try:  # no longer waiting: told to the loop's thread, which owns ``waiting``
            loop.call_soon_threadsafe(self.waiting.pop, seq, None)
        except RuntimeError:  # the loop is closed (shutdown)
            pass
        if self.spare is None:
            return fn(*args)
        # read from this thread while the loop's thread updates them: a count off by one
        # for a moment only changes how many threads this job borrows
        others = len(self.waiting) - (seq in self.waiting)
        set_granted(self.spare.grant(self.jobs, others))
        try:
            return fn(*args)
        finally:
            set_granted(1)

    def _release(self, loop: asyncio.AbstractEventLoop, f: Future, seq: int) -> None:
        try:
            loop.call_soon_threadsafe(self._finished, seq)
        except RuntimeError:  # the loop is closed (shutdown): nobody counts any more
            pass

    def _finished(self, seq: int) -> None:
        self.waiting.pop(seq, None)  # cancelled before it started
        self.jobs -= 1

    def close(self) -> None:
        self._ex.shutdown(wait=False, cancel_futures=True)


def _timed(fn, submitted: float, *args):
    t0 = time.perf_counter()
    out = fn(*args)
    return out, t0 - submitted, time.perf_counter() - t0
