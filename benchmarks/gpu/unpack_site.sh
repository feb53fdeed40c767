#!/usr/bin/env bash
# On the GPU machine: unpack the pieces of prepare_site.sh (gathered in STAGE) into $SITE
# (default /root/vllm-site) and the model folder into STAGE/x/model, where start_engines.sh
# finds both (it skips its own install when $SITE/.done exists). Python's lzma: no xz binary needed.
# Usage: unpack_site.sh STAGE
set -euo pipefail
S=$1; SITE=${SITE:-/root/vllm-site}
[ -f "$SITE/.done" ] && { echo "site already unpacked"; exit 0; }
mkdir -p "$S/x" /root/unpack
cat "$S"/gpu-site.part.* | python3 -c "
import sys, tarfile
tarfile.open(fileobj=sys.stdin.buffer, mode='r|xz').extractall('/root/unpack')"
rm -rf "$SITE" "$S/x/model"
mv /root/unpack/site "$SITE"; mv /root/unpack/site-model "$S/x/model"
echo "site unpacked: $(du -sh "$SITE" | cut -f1)"
