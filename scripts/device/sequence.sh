#!/usr/bin/env bash
# One hold, several studies, one after another (started detached by step.sh when hold.env sets
# SEQUENCE to this file; runs from /root/snap with PYTHONPATH = the vLLM site + servelab's lib and
# DEADLINE_S = the hold's time left). The studies come from hold.env's STEPS (stage.sh writes it from
# the environment): "STUDY[:GROUPS] ...", e.g. STEPS="h200-smollm2-load h200-arch-holdout:0,1", each
# run by drive.py with the time left; a step that would start with less than MIN_S left is skipped.
set -uo pipefail
# shellcheck disable=SC1091
source "${DEVICE_ROOT:-/root}/hold.env"
end=$(( $(date +%s) + ${DEADLINE_S:?} ))
left() { echo $(( end - $(date +%s) )); }
say() { echo "[sequence $(date -u +%H:%M:%S), $(left) s left] $*"; }
for s in ${STEPS:?hold.env sets no STEPS}; do
  study=${s%%:*}; groups=""
  [ "$s" != "$study" ] && groups="--groups ${s#*:}"
  if [ "$(left)" -lt "${MIN_S:-240}" ]; then say "$s skipped: $(left) s left"; continue; fi
  say "$s"
  # shellcheck disable=SC2086
  python3 scripts/device/drive.py "params/$study.yaml" --deadline-s "$(left)" $groups
done
say "sequence end"
