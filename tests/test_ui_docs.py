"""The documentation stays true to the code: docs/CONFIG.md is generated from the
config model and must be current; every key of the model appears in it."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import typing
from pathlib import Path

from vlm_gateway import docgen
from vlm_gateway.config import GatewayConfig

ROOT = Path(__file__).resolve().parent.parent


def all_keys(cls=GatewayConfig, prefix=""):
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        tp, args = hints[f.name], typing.get_args(hints[f.name])
        if dataclasses.is_dataclass(tp):
            yield from all_keys(tp, f"{prefix}{f.name}.")
        elif typing.get_origin(tp) is list and args and dataclasses.is_dataclass(args[0]):
            yield from all_keys(args[0], f"{prefix}{f.name}[].")
        else:
            yield f"{prefix}{f.name}"


def test_config_doc_is_current():
    r = subprocess.run([sys.executable, "-m", "vlm_gateway.docgen", "--check"], cwd=ROOT,
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr + "\n(regenerate with: python -m vlm_gateway.docgen)"


def test_config_doc_lists_every_key_with_type_and_default():
    text = docgen.render()
    for key in all_keys():
        line = next((ln for ln in text.splitlines() if ln.startswith(f"| `{key}` |")), None)
        assert line is not None, f"{key} missing from the configuration reference"
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert cells[1] and cells[2], f"{key}: type or default missing: {line}"


def test_comments_of_config_py_are_carried_over():
    text = docgen.render()
    assert "Bodies above this are refused with 413 before they are parsed." in text
    assert "`VLM_GATEWAY_IMAGES__MAX_LONG_SIDE`" in text


def test_docs_link_targets_exist():
    for doc in (ROOT / "docs").glob("*.md"):
        for target in __import__("re").findall(r"\]\((?!https?:|#|mailto:)([^)#\s]+)", doc.read_text()):
            assert (doc.parent / target).exists(), f"{doc.name} links to missing {target}"
