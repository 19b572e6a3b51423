#!/usr/bin/env bash
# One hold, several steps, one after another (started detached by step.sh when hold.env sets
# SEQUENCE to this file; runs from /root/snap with PYTHONPATH = the vLLM site + servelab's lib and
# DEADLINE_S = the hold's time left). hold.env (stage.sh writes it from the environment) names them:
#   CALIBRATE  optional: `servelab calibrate-hw` passes run first, their arguments separated by ";",
#              e.g. CALIBRATE="--id nvidia-h200-2026-12-02 --kinds dense,moe,mla --layers 2,4,8
#              --modes graphs,eager --concurrent 18 --port-base 8600; --id nvidia-h200-2026-12-02-deep
#              --add-to nvidia-h200-2026-12-02 --kinds dense,moe,mla --layers 16,32,64 --modes graphs
#              --concurrent 9 --port-base 8700" (the entry lands in lib/servelab/data/calibrations/ of
#              the snapshot, so every later run's prediction.json uses it; step.sh packs it);
#   STEPS      the studies: "STUDY[:GROUPS] ...", e.g. STEPS="h200-moe-explain:0 h200-perfmodel
#              h200-moe-explain:1", each run by drive.py with the time left (drive.py skips what is
#              complete); a step that would start with less than MIN_S left is skipped.
# The holds of 2026-12-02 and 2026-12-03 ran, in these terms: CALIBRATE as above with STEPS=
# "h200-moe-explain:0 h200-perfmodel h200-moe-explain:1"; STEPS="h200-perfmodel:1 h200-moe-explain:2"
# (no calibration: predictions from the committed entry); STEPS="h200-perfmodel:2"; STEPS="h200-moe-explain:2".
set -uo pipefail
# shellcheck disable=SC1091
source "${DEVICE_ROOT:-/root}/hold.env"
end=$(( $(date +%s) + ${DEADLINE_S:?} ))
left() { echo $(( end - $(date +%s) )); }
say() { echo "[sequence $(date -u +%H:%M:%S), $(left) s left] $*"; }
IFS=';' read -r -a passes <<< "${CALIBRATE:-}"
for args in "${passes[@]}"; do
  [ -n "${args// }" ] || continue
  say "calibrate-hw $args"
  # shellcheck disable=SC2086
  python3 -m servelab.cli calibrate-hw $args 2>&1 | tail -n 40
done
for s in ${STEPS:?hold.env sets no STEPS}; do
  study=${s%%:*}; groups=""
  [ "$s" != "$study" ] && groups="--groups ${s#*:}"
  if [ "$(left)" -lt "${MIN_S:-240}" ]; then say "$s skipped: $(left) s left"; continue; fi
  say "$s"
  # shellcheck disable=SC2086
  python3 scripts/device/drive.py "params/$study.yaml" --deadline-s "$(left)" $groups
done
say "sequence end"
