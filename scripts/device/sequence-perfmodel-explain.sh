#!/usr/bin/env bash
# One hold, several steps (started detached by step.sh when hold.env sets SEQUENCE to this file; runs
# from /root/snap with PYTHONPATH = the vLLM site + servelab's lib, DEADLINE_S = the hold's time left):
#   1. servelab calibrate-hw: micro-benchmarks of the H200 and the vLLM calibration models (dense, moe,
#      mla; 2/4/8 layers, CUDA graphs and eager: 18 servers), all started at once, measured one at a time;
#      the entry lands in lib/servelab/data/calibrations/ of this snapshot, so every later run's
#      prediction.json (written before its first request) uses it;
#   2. the SGLang fp8-KV follow-up's first group (params/h200-moe-explain.yaml: bf16, fp8 as published,
#      fp8 with the FlashMLA backend);
#   3. the performance model's held-out shape and a second dense shape (params/h200-perfmodel.yaml);
#   4. the follow-up's second group (the KV pool sweep and the Triton backend).
# Each step gets what is left of the deadline; drive.py skips what is complete.
set -uo pipefail
end=$(( $(date +%s) + ${DEADLINE_S:?} ))
left() { echo $(( end - $(date +%s) )); }
say() { echo "[sequence $(date -u +%H:%M:%S), $(left) s left] $*"; }
say "calibrate-hw"
python3 -m servelab.cli calibrate-hw --id nvidia-h200-2026-12-02 --kinds dense,moe,mla --layers 2,4,8 \
  --modes graphs,eager --concurrent 18 --port-base 8600 2>&1 | tail -n 40
say "calibrate-hw, deeper models (until the GPU leaves vLLM's CPU-side step floor)"
python3 -m servelab.cli calibrate-hw --id nvidia-h200-2026-12-02-deep --add-to nvidia-h200-2026-12-02 \
  --kinds dense,moe,mla --layers 16,32,64 --modes graphs --concurrent 9 --port-base 8700 2>&1 | tail -n 40
say "explain group 0"
python3 scripts/device/drive.py params/h200-moe-explain.yaml --deadline-s "$(left)" --groups 0
say "perfmodel"
python3 scripts/device/drive.py params/h200-perfmodel.yaml --deadline-s "$(left)"
say "explain group 1"
python3 scripts/device/drive.py params/h200-moe-explain.yaml --deadline-s "$(left)" --groups 1
say "sequence end"
