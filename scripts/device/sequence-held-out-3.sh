#!/usr/bin/env bash
# One hold, one step (started detached by step.sh when hold.env sets SEQUENCE to this file; runs
# from /root/snap with PYTHONPATH = the vLLM site + servelab's lib, DEADLINE_S = the hold's time left).
# No calibration: the predictions use the committed entry nvidia-h200-2026-12-02 and the model's
# second version (perfmodel-2), so every run's prediction.json (written before its first request)
# predicts from data and rules older than the hold.
#   params/h200-perfmodel.yaml group 2: Mixtral-8x7B and Llama-2-7B shapes, vLLM 0.26.0 with CUDA
#   graphs, c = 1, 8, 32, two servers on the one GPU.
set -uo pipefail
end=$(( $(date +%s) + ${DEADLINE_S:?} ))
left() { echo $(( end - $(date +%s) )); }
say() { echo "[sequence $(date -u +%H:%M:%S), $(left) s left] $*"; }
say "perfmodel group 2"
python3 scripts/device/drive.py params/h200-perfmodel.yaml --deadline-s "$(left)" --groups 2
say "sequence end"
