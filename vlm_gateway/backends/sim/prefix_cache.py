"""The KV-cache block pool with vLLM-style automatic prefix caching.

The pool has ``capacity_blocks`` blocks of ``BLOCK_SIZE`` tokens. A running
request holds the blocks of its prompt and of the tokens it generated. When it
finishes, its full prompt blocks stay in the pool as *cached free* blocks keyed
by their chained hash (see prompt.py); a later request whose prompt starts with
the same blocks reuses them and skips their prefill. Cached free blocks are
evicted least-recently-used first when new blocks are needed; the tail block of
a freed request goes first (vLLM frees in reverse order for that reason).

Counting as vLLM does: each admitted request adds its prompt length to
``queries`` and its cache-hit length to ``hits`` (tokens). The hit length is
capped at ``num_tokens - 1``: the last prompt token is always computed, so a
fully cached prompt still prefills one block.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from .prompt import BLOCK_SIZE


@dataclass
class Allocation:
    """Blocks one request holds."""
    hashed: list[int] = field(default_factory=list)   # shared, hash-keyed blocks (refcounted)
    anon: int = 0                                     # private blocks (uncached, partial, decode)


class PrefixCache:
    def __init__(self, capacity_blocks: int, enabled: bool = True) -> None:
        self.capacity = max(1, int(capacity_blocks))
        self.enabled = enabled
        self.in_use: dict[int, int] = {}                  # hash -> refcount
        self.free_cached: OrderedDict[int, None] = OrderedDict()   # LRU first
        self.active = 0                                   # physical blocks held by requests
        self.queries = 0
        self.hits = 0
        self.evictions = 0

    # -- state ---------------------------------------------------------------
    @property
    def free_blocks(self) -> int:
        """Blocks available to a new allocation (empty + evictable cached)."""
        return self.capacity - self.active

    def usage(self) -> float:
        """Fraction of blocks held by running requests (vLLM's kv_cache_usage_perc)."""
        return self.active / self.capacity

    def cached_blocks(self) -> int:
        return len(self.in_use) + len(self.free_cached)

    def match(self, hashes: list[int], num_tokens: int) -> int:
        """Tokens of the longest cached prefix (full blocks, at most num_tokens - 1)."""
        if not self.enabled:
            return 0
        limit = max(0, (num_tokens - 1) // BLOCK_SIZE)
        n = 0
        for h in hashes[:limit]:
            if h in self.in_use or h in self.free_cached:
                n += 1
            else:
                break
        return n * BLOCK_SIZE

    # -- allocation ----------------------------------------------------------
    def _make_room(self, blocks: int) -> bool:
        empty = self.capacity - self.active - len(self.free_cached)
        if self.capacity - self.active < blocks:
            return False
        while empty < blocks:
            self.free_cached.popitem(last=False)
            self.evictions += 1
            empty += 1
        return True

    def admit(self, hashes: list[int], num_tokens: int, reserve_tokens: int = 0) -> tuple[Allocation, int] | None:
        """Allocate a new request's prompt blocks: (allocation, cached tokens), or
        None when the pool cannot hold prompt + ``reserve_tokens`` right now."""
        hit_tokens = self.match(hashes, num_tokens)
        hit_blocks = hit_tokens // BLOCK_SIZE
        reused_free = sum(1 for h in hashes[:hit_blocks] if h in self.free_cached)
        total = -(-(num_tokens + reserve_tokens) // BLOCK_SIZE)
        need_new = total - hit_blocks
        if self.capacity - self.active < need_new + reused_free:
            return None
        alloc = Allocation()
        for h in hashes[:hit_blocks]:        # take the hit blocks first so room-making cannot evict them
            if h in self.free_cached:
                del self.free_cached[h]
                self.in_use[h] = 1
                self.active += 1
            else:
                self.in_use[h] += 1
            alloc.hashed.append(h)
        prompt_new = -(-num_tokens // BLOCK_SIZE) - hit_blocks
        self._make_room(prompt_new)
        alloc.anon = prompt_new
        self.active += prompt_new
        self.queries += num_tokens
        self.hits += hit_tokens
        return alloc, hit_tokens

    def grow(self, alloc: Allocation, blocks: int = 1) -> bool:
        """One more private block for generated tokens (False when the pool is full)."""
        if not self._make_room(blocks):
            return False
        alloc.anon += blocks
        self.active += blocks
        return True

    def commit(self, alloc: Allocation, hashes: list[int]) -> None:
        """The prompt is computed: its full blocks become shareable cache entries."""
        if not self.enabled:
            return
        for h in hashes[len(alloc.hashed):]:
            if alloc.anon <= 0:
                break
            if h in self.in_use or h in self.free_cached:
                continue                      # computed twice concurrently: ours stays private
            self.in_use[h] = 1
            alloc.hashed.append(h)
            alloc.anon -= 1

    def release(self, alloc: Allocation) -> None:
        """The request finished or was aborted: private blocks return to the pool,
        shared ones become evictable when nobody else holds them (tail first)."""
        self.active -= alloc.anon
        alloc.anon = 0
        for h in reversed(alloc.hashed):
            rc = self.in_use[h] - 1
            if rc:
                self.in_use[h] = rc
            else:
                del self.in_use[h]
                self.active -= 1
                self.free_cached[h] = None
        alloc.hashed = []

    def reset(self) -> None:
        """Drop every cached free block (vLLM's /reset_prefix_cache)."""
        self.free_cached.clear()
