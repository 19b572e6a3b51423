#!/usr/bin/env bash
# On the device: start SGLang 0.5.16 detached (it outlives the call) with dummy weights, the
# runbook's flags and one CUDA graph configuration, then optionally wait until /health answers.
#   eager      CUDA graphs off: --cuda-graph-backend-decode disabled --cuda-graph-backend-prefill
#              disabled (what the deprecated --disable-cuda-graph sets in 0.5.16)
#   cudagraph  SGLang's defaults: decode graph "full" (max bs 256 on an H200 at TP 1), prefill
#              graph "breakable" on CUDA
#   seed000    seed 000's flags: --cuda-graph-backend-decode full --cuda-graph-backend-prefill
#              disabled --cuda-graph-max-bs-decode $MAX_BS (1 there: its highest concurrency)
# Usage: MODEL_DIR=/root/models/llama8b [PORT=30000] [WAIT_S=300] [MAX_BS=1] [CUDA_VISIBLE_DEVICES=0]
#        bash scripts/device/serve-sglang.sh eager|cudagraph|seed000 [more sglang flags ...]
# Writes /root/sglang-CONFIG.log and /root/sglang.pid. Liveness: kill -0 "$(cat /root/sglang.pid)".
set -euo pipefail
config=${1:?usage: serve-sglang.sh eager|cudagraph|seed000 [extra launch_server flags]}
shift
model=${MODEL_DIR:?set MODEL_DIR to the model directory}
port=${PORT:-30000}
site=${SGLANG_SITE:-/root/site-sglang}
case "$config" in
  eager) graph=(--cuda-graph-backend-decode disabled --cuda-graph-backend-prefill disabled) ;;
  cudagraph) graph=() ;;
  seed000) graph=(--cuda-graph-backend-decode full --cuda-graph-backend-prefill disabled
                  --cuda-graph-max-bs-decode "${MAX_BS:-1}") ;;
  *) echo "unknown configuration '$config' (eager | cudagraph | seed000)" >&2; exit 2 ;;
esac
log=/root/sglang-$config.log
# PYTHONPATH is SGLang's site only: /root/site (vLLM) would bring its own pins along.
PYTHONPATH=$site PATH=$site/bin:$PATH setsid nohup python3 -m sglang.launch_server --model-path "$model" \
  --load-format dummy --host 127.0.0.1 --port "$port" --enable-metrics --mem-fraction-static 0.85 \
  --context-length 16384 "${graph[@]}" "$@" > "$log" 2>&1 < /dev/null &
pid=$!
echo "$pid" > /root/sglang.pid
echo "sglang $config pid $pid port $port log $log"
end=$(( $(date +%s) + ${WAIT_S:-0} ))
while [ "$(date +%s)" -lt "$end" ]; do
  kill -0 "$pid" 2>/dev/null || { echo "server exited"; tail -n 40 "$log"; exit 1; }
  if python3 -c "import urllib.request as u; u.urlopen('http://127.0.0.1:$port/health', timeout=2)" 2>/dev/null; then
    python3 - "$port" <<'EOF'
import json, sys, urllib.request as u
info = json.load(u.urlopen(f"http://127.0.0.1:{sys.argv[1]}/server_info", timeout=10))
print(json.dumps({k: info.get(k) for k in ("version", "attention_backend", "cuda_graph_config",
                                           "disable_cuda_graph", "max_total_num_tokens", "max_req_input_len",
                                           "chunked_prefill_size", "mem_fraction_static")}))
EOF
    exit 0
  fi
  sleep 5
done
[ "${WAIT_S:-0}" = 0 ] || { echo "not healthy after ${WAIT_S}s"; tail -n 20 "$log"; exit 1; }
