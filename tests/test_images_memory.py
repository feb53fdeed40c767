"""The decode memory estimate (stages/images/memory.py) against what decodes really hold:
valid images of every format, mode and conversion (``image_corpus.memory_corpus()``,
3.8 MP each), rewritten and sent at their own size in a fresh interpreter whose every
large block is mapped on its own (tests/bounded.py --legit), libvips included. The
estimate is what the per-image cap (images.max_decode_bytes) and the process bound
refuse on before the library allocates, so it must never be below the real peak; and
it must not be so far above it that valid images are refused for nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/self/clear_refs"), reason="needs Linux /proc")


def test_the_estimate_holds_every_decode_and_is_within_2x_of_it():
    here = os.path.dirname(os.path.abspath(__file__))
    out = subprocess.run([sys.executable, os.path.join(here, "bounded.py"), "--legit", "--max-decode-mb", "0"],
                         capture_output=True, text=True, timeout=600,
                         env={**os.environ, "PYTHONPATH": os.path.dirname(here)})
    assert out.returncode == 0, out.stderr[-3000:]
    results = [json.loads(line) for line in out.stdout.splitlines()]
    assert len(results) >= 50
    for r in results:
        assert r["result"] == "accepted", r
        # a decode that holds nothing at its size (a PNG sent as it came after its CRC scan) holds ~0
        assert r["estimate_mb"] >= r["rss_growth_mb"], r
        assert r["estimate_mb"] <= 2 * r["rss_growth_mb"] + 4, r
