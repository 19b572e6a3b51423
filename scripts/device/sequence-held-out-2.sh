#!/usr/bin/env bash
# One hold, two steps (started detached by step.sh when hold.env sets SEQUENCE to this file; runs
# from /root/snap with PYTHONPATH = the vLLM site + servelab's lib, DEADLINE_S = the hold's time left).
# No calibration: the predictions use the committed entry nvidia-h200-2026-12-02, so every run's
# prediction.json (written before its first request) predicts from data older than the hold.
#   1. params/h200-perfmodel.yaml group 1: two shapes added after that calibration (a dense Llama-3.1-8B,
#      the MLA MoE DeepSeek-V2-Lite), vLLM 0.26.0 with CUDA graphs, c = 1, 8, 32;
#   2. params/h200-moe-explain.yaml group 2: SGLang's bf16 reference, the fp8 fix again and the Triton
#      backend, in one hold (the fix was compared with a bf16 of another hold before).
set -uo pipefail
end=$(( $(date +%s) + ${DEADLINE_S:?} ))
left() { echo $(( end - $(date +%s) )); }
say() { echo "[sequence $(date -u +%H:%M:%S), $(left) s left] $*"; }
say "perfmodel group 1"
python3 scripts/device/drive.py params/h200-perfmodel.yaml --deadline-s "$(left)" --groups 1
say "explain group 2"
python3 scripts/device/drive.py params/h200-moe-explain.yaml --deadline-s "$(left)" --groups 2
say "sequence end"
