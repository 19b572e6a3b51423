#!/usr/bin/env bash
# Here, before a hold: lay out what the device calls carry under CHECKOUT/.gpu (the checkout that
# the device tool sends, with .gpu/ excluded from git), for scripts/device/step.sh:
#   .gpu/bin     step.sh + hold.env          (every call)
#   .gpu/code    this branch's lib, scripts, params, notebooks, pyproject.toml + prompts/ (every call)
#   .gpu/boot    the zstandard wheel          (first call only: the device may lack the zstd tool)
#   .gpu/parts   the packed streams split to fit: 64 MiB per call minus the checkout's working tree,
#                .gpu/bin and .gpu/code (and the boot wheel in the first call), minus a margin
# Usage: scripts/device/stage.sh CHECKOUT STUDY HOLD_S [PROMPTS_DIR]
#   (the streams: scripts/device/pack.py .gpu/packed --stream v ... --stream s ..., made first;
#   ORDER=v for a hold without SGLang)
set -euo pipefail
wt=$(cd "$(dirname "$0")/../.." && pwd)
co=${1:?CHECKOUT}; study=${2:?STUDY}; hold=${3:?HOLD_S}; prompts=${4:-$wt/lib/servelab/data/prompts}
grep -qx '/.gpu/' "$co/.git/info/exclude" 2>/dev/null || echo '/.gpu/' >> "$co/.git/info/exclude"
rm -rf "$co/.gpu/bin" "$co/.gpu/code" "$co/.gpu/boot" "$co/.gpu/parts"  # never .gpu itself: CHECKOUT may be this worktree, whose .gpu holds the wheels
mkdir -p "$co/.gpu/bin" "$co/.gpu/code" "$co/.gpu/boot" "$co/.gpu/parts"
cp "$wt/scripts/device/step.sh" "$co/.gpu/bin/"
(cd "$wt" && cp -r lib scripts params notebooks pyproject.toml "$co/.gpu/code/")
find "$co/.gpu/code" -name __pycache__ -prune -exec rm -rf {} +
rm -f "$co/.gpu/code/params/gm-local-test.yaml"
cp -r "$prompts" "$co/.gpu/code/prompts"
cp "$wt"/.gpu/sglang-wheels/zstandard-*-cp312-*.whl "$co/.gpu/boot/"
tree_b=$(cd "$co" && { git ls-files -z; git ls-files -z --others --exclude-standard; } | xargs -0 stat -c %s 2>/dev/null | awk '{s+=$1} END {print s}')
extra_b=$(du -cb "$co/.gpu/bin" "$co/.gpu/code" | tail -1 | cut -f1)
boot_b=$(du -cb "$co/.gpu/boot" | tail -1 | cut -f1)
part_mib=$(python3 -c "print(int((64 * 2**20 - $tree_b - $extra_b - ${MARGIN_MIB:-4} * 2**20) / 2**20))")
first_mib=$(python3 -c "print(int((64 * 2**20 - $tree_b - $extra_b - $boot_b - ${MARGIN_MIB:-4} * 2**20) / 2**20))")
echo "working tree $((tree_b / 1048576)) MiB, bin+code $((extra_b / 1024)) KiB, boot $((boot_b / 1024)) KiB -> parts of $part_mib MiB (first $first_mib)"
python3 "$wt/scripts/device/pack.py" "$wt/.gpu/packed" --split "$part_mib" --first-mib "$first_mib" --order "${ORDER:-v,s}" > /dev/null
ln "$wt"/.gpu/packed/parts/* "$co/.gpu/parts/" 2>/dev/null || cp "$wt"/.gpu/packed/parts/* "$co/.gpu/parts/"
nv=$(find "$co/.gpu/parts" -name 'v[0-9][0-9]' | wc -l); ns=$(find "$co/.gpu/parts" -name 's[0-9][0-9]' | wc -l)
cat > "$co/.gpu/bin/hold.env" <<EOF
STUDY=$study
SEQUENCE=${SEQUENCE:-}
STEPS="${STEPS:-}"
CALIBRATE="${CALIBRATE:-}"
HOLD_S=$hold
START_S=${START_S:-90}
MARGIN_S=${MARGIN_S:-100}
NPARTS_V=$nv
NPARTS_S=$ns
EOF
cat "$co/.gpu/bin/hold.env"
ls -l "$co/.gpu/parts" | tail -n +2
