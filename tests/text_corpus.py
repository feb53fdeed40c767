"""A deterministic generated corpus of images with known text, for the legibility
benchmark (benchmarks/quality.py) and its CI subset (tests/test_images_legibility.py).

Every sample carries the words drawn into it (the ground truth the readers are
scored against). Fonts: DejaVu (Debian fonts-dejavu-core) and Noto CJK (fonts-noto-cjk).
Nothing is downloaded; the same seed gives the same bytes.
"""

from __future__ import annotations

import io
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np
from PIL import Image, ImageDraw, ImageFilter, ImageFont

DEJAVU = "/usr/share/fonts/truetype/dejavu/"
SANS = DEJAVU + "DejaVuSans.ttf"
SANS_BOLD = DEJAVU + "DejaVuSans-Bold.ttf"
SERIF = DEJAVU + "DejaVuSerif.ttf"
MONO = DEJAVU + "DejaVuSansMono.ttf"
CJK = "/usr/share/fonts/opentype/noto/NotoSansCJK-Regular.ttc"

WORDS = ("account balance report status server region network latency request cache update "
         "deploy version window settings profile project invoice customer order payment export "
         "import filter search result history message channel display monitor storage memory "
         "process thread kernel module package license review comment branch commit release "
         "budget revenue margin growth quarter weekly monthly average median total pending "
         "approved rejected warning error notice details summary overview analysis forecast "
         "schedule meeting calendar contact address phone email office manager engineer "
         "product market sales support ticket priority billing tenant quota limit metric").split()
CJK_TEXT = ("人工智能模型正在改变我们处理文档和图像的方式这个系统可以识别屏幕截图中的文字并回答用户的问题"
            "数据分析报告显示本季度收入增长明显客户满意度持续提高服务器延迟降低网络请求数量增加"
            "请检查配置文件中的参数设置确认缓存命中率以及每个租户的配额限制是否正确")


@dataclass
class Sample:
    cls: str
    name: str
    data: bytes
    mime: str
    words: list[str] = field(default_factory=list)
    # (word, (left, top, right, bottom)) of every word drawn entirely inside the image
    boxes: list[tuple[str, tuple[int, int, int, int]]] = field(default_factory=list)
    lang: str = "eng"  # tesseract language
    text_px: float = 0.0  # font size drawn (the smallest significant one), for the record

    @property
    def width_height(self) -> tuple[int, int]:
        return Image.open(io.BytesIO(self.data)).size

    def words_in(self, box: tuple[int, int, int, int]) -> list[str]:
        """The words drawn entirely inside ``box`` (for reading a crop)."""
        l, t, r, b = box
        return [w for w, (x0, y0, x1, y1) in self.boxes if x0 >= l and y0 >= t and x1 <= r and y1 <= b]


class Recorder(ImageDraw.ImageDraw):
    """ImageDraw that records the box of every word it draws (CJK: runs of 4 characters)."""

    def __init__(self, im: Image.Image) -> None:
        super().__init__(im)
        self.size = im.size
        self.boxes: list[tuple[str, tuple[int, int, int, int]]] = []

    def text(self, xy, text, fill=None, font=None, **kw):  # noqa: D102
        super().text(xy, text, fill=fill, font=font, **kw)
        x, y = xy
        parts = text.split(" ") if " " in text or text.isascii() else [text[i:i + 4] for i in range(0, len(text), 4)]
        pos = 0
        for i, w in enumerate(parts):
            if not w:
                continue
            prefix = (" ".join(parts[:i]) + " ") if " " in text and i else "".join(parts[:i])
            x0 = x + (self.textlength(prefix, font=font) if prefix else 0)
            l, t, r, b = font.getbbox(w)
            box = (int(x0 + l), int(y + t), int(x0 + r + 1), int(y + b + 1))
            if box[0] >= 0 and box[1] >= 0 and box[2] <= self.size[0] and box[3] <= self.size[1]:
                self.boxes.append((w, box))
            pos += 1


def _draw(im: Image.Image) -> Recorder:
    return Recorder(im)


@lru_cache(maxsize=64)
def font(path: str, px: int) -> ImageFont.FreeTypeFont:
    return ImageFont.truetype(path, px)


def _png(im: Image.Image) -> bytes:
    buf = io.BytesIO()
    im.save(buf, "PNG", optimize=False, compress_level=3)
    return buf.getvalue()


def _jpeg(im: Image.Image, q: int) -> bytes:
    buf = io.BytesIO()
    im.save(buf, "JPEG", quality=q)
    return buf.getvalue()


def _phrase(rng, n: int) -> list[str]:
    ws = [WORDS[int(i)] for i in rng.integers(0, len(WORDS), n)]
    if rng.random() < 0.5:
        ws[0] = ws[0].capitalize()
    return ws


def _lines(d: ImageDraw.ImageDraw, rng, box, px: int, path: str, fill, words: list[str],
           spacing: float = 1.6, per_line=(4, 9)) -> None:
    """Fill ``box`` with lines of words; every drawn word is recorded."""
    x0, y0, x1, y1 = box
    f = font(path, px)
    y = y0
    while y + px * 1.3 < y1:
        ws = _phrase(rng, int(rng.integers(*per_line)))
        line = " ".join(ws)
        while ws and d.textlength(line, font=f) > x1 - x0:
            ws = ws[:-1]
            line = " ".join(ws)
        if ws:
            d.text((x0, y), line, font=f, fill=fill)
            words.extend(ws)
        y += int(px * spacing)


def ui(w: int, h: int, px: int, seed: int, path: str = SANS) -> tuple[Image.Image, list[str]]:
    """A desktop window: title bar, sidebar, toolbar, a content pane of text, buttons."""
    rng = np.random.default_rng(seed)
    im = Image.new("RGB", (w, h), (250, 250, 252))
    d = _draw(im)
    words: list[str] = []
    bar = int(px * 2.4)
    d.rectangle([0, 0, w, bar], fill=(40, 44, 52))
    _lines(d, rng, (px, int(px * 0.6), w // 3, bar), px, SANS, (230, 230, 230), words, per_line=(2, 4))
    side = w // 6
    d.rectangle([0, bar, side, h], fill=(236, 238, 242))
    _lines(d, rng, (px, bar + px, side - px, h - px), px, path, (30, 30, 40), words, 2.2, (1, 3))
    # toolbar buttons
    x = side + px
    for _ in range(5):
        ws = _phrase(rng, 1)
        tw = d.textlength(ws[0], font=font(path, px))
        d.rounded_rectangle([x, bar + px, x + tw + 2 * px, bar + 3 * px], 4, fill=(52, 101, 164))
        d.text((x + px, bar + int(px * 1.4)), ws[0], font=font(path, px), fill=(255, 255, 255))
        words.extend(ws)
        x += int(tw + 3 * px)
    _lines(d, rng, (side + px, bar + 5 * px, w - px, h - px), px, path, (25, 25, 30), words)
    return im, d.boxes


def terminal(w: int, h: int, px: int, seed: int) -> tuple[Image.Image, list[str]]:
    rng = np.random.default_rng(seed)
    im = Image.new("RGB", (w, h), (30, 30, 36))
    d = _draw(im)
    words: list[str] = []
    f = font(MONO, px)
    y = px // 2
    colours = [(220, 220, 220), (120, 220, 120), (240, 200, 90), (110, 170, 250)]
    while y + px * 1.3 < h:
        ws = _phrase(rng, int(rng.integers(3, 12)))
        ws = [f"{c}{int(rng.integers(0, 999))}" if rng.random() < 0.15 else c for c in ws]
        line = " ".join(ws)
        while ws and d.textlength(line, font=f) > w - px:
            ws = ws[:-1]
            line = " ".join(ws)
        d.text((px // 2, y), line, font=f, fill=colours[int(rng.integers(0, 4))])
        words.extend(ws)
        y += int(px * 1.25)
    return im, d.boxes


def dashboard(w: int, h: int, px: int, seed: int) -> tuple[Image.Image, list[str]]:
    """Panels with a title, a line chart or bars, axis tick labels and a legend."""
    rng = np.random.default_rng(seed)
    im = Image.new("RGB", (w, h), (245, 246, 248))
    d = _draw(im)
    words: list[str] = []
    cols, rows = 3, 2
    pw, ph = w // cols, h // rows
    for r in range(rows):
        for c in range(cols):
            x0, y0 = c * pw + 10, r * ph + 10
            x1, y1 = x0 + pw - 20, y0 + ph - 20
            d.rectangle([x0, y0, x1, y1], fill=(255, 255, 255), outline=(220, 222, 226))
            title = _phrase(rng, 3)
            d.text((x0 + 12, y0 + 8), " ".join(title), font=font(SANS_BOLD, px + 3), fill=(30, 30, 30))
            words.extend(title)
            gx0, gy0, gx1, gy1 = x0 + 6 * px, y0 + 4 * px, x1 - 12, y1 - 4 * px
            d.line([gx0, gy1, gx1, gy1], fill=(150, 150, 150))
            d.line([gx0, gy0, gx0, gy1], fill=(150, 150, 150))
            for i in range(5):  # y tick labels
                yy = gy1 - (gy1 - gy0) * i // 4
                lab = f"{int(rng.integers(1, 99)) * 10}"
                d.text((gx0 - 5 * px, yy - px // 2), lab, font=font(SANS, px), fill=(90, 90, 90))
                d.line([gx0, yy, gx1, yy], fill=(235, 235, 235))
                words.append(lab)
            n = 6
            for i in range(n):  # x tick labels
                xx = gx0 + (gx1 - gx0) * i // (n - 1)
                lab = _phrase(rng, 1)[0][:5]
                d.text((xx - px, gy1 + px // 2), lab, font=font(SANS, px), fill=(90, 90, 90))
                words.append(lab)
            pts = [(gx0 + (gx1 - gx0) * i // 19, gy1 - int((gy1 - gy0) * (0.2 + 0.6 * rng.random())))
                   for i in range(20)]
            if (r + c) % 2:
                d.line(pts, fill=(52, 101, 164), width=2)
            else:
                bw = (gx1 - gx0) // 12
                for i in range(0, 20, 2):
                    d.rectangle([pts[i][0], pts[i][1], pts[i][0] + bw, gy1], fill=(100, 170, 120))
            leg = _phrase(rng, 2)
            d.text((x1 - 14 * px, y0 + 8), " ".join(leg), font=font(SANS, px), fill=(60, 60, 60))
            words.extend(leg)
    return im, d.boxes


def spreadsheet(w: int, h: int, px: int, seed: int) -> tuple[Image.Image, list[str]]:
    rng = np.random.default_rng(seed)
    im = Image.new("RGB", (w, h), (255, 255, 255))
    d = _draw(im)
    words: list[str] = []
    rh = int(px * 1.9)
    cw = int(px * 9)
    f = font(SANS, px)
    d.rectangle([0, 0, w, rh], fill=(233, 236, 240))
    for y in range(0, h, rh):
        d.line([0, y, w, y], fill=(205, 208, 212))
    for x in range(0, w, cw):
        d.line([x, 0, x, h], fill=(205, 208, 212))
    for r, y in enumerate(range(0, h - rh, rh)):
        for x in range(0, w - cw, cw):
            if r and rng.random() < 0.5:
                v = f"{rng.integers(10, 99999)}"
            else:
                v = _phrase(rng, 1)[0]
            if d.textlength(v, font=f) < cw - 6:
                d.text((x + 4, y + (rh - px) // 2), v, font=f, fill=(20, 20, 20))
                words.append(v)
    return im, d.boxes


def document(w: int, h: int, px: int, seed: int) -> tuple[Image.Image, list[str]]:
    rng = np.random.default_rng(seed)
    im = Image.new("RGB", (w, h), (255, 255, 255))
    d = _draw(im)
    words: list[str] = []
    m = w // 9
    head = _phrase(rng, 4)
    d.text((m, m // 2), " ".join(head), font=font(SERIF, int(px * 1.8)), fill=(0, 0, 0))
    words.extend(head)
    _lines(d, rng, (m, m // 2 + px * 4, w - m, h - m), px, SERIF, (10, 10, 10), words, 1.45, (8, 14))
    return im, d.boxes


def scan(w: int, h: int, px: int, seed: int) -> tuple[Image.Image, list[str]]:
    """A document page as a scanner delivers it: grey paper, slight blur, noise, a tilt."""
    im, words = document(w, h, px, seed)
    rng = np.random.default_rng(seed + 100)
    im = im.rotate(0.4, resample=Image.Resampling.BICUBIC, fillcolor=(255, 255, 255))
    im = im.filter(ImageFilter.GaussianBlur(0.6))
    a = np.asarray(im).astype(np.float32) * 0.9 + 12
    a += rng.normal(0, 6, a.shape).astype(np.float32)
    return Image.fromarray(np.clip(a, 0, 255).astype(np.uint8)), words


def phone(w: int, h: int, px: int, seed: int) -> tuple[Image.Image, list[str]]:
    rng = np.random.default_rng(seed)
    im = Image.new("RGB", (w, h), (255, 255, 255))
    d = _draw(im)
    words: list[str] = []
    d.rectangle([0, 0, w, px * 5], fill=(245, 245, 247))
    t = _phrase(rng, 2)
    d.text((px, px * 2), " ".join(t), font=font(SANS_BOLD, int(px * 1.3)), fill=(0, 0, 0))
    words.extend(t)
    y = px * 6
    while y + px * 4 < h:  # chat bubbles / list cells
        d.rounded_rectangle([px, y, w - px, y + px * 4], px, fill=(233, 233, 235))
        ws = _phrase(rng, 6)
        line = " ".join(ws)
        while ws and d.textlength(line, font=font(SANS, px)) > w - 4 * px:
            ws = ws[:-1]
            line = " ".join(ws)
        d.text((2 * px, y + int(px * 1.4)), line, font=font(SANS, px), fill=(20, 20, 20))
        words.extend(ws)
        y += px * 5
    return im, d.boxes


def cjk(w: int, h: int, px: int, seed: int) -> tuple[Image.Image, list[str]]:
    """A UI pane of Chinese text (dense square glyphs)."""
    rng = np.random.default_rng(seed)
    im = Image.new("RGB", (w, h), (252, 252, 252))
    d = _draw(im)
    words: list[str] = []
    f = font(CJK, px)
    d.rectangle([0, 0, w, px * 3], fill=(40, 44, 52))
    y = px * 4
    n = len(CJK_TEXT)
    while y + px * 1.5 < h:
        k = int(rng.integers(8, max(9, (w - 2 * px) // px)))
        s = int(rng.integers(0, n))
        line = "".join(CJK_TEXT[(s + i) % n] for i in range(k))
        d.text((px, y), line, font=f, fill=(20, 20, 20))
        words.append(line)
        y += int(px * 1.7)
    return im, d.boxes


def photo(w: int, h: int, seed: int) -> Image.Image:
    """Photographic content: smooth shading, edges, fine texture (no text)."""
    from image_corpus import photo_array
    return Image.fromarray(photo_array(w, h, seed))


def captioned(w: int, h: int, px: int, seed: int) -> tuple[Image.Image, list[str]]:
    rng = np.random.default_rng(seed)
    im = photo(w, h, seed)
    d = _draw(im)
    words = _phrase(rng, 5)
    f = font(SANS_BOLD, px)
    tw = d.textlength(" ".join(words), font=f)
    y = h - px * 3
    d.rectangle([0, y - px // 2, w, h], fill=(0, 0, 0))
    d.text(((w - tw) / 2, y), " ".join(words), font=f, fill=(255, 255, 255))
    return im, d.boxes


def samples(per_class: int = 3) -> list[Sample]:
    """The corpus: a few images per class (``per_class`` caps it for the CI subset)."""
    out: list[Sample] = []

    def add(cls, name, im, boxes, fmt="png", q=90, lang="eng", px=0.0):
        data = _png(im) if fmt == "png" else _jpeg(im, q)
        out.append(Sample(cls, name, data, "image/png" if fmt == "png" else "image/jpeg", [w for w, _ in boxes],
                          boxes, lang, px))

    def take(cls, items):
        for it in items[:per_class]:
            it()

    take("ui_1080", [lambda px=px, s=s: add("ui_1080", f"ui_1080_{px}px", *ui(1920, 1080, px, s), px=px)
                     for px, s in ((13, 1), (11, 2), (16, 3))])
    take("ui_1440", [lambda px=px, s=s: add("ui_1440", f"ui_1440_{px}px", *ui(2560, 1440, px, s, SERIF if s % 2 else SANS), px=px)
                     for px, s in ((14, 4), (12, 5), (10, 6))])
    take("hidpi", [lambda px=px, s=s: add("hidpi", f"hidpi_2880_{px}px", *ui(2880, 1800, px, s), px=px)
                   for px, s in ((26, 7), (22, 8), (30, 9))])
    take("terminal", [lambda px=px, s=s: add("terminal", f"terminal_{px}px", *terminal(1920, 1080, px, s), px=px)
                      for px, s in ((14, 10), (12, 11), (16, 12))])
    take("dashboard", [lambda px=px, s=s: add("dashboard", f"dashboard_{px}px", *dashboard(1920, 1080, px, s), px=px)
                       for px, s in ((12, 13), (11, 14), (14, 15))])
    take("spreadsheet", [lambda px=px, s=s: add("spreadsheet", f"sheet_{px}px", *spreadsheet(1920, 1080, px, s), px=px)
                         for px, s in ((13, 16), (12, 17), (15, 18))])
    take("document", [lambda px=px, s=s: add("document", f"doc_{px}px", *document(1240, 1754, px, s), px=px)
                      for px, s in ((20, 19), (17, 20), (24, 21))])
    take("scan", [lambda px=px, s=s: add("scan", f"scan_{px}px", *scan(1654, 2339, px, s), "jpeg", 75, px=px)
                  for px, s in ((27, 22), (23, 23), (32, 24))])
    take("phone", [lambda px=px, s=s: add("phone", f"phone_{px}px", *phone(1170, 2532, px, s), px=px)
                   for px, s in ((44, 25), (40, 26), (50, 27))])
    take("cjk", [lambda px=px, s=s: add("cjk", f"cjk_{px}px", *cjk(1920, 1080, px, s), lang="chi_sim", px=px)
                 for px, s in ((16, 28), (14, 29), (18, 30))])
    take("photo", [lambda s=s, wh=wh: add("photo", f"photo_{wh[0]}x{wh[1]}", photo(*wh, s), [], "jpeg", 90)
                   for s, wh in ((31, (4000, 3000)), (32, (3024, 4032)), (33, (2048, 1536)))])
    take("photo_caption", [lambda px=px, s=s: add("photo_caption", f"caption_{px}px", *captioned(1920, 1280, px, s), "jpeg", 90, px=px)
                           for px, s in ((40, 34), (32, 35), (48, 36))])
    return out
