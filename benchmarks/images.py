"""Image rewrite benchmark.

Part 1 (CPU, one core, ``time.process_time``): ms per image for the gateway's
pipeline vs the naive one (PIL open -> LANCZOS resize -> JPEG q95) in the same
run, with output bytes and PSNR against a float64 Lanczos reference of the full
image; plus the pass-through path (header probe + hash of a compliant image).

Part 2 (end to end): rewritten images/s through a real gateway (1 and 2
workers) in front of the simulator, distinct images so every request rewrites.

Part 3 (CPU, one core): per format, what an image within budget costs now that it
is verified before passing through (structural scan + open + decode; JPEG at 1/8
scale) beside the header probe alone, what converting it costs when it must be
(AVIF, HEIC, animation, Display P3, nclx, 16-bit, transparency), and the full
rewrite of a 1920x1080 image in each format.

    python benchmarks/images.py [--reps 15] [--e2e-seconds 10] [--skip-e2e] [--formats-only]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import io
import os
import statistics
import sys
import time

import numpy as np
from PIL import Image

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))

import image_corpus as C  # noqa: E402

from vlm_gateway.stages.images import Policy  # noqa: E402
from vlm_gateway.stages.images.decode import probe  # noqa: E402
from image_quality import lanczos_reference, psnr  # noqa: E402
from vlm_gateway.stages.images.rewrite import rewrite  # noqa: E402
from vlm_gateway.stages.images.source import content_hash  # noqa: E402


def naive(data: bytes, size: tuple[int, int]) -> bytes:
    im = Image.open(io.BytesIO(data)).convert("RGB").resize(size, Image.Resampling.LANCZOS)
    buf = io.BytesIO()
    im.save(buf, "JPEG", quality=95)
    return buf.getvalue()


def cpu_ms(fn, reps: int) -> tuple[float, float, object]:
    fn()  # warm
    ts = []
    out = None
    for _ in range(reps):
        t0 = time.process_time()
        out = fn()
        ts.append((time.process_time() - t0) * 1000)
    ts.sort()
    return statistics.median(ts), ts[min(len(ts) - 1, int(len(ts) * 0.99))], out


def part1(reps: int) -> list[str]:
    cases = [("1920x1080 JPEG", C.photo_jpeg(1920, 1080)), ("1280x720 JPEG", C.photo_jpeg(1280, 720)),
             ("1920x1080 PNG screenshot, white margins", C.screenshot_png()),
             ("4032x3024 JPEG", C.photo_jpeg(4032, 3024)), ("500x300 JPEG (pass-through)", C.photo_jpeg(500, 300))]
    policies = [("gateway default (bicubic, gap 1.2)", Policy()),
                ("gateway strict (bicubic, gap 2)", Policy(prescale_gap=2.0)),
                ("gateway lanczos", Policy(resample="lanczos")),
                ("gateway fast (gap 1)", Policy(prescale_gap=1.0))]
    rows = ["| image | pipeline | out size | ms median | ms p99 | vs naive | bytes out | PSNR dB |",
            "|---|---|---|---|---|---|---|---|"]
    for name, data in cases:
        header = probe(data, 64_000_000)
        if max(header.width, header.height) <= 768:
            med, p99, _ = cpu_ms(lambda: (content_hash(data), probe(data, 64_000_000),
                                          rewrite(data, header, Policy())), reps * 20)
            rows.append(f"| {name} | pass-through (hash + header probe) | {header.width}x{header.height} | "
                        f"{med:.3f} | {p99:.3f} | - | {len(data)} (unchanged) | inf |")
            continue
        r0 = rewrite(data, header, Policy())
        full = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))
        # reference: the same content box the gateway kept (trim) at the gateway's output size
        if r0.trimmed:
            from vlm_gateway.stages.images.trim import content_box
            box = content_box(Image.fromarray(full), Policy().trim_tolerance)
            full = full[box[1]:box[3], box[0]:box[2]]
        size = (r0.width, r0.height)
        ref = lanczos_reference(full, *size)
        n_med, n_p99, n_out = cpu_ms(lambda: naive(data, size), reps)
        n_psnr = psnr(np.asarray(Image.open(io.BytesIO(n_out)).convert("RGB")), ref)
        rows.append(f"| {name} | naive (open, LANCZOS, q95){' on the trimmed size' if r0.trimmed else ''} | "
                    f"{size[0]}x{size[1]} | {n_med:.1f} | {n_p99:.1f} | 1.00 | {len(n_out)} | {n_psnr:.2f} |")
        for pname, pol in policies:
            med, p99, r = cpu_ms(lambda: rewrite(data, header, pol), reps)
            p = psnr(np.asarray(Image.open(io.BytesIO(r.data)).convert("RGB")),
                     ref if (r.width, r.height) == size else lanczos_reference(full, r.width, r.height))
            rows.append(f"| {name} | {pname}{' + trim' if r.trimmed else ''} ({r.mime.split('/')[1]}) | "
                        f"{r.width}x{r.height} | {med:.1f} | {p99:.1f} | {n_med / med:.2f}x faster | "
                        f"{len(r.data)} | {p:.2f} |")
        print("\n".join(rows[-4:]), flush=True)
    return rows


async def _load(url: str, bodies: list[bytes], seconds: float, conc: int) -> tuple[int, list[float], int]:
    import httpx
    done, lat, errors = 0, [], 0
    deadline = time.perf_counter() + seconds
    it = iter(range(10**9))
    async with httpx.AsyncClient(timeout=60) as client:
        async def worker():
            nonlocal done, errors
            while time.perf_counter() < deadline:
                body = bodies[next(it) % len(bodies)]
                t0 = time.perf_counter()
                r = await client.post(url, content=body, headers={"content-type": "application/json"})
                if r.status_code == 200:
                    done += 1
                    lat.append(time.perf_counter() - t0)
                else:
                    errors += 1
        await asyncio.gather(*(worker() for _ in range(conc)))
    return done, lat, errors


def part2(seconds: float) -> list[str]:
    import orjson
    from conftest import SIM_MODEL, Servers
    import tempfile
    n = 400  # distinct images: every request is an L1 miss while the run lasts
    bodies = []
    for i in range(n):
        data = C.photo_jpeg(1920, 1080, seed=1000 + i) if i < 40 else None
        bodies.append(data)
    # 40 distinct 1080p sources, made distinct per request by a changing trailing comment byte? No:
    # JPEG bytes after EOI are ignored by decoders but change the hash, so each body is a new L1 key.
    base = bodies[:40]
    payloads = []
    for i in range(n):
        src = base[i % 40] + i.to_bytes(4, "big")
        url = "data:image/jpeg;base64," + base64.b64encode(src).decode()
        payloads.append(orjson.dumps({"model": SIM_MODEL, "max_tokens": 1, "messages": [
            {"role": "user", "content": [{"type": "text", "text": "x"},
                                         {"type": "image_url", "image_url": {"url": url}}]}]}))
    rows = ["| gateway workers | concurrency | rewritten images/s | latency p50 ms | p99 ms | errors |",
            "|---|---|---|---|---|---|"]
    with tempfile.TemporaryDirectory() as tmp:
        s = Servers(tmp)
        try:
            sim = s.sim(profile="fast", echo=False)
            for workers in (1, 2):
                gw = s.gateway({"server": {"log_level": "warning"}}, backends=[sim], workers=workers)
                asyncio.run(_load(gw.base_url + "/chat/completions", payloads[:8], 2, 4))  # warm
                done, lat, errors = asyncio.run(_load(gw.base_url + "/chat/completions", payloads[8:], seconds, 8))
                lat.sort()
                rows.append(f"| {workers} | 8 | {done / seconds:.1f} | {1000 * statistics.median(lat):.0f} | "
                            f"{1000 * lat[int(len(lat) * 0.99)]:.0f} | {errors} |")
                print(rows[-1], flush=True)
                gw.stop()
        finally:
            s.stop_all()
    return rows


def part3(reps: int) -> list[str]:
    from PIL import Image as PILImage

    from vlm_gateway.stages.images.decode import HEIF
    photo = PILImage.fromarray(C.photo_array(768, 512))
    within = [("JPEG q90", C.save(photo, "JPEG", quality=90)), ("PNG photo", C.save(photo, "PNG")),
              ("PNG screenshot", C.screenshot_png(768, 512, (40, 20))), ("WebP q90", C.save(photo, "WEBP", quality=90)),
              ("GIF (palette)", C.save(photo.convert("P"), "GIF")),
              ("PNG, sRGB ICC (passes)", C.srgb_tagged_png(768, 512)),
              ("PNG, Display P3 ICC", C.p3_tagged("PNG", (250, 10, 10), 768, 512)),
              ("JPEG, Display P3 ICC", C.save(photo, "JPEG", quality=90, icc_profile=C.display_p3_icc())),
              ("PNG RGBA, transparent", C.rgba_png(768, 512)), ("PNG 16-bit gray", C.png16_gray(768, 512)),
              ("JPEG CMYK", C.cmyk_jpeg(768, 512)), ("JPEG EXIF-rotated", C.exif_rotated_jpeg(768, 512)),
              ("GIF animated, 3 frames", C.frames("GIF", 768, 512)), ("WebP animated", C.frames("WEBP", 768, 512)),
              ("APNG", C.frames("PNG", 768, 512)), ("TIFF", C.save(photo, "TIFF")), ("BMP", C.save(photo, "BMP")),
              ("AVIF q80", C.save(photo, "AVIF", quality=80)),
              ("AVIF, nclx Display P3", C.with_nclx(C.save(photo, "AVIF", quality=80), primaries=12))]
    if HEIF:
        within += [("HEIC q80", C.heic(image=photo)), ("HEIC 10-bit", C.heic_10bit(768, 512))]
    rows = ["| image within budget (768x512) | bytes | header probe + hash ms | now: verify (+ convert) ms median | p99 | "
            "outcome |", "|---|---|---|---|---|---|"]
    for name, data in within:
        header = probe(data, 64_000_000)
        p_med, _, _ = cpu_ms(lambda: (content_hash(data), probe(data, 64_000_000)), reps * 10)
        med, p99, r = cpu_ms(lambda: rewrite(data, header, Policy()), reps)
        outcome = "pass-through" if r.passthrough else f"converted ({', '.join(r.conversions)}) -> {r.mime.split('/')[1]}"
        rows.append(f"| {name} | {len(data)} | {p_med:.3f} | {med:.2f} | {p99:.2f} | {outcome} |")
        print(rows[-1], flush=True)
    big = PILImage.fromarray(C.photo_array(1920, 1080))
    over = [("JPEG q90", C.save(big, "JPEG", quality=90)), ("PNG", C.save(big, "PNG")),
            ("WebP q90", C.save(big, "WEBP", quality=90)), ("GIF", C.save(big.convert("P"), "GIF")),
            ("TIFF", C.save(big, "TIFF")), ("BMP", C.save(big, "BMP")), ("AVIF q80", C.save(big, "AVIF", quality=80))]
    if HEIF:
        over.append(("HEIC q80", C.heic(image=big)))
    rows += ["", "| 1920x1080 source | bytes | rewrite to 768x448 ms median | p99 | conversions |", "|---|---|---|---|---|"]
    for name, data in over:
        header = probe(data, 64_000_000)
        med, p99, r = cpu_ms(lambda: rewrite(data, header, Policy()), reps)
        rows.append(f"| {name} | {len(data)} | {med:.1f} | {p99:.1f} | {', '.join(r.conversions) or '-'} |")
        print(rows[-1], flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--e2e-seconds", type=float, default=10.0)
    ap.add_argument("--skip-e2e", action="store_true")
    ap.add_argument("--formats-only", action="store_true")
    a = ap.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})  # parts 1 and 3 on one core
    if a.formats_only:
        print("\n".join(part3(a.reps)))
        return
    rows = part1(a.reps)
    print("\n".join(rows))
    print("\n".join(part3(a.reps)))
    if not a.skip_e2e:
        os.sched_setaffinity(0, set(range(os.cpu_count() or 1)))
        print("\n".join(part2(a.e2e_seconds)))


if __name__ == "__main__":
    main()
