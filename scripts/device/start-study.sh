#!/usr/bin/env bash
# On the device, in the call that carries the last vLLM part: install vLLM 0.26.0 + servelab's
# device requirements into /root/site (the parts .gpu/wheels/p00.. carried into /root/parts),
# wait for the SGLang install started in the background by an earlier call
# (scripts/device/install-sglang.sh -> /root/site-sglang, /root/install-sglang.rc), snapshot the
# code that runs (later calls replace the working tree), check the imports of each site, and start
# drive.py detached. Usage (from the repository root on the device):
#   STUDY=h200-llama8b-sglang DEADLINE_S=1000 bash scripts/device/start-study.sh
# Then poll from /root/snap: bash scripts/device/poll.sh 540 $STUDY
set -uo pipefail  # pipefail: the import check below fails through | tail
study=${STUDY:?set STUDY}
deadline=${DEADLINE_S:?set DEADLINE_S}
t0=$(date +%s)
if [ ! -d /root/site/vllm ]; then
  if [ -f /root/parts/SHA256 ]; then
    got=$(cat /root/parts/p[0-9][0-9] | sha256sum | cut -d' ' -f1)
    [ "$got" = "$(cat /root/parts/SHA256)" ] && echo "vLLM parts sha256 ok" || echo "vLLM parts sha256 MISMATCH $got"
  fi
  rm -rf /root/whl && mkdir -p /root/whl
  cat /root/parts/p[0-9][0-9] | tar x -C /root/whl
  python3 -m pip install -q --no-index --no-deps --no-compile --target /root/site /root/whl/*.whl 2>&1 | tail -n 5
  rm -rf /root/whl
fi
echo "vLLM site: $(ls /root/site | wc -l) entries, $(( $(date +%s) - t0 )) s"
for i in $(seq 1 120); do [ -f /root/install-sglang.rc ] && break; sleep 2; done
echo "SGLang install rc=$(cat /root/install-sglang.rc 2>/dev/null || echo missing)"; tail -n 4 /root/install-sglang.log 2>/dev/null
rm -rf /root/snap && mkdir -p /root/snap
cp -r lib scripts params notebooks pyproject.toml /root/snap/
find /root/snap -name __pycache__ -prune -exec rm -rf {} +
cd /root/snap
# servelab's own env must import (2026-12-01: cli.py imported cli_aws -> botocore at the top, absent
# on the device, and every `servelab serve` failed at once): stop here rather than start drive.py
if ! PYTHONPATH=/root/site:/root/snap/lib python3 -c "
import importlib.metadata as md, servelab.cli, servelab.stages, papermill, pynvml, httpx, pydantic
print('servelab env ok: vllm', md.version('vllm'), 'papermill', papermill.__version__, 'pydantic', pydantic.VERSION)" 2>&1 | tail -n 3; then
  echo "servelab does not import with PYTHONPATH=/root/site:/root/snap/lib: drive.py not started"; exit 1
fi
PYTHONPATH=/root/site-sglang python3 -c "
import importlib.metadata as md, transformers, tokenizers
print('sglang env ok: sglang', md.version('sglang'), 'transformers', transformers.__version__, 'tokenizers', tokenizers.__version__)" 2>&1 | tail -n 3
nvidia-smi --query-gpu=index,name,memory.used,memory.total,power.draw,driver_version --format=csv,noheader
mkdir -p runs/$study
PYTHONUNBUFFERED=1 PYTHONPATH=/root/site:/root/snap/lib PATH=/root/site/bin:$PATH setsid nohup \
  python3 scripts/device/drive.py params/$study.yaml --deadline-s "$deadline" > /root/drive.log 2>&1 < /dev/null &
echo "drive pid $! deadline ${deadline}s, started $(date -u +%H:%M:%S) after $(( $(date +%s) - t0 )) s"
sleep 8
cat /root/drive.log
