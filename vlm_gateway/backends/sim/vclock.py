"""Run asyncio code on a virtual clock: sleeps take no wall time, the loop's
clock jumps to the next timer. Used to run the simulator's engine offline (the
calibration fit evaluates hundreds of parameter sets in seconds). Only for code
that does no real I/O."""

from __future__ import annotations

import asyncio


def run_virtual(coro):
    loop = asyncio.new_event_loop()
    now = [0.0]
    loop.time = lambda: now[0]           # type: ignore[method-assign]
    selector = loop._selector            # type: ignore[attr-defined]
    real_select = selector.select

    def select(timeout=None):
        if timeout is None:
            raise RuntimeError("virtual clock: nothing scheduled and nothing ready (deadlock)")
        if timeout > 0:
            now[0] += timeout
        return real_select(0)

    selector.select = select
    try:
        return loop.run_until_complete(coro)
    finally:
        loop.close()
