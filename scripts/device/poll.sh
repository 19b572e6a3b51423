#!/usr/bin/env bash
# On the device: wait up to $1 seconds while drive.py works (return early when it has ended),
# then pack what it measured into $OUT (the device tool brings $OUT back).
set -u
study=${2:-h200-llama8b-vllm}
end=$(( $(date +%s) + ${1:-500} ))
while [ "$(date +%s)" -lt "$end" ]; do
  grep -q "drive end" "runs/$study/device-progress.log" 2>/dev/null && break
  sleep 5
done
tail -n 40 "runs/$study/device-progress.log" 2>/dev/null
nvidia-smi --query-gpu=index,name,memory.used,utilization.gpu --format=csv,noheader 2>/dev/null
if [ -n "${OUT:-}" ] && [ -d "runs/$study" ]; then
  tar czf "$OUT/runs.tgz" --exclude='*.input.ipynb' "runs/$study"
  cp /root/drive.log "$OUT/drive.log" 2>/dev/null || true
  ls -la "$OUT"
fi
