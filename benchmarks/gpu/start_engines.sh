#!/usr/bin/env bash
# On the GPU machine: install the offline vLLM 0.24 bundle (once) and start N engines,
# one per GPU (or all on GPU 0 with GPU_UTIL=0.4 when SAME_GPU=1), with random weights of
# the Qwen3-VL-2B architecture. Waits until every engine answers /health.
# Usage: start_engines.sh STAGE N [extra vllm args...]   (STAGE holds bundle.part.NN pieces)
# Each engine's pid (= its process group) goes to /root/vllm-PORT.pid.
# API_SERVERS=K starts each engine as `vllm serve MODEL --api-server-count K` (the CLI entry
# point; only it honours --api-server-count: `python -m vllm.entrypoints.openai.api_server`
# parses the flag and still runs one API server, whose one renderer thread preprocesses every
# image). Unset: the api_server module, as in the earlier runs.
set -u
S=$1; N=$2; shift 2
SITE=${SITE:-/root/vllm-site}
if [ ! -f "$SITE/.done" ]; then
  mkdir -p "$S/x" && cat "$S"/bundle.part.* | tar -C "$S/x" -xf - || exit 1
  python3 -m pip install -q --no-index --no-deps --no-compile --target "$SITE" \
    "$S"/x/vllm-0.24.0-*.whl "$S"/x/deps/*.whl && touch "$SITE/.done" || exit 1
fi
export PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH} VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=0
pids=()
for i in $(seq 0 $((N - 1))); do
  port=$((8000 + i)); gpu=$i
  [ "${SAME_GPU:-0}" = 1 ] && gpu=0
  # an engine this script started on that port before (a restart with other flags): stop its
  # process group, found by the recorded pid, and wait until it is gone (its GPU memory freed)
  if [ -s /root/vllm-$port.pid ]; then
    old=$(cat /root/vllm-$port.pid)
    if kill -0 "$old" 2>/dev/null; then
      kill -TERM -- "-$old" 2>/dev/null
      for _ in $(seq 1 120); do kill -0 "$old" 2>/dev/null || break; sleep 0.25; done
      kill -KILL -- "-$old" 2>/dev/null
      sleep 1
    fi
    rm -f /root/vllm-$port.pid
  fi
  if [ -n "${API_SERVERS:-}" ]; then
    entry=(python3 -m vllm.entrypoints.cli.main serve "$S/x/model" --api-server-count "$API_SERVERS")
  else
    entry=(python3 -m vllm.entrypoints.openai.api_server --model "$S/x/model")
  fi
  CUDA_VISIBLE_DEVICES=$gpu setsid "${entry[@]}" \
    --served-model-name qwen3vl --load-format dummy --dtype bfloat16 --max-model-len 16384 \
    --gpu-memory-utilization "${GPU_UTIL:-0.85}" --limit-mm-per-prompt '{"image": 4, "video": 2}' \
    --enable-prefix-caching --enable-prompt-tokens-details --skip-mm-profiling \
    --host 127.0.0.1 --port "$port" "$@" > /root/vllm-$port.log 2>&1 &
  pids+=($!)
  echo $! > /root/vllm-$port.pid   # the engine's process group (setsid): for CPU sampling and stopping
done
for _ in $(seq 1 290); do
  up=0
  for i in $(seq 0 $((N - 1))); do
    curl -sf "http://127.0.0.1:$((8000 + i))/health" >/dev/null && up=$((up + 1))
    kill -0 "${pids[$i]}" 2>/dev/null || { echo "engine $i died:"; tail -30 /root/vllm-$((8000 + i)).log; exit 1; }
  done
  [ "$up" = "$N" ] && { echo "$N engine(s) up"; exit 0; }
  sleep 2
done
echo "engines not healthy in time"; tail -20 /root/vllm-8000.log; exit 1
