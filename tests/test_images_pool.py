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


def _stat(path, cpus: dict[int, tuple[int, int]]) -> None:
    """A /proc/stat with per-CPU (busy, idle) jiffies."""
    lines = ["cpu  0 0 0 0 0 0 0 0 0 0"]
    for i, (busy, idle) in sorted(cpus.items()):
        lines.append(f"cpu{i} {busy} 0 0 {idle} 0 0 0 0 0 0")
    path.write_text("\n".join(lines) + "\nintr 0\n")


def test_idle_cores_are_read_over_a_window_of_proc_stat(tmp_path, monkeypatch):
    from vlm_gateway.stages.images import spare
    monkeypatch.setattr(spare, "_affinity", lambda: {0, 1, 2, 3})
    stat, now = tmp_path / "stat", [0.0]
    _stat(stat, {i: (100, 100) for i in range(6)})              # cpu4, cpu5: not this process's
    idle = spare.IdleCores(str(stat), clock=lambda: now[0])
    assert idle.now() == 0.0                                      # no window yet
    _stat(stat, {0: (200, 100), 1: (150, 150), 2: (100, 200), 3: (100, 200), 4: (100, 900), 5: (100, 900)})
    assert idle.now() == 0.0                                      # within WINDOW_S: the last reading
    now[0] = 1.0
    assert idle.now() == pytest.approx(4 * 250 / 400)             # 2.5 of the 4 cores were idle
    _stat(stat, {0: (200, 100), 1: (150, 150), 2: (100, 200), 3: (100, 201), 4: (0, 0), 5: (0, 0)})
    now[0] = 2.0
    assert idle.now() == pytest.approx(2.5)                       # one jiffy in all: too short, kept
    spare.set_granted(1)


def test_a_job_gets_threads_only_from_idle_cores_and_none_while_jobs_queue():
    from vlm_gateway.stages.images.spare import Spare

    class Idle:
        def __init__(self, v):
            self.v = v

        def now(self):
            return self.v
    s = Spare(4, Idle(15.0))
    assert s.grant(jobs=1, waiting=0) == 4                        # alone on an idle machine: the limit
    assert s.grant(jobs=5, waiting=0) == 3                        # 15 idle cores over 5 jobs
    assert s.grant(jobs=2, waiting=1) == 1                        # a job waits: the pool is busy
    assert Spare(4, Idle(0.7)).grant(1, 0) == 1                   # the machine is busy
    assert Spare(1, Idle(15.0)).grant(1, 0) == 1                  # images.max_threads_per_image: 1


async def test_the_pool_tells_each_job_its_grant_and_one_when_jobs_wait():
    from vlm_gateway.stages.images.spare import Spare, granted

    class Idle:
        def now(self):
            return 8.0
    pool = BoundedPool(workers=1, max_queue=8, spare=Spare(4, Idle()))
    assert await pool.run(granted) == 4                           # alone: the limit
    gate = threading.Event()
    first = asyncio.ensure_future(pool.run(lambda: (gate.wait(5), granted())[1]))
    await until(lambda: not pool.waiting and pool.jobs == 1, "the first job runs")
    second = asyncio.ensure_future(pool.run(granted))
    third = asyncio.ensure_future(pool.run(granted))
    await until(lambda: len(pool.waiting) == 2, "two jobs wait")
    gate.set()
    assert await first == 4
    assert await second == 1                                      # started while the third still waited
    assert await third in (1, 4)                                  # last: the queue may have emptied
    assert granted() == 1                                         # outside a job
    pool.close()
