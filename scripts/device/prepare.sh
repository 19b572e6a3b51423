#!/usr/bin/env bash
# Prepare the wheel parts for a GPU study on the device machine (docs/gpu.md):
# vLLM 0.26.0's missing wheels plus what servelab needs there (scripts/device/requirements.txt),
# packed into 62 MiB parts under .gpu/wheels (git-ignored) for the device tool's 64 MiB carry.
set -euo pipefail
cd "$(dirname "$0")/../.."
here=scripts/device
bash "$here/fetch-wheels.sh" .gpu/wheels scripts/device/requirements.txt
# The tool carries the working tree (~10 MB with the published reports) and one part per call within 64 MiB: use 50 MiB parts.
(cd .gpu/wheels && cat p[0-9][0-9] > all.tar && rm p[0-9][0-9] && split -b 50M -d -a 2 all.tar p && rm all.tar)
ls -la .gpu/wheels
