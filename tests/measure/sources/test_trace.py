"""Workload sources without an engine: the prefix-reuse prompt shape (local tokenizer), trace
reading and scaling, equal hash ids -> equal prefix text, sessions and trace replay against the
reference server (schedule lag), Gamma and ramp-up arrivals."""

from __future__ import annotations

import numpy as np
import pytest

from servelab.hosts.base import Server
from servelab.measure import arrivals
from servelab.measure.runinfo import base_record
from servelab.measure.runner import run_workload
from servelab.measure.sources import RoundCtx, make_source
from servelab.measure.sources.trace import load, read_trace
from servelab.runfolder import load_records
from servelab.schema import Bucket, TraceSource, Workload
from paths import FIXTURES

FIX = FIXTURES / "traces"
AZURE, MOONCAKE = str(FIX / "azure-conv-2023-excerpt.csv"), str(FIX / "mooncake-conversation-excerpt.jsonl")


class WordCounter:
    """Counts like the reference server: words plus a 5-token template."""

    name = "words"

    def count(self, prompt: str) -> int:
        return len(prompt.split()) + 5


def _ctx(n: int, offsets=None) -> RoundCtx:
    return RoundCtx("tok", 0, 0, 1, 0.0, n, offsets, 0)


def test_prefix_reuse_shares_whole_blocks_then_breaks(cpu_model_dir):
    from servelab.measure.workload import LocalTokenizer

    counter = LocalTokenizer(cpu_model_dir)
    wl = Workload(buckets=[Bucket(input_tokens=512, output_tokens=8, prefix_reuse=0.5)], concurrency=[1])
    src = make_source(wl.buckets[0], wl, counter, 32)
    assert src.reuse_tokens == 256
    drafts = src.drafts(_ctx(3))
    ids = [counter.tok.apply_chat_template([{"role": "user", "content": d.prompt}], add_generation_prompt=True,
                                           tokenize=True) for d in drafts]
    ids = [x["input_ids"] if hasattr(x, "keys") else x for x in ids]
    assert [len(x) for x in ids] == [512, 512, 512]
    common = min(next(i for i, (a, b) in enumerate(zip(x, y)) if a != b) for x in ids for y in ids if x is not y)
    assert 256 <= common < 256 + 32  # blocks 0..7 shared, block 8 never complete
    assert len({d.cache_salt for d in drafts}) == 1


def test_trace_formats_read_with_offsets_and_lengths():
    az = read_trace(AZURE)
    assert len(az) == 200 and az[0].offset_s == 0.0
    assert (az[0].input_tokens, az[0].output_tokens) == (374, 44)
    assert az[1].offset_s == pytest.approx(50.9951690 - 46.6805900, abs=1e-6)
    mc = read_trace(MOONCAKE)
    assert len(mc) == 200 and mc[0].hash_ids[:3] == [0, 1, 2] and mc[0].input_tokens == 6758
    rows = load(TraceSource(path=MOONCAKE, window_s=(3.0, 12.0), time_scale=0.5, length_scale=0.01))
    assert rows[0].offset_s == 0.0 and max(r.offset_s for r in rows) == pytest.approx((9.0 - 3.0) * 0.5)
    assert all(3.0 <= read_trace(MOONCAKE)[r.index].offset_s < 12.0 for r in rows)
    assert rows[0].input_tokens == round(read_trace(MOONCAKE)[rows[0].index].input_tokens * 0.01)


def test_equal_hash_ids_give_equal_prefix_text():
    b = Bucket(trace=TraceSource(path=MOONCAKE, length_scale=0.05, max_requests=3))
    src = make_source(b, Workload(buckets=[b], concurrency=[1]), WordCounter())
    p = [d.prompt.split() for d in src.drafts(_ctx(3))]
    block = src.block  # 512 x 0.05 = 26 words per hash block
    assert block == 26
    # rows 0 and 1 share hash id 0 only; rows 0 and 2 too: one block of equal words, then different
    assert p[0][:block] == p[1][:block] == p[2][:block]
    assert p[0][block:2 * block] != p[1][block:2 * block]
    assert [len(x) + 5 for x in p] == [r.input_tokens for r in src.rows[:3]]


def test_trace_replay_keeps_its_arrival_offsets(refserver, tmp_path):
    """Azure excerpt, first 30 s at 5x speed: every send within 50 ms (p99) of its offset."""
    srv = refserver(ttft_s=0.02, itl_s=0.002)
    b = Bucket(trace=TraceSource(path=AZURE, window_s=(0.0, 30.0), time_scale=0.2, length_scale=0.02))
    wl = Workload(buckets=[b], concurrency=[1], warmup_rounds=0, rounds=1, timeout_s=10)
    res = run_workload(Server(base_url=srv.url, model="ref"), wl, tmp_path / "r", study="t", config_id="c", record=base_record("t", "c"),
                       progress=False, metrics_interval_s=0)
    assert res.status == "complete"
    recs = load_records(tmp_path / "r")
    rows = load(b.trace)
    assert len(recs) == len(rows) > 20
    assert recs["ok"].all()
    assert sorted(recs["scheduled_s"]) == pytest.approx([r.offset_s for r in rows])
    lag = recs["send_lag_s"].to_numpy()
    assert np.percentile(lag, 99) < 0.050, np.percentile(lag, 99)
    assert (recs["source"] == "trace").all() and recs["arrival"].eq("trace").all()
    assert sorted(recs["output_tokens"]) == sorted(r.output_tokens for r in rows)


def test_sessions_resend_their_history(refserver, tmp_path):
    srv = refserver(ttft_s=0.01, itl_s=0.001)
    b = Bucket(input_tokens=20, output_tokens=5,
               session={"turns": 3, "system_tokens": 40, "think_time_s": 0.05, "answer": "real"})
    wl = Workload(buckets=[b], concurrency=[2], warmup_rounds=0, rounds=1, requests_per_round=2, timeout_s=10)
    run_workload(Server(base_url=srv.url, model="ref"), wl, tmp_path / "r", study="t", config_id="c", record=base_record("t", "c"),
                 progress=False, metrics_interval_s=0)
    recs = load_records(tmp_path / "r")
    assert len(recs) == 4 * 3 and set(recs["turn"]) == {0, 1, 2}
    assert recs.groupby("session_id")["cache_salt"].nunique().eq(1).all() and recs["cache_salt"].nunique() == 4
    for _, g in recs.groupby("session_id"):
        p = g.sort_values("turn")["prompt_tokens"].tolist()
        # each turn adds the last answer (5 words, real text) and a new message (~20 tokens)
        assert p[1] - p[0] == p[2] - p[1] and p[1] - p[0] >= 5 + 20 - 2
        t = g.sort_values("turn")
        assert (t["start_s"].diff().dropna() >= 0.05).all()  # think time between turns


def test_gamma_keeps_the_rate_and_sets_the_burstiness():
    t = arrivals.offsets("gamma", 10.0, 4000, 7, burstiness=0.25)
    assert t[-1] == pytest.approx(3999 / 10.0)  # rate preserved (vLLM rescales to n / rate)
    assert arrivals.burstiness_of(t) == pytest.approx(0.25, rel=0.15)
    assert arrivals.burstiness_of(arrivals.offsets("poisson", 10.0, 4000, 7)) == pytest.approx(1.0, rel=0.1)
    ramp = arrivals.offsets("constant", 0, 5, 0, ramp=("linear", 1.0, 5.0))
    assert np.diff(ramp) == pytest.approx([1 / 1, 1 / 2, 1 / 3, 1 / 4])


def test_duration_bounded_closed_loop_rounds(refserver, tmp_path):
    srv = refserver(ttft_s=0.02, itl_s=0.005)
    wl = Workload(buckets=[Bucket(input_tokens=10, output_tokens=10)], concurrency=[2], warmup_rounds=0, rounds=1,
                  round_duration_s=0.6, timeout_s=10)
    run_workload(Server(base_url=srv.url, model="ref"), wl, tmp_path / "d", study="t", config_id="c",
                 record=base_record("t", "c"), progress=False, metrics_interval_s=0)
    recs = load_records(tmp_path / "d")
    starts = recs["start_s"] - recs["start_s"].min()
    assert starts.max() < 0.6 + 0.02  # nothing starts after the round's duration
    assert len(recs) >= 2 * 0.6 / 0.2  # each request takes ~0.07 s: the loop kept both slots busy
    assert recs["seq"].is_unique and recs["ok"].all()


def test_sessions_start_at_open_loop_arrivals(refserver, tmp_path):
    srv = refserver(ttft_s=0.01, itl_s=0.001)
    b = Bucket(input_tokens=10, output_tokens=3, session={"turns": 2})
    wl = Workload(buckets=[b], arrival="constant", rates_rps=[5.0], duration_s=1.0, concurrency=[1],
                  warmup_rounds=0, rounds=1, timeout_s=10)
    run_workload(Server(base_url=srv.url, model="ref"), wl, tmp_path / "o", study="t", config_id="c",
                 record=base_record("t", "c"), progress=False, metrics_interval_s=0)
    recs = load_records(tmp_path / "o")
    assert len(recs) == 5 * 2 and recs["session_id"].nunique() == 5
    first = recs[recs["turn"] == 0].sort_values("start_s")["start_s"]
    assert np.diff(first.to_numpy()) == pytest.approx([0.2] * 4, abs=0.03)  # a session every 1 / 5 s
