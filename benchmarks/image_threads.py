"""What more threads buy one image: the rewrite with a grant of 1 and of N threads
(``stages/images/spare.py``; forced here, where the gateway grants them only from idle
cores), interleaved rep by rep in one process, in a pool thread as in the gateway.

    python benchmarks/image_threads.py [--grants 1,2,4] [--reps 20] [--images ...] [--out FILE]

Per image and config (defaults; the h200 profile's caps): wall time of the rewrite (median,
p99) per grant and per step (``spans``), the ratio to grant 1, and whether every grant gave
the same bytes. On a machine whose other cores are busy a grant above 1 waits for them: read
it where the cores it grants are idle.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "benchmarks"), str(ROOT / "benchmarks" / "gpu")]

IMAGES = ["jpeg1080", "png1080", "png1800", "jpeg12mp"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--grants", default="1,2")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--images", default=",".join(IMAGES))
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    import loadgen
    from vlm_gateway.stages.images import spare
    from vlm_gateway.stages.images.decode import probe
    from vlm_gateway.stages.images.policy import Policy
    from vlm_gateway.stages.images.rewrite import rewrite
    from vlm_gateway.stages.images.spans import Spans
    from vlm_gateway.vision_tokens import send_cap
    grants = [int(g) for g in a.grants.split(",")]
    pool = ThreadPoolExecutor(1)

    def run(data, head, pol, n):
        spare.set_granted(n)
        try:
            sp = Spans()
            t = time.perf_counter()
            r = rewrite(data, head, pol, spans=sp)
            return (time.perf_counter() - t) * 1000, sp.steps, hashlib.sha256(r.data).hexdigest()
        finally:
            spare.set_granted(1)

    res = {"grants": grants, "reps": a.reps, "images": {}}
    for kind in a.images.split(","):
        data = loadgen.base_image(kind)
        head = probe(data, 64_000_000)
        for config in ("default", "h200"):
            pol = Policy() if config == "default" else Policy().capped(send_cap(head.width, head.height, 1280, 1638400))
            got = {n: {"wall": [], "steps": {}, "sha": set()} for n in grants}
            for n in grants:
                pool.submit(run, data, head, pol, n).result()  # warm
            for i in range(a.reps):
                for n in (grants if i % 2 == 0 else grants[::-1]):
                    w, steps, sha = pool.submit(run, data, head, pol, n).result()
                    g = got[n]
                    g["wall"].append(w)
                    g["sha"].add(sha)
                    for k, v in steps.items():
                        g["steps"].setdefault(k, []).append(v * 1000)
            row = {}
            for n, g in got.items():
                xs = sorted(g["wall"])
                row[str(n)] = {"p50": round(statistics.median(xs), 2), "p99": round(xs[min(len(xs) - 1, int(0.99 * len(xs)))], 2),
                               "steps": {k: round(statistics.median(v), 2) for k, v in g["steps"].items()}}
            for n in grants:
                row[str(n)]["over_grant_1"] = round(row[str(n)]["p50"] / row[str(grants[0])]["p50"], 3)
            row["same_bytes"] = len(set.union(*(g["sha"] for g in got.values()))) == 1
            res["images"][f"{kind}/{config}"] = row
            print(f"{kind:9s} {config:8s} " + "  ".join(
                f"grant {n}: {row[str(n)]['p50']:.1f} ms (p99 {row[str(n)]['p99']:.1f}, {row[str(n)]['over_grant_1']:.2f}x; "
                f"estimate {row[str(n)]['steps'].get('estimate', 0):.1f}, resize {row[str(n)]['steps'].get('resize', 0):.1f})"
                for n in grants) + f"  same bytes: {row['same_bytes']}", flush=True)
    if a.out:
        Path(a.out).write_text(json.dumps(res, indent=1) + "\n")


if __name__ == "__main__":
    main()
