"""Work that grows with a request's text, off the event loop: one thread per process.

Mapping the coordinates of a long text (a conversation's history, an answer, a large read
of a stream) and assembling a long stream for the response cache are pure Python under the
GIL: more threads would add no throughput, but one keeps the event loop free to serve every
other request while such work runs (the interpreter hands the loop the GIL every
``sys.getswitchinterval()``, 5 ms). Callers send only work that would hold the loop for more
than a couple of milliseconds (``stages/grounding/text.heavy``, streams of more than
``relay.ASSEMBLE_INLINE`` chunks): a hop costs ~0.3 ms of CPU and ~1 ms of latency.

Bounded: a request holds at most one job at a time and each job is bounded by the limits of
what it works on (``images.max_coordinate_groups``, ``upstream.max_response_bytes``). A job
submitted with ``refusable`` while ``MAX_WAITING`` jobs are queued is refused (503
``text_work_busy``, Retry-After), so a flood of large conversations cannot queue work in front
of the answers being relayed, which are never refused (their engine already did the work).
"""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, TypeVar

from .core.errors import Unavailable

T = TypeVar("T")

MAX_WAITING = 32

_lock = threading.Lock()
_executor: ThreadPoolExecutor | None = None
_jobs = 0  # submitted and not finished


def jobs() -> int:
    """Jobs submitted and not finished yet (running included)."""
    return _jobs


def _pool() -> ThreadPoolExecutor:
    global _executor
    if _executor is None:
        with _lock:
            if _executor is None:
                _executor = ThreadPoolExecutor(1, thread_name_prefix="vlmgw-text")
    return _executor


def _done(_f) -> None:
    global _jobs
    with _lock:
        _jobs -= 1


async def run(fn: Callable[..., T], *args, refusable: bool = False) -> T:
    """``fn(*args)`` on the text thread. A caller that is cancelled stops waiting: a job not
    started yet is dropped, a running one runs to its end (it touches only its request's objects)."""
    global _jobs
    with _lock:
        if refusable and _jobs > MAX_WAITING:
            raise Unavailable("The gateway is busy with long texts (coordinate mapping); retry shortly",
                              code="text_work_busy", headers={"retry-after": "1"})
        _jobs += 1
    try:
        cf = _pool().submit(fn, *args)
    except BaseException:
        _done(None)
        raise
    cf.add_done_callback(_done)
    return await asyncio.wrap_future(cf)
