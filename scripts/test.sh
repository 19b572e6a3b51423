#!/usr/bin/env bash
# The test command (README, .ci/run): params validation, ruff, unit tests, notebooks under
# papermill and nbval, the real vLLM CPU server end to end, the default study at reduced
# size and its HTML report checked in headless Chromium.
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
.venv/bin/servelab validate params/*.yaml
.venv/bin/ruff check lib tests benchmarks scripts notebooks  # [tool.ruff] in pyproject.toml
.venv/bin/python -m pytest -q -p no:cacheprovider --durations=15 "$@"
