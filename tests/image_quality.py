"""Quality yardstick for the rewrite: a float64 Lanczos-3 reference resize and PSNR.

Used by the tests (the >= 31 dB gate), the benchmark and the playground; never on
the request path (the reference is slow on purpose: exact, separable, float64).
"""

from __future__ import annotations

import math

import numpy as np


def _lanczos(x: np.ndarray, a: int = 3) -> np.ndarray:
    out = np.sinc(x) * np.sinc(x / a)
    out[np.abs(x) >= a] = 0.0
    return out


def _weights(src: int, dst: int, a: int = 3) -> np.ndarray:
    """dst x src matrix of an antialiased Lanczos resample (support widened by the scale)."""
    scale = src / dst
    support = max(scale, 1.0)
    centers = (np.arange(dst) + 0.5) * scale - 0.5
    idx = np.arange(src)
    w = _lanczos((idx[None, :] - centers[:, None]) / support, a)
    w /= w.sum(axis=1, keepdims=True)
    return w


def lanczos_reference(rgb: np.ndarray, width: int, height: int) -> np.ndarray:
    """Resize an HxWx3 array to height x width in float64 (values not clipped)."""
    src = rgb.astype(np.float64)
    wy = _weights(src.shape[0], height)
    wx = _weights(src.shape[1], width)
    out = np.empty((height, width, src.shape[2]), np.float64)
    for c in range(src.shape[2]):
        out[:, :, c] = wy @ src[:, :, c] @ wx.T
    return out


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    """Peak signal-to-noise ratio in dB of two same-shaped images on a 0..255 scale."""
    diff = np.clip(a.astype(np.float64), 0, 255) - np.clip(b.astype(np.float64), 0, 255)
    mse = float(np.mean(diff * diff))
    return math.inf if mse == 0 else 10.0 * math.log10(255.0 * 255.0 / mse)
