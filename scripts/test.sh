#!/usr/bin/env bash
# The test command (README, .ci/run): unit tests, params validation, notebooks under
# papermill and nbval, the real vLLM CPU server end to end, the default study at reduced
# size and its HTML report checked in headless Chromium.
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
.venv/bin/servelab validate params/*.yaml
.venv/bin/python -m pytest -q -p no:cacheprovider --durations=15 "$@"
