#!/usr/bin/env bash
# On the GPU machine: (re)start vlm-gateway on :8080 in front of N engines on 8000.. with a
# routing policy. Runs from the repository copy with the bundle's wheels on PYTHONPATH.
# Usage: start_gateway.sh N POLICY [WORKERS]
# The gateway's pid (= its process group) is kept in $PIDFILE (default /root/gateway.pid);
# a restart stops only that group, never processes found by name.
# TOKENIZER=<served model's tokenizer.json> makes the video token header count the
# "<t seconds>" texts with it (the GPU bundle's model is not Qwen's tokenizer);
# VIDEO_DECODE_THREADS (default 2) sets FFmpeg threads per video decode.
# KEEPALIVE_S sets server.keepalive_interval_s: a stream whose engine takes longer than that to
# answer gets the gateway's own headers and keepalive comments first (api_split.py uses 600, so
# that a client's time to the headers is the engine's, gateway time included).
set -u
N=$1; POLICY=$2; WORKERS=${3:-4}
SITE=${SITE:-/root/vllm-site}
here=$(cd "$(dirname "$0")/../.." && pwd)
PIDFILE=${PIDFILE:-/root/gateway.pid}
# stop the gateway this script started before (its process group, by the recorded pid)
if [ -s "$PIDFILE" ]; then
  old=$(cat "$PIDFILE")
  if kill -0 "$old" 2>/dev/null; then
    kill -TERM -- "-$old" 2>/dev/null || kill -TERM "$old"
    for _ in $(seq 1 40); do kill -0 "$old" 2>/dev/null || break; sleep 0.25; done
    kill -KILL -- "-$old" 2>/dev/null
  fi
  rm -f "$PIDFILE"
fi
cfg=/root/gateway-$POLICY.yaml
{
  echo "server: {port: 8080, workers: $WORKERS${KEEPALIVE_S:+, keepalive_interval_s: $KEEPALIVE_S}}"
  echo "routing: {policy: $POLICY}"
  echo "video: {decode_threads: ${VIDEO_DECODE_THREADS:-2}${TOKENIZER:+, tokenizer: $TOKENIZER}}"
  echo "backends:"
  for i in $(seq 0 $((N - 1))); do
    echo "  - {url: http://127.0.0.1:$((8000 + i))/v1, name: gpu$i, engine: vllm, profile: h200, models: [qwen3vl]}"
  done
} > "$cfg"
# the PNG decode and resize fast paths need pyvips + pyvips-binary (and cffi) among the wheels
PYTHONPATH=$SITE:$here python3 -c "import pyvips" 2>/dev/null ||
  echo "warning: pyvips is not importable: images take the slower Pillow-only path (add pyvips, pyvips-binary, cffi wheels)"
PYTHONPATH=$SITE:$here setsid python3 -m vlm_gateway serve --config "$cfg" > /root/gateway.log 2>&1 &
echo $! > "$PIDFILE"   # setsid: the pid is also the process group of the gateway and its workers
for _ in $(seq 1 60); do
  curl -sf http://127.0.0.1:8080/ready >/dev/null && { echo "gateway up ($POLICY, $N backends)"; exit 0; }
  sleep 0.5
done
echo "gateway did not start"; tail -30 /root/gateway.log; exit 1
