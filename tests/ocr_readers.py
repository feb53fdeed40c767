"""Two independent OCR readers and a character metric, for the legibility benchmark
and its CI subset.

- tesseract (Debian tesseract-ocr, eng + chi_sim), called as a binary;
- RapidOCR (``rapidocr-onnxruntime``: PP-OCR models shipped in the wheel).

The metric does not depend on line order or on how a reader splits words: the
recall of the character bigrams of each ground-truth word (whitespace removed,
case folded) in the multiset of bigrams of everything the reader returned,
whitespace removed. Reader outputs are cached on disk by image hash and reader
(``OCR_READER_CACHE``, default ~/.cache/vlm-gateway-ocr), outside the checkout.
"""

from __future__ import annotations

import hashlib
import io
import os
import subprocess
import tempfile
import threading
from collections import Counter
from pathlib import Path

from PIL import Image

CACHE = Path(os.environ.get("OCR_READER_CACHE", Path.home() / ".cache" / "vlm-gateway-ocr"))
READERS = ("tesseract", "rapidocr")
_rapid = None
_rapid_lock = threading.Lock()


def _norm(s: str) -> str:
    return "".join(s.split()).casefold()


def bigrams(s: str) -> Counter:
    s = _norm(s)
    if len(s) == 1:
        return Counter([s])
    return Counter(s[i:i + 2] for i in range(len(s) - 1))


def recall(words: list[str], text: str) -> float:
    """Share of the ground truth's in-word character bigrams found in the reader's text."""
    want: Counter = Counter()
    for w in words:
        want.update(bigrams(w))
    if not want:
        return 1.0
    got = Counter()
    t = _norm(text)
    got.update(t[i:i + 2] for i in range(len(t) - 1))
    got.update(t)  # single-character words
    hit = sum(min(n, got[g]) for g, n in want.items())
    return hit / sum(want.values())


def _png(im: Image.Image) -> bytes:
    buf = io.BytesIO()
    im.save(buf, "PNG", compress_level=1)
    return buf.getvalue()


def tesseract(png: bytes, lang: str) -> str:
    with tempfile.NamedTemporaryFile(suffix=".png") as f:
        f.write(png)
        f.flush()
        # psm 11: sparse text (UI layouts, chart labels); one thread: the machine is shared
        r = subprocess.run(["tesseract", f.name, "stdout", "-l", lang, "--psm", "11"], capture_output=True,
                           timeout=300, env={**os.environ, "OMP_THREAD_LIMIT": "1"})
    return r.stdout.decode("utf-8", "replace")


def rapidocr(png: bytes) -> str:
    global _rapid
    with _rapid_lock:
        if _rapid is None:
            from rapidocr_onnxruntime import RapidOCR
            _rapid = RapidOCR(intra_op_num_threads=1, inter_op_num_threads=1)
        res, _ = _rapid(png)
    return "\n".join(r[1] for r in (res or []))


def _path(im: Image.Image, reader: str, lang: str) -> Path:
    h = hashlib.sha256(im.tobytes() + repr((im.size, im.mode)).encode()).hexdigest()[:32]
    return CACHE / reader / f"{h}.{lang}.txt"


def cached(im: Image.Image, reader: str, lang: str = "eng") -> str | None:
    """The reader's text for ``im`` if it was read before, else None (nothing is run)."""
    path = _path(im, reader, lang)
    return path.read_text("utf-8") if path.exists() else None


def read(im: Image.Image, reader: str, lang: str = "eng") -> str:
    """The reader's text for ``im`` (cached on disk by pixels hash + reader + language)."""
    path = _path(im, reader, lang)
    if path.exists():
        return path.read_text("utf-8")
    png = _png(im)
    text = tesseract(png, lang) if reader == "tesseract" else rapidocr(png)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(text, "utf-8")
    tmp.replace(path)
    return text


def seen(sent: bytes, source_size: tuple[int, int]) -> Image.Image:
    """What the pixels still hold: the sent image scaled back to the source size."""
    im = Image.open(io.BytesIO(sent))
    im = im.convert("RGB")
    if im.size != source_size:
        im = im.resize(source_size, Image.Resampling.BICUBIC)
    return im
