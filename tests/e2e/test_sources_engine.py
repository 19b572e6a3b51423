"""Workload sources against the real vLLM CPU server with cached-token usage on
(--enable-prompt-tokens-details): an asked prefix-cache hit rate lands where the server's own
counters say, and a session's later turns reuse its history."""

from __future__ import annotations

import pytest

from servelab.analysis.cache import cache_levels, turn_hits
from servelab.measure.runinfo import base_record
from servelab.measure.runner import run_workload
from servelab.runfolder import load_records, read_jsonl
from servelab.schema import Bucket, Workload

pytestmark = [pytest.mark.engine, pytest.mark.xdist_group("vllm")]


@pytest.fixture
def engine(vllm_engine):
    """The session's engine (it reports cached tokens: --enable-prompt-tokens-details); every
    workload here salts its own requests, so what other tests cached does not count."""
    return vllm_engine


def _run(engine, wl, path):
    return run_workload(engine.server(), wl, path, study="sources", config_id="c", record=base_record("sources", "c"),
                        progress=False, metrics_interval_s=0)


def test_asked_hit_rate_lands_by_the_servers_counters(engine, tmp_path):
    wl = Workload(buckets=[Bucket(input_tokens=512, output_tokens=8, prefix_reuse=0.5),
                           Bucket(input_tokens=512, output_tokens=8, prefix_reuse=0.0)],
                  concurrency=[1, 4], warmup_rounds=1, rounds=2, timeout_s=120)
    res = _run(engine, wl, tmp_path / "run")
    assert res.status == "complete"
    assert res.calibration["in512-out8-reuse50"]["reuse_tokens"] == 256  # 8 blocks of 32 tokens
    recs = load_records(tmp_path / "run")
    levels = read_jsonl(tmp_path / "run" / "levels.jsonl")
    t = cache_levels(recs, levels)
    half, none = t[t["bucket"] == "in512-out8-reuse50"], t[t["bucket"] == "in512-out8-reuse0"]
    assert len(half) == 2 and len(none) == 2
    # the server's counters over the measured rounds: asked 50 %, within 3 points
    assert half["counter_hit_rate"].between(0.47, 0.53).all(), half[["counter_hit_rate"]]
    assert (none["counter_hit_rate"] < 0.03).all(), none[["counter_hit_rate"]]
    # per request: every measured 50 % request was served 256 cached tokens, the 0 % ones none
    m = recs[~recs["warmup"]]
    assert (m.loc[m["bucket"] == "in512-out8-reuse50", "cached_tokens"] == 256).all()
    assert (m.loc[m["bucket"] == "in512-out8-reuse0", "cached_tokens"] == 0).all()
    assert half["usage_hit_rate"].round(3).tolist() == [0.5, 0.5]
    print("\nhit rate asked vs counters:", half[["concurrency", "asked_hit_rate", "counter_hit_rate",
                                                 "ttft_hit_p50_s"]].to_dict("records"),
          "misses:", none[["concurrency", "ttft_miss_p50_s"]].to_dict("records"))


def test_later_session_turns_are_served_from_the_cache(engine, tmp_path):
    b = Bucket(input_tokens=64, output_tokens=16,
               session={"kind": "agent", "turns": 4, "system_tokens": 300, "tool_result_tokens": 48,
                        "think_time_s": 0.1})
    wl = Workload(buckets=[b], concurrency=[2], warmup_rounds=0, rounds=1, requests_per_round=1, timeout_s=120)
    assert _run(engine, wl, tmp_path / "s").status == "complete"
    recs = load_records(tmp_path / "s")
    assert len(recs) == 2 * 4 and recs["ok"].all()
    for _, g in recs.groupby("session_id"):
        g = g.sort_values("turn")
        p, cached = g["prompt_tokens"].tolist(), g["cached_tokens"].tolist()
        assert cached[0] == 0  # its own salt: nothing from the other session
        for t in range(1, 4):  # the whole previous prompt is a prefix of this one: its full blocks hit
            assert cached[t] >= p[t - 1] // 32 * 32, (t, p, cached)
            assert cached[t] < p[t]
    th = turn_hits(recs)
    assert th.loc[th["turn"] == 0, "cached_share_p50"].iloc[0] == 0
    assert (th.loc[th["turn"] > 0, "cached_share_p50"] > 0.6).all()
    print("\nsession turns:", th[["turn", "prompt_tokens_p50", "cached_share_p50", "ttft_p50_s"]].to_dict("records"))
