"""Image rewriting: safe fetch, safe decode, border trim, token-grid downscale,
deterministic re-encode, L1 cache. The chain stage lives in ``stage.py``; the
pure CPU pipeline (``rewrite_bytes``) is usable on its own (playground, bench)."""

from .policy import Policy
from .rewrite import Rewritten, rewrite_bytes

__all__ = ["Policy", "Rewritten", "rewrite_bytes"]
