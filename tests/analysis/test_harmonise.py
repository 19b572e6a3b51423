"""servelab's per-request definitions applied to imported records, statistics taken the tool's way,
and the definitions table held to the metrics servelab defines."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from servelab.analysis.aiperf import aiperf_reported, aiperf_rows, in_flight_max
from servelab.analysis.harmonise import (definitions, drop_role_chunk, harmonised_rows, recompute_per_request,
                                         recomputed, statistic, unexplained, window_throughput)
from servelab.schema.runfiles import RequestRecord
from servelab.summary import DEFINED_METRICS


def _rec(**kw):
    base = dict(config="x", bucket="b", target_input_tokens=8, target_output_tokens=5, concurrency=1, rate_rps=0.0,
                round=0, warmup=False, seq=0, ok=True, error_kind=None, error_detail=None, ttft_s=0.1, e2e_s=0.5,
                prompt_tokens=8, output_tokens=5, decode_tps=None, e2e_output_tps=None, tpot_s=None,
                chunk_times_s=[0.1, 0.2, 0.3, 0.4, 0.5], start_s=0.0, end_s=0.5, tool="t", times_reconstructed=False)
    return {**base, **kw}


def test_servelabs_definitions_replace_whatever_the_importer_had():
    df = pd.DataFrame([_rec(decode_tps=999.0), _rec(seq=1, output_tokens=1), _rec(seq=2, ok=False, ttft_s=None,
                                                                                 e2e_s=None, output_tokens=None)])
    r = recompute_per_request(df)
    assert r.loc[0, "decode_tps"] == pytest.approx(4 / 0.4)  # (out - 1) / (e2e - ttft)
    assert r.loc[0, "tpot_s"] == pytest.approx(0.1) and r.loc[0, "e2e_output_tps"] == pytest.approx(10.0)
    assert math.isnan(r.loc[1, "decode_tps"]) and r.loc[1, "e2e_output_tps"] == pytest.approx(2.0)
    assert r.loc[2, ["decode_tps", "tpot_s", "e2e_output_tps"]].isna().all()


def test_guidellms_median_is_a_sample_value_servelabs_interpolates():
    x = np.array([0.132, 0.209, 0.578, 0.703])
    assert statistic(x, "p50") == pytest.approx((0.209 + 0.578) / 2)
    assert statistic(x, "p50", "inverted_cdf") == pytest.approx(0.209)
    # GuideLLM sums the shares in floating point: twelve 1/12 reach 0.5 only at the 7th value
    assert statistic(np.arange(1.0, 13.0), "p50", "inverted_cdf") == 7.0
    assert statistic(np.arange(1.0, 13.0), "p50") == 6.5
    assert statistic(x, "mean") == pytest.approx(x.mean())
    assert math.isnan(statistic(np.array([]), "p50"))


def test_the_role_chunk_of_vllm_bench_is_not_servelabs_first_token():
    df = pd.DataFrame([_rec(chunk_times_s=[0.1, 0.10001, 0.2, 0.3, 0.4, 0.5])])  # 6 chunks for 5 tokens
    r = drop_role_chunk(df)
    assert r.loc[0, "ttft_s"] == pytest.approx(0.10001) and len(r.loc[0, "chunk_times_s"]) == 5
    same = drop_role_chunk(pd.DataFrame([_rec()]))  # one chunk per token: nothing to drop
    assert same.loc[0, "ttft_s"] == 0.1 and len(same.loc[0, "chunk_times_s"]) == 5


def test_a_round_gives_servelabs_aggregate_and_pooled_itl():
    df = recompute_per_request(pd.DataFrame([_rec(), _rec(seq=1, start_s=0.25, end_s=1.0)]))
    assert recomputed(df, "aggregate_output_tps", "value") == pytest.approx(10 / 1.0)
    assert recomputed(df, "itl_s", "p50") == pytest.approx(0.1)
    assert recomputed(df, "success_rate", "value") == 1.0


def test_a_same_definition_difference_beyond_tolerance_is_flagged_not_explained():
    tool = definitions().of("vllm-bench")
    df = pd.DataFrame([_rec(), _rec(seq=1)])
    # servelab: 10 tokens in the round's 0.5 s = 20 tok/s; the tool says 30
    rows = harmonised_rows(df, {("b", 1, 0): {"output_throughput": 30.0, "median_ttft_ms": 0.1}}, tool)
    agg = rows[rows["field"] == "output_throughput"].iloc[0]
    assert agg["diff_pct"] == pytest.approx(50.0) and agg["within"] == False  # noqa: E712
    assert agg["reason"].startswith("unexplained")
    assert list(unexplained(rows)["field"]) == ["output_throughput"]
    ttft = rows[rows["field"] == "median_ttft_ms"].iloc[0]
    assert ttft["within"] and pd.isna(ttft["reason"])
    missing = rows[rows["field"] == "median_itl_ms"].iloc[0]
    assert pd.isna(missing["tool_value"]) and missing["reason"] == "not reported"


def test_the_table_defines_every_servelab_metric_and_every_difference_has_a_reason():
    d = definitions()
    assert set(d.servelab) == set(DEFINED_METRICS)
    assert {t.tool for t in d.tools} == {"aiperf", "guidellm", "vllm-bench", "sglang-bench"}
    for t in d.tools:
        assert all(f.why and f.differs for f in t.figures if not f.same)


def test_aiperf_records_map_to_servelabs_fields():
    md = {"request_start_ns": 1_000_000_000_000, "request_end_ns": 1_000_500_000_000, "benchmark_phase": "profiling"}
    m = {"time_to_first_token": {"value": 100.0, "unit": "ms"}, "request_latency": {"value": 500.0, "unit": "ms"},
         "inter_chunk_latency": {"value": [100.0, 100.0, 100.0, 100.0], "unit": "ms"},
         "output_sequence_length": {"value": 5, "unit": "tokens"}, "usage_prompt_tokens": {"value": 9, "unit": "tokens"}}
    recs = [{"metadata": md, "metrics": m},
            {"metadata": {**md, "benchmark_phase": "warmup"}, "metrics": m},
            {"metadata": md, "metrics": {}, "error": {"message": "boom", "code": 500}}]
    rows = aiperf_rows(recs, config="a")
    assert set(RequestRecord.peer_columns()) <= set(rows[0])
    assert rows[0]["ttft_s"] == pytest.approx(0.1) and rows[0]["e2e_s"] == pytest.approx(0.5)
    assert rows[0]["chunk_times_s"] == pytest.approx([0.1, 0.2, 0.3, 0.4, 0.5])
    assert rows[0]["start_s"] == pytest.approx(1000.0) and rows[0]["prompt_tokens"] == 9
    assert rows[0]["output_tokens_source"] == "tool tokenizer"  # no usage_completion_tokens in the record
    assert rows[1]["warmup"] and not rows[2]["ok"] and rows[2]["error_detail"] == "boom"
    assert rows[0]["concurrency"] == 2  # no summary: the most requests in flight at once (warm-up left out)


def test_in_flight_and_aiperfs_figures_in_servelab_units():
    assert in_flight_max([0, 1, 2], [1.5, 2.5, 3]) == 2
    assert in_flight_max([0, 1], [1, 2]) == 1  # one ends as the next starts
    rep = aiperf_reported({"time_to_first_token": {"unit": "ms", "avg": 250.0, "p50": 200.0},
                           "output_token_throughput": {"unit": "tokens/sec", "avg": 99.7}})
    assert rep == {"time_to_first_token.avg": 0.25, "time_to_first_token.p50": 0.2, "output_token_throughput.avg": 99.7}


def test_a_request_without_decode_time_explains_a_same_definition_difference():
    """AIPerf counts a request whose whole output came in one chunk with an ITL of 0; servelab has no
    TPOT for it (no decode time): the medians run over different requests (seen in the tools study)."""
    tool = definitions().of("aiperf")
    df = pd.DataFrame([_rec(), _rec(seq=1, e2e_s=0.7), _rec(seq=2, e2e_s=0.1)])  # the last: e2e = TTFT
    rows = harmonised_rows(df, {("b", 1, 0): {"inter_token_latency.p50": 0.1}}, tool).set_index("field")
    r = rows.loc["inter_token_latency.p50"]
    assert r["servelab"] == pytest.approx(0.125) and r["same"] and not r["within"]  # median of 0.1 and 0.15
    assert r["reason"].startswith("a request whose whole output came in one chunk")
    assert r["reason"].endswith("(1 of 3 requests in this run)")
    assert unexplained(rows.reset_index()).empty


def test_guidellms_weighted_statistics():
    """GuideLLM 0.4+ weights a request's ITL by its tokens after the first: the mean is the tokens'
    mean, the median the value where the tokens' cumulative share reaches a half."""
    x, w = np.array([0.01, 0.02, 0.03]), np.array([1.0, 1.0, 8.0])
    assert statistic(x, "mean", weights=w) == pytest.approx((0.01 + 0.02 + 0.24) / 10)
    assert statistic(x, "p50", "inverted_cdf", w) == 0.03 and statistic(x, "p50", "inverted_cdf") == 0.02


def test_a_runs_throughput_over_the_tools_window():
    a = _rec(start_s=0.0, e2e_s=1.0, end_s=1.0, output_tokens=10, ttft_s=0.5, last_token_s=1.0)
    fail = _rec(seq=1, ok=False, start_s=0.5, end_s=21.0, output_tokens=None, ttft_s=None, e2e_s=None)
    df = recompute_per_request(pd.DataFrame([a, fail]))
    assert recomputed(df, "aggregate_output_tps", "value") == pytest.approx(10 / 21.0)  # servelab: the timeout's end
    assert window_throughput(df, "successful") == pytest.approx(10.0)  # AIPerf: last successful response
    # GuideLLM: from the first token (0.5 s) to the last (1.0 s)
    assert window_throughput(df, "token_span") == pytest.approx(10 / 0.5)


def test_a_difference_is_definitional_only_when_the_tools_definition_explains_it():
    tool = definitions().of("aiperf")
    df = pd.DataFrame([_rec(), _rec(seq=1, start_s=0.0, end_s=0.5),
                       _rec(seq=2, ok=False, ttft_s=None, e2e_s=None, output_tokens=None, start_s=0.1, end_s=2.0)])
    # servelab: 10 tokens / 2.0 s; AIPerf's window (successful only): 10 / 0.5 s
    rows = harmonised_rows(df, {("b", 1, 0): {"output_token_throughput.avg": 20.0}}, tool).set_index("field")
    assert rows.loc["output_token_throughput.avg", "reason"].startswith("definitional (duration window): ")
    rows = harmonised_rows(df, {("b", 1, 0): {"output_token_throughput.avg": 12.0}}, tool).set_index("field")
    r = rows.loc["output_token_throughput.avg", "reason"]
    assert r == ("unexplained: the tool 12, servelab 5, 20 by the tool's definition recomputed: duration window "
                 "does not account for the difference")


def test_a_sampled_run_quotes_the_tools_figures_it_cannot_recompute():
    tool = definitions().of("guidellm")
    df = pd.DataFrame([_rec(seq=i) for i in range(3)])
    rows = harmonised_rows(df, {("b", 1, 0): {"time_to_first_token_ms.mean": 0.2, "output_tokens_per_second.mean": 9.0}},
                           tool, {("b", 1, 0): {"counted": 40}}).set_index("field")
    for f in ("time_to_first_token_ms.mean", "output_tokens_per_second.mean"):
        assert math.isnan(rows.loc[f, "servelab"]) and rows.loc[f, "within"] is None
        assert rows.loc[f, "reason"].startswith("sampled report: 3 of the 40 requests the tool counted are stored: ")
        assert rows.loc[f, "reason"].endswith("the tool's own figure is quoted")
