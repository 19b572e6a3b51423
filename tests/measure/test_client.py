"""Streaming client: SSE parsing, timing against injected delays, failure classification."""

from __future__ import annotations

import asyncio
import statistics

import pytest

from servelab.measure import client
from servelab.schema.runfiles import RequestOutcome


def _parse(lines: list[tuple[str, float]]) -> tuple[RequestOutcome, client.StreamParser]:
    p = client.StreamParser(0)
    for line, t in lines:
        p.feed(line, int(t * 1e9))
    return p.fill(RequestOutcome()), p


def test_parser_skips_role_chunk_and_counts_text_chunks():
    lines = [
        ('data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}', 0.010),
        ("", 0.011),
        (": keep-alive", 0.012),
        ('data: {"choices":[{"index":0,"delta":{"content":"Hel"}}]}', 0.100),
        ('data: {"choices":[{"index":0,"delta":{"reasoning_content":"lo"}}]}', 0.130),
        ('data: {"choices":[{"index":0,"delta":{"content":""},"finish_reason":"length"}]}', 0.150),
        ('data: {"choices":[],"usage":{"prompt_tokens":7,"completion_tokens":3}}', 0.151),
        ("data: [DONE]", 0.152),
    ]
    r, p = _parse(lines)
    assert r.ttft_s == pytest.approx(0.100)
    assert r.chunk_times_s == pytest.approx([0.100, 0.130])
    assert r.n_text_chunks == 2 and r.n_chunks == 5  # role, 2 text, finish, usage
    assert r.finish_reason == "length"
    assert p.done and p.usage == {"prompt_tokens": 7, "completion_tokens": 3}
    assert r.end_s == pytest.approx(0.152)


def test_parser_keeps_the_tokens_each_chunk_carried_from_continuous_usage():
    """With stream_options.continuous_usage_stats every chunk carries the cumulative usage: the
    tokens of each text chunk are kept (n-gram speculation sends several in one chunk); a stream
    that said it for only some chunks keeps none."""
    u = '"usage":{{"prompt_tokens":7,"completion_tokens":{}}}'
    lines = [
        ('data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""}}],' + u.format(0) + '}', 0.01),
        ('data: {"choices":[{"index":0,"delta":{"content":"A"}}],' + u.format(1) + '}', 0.10),
        ('data: {"choices":[{"index":0,"delta":{"content":"BCDE"}}],' + u.format(5) + '}', 0.13),
        ('data: {"choices":[{"index":0,"delta":{"content":"F"},"finish_reason":"length"}],' + u.format(6) + '}', 0.16),
        ('data: {"choices":[],' + u.format(6) + '}', 0.161),
        ("data: [DONE]", 0.162),
    ]
    r, _ = _parse(lines)
    assert r.chunk_tokens == [1, 5, 6] and len(r.chunk_times_s) == 3
    r, _ = _parse([lines[1], ('data: {"choices":[{"index":0,"delta":{"content":"B"}}]}', 0.12), lines[-1]])
    assert r.chunk_tokens == [] and r.n_text_chunks == 2


def test_parser_bytes_split_anywhere():
    """Raw reads cut lines, CRLF pairs and UTF-8 characters anywhere; each line is timed by the
    read that completed it."""
    body = ('data: {"choices":[{"index":0,"delta":{"content":"日本"}}]}\r\n\r\n'
            'data: {"choices":[{"index":0,"delta":{"content":"語"}}]}\n\n'
            'data: {"choices":[],"usage":{"prompt_tokens":2,"completion_tokens":2}}\n\n'
            "data: [DONE]").encode()
    cut = body.index("本".encode()) + 1  # inside a 3-byte character
    reads = [body[:cut], body[cut:cut + 40], body[cut + 40:]]
    p = client.StreamParser(0)
    for i, data in enumerate(reads):
        p.feed_bytes(data, (i + 1) * 10**9)
    assert not p.done  # "data: [DONE]" had no newline yet
    p.flush(9 * 10**9)
    r = p.fill(RequestOutcome())
    assert p.done and r.end_s == 9.0
    assert r.n_text_chunks == 2 and r.ttft_s == 2.0  # first line completed by the second read
    assert r.output_chars == 3 and p.usage["completion_tokens"] == 2


def test_parser_completions_text_field():
    r, _ = _parse([('data: {"choices":[{"index":0,"text":"abc"}]}', 0.2), ("data: [DONE]", 0.3)])
    assert r.ttft_s == pytest.approx(0.2) and r.output_chars == 3


@pytest.mark.parametrize("line", ["data: {oops", "garbage line", 'data: {"error": {"message": "boom"}}', "data: [1,2]"])
def test_parser_rejects_malformed(line):
    with pytest.raises(ValueError):
        _parse([(line, 0.1)])


def test_metrics_from_result():
    r = RequestOutcome(ok=True, ttft_s=0.5, e2e_s=2.5, output_tokens=101).with_rates()
    assert r.decode_tps == pytest.approx(100 / 2.0)
    assert r.e2e_output_tps == pytest.approx(101 / 2.5)
    assert r.tpot_s == pytest.approx(2.0 / 100)
    failed = RequestOutcome(ok=False, ttft_s=0.5, e2e_s=2.5, output_tokens=101).with_rates()
    assert failed.decode_tps is None and failed.e2e_output_tps is None and failed.tpot_s is None


def test_request_body_has_benchmark_fields():
    b = client.RequestSpec(prompt="hi", max_tokens=8, model="m", cache_salt="s1", seed=42,
                       chat_template_kwargs={"enable_thinking": False}).body()
    assert b["stream"] is True and b["stream_options"] == {"include_usage": True}
    assert b["ignore_eos"] is True and b["cache_salt"] == "s1" and b["seed"] == 42
    assert b["messages"] == [{"role": "user", "content": "hi"}]
    assert b["chat_template_kwargs"] == {"enable_thinking": False}
    c = client.RequestSpec(prompt="hi", max_tokens=8, model="m", api="completions").body()
    assert c["prompt"] == "hi" and "messages" not in c and "cache_salt" not in c


async def _send_many(url: str, n: int, max_tokens: int, timeout_s: float = 20.0, api: str = "chat"):
    async with client.StreamClient(url, concurrency=n) as c:
        spec = client.RequestSpec(prompt="one two three", max_tokens=max_tokens, model="ref", api=api, cache_salt="x")
        return await asyncio.gather(*(client.send(c, spec, timeout_s=timeout_s) for _ in range(n)))


@pytest.mark.parametrize("api", ["chat", "completions"])
def test_timing_matches_injected_delays(refserver, api):
    """TTFT never under, and at most 150 ms over, what the reference server injects; ITL median within 25 %.

    The lower bound is exact: no client can see a token before it is sent. The upper one is loose
    for a loaded 2-core CI machine, where the server's thread and the client share the cores with
    other tests (a CI run saw 283 ms for 200 injected); the tight figures (1 ms, 2 %) are measured
    by `servelab calibrate` in benchmarks/, not asserted here."""
    s = refserver(ttft_s=0.200, itl_s=0.020)
    rs = asyncio.run(_send_many(s.url, 4, 30, api=api))
    assert all(r.ok for r in rs), [r.error_detail for r in rs]
    for r in rs:
        assert r.output_tokens == 30
        assert r.prompt_tokens == 3 + (5 if api == "chat" else 0)
        assert 0.200 <= r.ttft_s < 0.350
        gaps = [b - a for a, b in zip(r.chunk_times_s, r.chunk_times_s[1:])]
        assert statistics.median(gaps) == pytest.approx(0.020, rel=0.25)
        assert 0.200 + 29 * 0.020 <= r.e2e_s < 0.200 + 29 * 0.020 + 0.150
        assert r.decode_tps == pytest.approx(1 / 0.020, rel=0.25)


def test_coalesced_chunks_use_usage_for_tokens(refserver):
    s = refserver(ttft_s=0.05, itl_s=0.005, tokens_per_chunk=4)
    (r,) = asyncio.run(_send_many(s.url, 1, 20))
    assert r.ok and r.output_tokens == 20 and r.n_text_chunks == 5


@pytest.mark.parametrize("fault,kind", [
    ("http_429", client.HTTP_STATUS), ("http_500", client.HTTP_STATUS), ("http_503", client.HTTP_STATUS),
    ("reset", client.DISCONNECT), ("stall", client.TIMEOUT), ("malformed", client.MALFORMED),
    ("empty_choices", client.NO_TOKENS), ("no_usage", client.NO_USAGE), ("no_done", client.MALFORMED),
])
def test_failures_are_classified(refserver, fault, kind):
    s = refserver(ttft_s=0.01, itl_s=0.001, fault=fault)
    (r,) = asyncio.run(_send_many(s.url, 1, 10, timeout_s=1.0))
    assert not r.ok and r.error_kind == kind, (r.error_kind, r.error_detail)
    assert r.error_detail
    if kind == client.HTTP_STATUS:
        assert r.http_status == int(fault[5:]) and "injected" in r.error_detail


def test_connect_failure_is_classified():
    (r,) = asyncio.run(_send_many("http://127.0.0.1:9", 1, 5, timeout_s=5))
    assert not r.ok and r.error_kind == client.CONNECT


def test_stream_without_usage_keeps_its_text_and_is_counted_on_the_client(refserver):
    s = refserver(ttft_s=0.05, itl_s=0.01, usage=False)
    (r,) = asyncio.run(_send_many(s.url, 1, 12))
    assert not r.ok and r.error_kind == client.NO_USAGE and r.output_tokens is None
    assert r.output_text == " tok" * 12 and r.output_tokens_source is None
    d = client.count_on_client(r, lambda text: len(text.split()))
    assert d.ok and d.error_kind is None and d.output_tokens == 12
    assert d.output_tokens_source == "client" and d.output_text is None
    # its own end-to-end time, never under what the server injects (a loaded CI machine adds to it: 305 ms once)
    assert d.e2e_s == pytest.approx(r.end_s - r.start_s) and 0.05 + 11 * 0.01 <= d.e2e_s < 0.05 + 11 * 0.01 + 0.5
    assert d.decode_tps == pytest.approx(11 / (d.e2e_s - d.ttft_s))  # recomputed from the count
    assert d.start_s == r.start_s and d.end_s == pytest.approx(r.end_s)


def test_usage_marks_the_server_as_the_source_and_client_counting_leaves_it_alone(refserver):
    s = refserver(ttft_s=0.01, itl_s=0.001)
    (r,) = asyncio.run(_send_many(s.url, 1, 5))
    assert r.ok and r.output_tokens_source == "server" and r.output_text is None
    assert client.count_on_client(r, lambda text: 999) is r


def test_client_count_of_zero_tokens_is_still_a_failure():
    d = RequestOutcome(ok=False, error_kind=client.NO_USAGE, error_detail="x", start_s=10.0, end_s=10.5, ttft_s=0.1,
                       output_text="")
    out = client.count_on_client(d, lambda text: 0)
    assert not out.ok and out.error_kind == client.NO_TOKENS and out.end_s == pytest.approx(10.5)
