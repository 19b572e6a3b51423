"""End to end against the real vLLM CPU server (started by the fixtures, stopped after). The
session's engine reports cached tokens (--enable-prompt-tokens-details): the workload sources'
tests below check that an asked prefix-cache hit rate lands where the server's own counters say
and that a session's later turns reuse its history (each salts its own requests, so what other
tests cached does not count)."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from servelab.analysis.cache import cache_levels, turn_hits
from servelab.schema import Bucket, Workload
from servelab.measure.metrics import delta, snapshot
from servelab.runfolder import load_records, read_json, read_jsonl
from servelab.measure.runinfo import base_record
from servelab.measure.runner import run_workload

from conftest import ENGINE_PORT, start_engine

pytestmark = pytest.mark.engine


def _run(engine, wl, path, name):
    return run_workload(engine.server(), wl, path / name, study="e2e", config_id=name,
                        record=base_record("e2e", name), progress=False, metrics_interval_s=0.25)


def test_counts_tokens_and_cache_isolation(vllm_engine, tmp_path):
    import asyncio

    wl = Workload(buckets=[Bucket(input_tokens=64, output_tokens=16), Bucket(input_tokens=700, output_tokens=24)],
                  concurrency=[1, 4], warmup_rounds=1, rounds=2, timeout_s=120)
    before = asyncio.run(snapshot(vllm_engine.base_url))
    res = _run(vllm_engine, wl, tmp_path, "salted")
    after = asyncio.run(snapshot(vllm_engine.base_url))
    recs = read_jsonl(tmp_path / "salted" / "records.jsonl")
    assert res.status == "complete"
    assert len(recs) == 2 * 3 * (1 + 4)
    assert all(r["ok"] for r in recs), [r["error_detail"] for r in recs if not r["ok"]]
    for r in recs:
        target = r["target_input_tokens"]
        assert abs(r["prompt_tokens"] - target) <= max(2, 0.01 * target)
        assert r["output_tokens"] == r["target_output_tokens"]
    d = delta(before, after)
    # identical prompts were sent 30 times; unique salts keep the prefix cache cold
    assert d["prefix_cache_queries_total"] >= sum(r["prompt_tokens"] for r in recs)
    assert d["prefix_cache_hits_total"] == 0
    assert d["generation_tokens_total"] == sum(r["output_tokens"] for r in recs)
    run = read_json(tmp_path / "salted" / "run.json")
    assert run["server"]["version"] and run["server"]["command"][:3][1:] == ["-m", "vllm.entrypoints.openai.api_server"]
    assert run["server"]["startup_s"] > 0 and run["server"]["peak_rss_bytes"] > 500e6


def test_without_salt_the_prefix_cache_is_hit(vllm_engine, tmp_path):
    """The contrast that proves the zero above is measured, not structural."""
    import asyncio

    wl = Workload(buckets=[Bucket(input_tokens=700, output_tokens=4)], concurrency=[1], warmup_rounds=0, rounds=3,
                  cache_salt=False, timeout_s=120)
    before = asyncio.run(snapshot(vllm_engine.base_url))
    _run(vllm_engine, wl, tmp_path, "unsalted")
    d = delta(before, asyncio.run(snapshot(vllm_engine.base_url)))
    assert d["prefix_cache_hits_total"] >= 2 * 640  # 2nd and 3rd requests reuse whole 32-token blocks


def test_killing_the_server_mid_level(cpu_model_dir, tmp_path):
    eng = start_engine(cpu_model_dir, tmp_path / "engine", ENGINE_PORT + 1)
    try:
        wl = Workload(buckets=[Bucket(input_tokens=64, output_tokens=64)], concurrency=[4], warmup_rounds=0,
                      rounds=40, timeout_s=60)
        records = tmp_path / "killed" / "records.jsonl"

        def kill_after_some_successes():
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                if sum(r["ok"] for r in read_jsonl(records)) >= 6:
                    break
                time.sleep(0.2)
            os.killpg(eng.proc.pid, signal.SIGKILL)

        threading.Thread(target=kill_after_some_successes, daemon=True).start()
        res = _run(eng, wl, tmp_path, "killed")
    finally:
        eng.stop()
    recs = read_jsonl(records)
    ok = [r for r in recs if r["ok"]]
    assert res.status == "partial" and "stopped answering" in res.message and str(records) in res.message
    assert len(ok) >= 6 and len(recs) > len(ok)
    assert sorted(r["seq"] for r in recs) == list(range(len(recs)))  # every request sent is accounted for
    assert all(r["output_tokens"] == 64 for r in ok)
    assert {r["error_kind"] for r in recs if not r["ok"]} <= {"connect", "disconnect", "timeout"}
    assert read_json(tmp_path / "killed" / "run.json")["status"] == "partial"
    assert not eng.alive()


# -- workload sources (sessions, prefix reuse) ---------------------------------------------------

def _run_sources(engine, wl, path):
    return run_workload(engine.server(), wl, path, study="sources", config_id="c", record=base_record("sources", "c"),
                        progress=False, metrics_interval_s=0)


def test_asked_hit_rate_lands_by_the_servers_counters(vllm_engine, tmp_path):
    wl = Workload(buckets=[Bucket(input_tokens=512, output_tokens=8, prefix_reuse=0.5),
                           Bucket(input_tokens=512, output_tokens=8, prefix_reuse=0.0)],
                  concurrency=[1, 4], warmup_rounds=1, rounds=2, timeout_s=120)
    res = _run_sources(vllm_engine, wl, tmp_path / "run")
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


def test_later_session_turns_are_served_from_the_cache(vllm_engine, tmp_path):
    b = Bucket(input_tokens=64, output_tokens=16,
               session={"kind": "agent", "turns": 4, "system_tokens": 300, "tool_result_tokens": 48,
                        "think_time_s": 0.1})
    wl = Workload(buckets=[b], concurrency=[2], warmup_rounds=0, rounds=1, requests_per_round=1, timeout_s=120)
    assert _run_sources(vllm_engine, wl, tmp_path / "s").status == "complete"
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
