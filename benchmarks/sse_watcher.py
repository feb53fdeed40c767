"""Cost of watching a relayed SSE stream (proxy/sse.py StreamWatcher), side by side
with the approach it replaced: on every read, join the held bytes with the new ones
and re-split all of it on blank lines (``resplit``). Typical events (one 204-byte
vLLM chunk per read) and one long event fed in 4 KiB reads (a hostile backend that
never ends an event; with assemble=True, the cacheable case). CPU time
(time.process_time), median of 7 runs.

    PYTHONPATH=. python benchmarks/sse_watcher.py
"""

from __future__ import annotations

import statistics
import time

import orjson

from vlm_gateway.proxy.sse import StreamWatcher


class Resplit:
    """The replaced approach, reduced to its buffering (parsing as in StreamWatcher)."""

    def __init__(self, assemble: bool) -> None:
        self.assemble, self.buf, self.chunks = assemble, b"", []

    def feed(self, data: bytes) -> bytes:
        buf = self.buf + data if self.buf else data
        if not self.assemble and b'"usage":{' not in buf and b'"error"' not in buf:
            self.buf = buf[-64:]
            return data
        *events, self.buf = buf.replace(b"\r\n", b"\n").split(b"\n\n")
        for ev in events:
            for line in ev.split(b"\n"):
                if line.startswith(b"data:") and line[5:].strip() != b"[DONE]":
                    try:
                        self.chunks.append(orjson.loads(line[5:].strip()))
                    except orjson.JSONDecodeError:
                        pass
        return data


CHUNK = b"data: " + orjson.dumps({"id": "chatcmpl-0123456789abcdef", "object": "chat.completion.chunk",
                                  "created": 1700000000, "model": "qwen3vl", "choices": [{
                                      "index": 0, "delta": {"content": "token "}, "logprobs": None,
                                      "finish_reason": None}]}) + b"\n\n"


def per_event_us(make, n: int = 20000) -> float:
    runs = []
    for _ in range(7):
        w = make()
        t0 = time.process_time()
        for _ in range(n):
            w.feed(CHUNK)
        runs.append((time.process_time() - t0) / n * 1e6)
    return statistics.median(runs)


def long_event_s(make, size: int) -> float:
    w = make()
    part = b"x" * 4096
    t0 = time.process_time()
    w.feed(b'data: {"choices": [{"delta": {"content": "')
    for _ in range(size // 4096):
        w.feed(part)
    return time.process_time() - t0


def main() -> None:
    print("| case | re-split | StreamWatcher |\n|---|---|---|")
    for assemble in (False, True):
        old = per_event_us(lambda: Resplit(assemble))
        new = per_event_us(lambda: StreamWatcher(assemble))
        print(f"| one {len(CHUNK)}-byte event per read, assemble={assemble} | {old:.2f} us | {new:.2f} us |")
    for mib in (1, 4, 8):
        old = long_event_s(lambda: Resplit(True), mib << 20)
        new = long_event_s(lambda: StreamWatcher(True, max_event_bytes=1 << 30), mib << 20)
        print(f"| one {mib} MiB event in 4 KiB reads, assembled | {old:.3f} s | {new:.4f} s |")


if __name__ == "__main__":
    main()
