"""The sha256 of what the image rewrite sends, over a fixed set of corpus cases: a change
that must not alter output bytes (the engines' prefix and multimodal caches depend on
them) shows as no difference.

    python benchmarks/image_digests.py --write /tmp/before.json      # on the old version
    python benchmarks/image_digests.py --compare /tmp/before.json    # on the new one

Cases: generated images (tests/image_corpus.py, tests/text_corpus.py, the GPU load
generator's base images) of every class and format the stage meets, each under the
default legible budget, the shipped h200 profile's caps, the fixed 768 rule, a client's
1280 and a small cap; the rewrite runs as the stage runs it (``rewrite``). Exit status 1
when ``--compare`` finds a difference.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "benchmarks"), str(ROOT / "benchmarks" / "gpu")]


def images() -> dict[str, bytes]:
    import image_corpus as C
    import loadgen
    import text_corpus
    out = {k: loadgen.base_image(k) for k in ("jpeg1080", "png1080", "png1800", "jpeg12mp")}
    out.update({
        "photo_jpeg_1280x720": C.photo_jpeg(1280, 720), "photo_jpeg_prog": C.photo_jpeg(1600, 1200, progressive=True),
        "screenshot_margins": C.screenshot_png(), "letterboxed": C.letterboxed_jpeg(),
        "exif_rotated": C.exif_rotated_jpeg(), "cmyk": C.cmyk_jpeg(), "gray_jpeg": C.gray_jpeg(),
        "palette_transparent": C.palette_png_transparent(), "png16": C.png16_gray(), "webp": C.webp(),
        "gif": C.animated_gif(), "bmp": C.bmp(), "tiff": C.tiff(), "rgba": C.rgba_png(),
        "p3_png": C.p3_tagged("png"), "p3_jpeg": C.p3_tagged("jpeg"),
    })
    for s in text_corpus.samples(1):
        out[f"text_{s.name}"] = s.data
    return out


def policies(w: int, h: int):
    from vlm_gateway.stages.images.policy import Policy
    from vlm_gateway.vision_tokens import send_cap
    return {"default": Policy(), "h200": Policy().capped(send_cap(w, h, 1280, 1638400) or None),
            "fixed768": Policy(budget="fixed"), "client1280": Policy(max_long_side=1280, budget="client"),
            "cap512": Policy().capped(512)}


def digests() -> dict[str, str]:
    from vlm_gateway.stages.images.decode import ImageError, probe
    from vlm_gateway.stages.images.rewrite import rewrite
    out = {}
    for name, data in images().items():
        try:
            head = probe(data, 64_000_000)
        except ImageError as e:
            out[name] = f"refused {e.code}"
            continue
        for pname, pol in policies(head.width, head.height).items():
            r = rewrite(data, head, pol)
            b = r.budget.header("") if r.budget is not None else ""
            out[f"{name}/{pname}"] = (f"{hashlib.sha256(r.data).hexdigest()[:16]} {r.width}x{r.height} {r.mime} "
                                      f"{'pass' if r.passthrough else 'sent'} {b}")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--write", default="")
    ap.add_argument("--compare", default="")
    a = ap.parse_args()
    d = digests()
    if a.write:
        Path(a.write).write_text(json.dumps(d, indent=1, sort_keys=True) + "\n")
    if a.compare:
        old = json.loads(Path(a.compare).read_text())
        diff = sorted(k for k in set(old) | set(d) if old.get(k) != d.get(k))
        for k in diff:
            print(f"{k}\n  before {old.get(k)}\n  now    {d.get(k)}")
        print(f"{len(d)} cases, {len(diff)} differ")
        raise SystemExit(1 if diff else 0)
    if not a.write:
        for k, v in sorted(d.items()):
            print(k, v)


if __name__ == "__main__":
    main()
