"""The image pool bounds time as well as count: while the oldest job still waiting for a
thread has waited ``max_wait_s``, new jobs get 503 + Retry-After; once the queue moves,
jobs are taken again. In process, on a hand-moved clock (no timing assumptions)."""

from __future__ import annotations

import asyncio
import threading

import pytest

from vlm_gateway.core.errors import Unavailable
from vlm_gateway.stages.images.pool import BoundedPool
from waiting import async_wait_until as until


async def test_a_queue_older_than_max_wait_refuses_new_jobs_until_it_moves():
    now = [100.0]
    pool = BoundedPool(workers=1, max_queue=64, max_wait_s=1.0, clock=lambda: now[0])
    gate = threading.Event()
    running = asyncio.ensure_future(pool.run(gate.wait, 5))
    await until(lambda: not pool.waiting, "the first job holds the only thread")
    queued = [asyncio.ensure_future(pool.run(lambda: "a"))]      # waits from t = 100
    await until(lambda: len(pool.waiting) == 1, "the second job waits")
    now[0] = 100.9                                              # oldest wait 0.9 s < 1 s: taken
    queued.append(asyncio.ensure_future(pool.run(lambda: "b")))
    await until(lambda: len(pool.waiting) == 2, "the third job waits")
    now[0] = 101.0                                              # oldest wait 1.0 s: refused
    with pytest.raises(Unavailable) as e:
        await pool.run(lambda: "c")
    assert e.value.status == 503 and e.value.code == "image_queue_full"
    assert e.value.headers == {"retry-after": "1"} and "1.0 s" in e.value.message
    assert pool.jobs == 3                                       # the refused job took no place
    gate.set()                                                  # the queue moves: all done
    assert await running and await asyncio.gather(*queued) == ["a", "b"]
    await until(lambda: pool.jobs == 0 and not pool.waiting, "every job is released")
    assert await pool.run(lambda: 7) == 7                       # same clock, empty queue: taken
    pool.close()


async def test_without_a_wait_limit_only_the_count_bounds():
    now = [0.0]
    pool = BoundedPool(workers=1, max_queue=2, clock=lambda: now[0])
    gate = threading.Event()
    jobs = [asyncio.ensure_future(pool.run(gate.wait, 5))]
    await until(lambda: not pool.waiting, "the first job runs")
    jobs.append(asyncio.ensure_future(pool.run(lambda: 1)))
    now[0] = 3600.0                                             # waited an hour: still taken
    jobs.append(asyncio.ensure_future(pool.run(lambda: 2)))
    await until(lambda: pool.jobs == 3, "two jobs wait")
    with pytest.raises(Unavailable):                            # the count bound
        await pool.run(lambda: 3)
    gate.set()
    assert (await asyncio.gather(*jobs))[1:] == [1, 2]
    pool.close()


async def test_a_job_cancelled_before_it_starts_stops_counting_as_waiting():
    now = [0.0]
    pool = BoundedPool(workers=1, max_queue=4, max_wait_s=1.0, clock=lambda: now[0])
    gate = threading.Event()
    running = asyncio.ensure_future(pool.run(gate.wait, 5))
    await until(lambda: not pool.waiting, "the first job runs")
    waiting = asyncio.ensure_future(pool.run(lambda: None))
    await until(lambda: len(pool.waiting) == 1, "the second job waits")
    waiting.cancel()                                            # the client went away
    await until(lambda: not pool.waiting and pool.jobs == 1, "the cancelled job left the queue")
    now[0] = 10.0                                               # nothing waits: no age to refuse on
    later = asyncio.ensure_future(pool.run(lambda: "later"))
    gate.set()
    assert await running and await later == "later"
    pool.close()


def test_the_cores_are_shared_among_the_worker_processes():
    from vlm_gateway.config import ImagesConfig, LimitsConfig
    from vlm_gateway.stages.images.inflight import MediaBudget
    from vlm_gateway.stages.images.pool import cores
    from vlm_gateway.stages.images.source import MediaSources

    lim = LimitsConfig()
    for processes in (1, 2, 64):
        src = MediaSources(ImagesConfig(), lim, MediaBudget(lim), processes)
        assert src.pool.workers == max(1, cores() // processes)
        src.pool.close()
    src = MediaSources(ImagesConfig(pool_workers=3), lim, MediaBudget(lim), 64)   # set by hand: as set
    assert src.pool.workers == 3
    src.pool.close()
