"""Tests for servelab.metrics: parsing both engines' /metrics, deltas, and the sampler."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from servelab.engines import engine_of, parse_metrics
from servelab.engines.prom import COUNTER_FIELDS, SAMPLE_FIELDS, ServerSample
from servelab.measure.metrics import MetricsSampler, counter_resets, delta, metrics_url, scrape, snapshot
from servelab.runfolder import load_samples
from paths import FIXTURES

VLLM_TEXT = (FIXTURES / "metrics_vllm.txt").read_text()
SGLANG_TEXT = (FIXTURES / "metrics_sglang.txt").read_text()
QWEN = 'model_name="Qwen/Qwen2.5-0.5B-Instruct"'


# --------------------------------------------------------------------------- parsing


def test_parse_vllm_fixture_exact() -> None:
    s = parse_metrics(VLLM_TEXT)
    assert s == ServerSample(
        engine="vllm",
        kv_usage_frac=0.5,  # mean of 0.25 and 0.75 over engine 0/1, not the sum
        kv_capacity_tokens=2 * 2048 * 16,
        num_gpu_blocks=2048,
        block_size=16,
        running=5,
        waiting=1,
        preemptions_total=3.0,
        retracted_reqs=None,
        prefix_cache_queries_total=61440.0,
        prefix_cache_hits_total=12288.0,
        cache_hit_rate=None,
        spec_drafts_total=1500.0,
        spec_draft_tokens_total=4500.0,
        spec_accepted_tokens_total=3000.0,
        spec_accept_length=None,
        spec_accepted_per_pos_total=[1300.0, 1000.0, 700.0],  # engines 0 + 1, by draft position
        prompt_tokens_total=76800.0,
        generation_tokens_total=19200.0,
        ttft_sum_s=2.875,
        ttft_count=6.0,
        # the fixture also carries the deprecated time_per_output_token_seconds twin
        # with identical data; it must not be added on top
        itl_sum_s=0.5,
        itl_count=12.0,
        prefill_sum_s=2.25,
        prefill_count=3.0,
        queue_sum_s=0.75,
        queue_count=3.0,
        e2e_sum_s=7.0,
        e2e_count=3.0,
    )
    assert 0.0 <= s.kv_usage_frac <= 1.0


def test_parse_sglang_fixture_exact() -> None:
    s = parse_metrics(SGLANG_TEXT)
    # scheduler gauges are mirrored on tp_rank 0 and 1 and must be counted once
    assert s == ServerSample(
        engine="sglang",
        kv_usage_frac=0.375,
        kv_capacity_tokens=262144,
        num_gpu_blocks=None,
        block_size=None,
        running=7,
        waiting=2,
        preemptions_total=4.0,
        retracted_reqs=1,
        prefix_cache_queries_total=None,
        prefix_cache_hits_total=10240.0,  # cache_source device 8192 + host 2048
        cache_hit_rate=0.125,
        spec_drafts_total=None,
        spec_draft_tokens_total=None,
        spec_accepted_tokens_total=None,
        spec_accept_length=2.5,
        prompt_tokens_total=81920.0,
        generation_tokens_total=40960.0,
        ttft_sum_s=2.0,
        ttft_count=3.0,
        itl_sum_s=0.5,
        itl_count=16.0,
        e2e_sum_s=10.0,
        e2e_count=3.0,
    )


def test_engine_detection() -> None:
    assert engine_of(VLLM_TEXT) == "vllm"
    assert engine_of(SGLANG_TEXT) == "sglang"
    assert engine_of("") == "unknown"
    other = (
        "# HELP vllm:fake mentioned only in a comment\n"
        "# TYPE python_gc_objects_collected_total counter\n"
        'python_gc_objects_collected_total{generation="0"} 5.0\n'
    )
    assert engine_of(other) == "unknown"
    assert parse_metrics(other) == ServerSample(engine="unknown")
    mixed = VLLM_TEXT + "sglang:num_running_reqs 1\n"
    assert engine_of(mixed) == "vllm"


def test_counter_without_type_line_and_without_total_suffix() -> None:
    untyped = f"vllm:prompt_tokens_total{{{QWEN},engine=\"0\"}} 9\n"
    assert parse_metrics(untyped).prompt_tokens_total == 9.0
    typed_base = f"# TYPE vllm:prompt_tokens counter\nvllm:prompt_tokens{{{QWEN},engine=\"0\"}} 7\n"
    assert parse_metrics(typed_base).prompt_tokens_total == 7.0
    bare_untyped = f"vllm:num_preemptions{{{QWEN}}} 4\n"
    assert parse_metrics(bare_untyped).preemptions_total == 4.0


def test_itl_falls_back_to_old_tpot_name() -> None:
    text = (
        "# TYPE vllm:time_per_output_token_seconds histogram\n"
        f'vllm:time_per_output_token_seconds_bucket{{{QWEN},le="+Inf"}} 4.0\n'
        f"vllm:time_per_output_token_seconds_count{{{QWEN}}} 4.0\n"
        f"vllm:time_per_output_token_seconds_sum{{{QWEN}}} 0.5\n"
    )
    s = parse_metrics(text)
    assert (s.itl_sum_s, s.itl_count) == (0.5, 4.0)
    assert s.ttft_sum_s is None


def test_nan_and_uninitialised_cache_config() -> None:
    text = (
        "# TYPE vllm:kv_cache_usage_perc gauge\n"
        f"vllm:kv_cache_usage_perc{{{QWEN},engine=\"0\"}} NaN\n"
        "# TYPE vllm:cache_config_info gauge\n"
        'vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="None"} 1.0\n'
    )
    s = parse_metrics(text)
    assert s.kv_usage_frac is None
    assert s.block_size == 16
    assert s.num_gpu_blocks is None
    assert s.kv_capacity_tokens is None


def test_sum_across_models() -> None:
    text = (
        "# TYPE vllm:num_requests_running gauge\n"
        'vllm:num_requests_running{engine="0",model_name="a"} 2.0\n'
        'vllm:num_requests_running{engine="0",model_name="b"} 3.0\n'
    )
    assert parse_metrics(text).running == 5


def test_invalid_text_raises() -> None:
    with pytest.raises(ValueError):
        parse_metrics("<html><body>hello</body></html>")


def test_sample_json_roundtrip() -> None:
    d = parse_metrics(VLLM_TEXT).to_dict()
    assert tuple(d) == SAMPLE_FIELDS
    assert json.loads(json.dumps(d)) == d


# --------------------------------------------------------------------------- delta


def test_delta_arithmetic() -> None:
    before = parse_metrics(VLLM_TEXT)
    after_text = (
        VLLM_TEXT.replace(
            f'vllm:prompt_tokens_total{{engine="0",{QWEN}}} 51200.0',
            f'vllm:prompt_tokens_total{{engine="0",{QWEN}}} 52224.0',
        )
        .replace(
            f'vllm:generation_tokens_total{{engine="1",{QWEN}}} 6400.0',
            f'vllm:generation_tokens_total{{engine="1",{QWEN}}} 6656.0',
        )
        .replace(
            f'vllm:prefix_cache_queries_total{{engine="0",{QWEN}}} 40960.0',
            f'vllm:prefix_cache_queries_total{{engine="0",{QWEN}}} 41984.0',
        )
    )
    assert after_text != VLLM_TEXT
    after = parse_metrics(after_text)
    d = delta(before, after)
    assert set(d) == set(COUNTER_FIELDS) | {"spec_accepted_per_pos_total"}
    assert d["spec_accepted_per_pos_total"] == [0.0, 0.0, 0.0]
    assert d["prompt_tokens_total"] == 1024.0
    assert d["generation_tokens_total"] == 256.0
    assert d["prefix_cache_queries_total"] == 1024.0
    assert d["prefix_cache_hits_total"] == 0.0
    assert d["preemptions_total"] == 0.0
    assert d["spec_draft_tokens_total"] == 0.0
    assert counter_resets(before, after) == []


def test_delta_none_reset_and_mapping_rows() -> None:
    b = ServerSample(engine="sglang", prompt_tokens_total=100.0, generation_tokens_total=50.0, ttft_sum_s=1.5)
    a = dataclasses.replace(b, prompt_tokens_total=160.0, generation_tokens_total=20.0, ttft_sum_s=2.0)
    d = delta(b, a)
    assert d["prompt_tokens_total"] == 60.0
    assert d["ttft_sum_s"] == 0.5
    assert d["generation_tokens_total"] == 20.0  # reset: increase() convention
    assert d["spec_draft_tokens_total"] is None  # not exposed by this engine
    assert counter_resets(b, a) == ["generation_tokens_total"]
    # rows as read back from JSONL/pandas (NaN for missing) work too
    row_b = {"prompt_tokens_total": 10.0, "prefix_cache_hits_total": math.nan}
    row_a = {"prompt_tokens_total": 25.0, "prefix_cache_hits_total": 3.0}
    d2 = delta(row_b, row_a)
    assert d2["prompt_tokens_total"] == 15.0
    assert d2["prefix_cache_hits_total"] is None


# --------------------------------------------------------------------------- scrape


def test_metrics_url() -> None:
    assert metrics_url("http://h:8000") == "http://h:8000/metrics"
    assert metrics_url("http://h:8000/") == "http://h:8000/metrics"
    assert metrics_url("http://h:8000/v1") == "http://h:8000/metrics"
    assert metrics_url("http://h:8000/v1/") == "http://h:8000/metrics"
    assert metrics_url("http://h:8000/metrics") == "http://h:8000/metrics"


def test_scrape_mock_transport() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if request.url.host == "nometrics":
            return httpx.Response(404, text="Not Found")
        if request.url.host == "broken":
            return httpx.Response(500, text="boom")
        return httpx.Response(200, text=SGLANG_TEXT)

    async def go() -> None:
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as c:
            s = await scrape(c, "http://srv:30000/v1/", headers={"Authorization": "Bearer k"})
            assert s is not None and s.engine == "sglang" and s.running == 7
            assert await scrape(c, "http://nometrics:30000") is None
            with pytest.raises(httpx.HTTPStatusError):
                await scrape(c, "http://broken:30000")

    asyncio.run(go())
    assert str(seen[0].url) == "http://srv:30000/metrics"
    assert seen[0].headers["authorization"] == "Bearer k"
    assert len(seen) == 3


# --------------------------------------------------------------------------- sampler (real HTTP)


class _State:
    def __init__(self) -> None:
        self.mode = "ok"  # "ok" | "404" | "fail_2_3"
        self.requests = 0
        self.lock = threading.Lock()


def _vllm_text(n: int) -> str:
    return (
        "# HELP vllm:num_requests_running Number of requests in model execution batches.\n"
        "# TYPE vllm:num_requests_running gauge\n"
        f'vllm:num_requests_running{{engine="0",{QWEN}}} {n % 4}.0\n'
        "# HELP vllm:generation_tokens_total Number of generation tokens processed.\n"
        "# TYPE vllm:generation_tokens_total counter\n"
        f'vllm:generation_tokens_total{{engine="0",{QWEN}}} {n * 10}.0\n'
        "# HELP vllm:prefix_cache_hits_total Prefix cache hits, in terms of number of cached tokens.\n"
        "# TYPE vllm:prefix_cache_hits_total counter\n"
        f'vllm:prefix_cache_hits_total{{engine="0",{QWEN}}} 0.0\n'
        "# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.\n"
        "# TYPE vllm:kv_cache_usage_perc gauge\n"
        f'vllm:kv_cache_usage_perc{{engine="0",{QWEN}}} 0.5\n'
    )


@pytest.fixture
def metrics_server() -> Iterator[tuple[str, _State]]:
    state = _State()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            with state.lock:
                state.requests += 1
                n = state.requests
            if self.path != "/metrics" or state.mode == "404":
                status, body = 404, b"Not Found"
            elif state.mode == "fail_2_3" and n in (2, 3):
                status, body = 500, b"Internal Server Error"
            else:
                status, body = 200, _vllm_text(n).encode()
            self.send_response(status)
            self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    th = threading.Thread(target=srv.serve_forever, daemon=True)
    th.start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}", state
    finally:
        srv.shutdown()
        srv.server_close()
        th.join(timeout=5)


def _lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def test_sampler_writes_levelled_lines(metrics_server: tuple[str, _State], tmp_path: Path) -> None:
    base, state = metrics_server
    path = tmp_path / "run" / "server_metrics.jsonl"

    async def go() -> MetricsSampler:
        async with MetricsSampler(base + "/v1", path, interval_s=0.05) as s:
            assert s.available is True
            s.set_level("c=1 in=512")
            await asyncio.sleep(0.3)
            s.set_level("c=4 in=512")
            await asyncio.sleep(0.3)
        return s

    s = asyncio.run(go())
    lines = _lines(path)
    assert len(lines) >= 3
    assert s.n_errors == 0
    assert s.n_samples == len(lines) == state.requests  # one line per request, final sample included
    assert lines[0]["level"] is None  # first scrape happens on entry, before set_level
    levels = [ln["level"] for ln in lines]
    assert "c=1 in=512" in levels and "c=4 in=512" in levels
    assert levels[-1] == "c=4 in=512"
    first_c4 = levels.index("c=4 in=512")
    assert all(lv == "c=4 in=512" for lv in levels[first_c4:])
    assert lines[0]["t_s"] == pytest.approx(0.0, abs=0.05)
    ts = [ln["t_s"] for ln in lines]
    assert ts == sorted(ts) and len(set(ts)) == len(ts)
    # the server's counter is 10 x request number, so lines carry 10, 20, 30, ...
    assert [ln["generation_tokens_total"] for ln in lines] == [10.0 * (i + 1) for i in range(len(lines))]
    assert all(ln["engine"] == "vllm" and ln["kv_usage_frac"] == 0.5 for ln in lines)
    assert all(set(SAMPLE_FIELDS) <= set(ln) and "wall_time" in ln for ln in lines)
    d = delta(lines[0], lines[-1])
    assert d["prefix_cache_hits_total"] == 0.0
    assert d["generation_tokens_total"] == 10.0 * (len(lines) - 1)

    df = load_samples(path)
    assert len(df) == len(lines)
    assert df.attrs["available"] is True
    assert list(df["generation_tokens_total"]) == [ln["generation_tokens_total"] for ln in lines]
    assert list(df["level"].iloc[1:]) == levels[1:]
    assert str(df["wall_time"].dt.tz) == "UTC"
    assert df["spec_draft_tokens_total"].isna().all()


def test_sampler_takes_final_sample_on_exit(metrics_server: tuple[str, _State], tmp_path: Path) -> None:
    base, state = metrics_server
    path = tmp_path / "m.jsonl"

    async def go() -> None:
        # interval far longer than the block: only the entry and the exit samples happen
        async with MetricsSampler(base, path, interval_s=30.0) as s:
            s.set_level("c=8 in=128")
            await asyncio.sleep(0.05)

    asyncio.run(go())
    lines = _lines(path)
    assert [ln["level"] for ln in lines] == [None, "c=8 in=128"]
    assert [ln["generation_tokens_total"] for ln in lines] == [10.0, 20.0]
    assert state.requests == 2


def test_sampler_404_writes_unavailable_and_stops(metrics_server: tuple[str, _State], tmp_path: Path) -> None:
    base, state = metrics_server
    state.mode = "404"
    path = tmp_path / "server_metrics.jsonl"

    async def go() -> MetricsSampler:
        async with MetricsSampler(base, path, interval_s=0.05) as s:
            assert s.available is False
            await asyncio.sleep(0.3)
        return s

    s = asyncio.run(go())
    lines = _lines(path)
    assert len(lines) == 1
    assert lines[0]["available"] is False
    assert "404" in lines[0]["reason"]
    assert state.requests == 1  # no sampling after the first 404, no final sample
    df = load_samples(path)
    assert len(df) == 0
    assert df.attrs["available"] is False and "404" in df.attrs["reason"]
    assert s.n_samples == 0


def test_sampler_connection_refused(tmp_path: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    path = tmp_path / "m.jsonl"

    async def go() -> None:
        async with MetricsSampler(f"http://127.0.0.1:{port}", path, interval_s=0.05) as s:
            assert s.available is False
            await asyncio.sleep(0.1)

    asyncio.run(go())
    lines = _lines(path)
    assert len(lines) == 1
    assert lines[0]["available"] is False
    assert lines[0]["reason"].startswith("connection failed")


def test_sampler_counts_transient_errors(metrics_server: tuple[str, _State], tmp_path: Path) -> None:
    base, state = metrics_server
    state.mode = "fail_2_3"
    path = tmp_path / "m.jsonl"

    async def go() -> MetricsSampler:
        async with MetricsSampler(base, path, interval_s=0.05) as s:
            await asyncio.sleep(0.4)
        return s

    s = asyncio.run(go())
    lines = _lines(path)
    assert s.n_errors == 2
    assert "500" in (s.last_error or "")
    assert len(lines) == state.requests - 2 >= 3
    assert [ln["generation_tokens_total"] for ln in lines[:3]] == [10.0, 40.0, 50.0]


def test_snapshot(metrics_server: tuple[str, _State]) -> None:
    base, state = metrics_server
    s = asyncio.run(snapshot(base))
    assert s is not None and s.generation_tokens_total == 10.0 and s.running == 1
    state.mode = "404"
    assert asyncio.run(snapshot(base)) is None


def test_load_samples_skips_truncated_line(tmp_path: Path) -> None:
    p = tmp_path / "m.jsonl"
    good = {"t_s": 0.0, "wall_time": "2025-01-01T00:00:00.000+00:00", "level": "c=1", "engine": "vllm", "running": 2}
    p.write_text(json.dumps(good) + "\n" + json.dumps(good | {"t_s": 0.5, "running": 3}) + "\n" + '{"t_s": 1.0, "wall')
    df = load_samples(p)
    assert list(df["running"]) == [2.0, 3.0]
    assert list(df["t_s"]) == [0.0, 0.5]
    assert df["kv_usage_frac"].isna().all()
