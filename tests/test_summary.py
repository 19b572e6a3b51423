"""Summary arithmetic on synthetic records with known answers."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from servelab.summary import round_throughput, summarize


def rec(round_, start, end, ttft, out=11, ok=True, warmup=False, c=2, err=None):
    return {"config": "a", "bucket": "in8-out11", "target_input_tokens": 8, "target_output_tokens": 11,
            "concurrency": c, "round": round_, "warmup": warmup, "ok": ok, "error_kind": err,
            "start_s": start, "end_s": end, "ttft_s": ttft if ok else None, "e2e_s": end - start if ok else None,
            "prompt_tokens": 8, "output_tokens": out if ok else None,
            "e2e_output_tps": out / (end - start) if ok else None,
            "decode_tps": (out - 1) / (end - start - ttft) if ok else None,
            "tpot_s": (end - start - ttft) / (out - 1) if ok else None,
            "chunk_times_s": [ttft + 0.1 * i for i in range(out)] if ok else []}


def test_summary_excludes_warmup_and_computes_rounds():
    rows = [
        rec(0, 0.0, 100.0, 50.0, warmup=True),  # warmup: must not count
        rec(1, 10.0, 12.0, 0.5), rec(1, 10.5, 13.0, 0.5),  # round 1: wall 3 s, 22 tokens
        rec(2, 20.0, 22.0, 1.0), rec(2, 20.0, 21.0, 0.5, ok=False, err="http_status"),  # round 2: wall 2 s, 11 tok
    ]
    df = pd.DataFrame(rows)
    rt = round_throughput(df)
    assert list(rt["aggregate_output_tps"]) == pytest.approx([22 / 3.0, 11 / 2.0])
    s = summarize(df).iloc[0]
    assert s["sent"] == 4 and s["ok"] == 3 and s["success_rate"] == pytest.approx(0.75)
    assert s["failures"] == "http_status=1"
    assert s["rounds"] == 2
    assert s["aggregate_output_tps"] == pytest.approx((22 / 3 + 11 / 2) / 2)
    assert s["aggregate_output_tps_min"] == pytest.approx(5.5)
    assert s["ttft_p50_s"] == pytest.approx(0.5)
    assert s["decode_tps_p50"] == pytest.approx(10 / 1.5)  # median of 10/1.5, 10/2.0, 10/1.0
    assert s["itl_p50_s"] == pytest.approx(0.1)
    assert s["prompt_tokens"] == 8


def test_terminal_table_says_a_level_failed_instead_of_nan():
    from servelab.summary import format_table

    rows = [rec(0, 0.0, 2.0, 0.5, c=1), rec(0, 2.0, 4.0, 0.5, c=1)]  # c=1: fine
    rows += [rec(0, 5.0, 5.1, 0.0, ok=False, err="disconnect", c=2) for _ in range(3)]  # c=2: the engine died
    rows += [rec(0, 5.0, 5.1, 0.0, ok=False, err="connect", c=2)]
    text = format_table(summarize(pd.DataFrame(rows)))
    good, bad = text.splitlines()[1:]
    assert "NaN" not in text and "nan" not in text and "0.0-0.0" not in text
    assert "level failed: no successful request (connect=1, disconnect=3)" in bad
    assert bad.split()[2] == "2" and bad.split()[3:11] == ["-"] * 8  # every measured cell is empty
    assert bad.split()[11] == "0.0"  # ok %
    assert good.split()[2] == "1" and "500.0" in good.split() and "failed" not in good


def test_round_decode_speed_is_one_over_the_mean_tpot_and_keeps_still_when_the_batch_regroups():
    """A round's decode tok/s is 1 / its requests' mean TPOT: when the engine prefills the four
    requests of a round one then three instead of three then one, the median of their speeds jumps
    (14.8, 29.5 x 3 against 22.7 x 3, 29.6: SmolLM2 on vLLM CPU, 2026-12-05) and the mean TPOT hardly moves."""
    from servelab.summary import decode_tps_of_round

    one_then_three, three_then_one = [14.8, 29.5, 29.5, 29.5], [22.7, 22.7, 22.7, 29.6]
    assert decode_tps_of_round(one_then_three) == pytest.approx(4 / (1 / 14.8 + 3 / 29.5))
    a, b = decode_tps_of_round(one_then_three), decode_tps_of_round(three_then_one)
    assert abs(a / b - 1) < 0.02
    assert abs(29.5 / 22.7 - 1) > 0.25  # what the median of each round said
    assert decode_tps_of_round([30.0]) == pytest.approx(30.0)  # one request: its own speed
    assert math.isnan(decode_tps_of_round([])) and math.isnan(decode_tps_of_round([None, 0.0]))
    rows = [rec(1, 0.0, 0.1 + 10 / v, 0.1, c=4) for v in one_then_three]  # 11 tokens: 10 gaps at v tok/s
    rt = round_throughput(pd.DataFrame(rows))
    assert rt["decode_tps_mean_tpot"].iloc[0] == pytest.approx(a)


def _stream(start, ttft, step, n, stall_at=None, stall_s=0.0, tokens=None):
    """A record of `n` one-token chunks `step` apart after `ttft`; a `stall_s` pause before chunk
    `stall_at` (another request's prefill); `tokens`: the chunks' cumulative counts instead."""
    times, t = [ttft], ttft
    for k in range(1, n):
        t += step + (stall_s if k == stall_at else 0.0)
        times.append(t)
    out = tokens[-1] if tokens else n
    r = rec(1, start, start + t, ttft, out=out, c=4)
    return {**r, "chunk_times_s": times, "chunk_tokens": tokens or []}


def test_steady_decode_leaves_out_the_gaps_where_another_request_was_prefilled():
    """At four in flight the engine prefills the first request alone and the other three together,
    and the first one waits 0.8 s for their prefill: its TPOT is 74 ms against the others' 40 ms
    (SmolLM2 on vLLM CPU, 2026-12-05). Between prefills every request decodes at 40 ms, whatever the
    grouping: 1+3 and 2+2 give the same round value; the mean TPOT does not."""
    from servelab.summary import decode_tps_of_round, decode_tps_steady

    step = 0.040
    one_then_three = [_stream(0.0, 0.34, step, 24, stall_at=1, stall_s=0.78)] + \
        [_stream(0.0, 0.34 + step + 0.78 + 0.002 * i, step, 24) for i in range(3)]  # parsed 0-4 ms apart
    two_and_two = [_stream(0.0, 0.60, step, 24, stall_at=1, stall_s=0.50) for _ in range(2)] + \
        [_stream(0.0, 0.60 + step + 0.50, step, 24) for _ in range(2)]
    a, b = decode_tps_steady(one_then_three), decode_tps_steady(two_and_two)
    assert a == pytest.approx(1 / step, rel=1e-6) and b == pytest.approx(1 / step, rel=1e-6)
    mean_a = decode_tps_of_round([r["decode_tps"] for r in one_then_three])
    mean_b = decode_tps_of_round([r["decode_tps"] for r in two_and_two])
    assert abs(mean_a / mean_b - 1) > 0.04 and mean_a < 0.9 / step
    # one request alone: its own decode speed
    alone = [_stream(0.0, 0.3, step, 24)]
    assert decode_tps_steady(alone) == pytest.approx(alone[0]["decode_tps"])
    # requests one after another (c=1 rounds of several): nobody's prefill falls inside another's decode
    seq = [_stream(0.0, 0.3, step, 24), _stream(2.0, 0.3, 0.050, 24)]
    assert decode_tps_steady(seq) == pytest.approx(2 / (step + 0.050))
    assert round_throughput(pd.DataFrame(one_then_three))["decode_tps_steady"].iloc[0] == pytest.approx(a)
    assert math.isnan(decode_tps_steady([])) and math.isnan(decode_tps_steady([rec(1, 0, 1, 0.5, ok=False)]))


def test_steady_decode_counts_the_tokens_each_chunk_carried():
    """Speculative decoding sends several tokens a chunk: the stalled gap's tokens come from the
    chunks' usage counts; without them tokens are spread evenly over the chunks."""
    from servelab.summary import steady_tpot_s

    # 6 chunks, 24 tokens: 1 | 8 after a 0.5 s stall (another request prefilled) | 4, 4, 4, 3 at 0.05 s
    r = _stream(0.0, 0.2, 0.05, 6, stall_at=1, stall_s=0.5, tokens=[1, 9, 13, 17, 21, 24])
    other_first = 0.2 + 0.55
    assert steady_tpot_s(r, [other_first], 0.01) == pytest.approx(0.20 / 15)
    assert steady_tpot_s(r, [], 0.01) == pytest.approx(r["tpot_s"])  # nobody else: its TPOT
    even = {**r, "chunk_tokens": []}  # 23 tokens over 5 gaps: 4.6 a gap
    assert steady_tpot_s(even, [other_first], 0.01) == pytest.approx(0.20 / (23 - 4.6))
