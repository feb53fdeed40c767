"""L1 cache of rewritten videos: in-process LRU bounded by bytes, plus an optional
Redis tier shared by replicas (with a TTL). Key = the source's content hash + the
settings key (every setting that changes the output bytes or the counts); value =
``VideoEntry``: the MP4 sent and what the headers, metrics and token rule need.
Redis trouble never fails a request: it only costs a miss.
"""

from __future__ import annotations

import logging
import struct
from dataclasses import asdict, dataclass, fields

import orjson

from ... import metrics, redis_keys
from ...backoff import Backoff
from ...lru import LRU
from ...redis_clients import delete_matching

log = logging.getLogger("vlm_gateway.video")

LEVEL = "l1_video"   # cache level label in metrics and the status page


@dataclass(frozen=True, slots=True)
class VideoEntry:
    """One rewritten video (``data`` is the MP4 sent; ``identity`` its content hash)."""

    data: bytes
    identity: str
    mime: str
    # the source as the engine would read it (OpenCV's frame count and rate)
    src_width: int
    src_height: int
    src_frames: int
    src_rate: str            # a fraction, "30" or "30000/1001"
    src_container: str
    src_codec: str
    decoded_frames: int
    duration_s: float
    # the output: every frame is sampled by the engine (rate <= its fps)
    width: int
    height: int
    frames: int
    rate: str                # a fraction, "1/3"
    states: int              # distinct screen states kept
    plan: str                # groups | frames
    mixed_groups: int        # engine groups pairing two states (frames plan only)
    tokens_before: int       # everything the source would add to the prompt (0 = unknown)
    tokens_after: int        # everything the output adds to the prompt
    cpu_s: float
    wall_s: float

    @property
    def size(self) -> int:
        return len(self.data) + 512


def pack(e: VideoEntry) -> bytes:
    meta = orjson.dumps({k: v for k, v in asdict(e).items() if k != "data"})
    return struct.pack(">I", len(meta)) + meta + e.data


def unpack(blob: bytes) -> VideoEntry:
    (n,) = struct.unpack_from(">I", blob)
    meta = orjson.loads(blob[4:4 + n])
    names = {f.name for f in fields(VideoEntry)} - {"data"}
    if set(meta) != names:
        raise ValueError("an entry of another version: a miss")
    return VideoEntry(data=blob[4 + n:], **meta)


class VideoL1:
    def __init__(self, max_bytes: int, redis_url: str = "", ttl_s: int = 3600, timeout_s: float = 0.05,
                 redis_prefix: str = redis_keys.DEFAULT_PREFIX) -> None:
        self.max_bytes = max_bytes
        self.prefix = redis_keys.namespace(redis_prefix, redis_keys.L1_VIDEOS)
        self.ttl_s = ttl_s
        self._lru: LRU[str, VideoEntry] = LRU(max_bytes=max(1, max_bytes), size=lambda e: e.size)
        self._redis = None
        self.backoff = Backoff("L1 video cache")
        if redis_url:
            from ...redis_clients import async_client
            self._redis = async_client(redis_url, timeout_s)

    def __len__(self) -> int:
        return len(self._lru)

    @property
    def bytes(self) -> int:
        return self._lru.bytes

    def _put_local(self, key: str, e: VideoEntry) -> None:
        self._lru.put(key, e)

    async def get(self, key: str) -> VideoEntry | None:
        metrics.CACHE_LOOKUPS.labels(LEVEL).inc()
        e = self._lru.get(key)
        if e is None and self._redis is not None and self.backoff.up():
            try:
                blob = await self._redis.get(self.prefix + key)
            except Exception as err:  # noqa: BLE001 - a miss, never an error
                self._warn(err)
                blob = None
            if blob:
                try:
                    e = unpack(blob)
                except (ValueError, TypeError, struct.error, orjson.JSONDecodeError):
                    e = None
                if e is not None:
                    self._put_local(key, e)
        if e is not None:
            metrics.CACHE_HITS.labels(LEVEL).inc()
        return e

    async def put(self, key: str, e: VideoEntry) -> None:
        self._put_local(key, e)
        if self._redis is not None and self.backoff.up():
            try:
                await self._redis.set(self.prefix + key, pack(e), ex=self.ttl_s)
            except Exception as err:  # noqa: BLE001
                self._warn(err)

    async def flush(self) -> int:
        """Drop every rewritten video (this process, and the shared Redis tier)."""
        n = self._lru.clear()
        if self._redis is not None:
            try:
                n += await delete_matching(self._redis, self.prefix + "*")
            except Exception as err:  # noqa: BLE001 - the local tier is flushed regardless
                self._warn(err)
        return n

    def _warn(self, err: Exception) -> None:
        self.backoff.failed(err, "using the in-process tier only")

    async def close(self) -> None:
        if self._redis is not None:
            await self._redis.aclose()
