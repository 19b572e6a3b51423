#!/usr/bin/env bash
# The test command (README, .ci/run): params validation, ruff, unit tests, every benchmarks/ script's
# smoke run (tests/benchmarks/), notebooks under papermill and nbval, the real vLLM CPU server end to
# end, the default study at reduced size and its HTML report checked in headless Chromium.
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
.venv/bin/servelab validate params/*.yaml
.venv/bin/ruff check lib tests benchmarks scripts notebooks  # [tool.ruff] in pyproject.toml
# Two passes: the tests without an engine on three workers (pytest-xdist, one test file per worker at a
# time: work-stealing saved 25 s but split a file's tests, such as the Ray pool's, over both workers, and a
# Ray worker then started 1 s late in a test that allows 50 ms), then those that start the real vLLM CPU server on one. Two engine tests side by side on two
# cores slowed each other 4-5x (two reduced KV studies at once: 460 s each, 92 s alone; each saw the
# other as a disturbance and measured rounds again), so the engine pass on two workers took 9 min 34 s
# and on one 7 min 51 s (2026-12-04). Exit 5 is "no test selected" (a path given to `make test` may
# hold tests of one kind only).
run_pass() { .venv/bin/python -m pytest -q -p no:cacheprovider "$@" || { rc=$?; [ $rc -eq 5 ] || exit $rc; }; }
# A test marked `alone` measures a real disturbance, which another worker's load can hide (the machine
# already busy all along: a make test after make report, 2026-12-05, and CI that evening): it runs in the
# one-worker pass.
# Three workers on two cores: that pass waits a good part of its time (reference servers' timed trials, Ray,
# signals, subprocesses): on fresh clones of 2026-12-06 (2 vCPUs, Intel type) it took 491 s with two workers (a
# quiet CI run), 448 s with three alone, and 437 s and 402 s with three in quiet CI runs that also ran
# test_cli_predict in process; every test passing.
run_pass -m "not engine and not alone" -n 3 --dist loadfile --durations=10 "$@"
run_pass -m "engine or alone" -n 1 --durations=15 "$@"
