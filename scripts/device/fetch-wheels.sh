#!/usr/bin/env bash
# Copied on 2026-12-01 from ../shared/gpu/fetch-wheels.sh (the GPU runbook's helpers; sha256 55f941e11fea9373...)
# so that nothing under scripts/device/ refers to ../shared at run time. Unchanged below this header.
# Download the wheels that the GPU host lacks for vLLM 0.26.0 (+ any extra requirement files),
# pack them into one tar and split it into parts that fit the device tool's 64 MiB carry limit.
# Usage: fetch-wheels.sh OUTDIR [EXTRA_REQUIREMENTS.txt ...]
# Result: OUTDIR/p00, p01, ... (62 MiB each) and OUTDIR/SHA256 of the whole tar.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${1:?usage: fetch-wheels.sh OUTDIR [EXTRA_REQUIREMENTS.txt ...]}; shift || true
mkdir -p "$out/wheels"
plat=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_26_x86_64
      --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64
      --platform manylinux1_x86_64 --platform manylinux_2_31_x86_64 --platform manylinux_2_34_x86_64
      --platform manylinux_2_35_x86_64 --platform manylinux_2_5_x86_64)
for req in "$here/vllm-0.26.0-wheels.txt" "$@"; do
  python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    "${plat[@]}" -d "$out/wheels" -r "$req"
done
tar cf "$out/all.tar" -C "$out/wheels" .
sha256sum "$out/all.tar" | cut -d' ' -f1 > "$out/SHA256"
rm -f "$out"/p[0-9][0-9]
split -b 62M -d -a 2 "$out/all.tar" "$out/p"
rm "$out/all.tar"
ls -la "$out"
