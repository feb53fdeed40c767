"""Redis memory per cached item, measured on a real Redis Cluster (three primaries, one
replica each, on loopback) written by a running gateway.

A gateway in front of one simulator sends ``--n`` requests of each kind through the
OpenAI-compatible API; the kinds:

- **image**: one 1280x720 JPEG (smooth content plus noise, as a photo) and a question:
  one L1 rewritten-image entry, one L3 exact entry and one semantic stream entry;
- **short answer** / **long answer**: a text question answered with ``--short`` /
  ``--long`` tokens: one L3 exact entry and one semantic stream entry each.

Reported per kind: the keys written per namespace, ``MEMORY USAGE`` of each key
(median and p99, bytes), and the growth of ``used_memory_dataset`` summed over the
primaries divided by the number of requests (what an item really costs: key, value,
expiry and allocator rounding; the server's fixed buffers left out); then what 1M items cost on the primaries (replicas hold a copy
each: multiply by 1 + replicas).

    python benchmarks/redis_memory.py           # writes docs/benchmarks/redis_memory.md
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import os
import platform
import statistics
import sys
import tempfile
import time
import uuid

import httpx
import orjson
import redis
import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from scale import DOCS, MODEL, Proc, free_port, make_image, pct, vg  # noqa: E402
from redis_cluster import LocalCluster  # noqa: E402  (put on the path by scale)

PREFIX = "mem"


def used_memory(cluster: LocalCluster) -> int:
    return sum(int(redis.Redis(port=p).info("memory")["used_memory_dataset"]) for p in cluster.primaries())


def keys_by_namespace(cluster: LocalCluster) -> dict[str, list[bytes]]:
    out: dict[str, list[bytes]] = {}
    for p in cluster.primaries():
        for k in redis.Redis(port=p).scan_iter(match=f"{PREFIX}:*", count=1000):
            ns = k.decode().split(":")[1]
            if k.decode() == f"{PREFIX}:l3:semantic":
                ns = "l3:semantic"
            out.setdefault(ns, []).append(k)
    return out


def usage(cluster: LocalCluster, keys: list[bytes]) -> list[int]:
    c = cluster.client()
    try:
        return [int(c.memory_usage(k, samples=0) or 0) for k in keys]
    finally:
        c.close()


def stream_len(cluster: LocalCluster) -> int:
    c = cluster.client()
    try:
        return int(c.xlen(f"{PREFIX}:l3:semantic"))
    except redis.ResponseError:
        return 0
    finally:
        c.close()


def settle(cluster: LocalCluster, want: dict[str, int], timeout: float = 30.0) -> None:
    """Until the background writes have landed (key counts reach ``want``)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        got = {ns: len(v) for ns, v in keys_by_namespace(cluster).items()}
        if all(got.get(ns, 0) >= n for ns, n in want.items()):
            return
        time.sleep(0.2)
    raise RuntimeError(f"writes did not land: want {want}, have {got}")


def run_kind(kind: str, gw: Proc, cluster: LocalCluster, n: int, args, key: str) -> dict:
    before_keys = {ns: set(v) for ns, v in keys_by_namespace(cluster).items()}
    before_mem, before_stream = used_memory(cluster), stream_len(cluster)
    with httpx.Client(timeout=60, headers={"authorization": f"Bearer {key}"}) as hc:
        for i in range(n):
            tag = uuid.uuid4().hex[:12]
            if kind == "image":
                content = [{"type": "image_url", "image_url": {"url": make_image(hash((tag, i)) & 0xFFFFFFFF)}},
                           {"type": "text", "text": f"What is shown in this picture? ({tag})"}]
                max_tokens = args.short
            else:
                content = f"Question {tag}: explain topic number {i} in a few sentences."
                max_tokens = args.short if kind == "short answer" else args.long
            r = hc.post(gw.url + "/v1/chat/completions",
                        json={"model": MODEL, "temperature": 0, "max_tokens": max_tokens,
                              "messages": [{"role": "user", "content": content}]})
            r.raise_for_status()
    want = {"l3": n + len(before_keys.get("l3", ()))}
    if kind == "image":
        want["img1"] = n + len(before_keys.get("img1", ()))
    settle(cluster, want)
    deadline = time.time() + 15
    while stream_len(cluster) < before_stream + n and time.time() < deadline:
        time.sleep(0.2)
    time.sleep(0.5)
    after = keys_by_namespace(cluster)
    new = {ns: [k for k in v if k not in before_keys.get(ns, set())] for ns, v in after.items()}
    row = {"kind": kind, "n": n, "bytes_per_item": (used_memory(cluster) - before_mem) / n,
           "stream_entries": stream_len(cluster) - before_stream, "namespaces": {}}
    for ns, ks in new.items():
        if not ks or ns == "rl":
            continue
        u = usage(cluster, ks)
        row["namespaces"][ns] = {"keys": len(ks), "median": statistics.median(u), "p99": pct(u, 0.99)}
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=300, help="requests per kind")
    ap.add_argument("--short", type=int, default=16)
    ap.add_argument("--long", type=int, default=256)
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()
    started = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    with tempfile.TemporaryDirectory(prefix="vlmgw-redis-mem-") as tmp:
        cluster = LocalCluster(os.path.join(tmp, "cluster")).start()
        procs: list[Proc] = []
        try:
            port = free_port()
            sim = Proc(vg("sim", "--port", str(port), "--profile", "fast", "--token-rate", "5000",
                          "--model", MODEL), port, os.path.join(tmp, "sim.log"), "/health")
            procs.append(sim)
            sim.wait()
            key = f"sk-mem-{uuid.uuid4().hex}"
            cfg = {"redis_url": cluster.url, "redis_prefix": PREFIX, "cache": {"semantic": True},
                   "backends": [{"url": sim.url + "/v1", "name": "sim0", "engine": "sim"}],
                   "auth": {"tenants": [{"name": "mem", "key_sha256": hashlib.sha256(key.encode()).hexdigest(),
                                         "requests_per_minute": 10**6}]}}
            path = os.path.join(tmp, "gw.yaml")
            with open(path, "w") as f:
                yaml.safe_dump(cfg, f)
            port = free_port()
            gw = Proc(vg("serve", "--config", path, "--port", str(port)), port, os.path.join(tmp, "gw.log"), "/ready")
            procs.append(gw)
            gw.wait()
            rows = [run_kind(k, gw, cluster, args.n, args, key) for k in ("image", "short answer", "long answer")]
            rl = usage(cluster, [k for k in keys_by_namespace(cluster).get("rl", [])])
        finally:
            for p in reversed(procs):
                p.stop()
            cluster.stop()
    for r in rows:
        print(orjson.dumps(r).decode())
    print("rate-limit keys:", rl)
    if not args.no_write:
        write(rows, rl, args, started)


def write(rows: list[dict], rl: list[int], args, started: str) -> None:
    lines = ["## Redis memory per cached item (Redis Cluster)", "",
             f"A gateway (L1 images, L3 exact and semantic on) wrote {args.n} items of each kind to a private "
             "Redis Cluster of three primaries with one replica each (Redis 7, jemalloc, loopback). "
             "Per kind: the keys written and their `MEMORY USAGE` (bytes, median / p99), and the growth of "
             "`used_memory_dataset` summed over the primaries per item (key, value, expiry, the semantic "
             "stream entry and allocator rounding; the servers' fixed buffers left out). 1M items: that growth x 1,000,000, on the primaries; each replica holds a copy "
             "(x2 with one replica per primary).", "",
             "| kind | keys per item | MEMORY USAGE median / p99 (bytes) | dataset growth per item | 1M items (primaries) | 1M items with one replica each |",
             "|---|---|---|---:|---:|---:|"]
    for r in rows:
        ns = "; ".join(f"`{k}` {v['keys'] / r['n']:.0f}" for k, v in sorted(r["namespaces"].items())
                       if k != "l3:semantic")
        mu = "; ".join(f"`{k}` {v['median']:,.0f} / {v['p99']:,.0f}" for k, v in sorted(r["namespaces"].items())
                       if k != "l3:semantic")
        b = r["bytes_per_item"]
        ns += f"; semantic stream entries {r['stream_entries'] / r['n']:.0f}"
        lines.append(f"| {r['kind']} | {ns} | {mu} | {b:,.0f} B | {b * 1e6 / 2**30:.2f} GiB | "
                     f"{2 * b * 1e6 / 2**30:.2f} GiB |")
    lines += ["", f"Rate-limit state is per tenant, not per item: one hash per bucket and one sorted set of "
              f"concurrency slots, {', '.join(str(x) for x in sorted(rl))} bytes (MEMORY USAGE) for the tenant "
              "of this run.", "",
              f"Answers: {args.short} tokens (image and short answer) and {args.long} tokens (long answer) of the "
              "simulator's filler text; the semantic stream entry holds a 384-float vector (1.5 KB) plus the "
              "question, partition and exact key; its share is inside the growth (one stream "
              "key, on one slot). The L3 answer is stored twice, under its exact and its normalised key "
              "(`cache.normalized`). The image is the rewritten one (what the engine is sent), from a "
              "1280x720 JPEG of photo-like content.", "",
              f"Command: `python benchmarks/redis_memory.py {' '.join(sys.argv[1:])}`".rstrip() + f" ({started}; "
              f"Python {platform.python_version()}). Raw rows: `redis_memory.json`.", ""]
    os.makedirs(DOCS, exist_ok=True)
    with open(os.path.join(DOCS, "redis_memory.md"), "w") as f:
        f.write("\n".join(lines))
    with open(os.path.join(DOCS, "redis_memory.json"), "wb") as f:
        f.write(orjson.dumps({"started": started, "argv": sys.argv[1:], "rows": rows, "rate_limit_keys": rl},
                             option=orjson.OPT_INDENT_2))


if __name__ == "__main__":
    main()
