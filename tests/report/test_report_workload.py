"""The report's workload section: absent for studies without workload-source data (their pages
stay byte-identical), present with asked-vs-measured hit rates for the example study."""

from __future__ import annotations

import pytest

from servelab.analysis.cache import cache_levels
from servelab.report import load_study_data
from servelab.report import workload as wk
from servelab.runfolder import read_jsonl
from paths import ROOT

EXAMPLE = ROOT / "reports" / "local-cpu-workloads"


def test_absent_without_workload_data():
    sd = load_study_data(ROOT / "reports" / "local-cpu-kv")
    assert wk.section(sd) == ("", [])
    assert wk.extra_definitions(sd) == []
    assert cache_levels(sd.records).empty  # no cached-token data: no rows, never zeros


@pytest.mark.skipif(not (EXAMPLE / "data").exists(), reason="example study not published")
def test_example_study_says_asked_and_measured():
    sd = load_study_data(EXAMPLE)
    text, items = wk.section(sd)
    assert "replay of `mooncake-conversation-excerpt.jsonl`" in text and "scaled by 0.25 in time" in text
    lv = {x["label"]: x for x in read_jsonl(EXAMPLE / "data" / "vllm-cpu" / "levels.jsonl")}["in256-out16-reuse50 c=2"]
    measured = lv["prefix_cache_hits"] / lv["prefix_cache_queries"]
    assert f"asked 50.0 %, the server reports {measured * 100:.1f} %" in wk.asked_vs_measured(sd)
    keys = [k for k, _ in wk.extra_definitions(sd)]
    assert keys[:3] == ["cached_tokens", "hit_rate", "ttft_hit_s / ttft_miss_s"] and "send_lag_s" in keys
    ja = sd.with_language("ja")
    assert "指定 50.0 %" in wk.asked_vs_measured(ja)
