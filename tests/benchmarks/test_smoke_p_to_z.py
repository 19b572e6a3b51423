"""Smoke runs of the benchmark scripts named p-z (tests/benchsmoke.py)."""

from __future__ import annotations

import pytest

import benchsmoke


@pytest.mark.parametrize("script", benchsmoke.half(second=True))
def test_smoke(script, tmp_path):
    benchsmoke.CHECKS[script](tmp_path, benchsmoke.run(script, tmp_path))
