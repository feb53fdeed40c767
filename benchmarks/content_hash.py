"""Cost of the content-identity hash on one core: CPU time per MB and per typical
image, for the cryptographic candidates (BLAKE3, SHA-256, BLAKE2b-256) beside the
non-cryptographic XXH3-128 they replace (when xxhash is installed).

    taskset -c 0 python benchmarks/content_hash.py [--reps 21]

CPU time of the calling thread (time.thread_time), median and p99 over reps; every
candidate runs on the same buffers in one process, interleaved.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import time

import blake3

SIZES = {"200 KB (rewritten JPEG)": 200_000, "2.7 MB (12 MP JPEG)": 2_700_000, "8 MB": 8 << 20}


def candidates() -> dict:
    c = {
        "blake3-256 (1 thread)": lambda d: blake3.blake3(d).hexdigest(),
        "sha256 (OpenSSL)": lambda d: hashlib.sha256(d).hexdigest(),
        "blake2b-256": lambda d: hashlib.blake2b(d, digest_size=32).hexdigest(),
    }
    try:
        import xxhash
        c["xxh3-128 (not collision-resistant)"] = lambda d: xxhash.xxh3_128_hexdigest(d)
    except ImportError:
        pass
    return c


def measure(fn, data: bytes, reps: int) -> list[float]:
    inner = max(1, (64 << 20) // len(data))  # >= 64 MB per timing: steady on a coarse clock
    out = []
    for _ in range(reps):
        t = time.thread_time()
        for _ in range(inner):
            fn(data)
        out.append((time.thread_time() - t) / inner)
    return sorted(out)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=21)
    args = ap.parse_args()
    cands = candidates()
    print("| hash | size | ms median | ms p99 | ms per MB |")
    print("|---|---|---|---|---|")
    for label, n in SIZES.items():
        data = os.urandom(n)
        for name, fn in cands.items():
            ts = measure(fn, data, args.reps)
            med = statistics.median(ts)
            p99 = ts[min(len(ts) - 1, int(len(ts) * 0.99))]
            print(f"| {name} | {label} | {med * 1e3:.3f} | {p99 * 1e3:.3f} | {med * 1e3 / (n / 1e6):.3f} |")


if __name__ == "__main__":
    main()
