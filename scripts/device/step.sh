#!/usr/bin/env bash
# On the device: one idempotent step of a hold whose calls all run the same command, so that the
# calls can follow each other within the machine's 30 s idle window (docs/gpu.md, "One command").
# Each call carries .gpu/bin (this script, hold.env), .gpu/code (the branch's lib, scripts, params,
# notebooks, prompts) and at most one part of the packed streams (scripts/device/pack.py):
#   bash .gpu/bin/step.sh step        move the carried part to /root/parts; when a stream is
#                                     complete, unpack and install it in the background (v: vLLM and
#                                     servelab's device wheels -> /root/site; s: SGLang ->
#                                     /root/site-sglang, with the shared wheels from v); once v is
#                                     installed, snapshot .gpu/code to /root/snap and start drive.py
#                                     detached with the hold's remaining time as its deadline
#   bash .gpu/bin/step.sh poll N      step, then wait up to N s (until drive.py ends), then pack
#                                     runs/$STUDY and the logs into $OUT
# hold.env: STUDY, HOLD_S (device time left at the first call), START_S (the machine's start
# before the first call), MARGIN_S (kept for the last fetch), NPARTS_V, NPARTS_S.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=${REPO:-$(cd "$here/../.." && pwd)}
export REPO=$repo
# shellcheck disable=SC1091
source "$here/hold.env"
R=${DEVICE_ROOT:-/root}  # everything of the hold lives here (a test sets another folder)
export DEVICE_ROOT=$R
mkdir -p $R/parts
[ -f $R/t0 ] || date +%s > $R/t0
now() { date +%s; }
elapsed() { echo $(( $(now) - $(cat $R/t0) )); }
say() { echo "[$(date -u +%H:%M:%S) +$(elapsed)s] $*"; }

take_parts() {
  shopt -s nullglob
  for f in "$repo"/.gpu/parts/*; do  # never rewrite a part already there: a detached install may be reading it
    [ -f "$R/parts/$(basename "$f")" ] || { cp "$f" $R/parts/ && say "part $(basename "$f") $(stat -c %s "$f") B"; }
  done
  for f in "$repo"/.gpu/boot/*.whl; do mkdir -p $R/boot-whl && cp -f "$f" $R/boot-whl/; done
  shopt -u nullglob
  cp -f "$here/step.sh" "$here/hold.env" $R/  # the detached installs run these copies (a call replaces .gpu)
}

have_all() {  # stream count
  local n
  n=$(ls $R/parts/"$1"[0-9][0-9] 2>/dev/null | wc -l)
  [ "$n" -ge "$2" ] && [ -f $R/parts/SHA256 ]
}

unpack() {  # stream dest
  local want got
  want=$(awk -v n="$1" '$2==n {print $1}' $R/parts/SHA256)
  got=$(cat $R/parts/"$1"[0-9][0-9] | sha256sum | cut -d' ' -f1)
  [ "$got" = "$want" ] || { echo "$1: sha256 $got != $want"; return 1; }
  mkdir -p "$2"
  if [ -z "${NO_ZSTD:-}" ] && command -v zstd >/dev/null; then  # NO_ZSTD=1: the Python path (tests)
    cat $R/parts/"$1"[0-9][0-9] | zstd -d -q --long=27 -c | tar x -C "$2"
  else
    [ -d $R/boot/zstandard ] || python3 -m pip install -q --no-index --no-deps --target $R/boot $R/boot-whl/zstandard-*.whl
    cat $R/parts/"$1"[0-9][0-9] | PYTHONPATH=$R/boot python3 -c "import sys, zstandard
zstandard.ZstdDecompressor(max_window_size=2**27).copy_stream(sys.stdin.buffer, sys.stdout.buffer)" | tar x -C "$2"
  fi
}

install_v() {
  unpack v $R/whl || return 1
  python3 -m pip install -q --no-index --no-deps --no-compile --target $R/site $R/whl/v/*.whl 2>&1 | tail -n 5
  PYTHONPATH=$R/site python3 -c "import importlib.metadata as md; print('vllm', md.version('vllm'), 'papermill', md.version('papermill'))" \
    && touch $R/site/.servelab-installed
}

install_s() {
  unpack s $R/whl || return 1
  local wheels=($R/whl/s/*.whl)
  # the shared wheels from v, except a project s ships in another version (2026-12-03: anthropic
  # 2.14.0 from v beside 2.16.0 from s made pip refuse the whole set)
  for w in $(python3 -c "import json, os, re
proj = lambda w: re.split(r'-[0-9]', w, maxsplit=1)[0].lower().replace('_', '-')
own = {proj(w) for w in os.listdir('$R/whl/s') if w.endswith('.whl')}
print(' '.join(w for w in json.load(open('$R/parts/MANIFEST.json'))['s']['shared'] if proj(w) not in own))"); do
    wheels+=("$R/whl/v/$w")
  done
  python3 -m pip install -q --no-index --no-deps --no-compile --target $R/site-sglang --upgrade "${wheels[@]}" 2>&1 | tail -n 5
  PYTHONPATH=$R/site-sglang python3 -c "import importlib.metadata as md, transformers, tokenizers
print('sglang', md.version('sglang'), 'sglang-kernel', md.version('sglang-kernel'), 'transformers', transformers.__version__, 'tokenizers', tokenizers.__version__)" \
    && touch $R/site-sglang/.servelab-installed
}

background() {  # name: run `step.sh NAME` once, detached (it outlives the call); rc in $R/NAME.rc
  [ -f "$R/$1.started" ] && return 0
  touch "$R/$1.started"
  setsid nohup bash -c "bash $R/step.sh $1 > $R/$1.log 2>&1; echo \$? > $R/$1.rc" < /dev/null > /dev/null 2>&1 &
  say "$1 started in the background"
}

start_drive() {
  [ -f $R/drive.started ] && return 0
  [ -f $R/install-v.rc ] || return 0
  if [ "$(cat $R/install-v.rc)" != 0 ] || ! grep -q "^vllm " $R/install-v.log; then
    say "install-v failed:"; tail -n 8 $R/install-v.log; return 1
  fi
  touch $R/drive.started
  rm -rf $R/snap && mkdir -p $R/snap && cp -r "$repo"/.gpu/code/. $R/snap/
  find $R/snap -name __pycache__ -prune -exec rm -rf {} +
  local deadline=$(( HOLD_S - START_S - $(elapsed) - MARGIN_S ))
  cd $R/snap || return 1
  if ! PYTHONPATH=$R/site:$R/snap/lib python3 -c "
import importlib.metadata as md, servelab.cli, servelab.stages, papermill, pynvml, httpx, pydantic
print('servelab env ok: vllm', md.version('vllm'), 'papermill', papermill.__version__, 'pydantic', pydantic.VERSION)" 2>&1 | tail -n 3; then
    say "servelab does not import: drive.py not started"; return 1
  fi
  mkdir -p "runs/$STUDY"
  if [ -n "${SEQUENCE:-}" ]; then  # several steps (calibrate-hw, drive.py per study): scripts/device/sequence.sh
    DEADLINE_S=$deadline SERVELAB_WAIT_SITES=1 SERVELAB_PROMPTS=$R/snap/prompts PYTHONUNBUFFERED=1 \
      PYTHONPATH=$R/site:$R/snap/lib PATH=$R/site/bin:$PATH \
      setsid nohup bash "$SEQUENCE" > $R/drive.log 2>&1 < /dev/null &
    say "$SEQUENCE pid $! started, deadline ${deadline}s"
  else
    SERVELAB_WAIT_SITES=1 SERVELAB_PROMPTS=$R/snap/prompts PYTHONUNBUFFERED=1 PYTHONPATH=$R/site:$R/snap/lib PATH=$R/site/bin:$PATH \
      setsid nohup python3 scripts/device/drive.py "params/$STUDY.yaml" --deadline-s "$deadline" > $R/drive.log 2>&1 < /dev/null &
    say "drive.py pid $! started, deadline ${deadline}s"
  fi
  cd "$repo" || return 1
}

step() {
  take_parts
  have_all v "$NPARTS_V" && background install-v
  [ "$NPARTS_S" -gt 0 ] && have_all s "$NPARTS_S" && background install-s
  start_drive
  for n in install-v install-s; do
    [ -f "$R/$n.rc" ] && say "$n rc=$(cat $R/$n.rc): $(tail -n 1 $R/$n.log)"
  done
  say "parts: $(ls $R/parts | tr '\n' ' ')"
  [ -f "$R/snap/runs/$STUDY/device-progress.log" ] && tail -n 6 "$R/snap/runs/$STUDY/device-progress.log"
  [ -n "${SEQUENCE:-}" ] && [ -f $R/drive.log ] && tail -n 4 $R/drive.log | cut -c1-300
  nvidia-smi --query-gpu=memory.used,utilization.gpu,power.draw --format=csv,noheader 2>/dev/null
}

pack_out() {
  [ -n "${OUT:-}" ] || return 0
  if [ -n "${SEQUENCE:-}" ]; then  # every study of the sequence, and the calibration entries it wrote
    [ -d "$R/snap/runs" ] && tar czf "$OUT/runs.tgz" -C $R/snap --exclude='*.input.ipynb' --exclude='runs/calibrate-hw/*/engines' runs lib/servelab/data/calibrations
  else
    [ -d "$R/snap/runs/$STUDY" ] && tar czf "$OUT/runs.tgz" -C $R/snap --exclude='*.input.ipynb' "runs/$STUDY"
  fi
  tar czf "$OUT/logs.tgz" -C $R drive.log install-v.log install-s.log 2>/dev/null
  ls -l "$OUT" | tail -n +2
}

poll() {
  step
  local end=$(( $(now) + ${1:-300} ))
  while [ "$(now)" -lt "$end" ]; do
    if [ -n "${SEQUENCE:-}" ]; then grep -q "sequence end" $R/drive.log 2>/dev/null && break
    else grep -q "drive end" "$R/snap/runs/$STUDY/device-progress.log" 2>/dev/null && break; fi
    sleep 5
  done
  echo "--- progress"
  tail -n 30 "$R/snap/runs/$STUDY/device-progress.log" 2>/dev/null | cut -c1-400
  [ -n "${SEQUENCE:-}" ] && tail -n 40 $R/drive.log | cut -c1-400
  nvidia-smi --query-gpu=memory.used,utilization.gpu,power.draw --format=csv,noheader 2>/dev/null
  pack_out
}

case "${1:-step}" in
  step) step ;;
  poll) poll "${2:-300}" ;;
  install-v) install_v ;;
  install-s) install_s ;;
  *) echo "usage: step.sh step | poll SECONDS"; exit 2 ;;
esac
