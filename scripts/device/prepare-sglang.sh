#!/usr/bin/env bash
# Prepare the wheel parts for a GPU session that runs BOTH vLLM 0.26.0 and SGLang 0.5.16 on one
# H200 (runbook: ../shared/gpu/README.md, "SGLang 0.5.16"). Everything it uses lives in
# scripts/device/ (copies of the runbook's helpers and wheel lists, each naming its origin), so
# nothing refers to ../shared when it runs. Results, all under .gpu/ (git-ignored):
#   .gpu/wheels/p00 ...         vLLM 0.26.0 + servelab's device requirements (as prepare.sh makes
#                               them; built here only when no part exists yet), 50 MiB parts
#   .gpu/sglang-parts/s00 ...   SGLang 0.5.16's 81 wheels + the transformers 5.12.1 / tokenizers
#                               0.22.2 override (+ nvidia-ml-py if the image lacked it), one tar
#                               split into 50 MiB parts; SHA256-sglang = sha256 of the whole tar
# Carry one part per device call (64 MiB per call, the working tree included), then run
# scripts/device/install-sglang.sh (SGLang -> /root/site-sglang; vLLM stays in /root/site).
# Usage: scripts/device/prepare-sglang.sh [--force]   (--force re-packs the SGLang parts)
set -euo pipefail
cd "$(dirname "$0")/../.."
dev=scripts/device
force=${1:-}

# 1. vLLM's parts (prepare.sh's steps, from the local copies)
if ls .gpu/wheels/p[0-9][0-9] >/dev/null 2>&1; then
  echo "vLLM parts present: $(ls .gpu/wheels/p[0-9][0-9] | wc -l) in .gpu/wheels (not rebuilt)"
else
  bash "$dev/fetch-wheels.sh" .gpu/wheels "$dev/requirements.txt"
  (cd .gpu/wheels && cat p[0-9][0-9] > all.tar && rm p[0-9][0-9] && split -b 50M -d -a 2 all.tar p && rm all.tar)
fi

# 2. SGLang's wheels: the listed set must be there; resolve what is missing (runbook step 1)
want=$(grep -v '^#' "$dev/sglang-0.5.16-wheels.txt")
missing() { for w in $want; do [ -f ".gpu/sglang-wheels/$w" ] || [ -f ".gpu/sglang-override/$w" ] || echo "$w"; done; }
if [ -n "$(missing)" ]; then
  echo "resolving SGLang 0.5.16's wheels (missing: $(missing | wc -l))"
  python3 "$dev/resolve-wheels.py" .gpu/sglang-wheels "sglang==0.5.16" ipython datasets --pin xgrammar==0.2.1 \
    --skip flash-attn-4 helion humming-kernels tilelang tokenspeed-mla quack-kernels nvidia-cutlass-dsl \
    nvidia-mathdx kernels torchao modelscope py-spy torchcodec av decord2 smg-grpc-servicer
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .gpu/sglang-override \
    transformers==5.12.1 tokenizers==0.22.2
fi
# the resolver may pick a newer release of a wheel that vLLM's set pins (anthropic, uvicorn): the listed
# release, already downloaded with vLLM's wheels, is the one seen working beside SGLang 0.5.16
for w in $(missing); do [ -f ".gpu/wheels/wheels/$w" ] && cp ".gpu/wheels/wheels/$w" .gpu/sglang-wheels/; done
if [ -n "$(missing)" ]; then echo "still missing:"; missing; exit 1; fi

# 3. nvidia-ml-py (pynvml, for servelab's GpuSampler) only if the device image lacks it
files=()
for w in $want; do
  if [ -f ".gpu/sglang-wheels/$w" ]; then files+=("sglang-wheels/$w"); else files+=("sglang-override/$w"); fi
done
if ! grep -qi '^nvidia-ml-py==' "$dev/device-pip-list.txt"; then
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 -d .gpu/sglang-extra nvidia-ml-py
  for w in .gpu/sglang-extra/*.whl; do files+=("sglang-extra/$(basename "$w")"); done
else
  echo "nvidia-ml-py: on the device already ($(grep -i '^nvidia-ml-py==' "$dev/device-pip-list.txt"))"
fi

# 4. one tar, 50 MiB parts s00 s01 ...
out=.gpu/sglang-parts
if [ "$force" != "--force" ] && ls "$out"/s[0-9][0-9] >/dev/null 2>&1 && [ -f "$out/SHA256-sglang" ]; then
  echo "SGLang parts present (use --force to re-pack)"
else
  rm -rf "$out" && mkdir -p "$out"
  tar cf "$out/all.tar" -C .gpu "${files[@]}"
  sha256sum "$out/all.tar" | cut -d' ' -f1 > "$out/SHA256-sglang"
  split -b 50M -d -a 2 "$out/all.tar" "$out/s"
  rm "$out/all.tar"
fi
echo "SGLang: ${#files[@]} wheels"
ls -l "$out"
du -cb "$out"/s[0-9][0-9] | tail -1
ls -l .gpu/wheels/p[0-9][0-9]
du -cb .gpu/wheels/p[0-9][0-9] | tail -1
