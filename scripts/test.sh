#!/usr/bin/env bash
# The test command (README, .ci/run): params validation, ruff, unit tests, notebooks under
# papermill and nbval, the real vLLM CPU server end to end, the default study at reduced
# size and its HTML report checked in headless Chromium.
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
.venv/bin/servelab validate params/*.yaml
.venv/bin/ruff check lib tests benchmarks scripts notebooks  # [tool.ruff] in pyproject.toml
# Two passes, each on two workers (pytest-xdist, one test file per worker at a time): the tests
# without an engine, then those that start the real vLLM CPU server. Most of an engine test's time
# is the engine's start-up, which keeps one core busy; their benchmarks are small and none of them
# judges timing. A session fixture runs once per worker that uses it: the README run's users live
# in one file (tests/e2e/test_readme.py). Exit 5 is "no test selected" (a path given to
# `make test` may hold tests of one kind only).
run_pass() { .venv/bin/python -m pytest -q -p no:cacheprovider "$@" || { rc=$?; [ $rc -eq 5 ] || exit $rc; }; }
run_pass -m "not engine" -n 2 --dist loadfile --durations=10 "$@"
run_pass -m engine -n 2 --dist loadfile --durations=15 "$@"
