"""Per-image CPU on one core, the rewrite before and after the fast paths side by side in
one run, plus the library comparison and the floors.

Each image is rewritten ``--reps`` times in a child process pinned to one core
(``time.process_time``, median and p99) with the package at ``--before`` (a copy of the
previous version, e.g. ``git archive <commit> vlm_gateway | tar -x -C /tmp/before``) and
with this checkout; children alternate so load changes hit both alike. The same child
also times the pieces: PNG decode with Pillow, libvips (libspng) and kornia-rs, raw
inflate of the PNG's IDAT stream (zlib: the floor of any PNG decoder), the JPEG entropy
decode at 1/8 scale (every coefficient read, IDCT of DC only: the floor of a JPEG decode),
and the final resize filter with Pillow and libvips.

    python benchmarks/image_cpu.py --before /tmp/before [--reps 15] [--out docs/benchmarks/image-cpu.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

IMAGES = ["jpeg1080", "jpeg720", "png1080_margins", "png1080", "png1800", "jpeg12mp"]


def make(name: str) -> bytes:
    import importlib.util  # this checkout's corpus, whichever package version is timed
    spec = importlib.util.spec_from_file_location("corpus_now", ROOT / "tests/image_corpus.py")
    C = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(C)
    return {"jpeg1080": lambda: C.photo_jpeg(1920, 1080), "jpeg720": lambda: C.photo_jpeg(1280, 720),
            "png1080_margins": lambda: C.screenshot_png(),
            "png1080": lambda: C.desktop_screenshot_png(1920, 1080),
            "png1800": lambda: C.desktop_screenshot_png(2880, 1800),
            "jpeg12mp": lambda: C.photo_jpeg(4032, 3024)}[name]()


def cpu_ms(fn, reps: int) -> dict:
    fn()
    ts = []
    for _ in range(reps):
        t0 = time.process_time()
        fn()
        ts.append((time.process_time() - t0) * 1000)
    ts.sort()
    return {"median": round(statistics.median(ts), 2), "p99": round(ts[min(len(ts) - 1, int(len(ts) * 0.99))], 2)}


def child(name: str, reps: int, pieces: bool) -> dict:
    os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[-1]})
    from vlm_gateway.stages.images import Policy
    from vlm_gateway.stages.images.decode import probe
    from vlm_gateway.stages.images.rewrite import rewrite
    data = make(name)
    h = probe(data, 64_000_000)
    # IMAGE_CPU_BUDGET: "fixed" (long side <= 768), "legible" (the default budget), or
    # "legible:<cap>" (the default under a backend profile's cap, e.g. h200's 1280)
    spec = os.environ.get("IMAGE_CPU_BUDGET", "legible")
    budget, _, cap = spec.partition(":")
    pol = Policy(budget=budget).capped(int(cap) if cap else None)
    r = rewrite(data, h, pol)
    out = {"rewrite": cpu_ms(lambda: rewrite(data, h, pol), reps), "out": f"{r.width}x{r.height}", "budget": spec,
           "mime": r.mime, "bytes_out": len(r.data), "trimmed": r.trimmed, "in": f"{h.width}x{h.height}",
           "bytes_in": len(data)}
    if not pieces:
        return out
    import io
    import zlib

    from PIL import Image
    if name.startswith("png"):
        import struct
        idat, i = [], 8
        while i < len(data):
            (n,) = struct.unpack_from(">I", data, i)
            if data[i + 4:i + 8] == b"IDAT":
                idat.append(data[i + 8:i + 8 + n])
            i += 12 + n
        stream = b"".join(idat)
        out["inflate_floor"] = cpu_ms(lambda: zlib.decompress(stream), reps)
        out["decode_pillow"] = cpu_ms(lambda: Image.open(io.BytesIO(data)).load(), reps)
        try:
            import pyvips
            out["decode_libvips"] = cpu_ms(
                lambda: pyvips.Image.new_from_buffer(data, "", access="sequential").write_to_memory(), reps)
        except ImportError:
            pass
        try:
            import kornia_rs
            out["decode_kornia_rs"] = cpu_ms(lambda: kornia_rs.io.decode_image_png_u8(data, (h.height, h.width),
                                                                                     "rgb"), reps)
        except ImportError:
            pass
    else:
        def eighth():
            im = Image.open(io.BytesIO(data))
            im.draft("RGB", (max(1, im.width // 8), max(1, im.height // 8)))
            im.load()
        out["entropy_decode_floor"] = cpu_ms(eighth, reps)

        def dct_scaled():
            from vlm_gateway.stages.images.resize import prescale_size
            from vlm_gateway.vision_tokens import target_size
            im = Image.open(io.BytesIO(data))
            im.draft("RGB", prescale_size(target_size(im.width, im.height, 768), pol.prescale_gap))
            im.load()
        out["decode_dct_scaled"] = cpu_ms(dct_scaled, reps)
        out["decode_full_pillow"] = cpu_ms(lambda: Image.open(io.BytesIO(data)).load(), reps)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", required=False)
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--out", default=str(ROOT / "docs" / "benchmarks" / "image-cpu.json"))
    ap.add_argument("--child", nargs=2, metavar=("IMAGE", "PIECES"))
    ap.add_argument("--images", default=",".join(IMAGES))
    a = ap.parse_args()
    if a.child:
        print(json.dumps(child(a.child[0], a.reps, a.child[1] == "1")))
        return
    res: dict = {}
    for name in a.images.split(","):
        res[name] = {}
        for label, path in (("before", a.before), ("after", str(ROOT))):
            if not path:
                continue
            env = {**os.environ, "PYTHONPATH": path}
            p = subprocess.run([sys.executable, __file__, "--reps", str(a.reps), "--child", name,
                                "1" if label == "after" else "0"], env=env, capture_output=True, text=True)
            if p.returncode:
                raise SystemExit(p.stderr)
            res[name][label] = json.loads(p.stdout)
        b, f = res[name].get("before", {}), res[name]["after"]
        print(f"{name:16s} {f['in']:>10s} -> {f['out']:8s} before {b.get('rewrite', {}).get('median', '-')} ms  "
              f"after {f['rewrite']['median']} ms (p99 {f['rewrite']['p99']})  "
              + "  ".join(f"{k} {v['median']}" for k, v in f.items() if isinstance(v, dict) and k != "rewrite"),
              flush=True)
    Path(a.out).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
