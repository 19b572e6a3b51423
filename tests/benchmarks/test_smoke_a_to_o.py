"""Smoke runs of the benchmark scripts named a-o (tests/benchsmoke.py), and that every script in
benchmarks/ has one."""

from __future__ import annotations

import pytest

import benchsmoke


def test_every_benchmark_script_has_a_smoke_run():
    """A new script without a check in tests/benchsmoke.py (and a `--smoke DIR` mode) fails here."""
    assert sorted(benchsmoke.CHECKS) == benchsmoke.scripts()


@pytest.mark.parametrize("script", benchsmoke.half(second=False))
def test_smoke(script, tmp_path):
    benchsmoke.CHECKS[script](tmp_path, benchsmoke.run(script, tmp_path))
