"""Bounded off-loop executor for decode/resize/encode.

Pillow and hashlib release the GIL in their heavy loops, so threads give real
parallelism without copying megabytes between processes. The bound counts jobs
running plus waiting; past it the request is refused with 503 + Retry-After
rather than letting memory grow with a burst of large images.
"""

from __future__ import annotations

import asyncio
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, TypeVar

from ...proxy.errors import Unavailable

T = TypeVar("T")


class BoundedPool:
    def __init__(self, workers: int = 0, max_queue: int = 64) -> None:
        self.workers = workers or os.cpu_count() or 1
        self.max_jobs = self.workers + max(0, max_queue)
        self.jobs = 0
        self._ex = ThreadPoolExecutor(self.workers, thread_name_prefix="vlmgw-img")

    async def run(self, fn: Callable[..., T], *args) -> T:
        if self.jobs >= self.max_jobs:
            raise Unavailable("The image decode queue is full; retry shortly", code="image_queue_full",
                              headers={"retry-after": "1"})
        self.jobs += 1
        try:
            return await asyncio.get_running_loop().run_in_executor(self._ex, fn, *args)
        finally:
            self.jobs -= 1

    def close(self) -> None:
        self._ex.shutdown(wait=False, cancel_futures=True)
