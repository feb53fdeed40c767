"""Colour management to sRGB: what the model sees is what a colour-managed viewer shows.

Engines read pixels as numbers (Pillow's ``convert("RGB")``) and ignore colour
descriptions, so a Display P3 photo (every recent phone) or a CMYK print file
reaches the model with shifted colours unless the gateway converts it.

- ICC profiles (JPEG APP2, PNG iCCP, WebP ICCP, TIFF, AVIF/HEIF ``colr prof``):
  LittleCMS (Pillow's ``ImageCms``), source profile -> built-in sRGB, perceptual
  intent (LittleCMS uses relative colorimetric for matrix/TRC profiles such as
  Display P3, i.e. out-of-gamut colours are clipped, as browsers do). A profile
  that maps a test set of colours (primaries, secondaries, greys) to within 2/255
  of themselves is sRGB in effect: nothing is converted. Transforms are cached per
  profile (digest of its bytes); broken or mismatched profiles are ignored, as
  browsers ignore them.
- ``nclx`` descriptions (AVIF/HEIF without an ICC profile): CICP primaries and
  transfer as numbers, converted here with numpy in row bands (bounded memory):
  linearise (sRGB curve for SDR transfers, gamma 2.2/2.8, linear, PQ, HLG), 3x3
  primaries matrix to BT.709/sRGB (von Kries-free: every supported set has a D65
  white except DCI-P3, which is Bradford-adapted), then for HDR (PQ, HLG) a
  hue-preserving soft knee above 0.75 of SDR white (203 cd/m2, BT.2408), clip, and
  the sRGB curve.
"""

from __future__ import annotations

import hashlib
import io
import struct
import threading

import numpy as np
from PIL import Image, ImageCms

from ...lru import LRU

_SRGB = ImageCms.createProfile("sRGB")
_D65 = (0.3127, 0.3290)
# CICP colour_primaries (ITU-T H.273): red, green, blue, white (CIE xy)
PRIMARIES = {
    1: ((0.640, 0.330), (0.300, 0.600), (0.150, 0.060), _D65),  # BT.709 / sRGB
    5: ((0.640, 0.330), (0.290, 0.600), (0.150, 0.060), _D65),  # BT.470BG
    6: ((0.630, 0.340), (0.310, 0.595), (0.155, 0.070), _D65),  # SMPTE 170M
    9: ((0.708, 0.292), (0.170, 0.797), (0.131, 0.046), _D65),  # BT.2020
    11: ((0.680, 0.320), (0.265, 0.690), (0.150, 0.060), (0.314, 0.351)),  # DCI-P3
    12: ((0.680, 0.320), (0.265, 0.690), (0.150, 0.060), _D65),  # Display P3
}
NAMES = {1: "BT.709", 5: "BT.470BG", 6: "SMPTE-170M", 9: "BT.2020", 11: "DCI-P3", 12: "Display-P3"}
SDR_TRANSFERS = {1, 2, 6, 13, 14, 15}  # BT.709-family and sRGB: decoded with the sRGB curve
PQ, HLG, LINEAR = 16, 18, 8
SDR_WHITE_NITS = 203.0
_KNEE = 0.75
_BAND_PIXELS = 1 << 20


def rgb_to_xyz(primaries) -> np.ndarray:
    """3x3 matrix from linear RGB with these xy primaries and white to CIE XYZ (Y of white = 1)."""
    (rx, ry), (gx, gy), (bx, by), (wx, wy) = primaries
    m = np.array([[rx / ry, gx / gy, bx / by], [1.0, 1.0, 1.0],
                  [(1 - rx - ry) / ry, (1 - gx - gy) / gy, (1 - bx - by) / by]])
    white = np.array([wx / wy, 1.0, (1 - wx - wy) / wy])
    return m * np.linalg.solve(m, white)


_BRADFORD = np.array([[0.8951, 0.2664, -0.1614], [-0.7502, 1.7135, 0.0367], [0.0389, -0.0685, 1.0296]])


def adapt(src_white, dst_white) -> np.ndarray:
    """Bradford chromatic adaptation matrix (XYZ -> XYZ) between two xy whites."""
    def xyz(w):
        return np.array([w[0] / w[1], 1.0, (1 - w[0] - w[1]) / w[1]])
    s, d = _BRADFORD @ xyz(src_white), _BRADFORD @ xyz(dst_white)
    return np.linalg.inv(_BRADFORD) @ np.diag(d / s) @ _BRADFORD


def to_srgb_matrix(primaries) -> np.ndarray:
    m = rgb_to_xyz(primaries)
    if primaries[3] != _D65:
        m = adapt(primaries[3], _D65) @ m
    return np.linalg.inv(rgb_to_xyz(PRIMARIES[1])) @ m


def srgb_decode(v: np.ndarray) -> np.ndarray:
    return np.where(v <= 0.04045, v / 12.92, ((v + 0.055) / 1.055) ** 2.4)


def srgb_encode(v: np.ndarray) -> np.ndarray:
    v = np.clip(v, 0.0, 1.0)
    return np.where(v <= 0.0031308, v * 12.92, 1.055 * np.power(v, 1 / 2.4) - 0.055)


def _pq_to_sdr(v: np.ndarray) -> np.ndarray:
    m1, m2, c1, c2, c3 = 0.1593017578125, 78.84375, 0.8359375, 18.8515625, 18.6875
    p = np.power(v, 1 / m2)
    nits = 10000.0 * np.power(np.maximum(p - c1, 0) / (c2 - c3 * p), 1 / m1)
    return nits / SDR_WHITE_NITS


def _hlg_to_sdr(v: np.ndarray) -> np.ndarray:
    a, b, c = 0.17883277, 0.28466892, 0.55991073
    scene = np.where(v <= 0.5, v * v / 3.0, (np.exp((v - c) / a) + b) / 12.0)
    return scene * (1000.0 / SDR_WHITE_NITS)  # OOTF applied per pixel below (system gamma 1.2)


def _linearise_lut(transfer: int, bits: int = 8) -> np.ndarray:
    v = np.arange(1 << bits, dtype=np.float64) / ((1 << bits) - 1)
    if transfer == PQ:
        return _pq_to_sdr(v)
    if transfer == HLG:
        return _hlg_to_sdr(v)
    if transfer == LINEAR:
        return v
    if transfer == 4:
        return v ** 2.2
    if transfer == 5:
        return v ** 2.8
    return srgb_decode(v)


def _knee(peak: np.ndarray) -> np.ndarray:
    """Scale factor that maps a pixel's peak channel through a soft knee into [0, 1]."""
    over = peak > _KNEE
    out = np.ones_like(peak)
    p = peak[over]
    out[over] = (_KNEE + (1 - _KNEE) * (1 - np.exp(-(p - _KNEE) / (1 - _KNEE)))) / p
    return out


def needs_nclx(nclx: tuple[int, int, int, int] | None) -> bool:
    if nclx is None:
        return False
    prim, trc = nclx[0], nclx[1]
    return (prim in PRIMARIES and prim != 1) or trc in (PQ, HLG, LINEAR, 4, 5)


def describe_nclx(nclx: tuple[int, int, int, int]) -> str:
    trc = {PQ: "PQ", HLG: "HLG", LINEAR: "linear", 4: "gamma2.2", 5: "gamma2.8"}.get(nclx[1], "")
    return "nclx:" + NAMES.get(nclx[0], str(nclx[0])) + (f"/{trc}" if trc else "")


_CURVES = {LINEAR: (1.0,), 4: (2.2,), 5: (2.8,)}


def nclx_to_srgb(im: Image.Image, nclx: tuple[int, int, int, int]) -> Image.Image:
    """An 8-bit RGB image described by ``nclx`` -> sRGB (see the module docstring).
    SDR descriptions go through LittleCMS with a profile built for them (about 4x
    faster than numpy); PQ and HLG need the tone mapping below."""
    prim, trc = nclx[0], nclx[1]
    if trc not in (PQ, HLG):
        icc = icc_profile(PRIMARIES.get(prim, PRIMARIES[1]), _CURVES.get(trc, SRGB_CURVE), f"nclx {prim}/{trc}")
        out, desc = icc_to_srgb(im.convert("RGB"), icc)
        return out
    m = to_srgb_matrix(PRIMARIES.get(prim, PRIMARIES[1])).astype(np.float32)
    lut = _linearise_lut(trc).astype(np.float32)
    hdr = trc in (PQ, HLG)
    a = np.asarray(im.convert("RGB"))
    out = np.empty_like(a)
    band = max(1, _BAND_PIXELS // max(1, a.shape[1]))
    for y in range(0, a.shape[0], band):
        lin = lut[a[y:y + band]] @ m.T
        if trc == HLG:  # BT.2100 OOTF, system gamma 1.2 (1000 cd/m2 display)
            ys = np.maximum(lin @ np.array([0.2627, 0.6780, 0.0593], np.float32), 1e-6)
            lin = lin * np.power(ys * (SDR_WHITE_NITS / 1000.0), 0.2)[..., None]  # ys is in SDR-white units
        if hdr:
            lin = lin * _knee(np.max(lin, axis=-1))[..., None]
        out[y:y + band] = np.rint(srgb_encode(lin) * 255).astype(np.uint8)
    return Image.fromarray(out, "RGB")


# -- ICC ---------------------------------------------------------------------------------

def _s15(v: float) -> bytes:
    return struct.pack(">i", int(round(v * 65536)))


SRGB_CURVE = (2.4, 1 / 1.055, 0.055 / 1.055, 1 / 12.92, 0.04045)


def icc_profile(primaries, curve: tuple[float, ...] = SRGB_CURVE, description: str = "generated") -> bytes:
    """A v4 matrix/TRC display profile: these xy primaries + white and one tone curve
    (ICC parametric: 5 values = type 3, the sRGB form; 1 value = a pure gamma).

    The colorants are Bradford-adapted to the D50 PCS, with a ``chad`` tag, as ICC v4
    asks; LittleCMS reads it like Apple's Display P3 profile (the tests build that
    one with it) and the gateway builds one per nclx description it converts."""
    d50 = (0.3457, 0.3585)
    m = adapt(primaries[3], d50) @ rgb_to_xyz(primaries)
    chad = adapt(primaries[3], d50)

    def xyz(v) -> bytes:
        return b"XYZ \0\0\0\0" + b"".join(_s15(x) for x in v)

    def mluc(text: str) -> bytes:
        s = text.encode("utf-16-be")
        return b"mluc\0\0\0\0" + struct.pack(">II2s2sII", 1, 12, b"en", b"US", len(s), 28) + s

    para = b"para\0\0\0\0" + struct.pack(">HH", 3 if len(curve) == 5 else 0, 0) + b"".join(_s15(v) for v in curve)
    tags = [(b"desc", mluc(description)), (b"cprt", mluc("No copyright, generated test data")),
            (b"wtpt", xyz((0.9642, 1.0, 0.8249))), (b"chad", b"sf32\0\0\0\0" + b"".join(_s15(v) for v in chad.flat)),
            (b"rXYZ", xyz(m[:, 0])), (b"gXYZ", xyz(m[:, 1])), (b"bXYZ", xyz(m[:, 2])),
            (b"rTRC", para), (b"gTRC", para), (b"bTRC", para)]
    table, body = b"", b""
    offset = 128 + 4 + 12 * len(tags)
    for sig, data in tags:
        data += b"\0" * (-len(data) % 4)
        table += struct.pack(">4sII", sig, offset + len(body), len(data))
        body += data
    size = offset + len(body)
    header = (struct.pack(">I4sI4s4s4s", size, b"\0\0\0\0", 0x04300000, b"mntr", b"RGB ", b"XYZ ")
              + struct.pack(">6H", 2026, 1, 1, 0, 0, 0) + b"acsp" + b"\0" * 24 + struct.pack(">I", 0)
              + _s15(0.9642) + _s15(1.0) + _s15(0.8249) + b"\0" * 4 + b"\0" * 16 + b"\0" * 28)
    assert len(header) == 128
    return header + struct.pack(">I", len(tags)) + table + body



_TEST_RGB = Image.frombytes("RGB", (16, 1), bytes([
    255, 0, 0, 0, 255, 0, 0, 0, 255, 255, 255, 0, 0, 255, 255, 255, 0, 255, 255, 255, 255, 0, 0, 0,
    128, 128, 128, 64, 64, 64, 192, 192, 192, 200, 60, 30, 30, 160, 90, 40, 80, 200, 230, 200, 150, 90, 40, 140]))
_TEST_L = Image.frombytes("L", (16, 1), bytes(range(0, 256, 17)))
_lock = threading.Lock()
_CACHE_ENTRIES = 64
# decode threads share it: every access holds _lock
_cache: LRU[tuple[bytes, str], tuple[ImageCms.ImageCmsTransform | None, str]] = LRU(max_entries=_CACHE_ENTRIES)
_SPACES = {"RGB": b"RGB ", "RGBA": b"RGB ", "CMYK": b"CMYK", "L": b"GRAY"}


def _build(icc: bytes, mode: str) -> tuple[ImageCms.ImageCmsTransform | None, str]:
    if len(icc) < 128 or icc[16:20] != _SPACES.get(mode):
        return None, ""  # a profile for another colour space than the pixels: ignored, as browsers do
    try:
        prof = ImageCms.ImageCmsProfile(io.BytesIO(icc))
        desc = (ImageCms.getProfileDescription(prof) or "").strip() or "ICC"
        t = ImageCms.buildTransform(prof, _SRGB, mode, "RGB", ImageCms.Intent.PERCEPTUAL,
                                    flags=ImageCms.Flags.NOCACHE)  # NOCACHE: shared across threads
        if mode in ("RGB", "L"):
            test = _TEST_RGB if mode == "RGB" else _TEST_L
            got = np.asarray(ImageCms.applyTransform(test, t)).astype(int)
            want = np.asarray(test.convert("RGB")).astype(int)
            if np.abs(got - want).max() <= 2:
                return None, desc  # sRGB in effect
        return t, desc
    except (ImageCms.PyCMSError, OSError, ValueError, TypeError):
        return None, ""


def icc_transform(icc: bytes, mode: str) -> tuple[ImageCms.ImageCmsTransform | None, str]:
    """(transform to sRGB or None when the profile is sRGB in effect / unusable, description)."""
    key = (hashlib.blake2b(icc, digest_size=16).digest(), mode)
    with _lock:
        hit = _cache.get(key)
    if hit is not None:
        return hit
    value = _build(icc, mode)
    with _lock:
        _cache.put(key, value)
    return value


def icc_to_srgb(im: Image.Image, icc: bytes) -> tuple[Image.Image, str | None]:
    """``im`` (RGB, CMYK or L) in sRGB, and a description when a conversion happened."""
    t, desc = icc_transform(icc, im.mode)
    if t is None:
        return im, None
    return ImageCms.applyTransform(im, t), desc
