"""static: a fixed list of targets, published once; ``set`` publishes a new list.

The static ``backends`` section is this source's shape, built into the pool at start; the
class is also the in-process seam through which tests (and tools) push membership changes
to a ``Reconciler`` without DNS or an API server.
"""

from __future__ import annotations

import asyncio

from .source import Discovery, Publish, Target


class StaticDiscovery(Discovery):
    def __init__(self, targets: list[Target], label: str = "static") -> None:
        self.label = label
        self._targets = list(targets)
        self._changed = asyncio.Event()
        self._changed.set()

    def set(self, targets: list[Target]) -> None:
        self._targets = list(targets)
        self._changed.set()

    async def run(self, publish: Publish) -> None:
        while True:
            await self._changed.wait()
            self._changed.clear()
            publish(list(self._targets))
