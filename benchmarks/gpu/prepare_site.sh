#!/usr/bin/env bash
# Here (with PyPI access): turn the offline vLLM bundle of ../shared/gpu/prepare_bundle.sh into
# one installed site-packages folder for Python 3.12, compressed with xz and cut into pieces
# that each travel in one device call. 8 bundle pieces (380 MB of wheels: the vLLM wheel is
# deflate-compressed) become 3 (157 MB: xz over the unpacked .so files), and the GPU machine
# unpacks instead of running pip (unpack_site.sh).
# Usage: prepare_site.sh BUNDLE_DIR OUT_DIR   (BUNDLE_DIR: the parts/ folder of prepare_bundle.sh)
set -euo pipefail
bundle=$1; out=$2; tmp=$(mktemp -d)
cat "$bundle"/*/bundle.part.* | tar -C "$tmp" -xf -
python3 -m pip install -q --no-deps --no-compile --target "$tmp/site" --only-binary=:all: \
  --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 \
  --platform manylinux_2_31_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform any "$tmp"/vllm-0.24.0-*.whl "$tmp"/deps/*.whl
touch "$tmp/site/.done"
mv "$tmp/model" "$tmp/site-model"
mkdir -p "$out"; rm -rf "${out:?}"/*
tar -C "$tmp" -cf - site site-model | xz -T2 -7 | (cd "$out" && split -b 55m -d - gpu-site.part.)
(cd "$out" && for p in gpu-site.part.*; do mkdir -p "${p##*.}" && mv "$p" "${p##*.}/"; done)
rm -rf "$tmp"; du -sh "$out"/*
