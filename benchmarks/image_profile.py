"""Where one image request's time goes in the gateway process, step by step.

    python benchmarks/image_profile.py [--reps 9] [--images jpeg1080,png1080,png1800,jpeg12mp]
                                       [--before DIR] [--cores 0] [--out docs/benchmarks/image-profile.json]

Per image (benchmarks/gpu/loadgen.py's base images: a 1080p JPEG screenshot, 1080p and
2880x1800 PNG desktop screenshots, a 12 MP JPEG photo) and per config (``default``: the
gateway's defaults, no profile; ``h200``: the shipped profile's caps, its
``image_max_long_side`` and ``image_max_pixels`` as the stage applies them), the request
body a client sends (JSON with a data: URI) goes through the gateway's own functions in
order: on the calling thread (the event loop's) the body read (the ASGI chunks joined, as
``proxy/body.py`` does) and the JSON parse and validation (``parse_chat``); in a pool
thread, as the gateway runs them, the base64 decode, hash and header probe and the
rewrite's own spans (``stages/images/spans.py``: open = structural scan + open + size
check, decode, trim, estimate = the legibility estimate and the budget, resize, encode,
base64 of the output); then the JSON re-encode of the body sent upstream. Each step's
process CPU time (``time.process_time``: every thread, libvips' too) beside its wall time
(``time.perf_counter``); CPU is the figure to read on a shared machine. Median and p99 of
``--reps`` runs after one warm-up; ``--cores N`` pins the process to N cores first (0: as
it is). ``--cprofile`` also prints the functions with the most own time.

Each image and config runs in a child process that imports only the package measured:
this checkout, and with ``--before DIR`` also the package in DIR (e.g. ``git archive
<commit> vlm_gateway | tar -x -C DIR``; it must have ``stages/images/spans.py``), the two
alternating child by child.
"""

from __future__ import annotations

import argparse
import base64
import cProfile
import io
import json
import os
import pstats
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

IMAGES = ["jpeg1080", "png1080", "png1800", "jpeg12mp"]
# the shipped h200 profile's image caps (backends/profiles.yaml), read at run time
PROFILE = "h200"
CHUNK = 65536  # ASGI body chunks as uvicorn hands them over loopback (up to 64 KiB)
# The image work runs in a pool thread, as in the gateway: in the main thread glibc's main
# arena gives freed megabytes back and every large buffer page-faults again (measured: the
# rewrite of a 1080p JPEG at 37 ms of CPU there, 20 ms in a pool thread, same code).
POOL = ThreadPoolExecutor(1)


def profile_caps(name: str) -> tuple[int, int]:
    from vlm_gateway.backends.profiles import load_profiles
    p = load_profiles()[name]
    return int(p.get("image_max_long_side") or 0), int(p.get("image_max_pixels") or 0)


def request_body(img: bytes) -> bytes:
    mime = "image/png" if img[:4] == b"\x89PNG" else "image/jpeg"
    import orjson
    return orjson.dumps({"model": "qwen3vl", "max_tokens": 64, "stream": True, "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": f"data:{mime};base64," + base64.b64encode(img).decode()}},
        {"type": "text", "text": "What does the screen show?"}]}]})


def one(raw_body: bytes, caps: tuple[int, int] | None) -> tuple[dict[str, float], str, dict[str, float]]:
    """The request path once: step -> wall seconds, what was sent (size, mime), step -> CPU seconds."""
    from vlm_gateway.config import ImagesConfig
    from vlm_gateway.core.request import parse_chat
    from vlm_gateway.data_uri import decode as decode_uri
    from vlm_gateway.hashing import content_hash
    from vlm_gateway.stages.images.decode import probe
    from vlm_gateway.stages.images.policy import resolve
    from vlm_gateway.stages.images.rewrite import rewrite
    from vlm_gateway.stages.images.spans import Spans
    from vlm_gateway.stages.images.stage import _capped
    from vlm_gateway.stages.images.source import Source

    chunks = [raw_body[i:i + CHUNK] for i in range(0, len(raw_body), CHUNK)]
    cfg = ImagesConfig()
    steps: dict[str, float] = {}
    cpu: dict[str, float] = {}
    t, c = time.perf_counter(), time.process_time()

    def mark(name: str) -> None:
        nonlocal t, c
        now, cn = time.perf_counter(), time.process_time()
        steps[name], cpu[name] = now - t, cn - c
        t, c = now, cn

    body = b"".join(chunks)
    mark("body read")
    req = parse_chat(body, {"content-type": "application/json"}, "r")
    mark("JSON parse")
    part = req.images[0]

    def pooled():  # what the gateway runs in a pool thread (one job for decode, hash, probe; one rewrite)
        sp = Spans()
        data = decode_uri(part.url)
        sp.mark("base64 decode")
        h = content_hash(data)
        sp.mark("hash")
        header = probe(data, cfg.max_source_pixels)
        sp.mark("header probe")
        pol = resolve(cfg, req.model, "default", part.detail)
        if caps is not None:
            pol = _capped(pol, Source("data", part.url, h, header, len(data), data), *caps)
        sp.t, sp.c = time.perf_counter(), time.process_time()
        return rewrite(data, header, pol, cfg.max_source_pixels, spans=sp), sp
    r, sp = POOL.submit(pooled).result()
    t, c = time.perf_counter(), time.process_time()
    for k, v in sp.steps.items():
        steps[k] = steps.get(k, 0.0) + v
        cpu[k] = cpu.get(k, 0.0) + sp.cpu[k]
    part.set_url(r.url if r.url is not None else part.url)
    out = req.encode()
    mark("JSON re-encode")
    return steps, f"{r.width}x{r.height} {r.mime.split('/')[1]} ({len(out)} B body)", cpu


ORDER = ["body read", "JSON parse", "base64 decode", "hash", "header probe", "open", "verify", "decode", "trim",
         "estimate", "resize", "encode", "base64", "JSON re-encode"]


def child(body_path: str, config: str, reps: int, cprofile: bool) -> dict:
    body = Path(body_path).read_bytes()
    caps = profile_caps(PROFILE) if config != "default" else None
    one(body, caps)
    runs = [one(body, caps) for _ in range(reps)]
    names = [k for k in ORDER if any(k in s for s, _, _ in runs)]
    row = {"body_bytes": len(body), "sent": runs[0][1], "steps": {}, "cpu": {}}
    for field, idx in (("steps", 0), ("cpu", 2)):
        for k in names:
            xs = sorted(r[idx].get(k, 0.0) * 1000 for r in runs)
            row[field][k] = {"median": round(statistics.median(xs), 3),
                             "p99": round(xs[min(len(xs) - 1, int(0.99 * len(xs)))], 3)}
    totals = sorted(sum(r[0].values()) * 1000 for r in runs)
    cpus = sorted(sum(r[2].values()) * 1000 for r in runs)
    row["total"] = {"median": round(statistics.median(totals), 2), "p99": round(totals[-1], 2)}
    row["total_cpu"] = {"median": round(statistics.median(cpus), 2), "p99": round(cpus[-1], 2)}
    if cprofile:
        pr = cProfile.Profile()
        pr.enable()
        for _ in range(reps):
            one(body, caps)
        pr.disable()
        out = io.StringIO()
        pstats.Stats(pr, stream=out).sort_stats("tottime").print_stats(10)
        row["cprofile"] = out.getvalue().split("\n\n", 2)[-1][:2200]
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--images", default=",".join(IMAGES))
    ap.add_argument("--before", default="")
    ap.add_argument("--cores", type=int, default=0)
    ap.add_argument("--cprofile", action="store_true")
    ap.add_argument("--out", default="")
    ap.add_argument("--child", nargs=2, metavar=("BODY", "CONFIG"))
    a = ap.parse_args()
    if a.cores:
        os.sched_setaffinity(0, set(sorted(os.sched_getaffinity(0))[:a.cores]))
    if a.child:
        print(json.dumps(child(a.child[0], a.child[1], a.reps, a.cprofile)))
        return
    sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "benchmarks"), str(ROOT / "benchmarks" / "gpu")]
    import loadgen
    versions = {"after": str(ROOT)} if not a.before else {"before": a.before, "after": str(ROOT)}
    tmp = Path(tempfile.mkdtemp(prefix="image-profile-"))
    res: dict = {"reps": a.reps, "cores": len(os.sched_getaffinity(0)), "profile": PROFILE,
                 "clock": "time.perf_counter spans, wall ms, one process per version", "versions": versions,
                 "images": {}}
    for i, kind in enumerate(a.images.split(",")):
        img = loadgen.base_image(kind)
        path = tmp / f"{kind}.json"
        path.write_bytes(request_body(img))
        for config in ("default", PROFILE):
            key = f"{kind}/{config}"
            res["images"][key] = {"bytes_in": len(img)}
            for label in (list(versions) if i % 2 == 0 else list(versions)[::-1]):
                cmd = [sys.executable, __file__, "--reps", str(a.reps), "--child", str(path), config]
                if a.cprofile:
                    cmd.append("--cprofile")
                p = subprocess.run(cmd, env={**os.environ, "PYTHONPATH": versions[label]}, capture_output=True,
                                   text=True)
                if p.returncode:
                    raise SystemExit(p.stderr)
                row = json.loads(p.stdout)
                res["images"][key][label] = row
                print(f"{kind:9s} {config:8s} {label:6s} -> {row['sent']:34s} wall {row['total']['median']:6.1f} "
                      f"cpu {row['total_cpu']['median']:6.1f} ms  " +
                      "  ".join(f"{k} {v['median']:.2f}" for k, v in row["cpu"].items()), flush=True)
                if a.cprofile:
                    print(row["cprofile"])
    if a.out:
        Path(a.out).write_text(json.dumps(res, indent=1) + "\n")


if __name__ == "__main__":
    main()
