"""Spare cores: how many threads one media job may use when it starts.

At concurrency 1 a request waits for its own image, and the other cores of the machine
sit idle; under load every core is busy with a job of its own and more threads per job
only slow all of them down. So a job gets more threads only from cores that are idle:

    idle  = cores of this process's affinity set idle over the last window (/proc/stat:
            the machine, other worker processes and the engine on the same node included;
            refreshed when a job starts and the last reading is >= WINDOW_S old)
    grant = clamp(floor(idle / jobs), 1, limit)   jobs: this pool's jobs started or waiting
            1 while any job of this pool waits for a thread (the pool is busy)

Without /proc/stat (not Linux) the grant is 1. The grant is read by the job itself
(``granted()``, set for the job's thread by the pool) and spent on work that splits without
changing a byte of the output: libvips' threads for the resize, the legibility estimate's
strips in bands (``helpers``). Same input, same bytes, whatever the grant.
"""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

WINDOW_S = 0.05  # shortest window idle time is read over (a jiffy is 10 ms: shorter is noise)


def _affinity() -> set[int]:
    try:
        return set(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        return set(range(os.cpu_count() or 1))


class IdleCores:
    """Idle cores of this process's CPUs over the last window, from /proc/stat."""

    def __init__(self, path: str = "/proc/stat", clock=time.monotonic) -> None:
        self.path = path
        self.clock = clock
        self.cpus = {f"cpu{i}" for i in _affinity()}
        self._lock = threading.Lock()
        self._last: tuple[int, int] | None = self._read()  # (idle, total) jiffies
        self._t = self.clock()
        self.idle = 0.0  # no window yet

    def _read(self) -> tuple[int, int] | None:
        try:
            with open(self.path, "rb") as f:
                text = f.read()
        except OSError:
            return None
        idle = total = 0
        for line in text.split(b"\n"):
            if not line.startswith(b"cpu") or line.startswith(b"cpu "):
                continue
            name, *vals = line.split()
            if name.decode() not in self.cpus:
                continue
            v = [int(x) for x in vals[:8]]
            idle += v[3] + v[4]  # idle + iowait
            total += sum(v)
        return (idle, total) if total else None

    def now(self) -> float:
        """Idle cores (0 when unknown)."""
        t = self.clock()
        if t - self._t < WINDOW_S:
            return self.idle
        with self._lock:
            if t - self._t < WINDOW_S:
                return self.idle
            cur = self._read()
            if cur is None:
                self._t, self.idle = t, 0.0
                return 0.0
            if self._last is not None:
                di, dt = cur[0] - self._last[0], cur[1] - self._last[1]
                if dt >= len(self.cpus):  # at least a jiffy per CPU since the last reading
                    self.idle = max(0.0, len(self.cpus) * di / dt)
                    self._last, self._t = cur, t
            else:
                self._last, self._t = cur, t
            return self.idle


class Spare:
    """The grant rule above, for one pool (``limit``: most threads a job may use)."""

    def __init__(self, limit: int, idle: IdleCores | None = None) -> None:
        self.limit = max(1, int(limit))
        self.idle = idle if idle is not None else (IdleCores() if self.limit > 1 else None)

    def grant(self, jobs: int, waiting: int) -> int:
        if self.limit <= 1 or waiting > 0 or self.idle is None:
            return 1
        return max(1, min(self.limit, int(self.idle.now() // max(1, jobs))))


_local = threading.local()
_helpers: ThreadPoolExecutor | None = None
_helpers_lock = threading.Lock()


def granted() -> int:
    """Threads the running job may use (1 outside a pool job)."""
    return getattr(_local, "n", 1)


def set_granted(n: int) -> None:
    _local.n = n


def helpers(n: int) -> ThreadPoolExecutor:
    """The process's helper threads (at least ``n - 1`` of them), shared by every job that
    was granted more than one thread; a helper only ever runs part of a granted job, so at
    most the idle cores' worth of them are busy."""
    global _helpers
    with _helpers_lock:
        if _helpers is None or _helpers._max_workers < n - 1:  # noqa: SLF001 - grown, never shrunk
            old, _helpers = _helpers, ThreadPoolExecutor(max(1, n - 1), thread_name_prefix="vlmgw-help")
            if old is not None:
                old.shutdown(wait=False)  # its threads end once their work is done
        return _helpers
