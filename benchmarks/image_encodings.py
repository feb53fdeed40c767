"""What the gateway should send: per image class, the cost of each encoding to the gateway
(encode + base64) and to the engine (vLLM 0.24's image loader: ``pybase64.b64decode``,
``Image.open(...).load()``, RGB), its bytes, and what two OCR readers still read in it.

    python benchmarks/image_encodings.py [--reps 15] [--ocr] [--per-class 1] [--out FILE]

Images (tests/text_corpus.py, tests/image_corpus.py, the GPU load generator's base
images): light and dark screenshots, documents, charts (dashboards, a flat bar chart),
photos with and without a caption. Each is rewritten by the gateway's own ``rewrite``
(default budget, and under the h200 profile's caps); the pixels it encodes are taken
from the encoder's call and encoded again by every candidate:

    jpeg420_q90   JPEG q90 4:2:0 (what the gateway sends today)
    jpeg444_q90   JPEG q90 4:4:4        jpeg444_q95   JPEG q95 4:4:4
    png_l1        PNG, Pillow (zlib) level 1, adaptive filters (today's flat-colour PNG)
    png_vips_c1   PNG, libvips (libspng) compression 1, no filter
    png_vips_c1_f PNG, libvips compression 1, adaptive filters
    webp_ll       WebP lossless, method 0 (fastest)
    webp_q90      WebP lossy q90, method 0

Times: median of ``--reps``, process CPU time (``time.process_time``: survives a shared
machine), one process, nothing else running in it.
``--ocr``: tesseract and RapidOCR (tests/ocr_readers.py, cached on disk) read the raw image,
the lossless pixels and each lossy encoding, scaled back to the source (the quality
benchmark's ``seen``); recall is the share of drawn words' character bigrams found.
"""

from __future__ import annotations

import argparse
import io
import json
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "benchmarks"), str(ROOT / "benchmarks" / "gpu")]

import pybase64  # noqa: E402
from PIL import Image  # noqa: E402

LOSSLESS = ("png_l1", "png_vips_c1", "png_vips_c1_f", "webp_ll")


def _save(im: Image.Image, fmt: str, **kw) -> bytes:
    buf = io.BytesIO()
    im.save(buf, fmt, **kw)
    return buf.getvalue()


def _vips_png(im: Image.Image, filt: str) -> bytes:
    import pyvips
    rgb = im.convert("RGB") if im.mode != "RGB" else im
    v = pyvips.Image.new_from_memory(rgb.tobytes(), rgb.width, rgb.height, 3, "uchar")
    return v.pngsave_buffer(compression=1, filter=filt, strip=True)


def encoders():
    rgb = lambda im: im.convert("RGB") if im.mode == "RGBX" else im  # noqa: E731 - PNG/WebP have no RGBX
    return {
        "jpeg420_q90": lambda im: _save(im, "JPEG", quality=90, subsampling="4:2:0", optimize=False),
        "jpeg444_q90": lambda im: _save(im, "JPEG", quality=90, subsampling="4:4:4", optimize=False),
        "jpeg444_q95": lambda im: _save(im, "JPEG", quality=95, subsampling="4:4:4", optimize=False),
        "png_l1": lambda im: _save(rgb(im), "PNG", compress_level=1),
        "png_vips_c1": lambda im: _vips_png(im, "none"),
        "png_vips_c1_f": lambda im: _vips_png(im, "all"),
        "webp_ll": lambda im: _save(rgb(im), "WEBP", lossless=True, method=0, quality=0),
        "webp_q90": lambda im: _save(rgb(im), "WEBP", quality=90, method=0),
    }


def engine_load(b64: str) -> Image.Image:
    """vLLM 0.24's ImageMediaIO.load_base64 -> load_bytes, then the RGB mode conversion."""
    data = pybase64.b64decode(b64, validate=True)
    im = Image.open(io.BytesIO(data))
    im.load()
    return im.convert("RGB") if im.mode != "RGB" else im


def median_ms(fn, reps: int) -> float:
    """Median process CPU time (every thread of this process: libvips' too; nothing else runs)."""
    fn()
    ts = []
    for _ in range(reps):
        t = time.process_time()
        fn()
        ts.append((time.process_time() - t) * 1000)
    return round(statistics.median(ts), 3)


def samples(per_class: int):
    """(class, name, bytes, words, lang)."""
    import image_corpus as C
    import loadgen
    import text_corpus as T
    want = {"ui_1080": "screenshot_light", "ui_1440": "screenshot_light", "terminal": "screenshot_dark",
            "document": "document", "dashboard": "chart", "photo": "photo", "photo_caption": "photo_text",
            "spreadsheet": "screenshot_light"}
    seen: dict[str, int] = {}
    for s in T.samples(per_class):
        cls = want.get(s.cls)
        if cls is None or seen.get(s.cls, 0) >= per_class:
            continue
        seen[s.cls] = seen.get(s.cls, 0) + 1
        yield cls, s.name, s.data, s.words, s.lang
    yield "screenshot_light", "desktop_png1080", loadgen.base_image("png1080"), [], "eng"
    yield "screenshot_light", "desktop_jpeg1080", loadgen.base_image("jpeg1080"), [], "eng"
    yield "chart", "flat_bars", _flat_chart(), [], "eng"
    yield "photo", "photo_jpeg12mp", C.photo_jpeg(4032, 3024), [], "eng"


def _flat_chart() -> bytes:
    """A flat bar chart (few colours: the gateway's PNG case)."""
    from PIL import ImageDraw
    im = Image.new("RGB", (1600, 1000), (255, 255, 255))
    d = ImageDraw.Draw(im)
    for i in range(12):
        h = 80 + (i * 53) % 700
        d.rectangle([100 + i * 120, 900 - h, 180 + i * 120, 900], fill=[(52, 101, 164), (220, 120, 60)][i % 2])
    d.line([90, 900, 1550, 900], fill=(0, 0, 0), width=2)
    return _save(im, "PNG")


def capture(data: bytes, policy):
    """(the pixels the gateway encodes, its Rewritten) for ``data`` under ``policy``."""
    from vlm_gateway.stages.images import rewrite as rw
    from vlm_gateway.stages.images.decode import probe
    got = []
    real = rw.encode

    def grab(im, q):
        got.append(im)
        return real(im, q)
    rw.encode = grab
    try:
        r = rw.rewrite(data, probe(data, 64_000_000), policy)
    finally:
        rw.encode = real
    return (got[0] if got else None), r


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--per-class", type=int, default=1)
    ap.add_argument("--ocr", action="store_true")
    ap.add_argument("--configs", default="default,h200")
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    from vlm_gateway.stages.images.policy import Policy
    from vlm_gateway.stages.images.decode import probe
    from vlm_gateway.vision_tokens import send_cap, smart_resize
    encs = encoders()
    rows = []
    pool = None
    if a.ocr:
        from concurrent.futures import ThreadPoolExecutor

        import ocr_readers
        from quality import seen, source_image
        pool = ThreadPoolExecutor(2)
    for cls, name, data, words, lang in samples(a.per_class):
        head = probe(data, 64_000_000)
        for config in a.configs.split(","):
            pol = Policy() if config == "default" else Policy().capped(send_cap(head.width, head.height, 1280, 1638400))
            im, r = capture(data, pol)
            if im is None:  # sent as it came: what the engine pays for it, and what a JPEG on its grid would cost
                row = {"class": cls, "name": name, "config": config, "sent": "original",
                       "size": [head.width, head.height], "bytes": len(data)}
                b64 = pybase64.b64encode(data).decode("ascii")
                row["engine_ms_original"] = median_ms(lambda: engine_load(b64), a.reps)
                full = engine_load(b64)
                gh, gw = smart_resize(full.height, full.width)

                def to_grid():  # Pillow's bicubic: libvips' resize takes its slow path for a 0.7 % upscale
                    return encs["jpeg420_q90"](full.resize((gw, gh), Image.Resampling.BICUBIC)
                                               if (gw, gh) != full.size else full)
                jpg = to_grid()
                row["as_jpeg_on_grid"] = {"size": [gw, gh], "bytes": len(jpg),
                                          "gateway_ms": median_ms(lambda: pybase64.b64encode(to_grid()), a.reps),
                                          "engine_ms": median_ms(lambda: engine_load(pybase64.b64encode(jpg).decode()),
                                                                 a.reps)}
                rows.append(row)
                print(f"{cls:17s} {name:22s} {config:8s} sent as it came: engine {row['engine_ms_original']} ms; "
                      f"as JPEG on the grid {row['as_jpeg_on_grid']}", flush=True)
                continue
            row = {"class": cls, "name": name, "config": config, "size": [im.width, im.height],
                   "today": r.mime, "flat": im.getcolors(1024) is not None, "enc": {}}
            views = {}
            for ename, fn in encs.items():
                out = fn(im)
                b64 = pybase64.b64encode(out).decode("ascii")
                enc_ms = median_ms(lambda: pybase64.b64encode(fn(im)), a.reps)
                dec_ms = median_ms(lambda: engine_load(b64), a.reps)
                row["enc"][ename] = {"bytes": len(out), "gateway_ms": enc_ms, "engine_ms": dec_ms,
                                     "total_ms": round(enc_ms + dec_ms, 3)}
                if a.ocr and words and ename not in LOSSLESS[1:]:
                    views[ename] = replace(r, data=out)
            if a.ocr and words:
                src = source_image(data)
                vs = {"raw": src, **{k: seen(v, src) for k, v in views.items()}}
                futs = {(k, rd): pool.submit(lambda im=v, rd=rd: ocr_readers.recall(words, ocr_readers.read(im, rd, lang)))
                        for k, v in vs.items() for rd in ocr_readers.READERS}
                row["recall"] = {f"{k}/{rd}": round(f.result(), 4) for (k, rd), f in futs.items()}
                row["recall"] = {k.replace("png_l1", "lossless"): v for k, v in row["recall"].items()}
            rows.append(row)
            best = min(row["enc"], key=lambda k: row["enc"][k]["total_ms"])
            print(f"{cls:17s} {name:22s} {config:8s} {im.width}x{im.height} flat={row['flat']} best={best}  " +
                  "  ".join(f"{k} {v['gateway_ms']:.1f}+{v['engine_ms']:.1f} ({v['bytes'] // 1000}K)"
                            for k, v in row["enc"].items()) +
                  (f"  recall {row['recall']}" if "recall" in row else ""), flush=True)
    if a.out:
        Path(a.out).write_text(json.dumps({"reps": a.reps, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
