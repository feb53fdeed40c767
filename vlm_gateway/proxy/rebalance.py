"""Keep client connections spread evenly over the workers.

The kernel hashes each new connection to one worker's listening socket (SO_REUSEPORT,
``workers.py``): even on average, uneven by chance (64 connections over 8 workers landed
3 to 18 a worker). Keep-alive connections then stay where they landed. So each worker
counts its open connections in a slot of an array shared by all workers, and a worker
holding more than its share,

    open_here - already_closing > ceil(open_everywhere / workers) + SLACK,

answers the next request on one of its connections with ``Connection: close`` (after the
whole response). The client opens a new connection, which the kernel hashes again; the
counts converge on the share. Only a worker's own process writes its slot; reads of the
others may be a moment old, which the slack absorbs.
"""

from __future__ import annotations

SLACK = 0


class Share:
    def __init__(self, index: int, counts) -> None:
        self.index = index
        self.counts = counts  # multiprocessing RawArray("i", workers)
        self.closing = 0

    def opened(self) -> None:
        self.counts[self.index] += 1

    def closed(self, marked: bool) -> None:
        self.counts[self.index] -= 1
        if marked:
            self.closing -= 1

    def should_close(self) -> bool:
        counts = self.counts[:]
        share = -(-sum(counts) // len(counts))
        if counts[self.index] - self.closing > share + SLACK:
            self.closing += 1
            return True
        return False


SHARE: Share | None = None  # set in each worker process by workers.py


def install(index: int, counts) -> None:
    global SHARE
    SHARE = Share(index, counts)
