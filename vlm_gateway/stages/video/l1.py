"""L1 cache of rewritten videos: one ``Tier`` (``tier.py``: in-process LRU bounded
by bytes, plus an optional Redis tier shared by replicas, with a TTL). Key = the
source's content hash + the settings key (every setting that changes the output
bytes or the counts); value = ``VideoEntry``: the MP4 sent and what the headers,
metrics and token rule need. Redis trouble never fails a request: it only costs a miss.
"""

from __future__ import annotations

import logging
import struct
from dataclasses import asdict, dataclass, fields

import orjson

from ... import metrics, redis_keys
from ...tier import Codec, Tier

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


CODEC: Codec[VideoEntry] = Codec(pack, unpack)


class VideoL1:
    """The rewritten-video ``Tier`` (``tier.py``), counted under the ``l1_video`` level."""

    def __init__(self, max_bytes: int, redis_url: str = "", ttl_s: int = 3600, timeout_s: float = 0.05,
                 redis_prefix: str = redis_keys.DEFAULT_PREFIX) -> None:
        self.max_bytes = max_bytes
        self.tier: Tier[VideoEntry] = Tier("L1 video cache", CODEC, max_bytes, lambda e: e.size,
                                           redis_url=redis_url,
                                           prefix=redis_keys.namespace(redis_prefix, redis_keys.L1_VIDEOS),
                                           ttl_s=ttl_s, timeout_s=timeout_s)
        self.backoff = self.tier.backoff
        self._get_local = self.tier.local.get   # bound once: the hit path is one call
        self._lookups = metrics.CACHE_LOOKUPS.labels(LEVEL)
        self._hits = metrics.CACHE_HITS.labels(LEVEL)

    def __len__(self) -> int:
        return len(self.tier)

    @property
    def bytes(self) -> int:
        return self.tier.bytes

    async def get(self, key: str) -> VideoEntry | None:
        self._lookups.inc()
        e = self._get_local(key)
        if e is None:  # the local half inline: a hit costs no coroutine
            e = await self.tier.get_shared(key)
        if e is not None:
            self._hits.inc()
        return e

    async def put(self, key: str, e: VideoEntry) -> None:
        await self.tier.put(key, e)

    async def flush(self) -> int:
        """Drop every rewritten video (this process, and the shared Redis tier)."""
        return await self.tier.flush()

    async def close(self) -> None:
        await self.tier.close()
