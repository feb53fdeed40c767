"""Waiting on a condition, never on the clock: a test that must let something happen
(a burst queued, a stream started, a scrape taken, a back-off over) polls for the thing
itself until it holds or a deadline passes.

    poll(fn, timeout)                        -> fn's last value (truthy once it held, else falsy)
    wait_until(fn, what, timeout)            -> fn's truthy value, or AssertionError naming ``what``
    await async_wait_until(fn, what, timeout) the same inside a test's event loop: other tasks
                                             run between polls; ``fn`` may return an awaitable

``what`` says what should have happened ("every stream is in flight"), so a timeout reads
as the failure it is. ``every`` is the polling interval: how late a holding condition may
be seen, never how long anything is given to happen.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from typing import Any, Callable

EVERY_S = 0.05


def poll(fn: Callable[[], Any], timeout: float = 5.0, every: float = EVERY_S) -> Any:
    """Call ``fn`` until it returns something truthy or ``timeout`` passes; its last value."""
    deadline = time.monotonic() + timeout
    while True:
        v = fn()
        if v or time.monotonic() > deadline:
            return v
        time.sleep(every)


def wait_until(fn: Callable[[], Any], what: str, timeout: float = 10.0, every: float = EVERY_S) -> Any:
    """``fn``'s first truthy value; AssertionError naming ``what`` after ``timeout`` s."""
    v = poll(fn, timeout, every)
    if not v:
        raise AssertionError(f"not within {timeout:g} s: {what} (last value {v!r})")
    return v


async def async_wait_until(fn: Callable[[], Any], what: str, timeout: float = 10.0,
                           every: float = EVERY_S) -> Any:
    """``wait_until`` for async tests: sleeps on the loop between polls, so the tasks the
    condition waits for keep running; ``fn`` may be a coroutine function."""
    deadline = time.monotonic() + timeout
    while True:
        v = fn()
        if inspect.isawaitable(v):
            v = await v
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout:g} s: {what} (last value {v!r})")
        await asyncio.sleep(every)
