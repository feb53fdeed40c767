"""vlm_gateway/backoff.py: the one Redis back-off (skip for retry_s after a failure,
one warning per outage), on a hand-moved clock; and every Redis tier uses it."""

import asyncio
import logging

import pytest

from vlm_gateway.backoff import Backoff
from vlm_gateway.stages.cache.store import TieredStore
from vlm_gateway.stages.images.l1 import L1Cache
from vlm_gateway.stages.ratelimit.buckets import RedisStore as BucketStore
from vlm_gateway.stages.video.l1 import VideoL1

from transport import ManualClock


def test_skipped_for_retry_s_after_a_failure_with_one_warning_per_outage(caplog):
    clock = ManualClock()
    b = Backoff("L9 cache", retry_s=2.0, clock=clock)
    assert b.up()
    with caplog.at_level(logging.WARNING, "vlm_gateway.redis"):
        b.failed(ConnectionError())
        assert not b.up()
        b.failed(TimeoutError())          # still down: counted, not logged again
        clock.advance(1.99)
        assert not b.up()
        clock.advance(0.01)
        assert b.up()
        b.failed(ConnectionError())       # a new outage: logged again
        clock.advance(2.0)
        b.succeeded()                     # its end: said once
        b.succeeded()
    assert b.failures == 3
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 3 and all(m.startswith("L9 cache: Redis failed") for m in lines[:2])
    assert lines[2] == "L9 cache: Redis answers again"


def test_every_redis_tier_has_the_back_off():
    url = "redis://127.0.0.1:9/0"   # never connected here
    assert isinstance(L1Cache(1 << 20, url).backoff, Backoff)
    assert isinstance(VideoL1(1 << 20, url).backoff, Backoff)
    assert isinstance(TieredStore(1 << 20, 60, 1 << 20, url).backoff, Backoff)
    assert isinstance(BucketStore(url).backoff, Backoff)


@pytest.mark.parametrize("error", [ConnectionError("refused"),
                                   AttributeError("'NoneType' object has no attribute 'writelines'"),
                                   TypeError("'NoneType' object is not callable")])
def test_a_rate_limit_call_that_fails_inside_the_redis_client_falls_back_to_local_limits(error):
    """A connection torn down under a command makes redis-py raise AttributeError or
    TypeError from its own code: to the rate limiter that is Redis failing (in-process limits
    and the back-off), never a 500."""
    from vlm_gateway.stages.ratelimit.buckets import Check, RedisUnavailable

    store = BucketStore("redis://127.0.0.1:9/0")

    async def broken(keys=(), args=()):
        raise error

    store._take = broken  # the registered script, as the client raised it
    with pytest.raises(RedisUnavailable):
        asyncio.run(store.take([Check("k", 10.0, 1.0, 1.0)]))
    assert not store.up and store.backoff.failures == 1
