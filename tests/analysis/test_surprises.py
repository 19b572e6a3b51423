"""Surprises (analysis.surprises) on recorded data and the levers table they read: the committed
h200-moe study's SGLang fp8 KV cache, which loses more than half its throughput, is one; a law fit
on a known line; the knee of a sweep; the table validated like params."""

from __future__ import annotations

import math

import pytest

from servelab.analysis import surprises as su
from servelab.report import load_study_data
from servelab.report.verdicts import rows
from servelab.schema import ParamsError
from servelab.schema.levers import load_levers, parse_levers
from paths import ROOT


def test_the_committed_sglang_fp8_kv_run_is_a_surprise_and_vllms_is_not():
    sd = load_study_data(ROOT / "reports" / "h200-moe")
    found = su.detect(rows(sd, aa=False), {c: sd.engine_params(c) for c in sd.config_ids}, load_levers())
    fp8 = [s for s in found if s.flag == "kv-cache-dtype"]
    assert {s.config for s in fp8} == {"sglang-fp8kv"}  # vLLM's fp8 KV change is no surprise
    c1 = next(s for s in fp8 if s.level == "in256-out256 c=1")
    assert c1.rule == "fell_by_half" and c1.effect == pytest.approx(-0.87, abs=0.01) and c1.ci[1] < -0.5
    assert all(s.effect <= -0.5 for s in fp8) and len(fp8) >= 4


def test_a_law_fit_recovers_a_known_line_and_says_when_a_knob_does_not_matter():
    law = su.fit_law([1, 2, 3, 4, 5], [0.1, 0.3, 0.5, 0.7, 0.9])
    assert law["slope"] == pytest.approx(0.2) and law["r2"] == pytest.approx(1.0) and law["matters"]
    flat = su.fit_law([1, 2, 3, 4, 5], [0.1, -0.1, 0.05, -0.05, 0.0])
    assert not flat["matters"] and flat["slope_ci"][0] < 0 < flat["slope_ci"][1]
    assert math.isnan(su.fit_law([1, 1, 2], [0, 1, 2])["slope"])  # fewer than 3 distinct values: no law


def test_the_knee_is_the_smallest_value_within_ten_percent():
    values = {"b2048": 2048, "b1024": 1024, "b512": 512, "b256": 256, "b128": 128, "b64": 64}
    effects = {"b2048": 0.0, "b1024": -0.02, "b512": -0.05, "b256": -0.08, "b128": -0.3, "b64": -0.5}
    assert su.knee(values, effects) == ("b256", 256.0)
    effects["b512"] = -0.2  # a dip above the knee: the knee is where it stays within
    assert su.knee(values, effects) == ("b1024", 1024.0)
    assert su.knee({"a": 1, "b": 2}, {"a": -0.5, "b": -0.5}) is None


def test_the_levers_table_is_validated_like_params():
    assert load_levers().of("kv-cache-dtype").expect == "no_cost"
    with pytest.raises(ParamsError, match=r"did you mean 'page-size'"):
        parse_levers({"levers": [{"flag": "kv-cache-dtype", "expect": "no_cost", "why": {"en": "w"}, "suspects": [
            {"knob": "page-sise", "engines": ["sglang"], "values": [1, 16], "why": "w"}]}]})
    with pytest.raises(ParamsError, match="unknown key"):
        parse_levers({"levers": [{"flag": "x", "expect": "no_cost", "why": {"en": "w"}, "suspect": []}]})
    with pytest.raises(ParamsError, match="expect"):
        parse_levers({"levers": [{"flag": "x", "expect": "maybe", "why": "w"}]})
