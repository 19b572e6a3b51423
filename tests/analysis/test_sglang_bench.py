"""SGLang's bench_serving results imported as servelab records, and the command that makes them.

The fixture tests/fixtures/sglang_bench_serving.jsonl has the shape SGLang 0.5.16 writes
(sglang-0.5.16 wheel, sglang/benchmark/serving.py): the summary dict `result` built in
`benchmark()` (lines 1747-1800: tag, backend, ..., server_info, duration, completed, ...,
max_concurrent_requests) merged with `result_details` (lines 1834-1841: input_lens,
output_lens, ttfts, itls, generated_texts, errors) under --output-details, one
`json.dumps(result_for_dump) + "\\n"` per run (lines 1850-1855), so request_rate inf is the
token `Infinity`. Only `server_info` (their /server_info: every ServerArgs field) is trimmed to a
few keys. Its summary numbers were computed from the details as `calculate_metrics()` does
(lines 1061-1239). Two runs: c=1 with 3 requests, c=2 with 4 requests of which one failed
(output_lens 0, ttft 0.0, a traceback in errors, as the chat request function leaves them).
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from servelab.schema.runfiles import RequestRecord
from servelab.analysis.sglang_bench import sglang_bench_command, sglang_bench_reported, sglang_bench_rows
from servelab.results.peers import import_sglang_bench, import_vllm_bench, read_objects
from paths import FIXTURES

FIXTURE = FIXTURES / "sglang_bench_serving.jsonl"


def _summarize():
    try:
        from servelab.analysis.summary import summarize
    except ImportError:
        from servelab.summary import summarize
    return summarize


def _runs():
    return [json.loads(line) for line in FIXTURE.read_text().splitlines()]


def test_fixture_has_the_real_keys():
    r1, r2 = _runs()
    for k in ("backend", "dataset_name", "request_rate", "max_concurrency", "random_input_len", "random_output_len",
              "random_range_ratio", "server_info", "duration", "completed", "total_input_tokens",
              "total_output_tokens", "output_throughput", "median_ttft_ms", "p99_itl_ms", "median_e2e_latency_ms",
              "concurrency", "max_concurrent_requests", "input_lens", "output_lens", "ttfts", "itls",
              "generated_texts", "errors"):
        assert k in r1 and k in r2, k
    assert r1["request_rate"] == float("inf") and r2["completed"] == 3


def test_import_token_counts_ttft_and_levels():
    df = import_sglang_bench(FIXTURE, config="sglang-cudagraph")
    assert list(df.columns) == RequestRecord.peer_columns() and len(df) == 7
    assert df["tool"].eq("sglang.bench_serving").all() and df["times_reconstructed"].all()
    assert df["bucket"].eq("in256-out8").all()
    assert df["concurrency"].tolist() == [1, 1, 1, 2, 2, 2, 2] and df["round"].tolist() == [0, 0, 0, 1, 1, 1, 1]
    assert df["rate_rps"].eq(0.0).all() and df["seq"].tolist() == list(range(7))
    ok = df[df["ok"]]
    assert len(ok) == 6 and ok["output_tokens"].tolist() == [8] * 6 and ok["prompt_tokens"].tolist() == [255] * 6
    bad = df[~df["ok"]].iloc[0]
    assert bad["seq"] == 6 and bad["error_kind"] == "peer_error" and "ServerDisconnectedError" in bad["error_detail"]
    assert bad["output_tokens"] is None or np.isnan(bad["output_tokens"])
    assert bad["chunk_times_s"] == []
    first = df.iloc[0]
    assert first["ttft_s"] == 0.0201 and len(first["chunk_times_s"]) == 8
    assert first["e2e_s"] == pytest.approx(0.0201 + sum(0.006 + 0.0001 * k for k in range(7)))
    assert first["tpot_s"] == pytest.approx((first["e2e_s"] - 0.0201) / 7)
    r1, r2 = _runs()
    # TTFT medians equal theirs exactly; e2e is short of their latency only by the [DONE] tail
    assert float(np.median(df[df["round"] == 0]["ttft_s"])) * 1000 == pytest.approx(r1["median_ttft_ms"], abs=1e-9)
    assert float(np.median(ok[ok["round"] == 1]["ttft_s"])) == pytest.approx(0.0305) == r2["median_ttft_ms"] / 1000
    e2e_med = float(np.median(ok[ok["round"] == 1]["e2e_s"])) * 1000
    assert 0 < r2["median_e2e_latency_ms"] - e2e_med < 1.0


def test_summarize_works_on_imported_rows():
    df = import_sglang_bench(FIXTURE, config="sglang")
    s = _summarize()(df).set_index("concurrency")
    assert s.loc[1, "sent"] == 3 and s.loc[1, "ok"] == 3 and s.loc[2, "sent"] == 4 and s.loc[2, "ok"] == 3
    assert s.loc[1, "output_tokens_p50"] == 8 and s.loc[2, "prompt_tokens"] == 255
    assert s.loc[1, "ttft_p50_s"] == pytest.approx(0.0201) and s.loc[2, "ttft_p50_s"] == pytest.approx(0.0305)
    r1, r2 = _runs()
    # start 0 / end duration for every request: aggregate output tok/s = their output_throughput
    assert s.loc[1, "aggregate_output_tps"] == pytest.approx(r1["output_throughput"])
    assert s.loc[2, "aggregate_output_tps"] == pytest.approx(r2["output_throughput"])
    assert s.loc[1, "itl_p50_s"] * 1000 == pytest.approx(r1["median_itl_ms"])


def test_reported_and_errors():
    rep = sglang_bench_reported(read_objects(FIXTURE)[0])
    assert rep["completed"] == 3 and rep["server_version"] == "0.5.16" and rep["max_concurrency"] == 1
    assert rep["ttft_p50_s"] == pytest.approx(0.0201) and rep["total_output_tokens"] == 24
    with pytest.raises(ValueError, match="--output-details"):
        sglang_bench_rows({"duration": 1.0, "completed": 1}, config="x")


def test_command_argv():
    argv = sglang_bench_command("http://127.0.0.1:30000/v1", "/root/models/llama8b", 2048, 256, 4, 64,
                                "/tmp/out/c4.jsonl")
    assert argv[:3] == ["python3", "-m", "sglang.bench_serving"]
    flags = {a: b for a, b in zip(argv[3:], argv[4:]) if a.startswith("--")}
    assert flags["--backend"] == "sglang-oai-chat" and flags["--base-url"] == "http://127.0.0.1:30000"
    assert flags["--dataset-name"] == "random-ids" and flags["--random-range-ratio"] == "1"
    assert (flags["--random-input-len"], flags["--random-output-len"], flags["--max-concurrency"],
            flags["--num-prompts"], flags["--seed"]) == ("2048", "256", "4", "64", "42")
    assert flags["--model"] == flags["--tokenizer"] == "/root/models/llama8b"
    assert flags["--output-file"] == "/tmp/out/c4.jsonl" and flags["--request-rate"] == "inf"
    assert "--output-details" in argv and "--disable-ignore-eos" not in argv  # ignore_eos stays on


def test_record_columns_match_the_other_importers():
    # one record shape for every peer tool: the SGLang import and the vLLM import line up column by column
    vllm = import_vllm_bench(FIXTURES / "vllm_bench_refserver.json", config="v")
    sglang = import_sglang_bench(FIXTURE, config="s")
    assert list(sglang.columns) == list(vllm.columns) == RequestRecord.peer_columns()
    assert sglang["tool"].iloc[0] != vllm["tool"].iloc[0]  # each says which tool measured it