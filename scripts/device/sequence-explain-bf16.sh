#!/usr/bin/env bash
# A short hold (2026-12-03, the second of the day): SGLang's bf16 reference and the fp8 fix in one hold
# (params/h200-moe-explain.yaml group 2), after the first hold's machine went away before the fix ran.
set -uo pipefail
say() { echo "[sequence $(date -u +%H:%M:%S)] $*"; }
say "explain group 2"
python3 scripts/device/drive.py params/h200-moe-explain.yaml --deadline-s "${DEADLINE_S:?}" --groups 2
say "sequence end"
