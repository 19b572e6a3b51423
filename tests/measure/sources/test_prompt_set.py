"""Prompt-set buckets (servelab.measure.sources.prompt_set) through the runner and the summary (servelab.measure.sources), against the
reference server (prompt tokens = words + the template's tokens)."""

from __future__ import annotations

import json

from servelab.hosts.base import Server
from servelab.measure.refserver import TEMPLATE_TOKENS, count_tokens
from servelab.measure.runinfo import base_record
from servelab.measure.runner import run_workload
from servelab.measure.sources import RoundCtx, make_source
from servelab.prompts import load_set
from servelab.runfolder import RunFolder, read_jsonl
from servelab.schema import Bucket, Workload


def _drafts(wl, n, rnd=0):
    src = make_source(wl.buckets[0], wl, counter=None)
    return src.drafts(RoundCtx("tok", 0, rnd, 1, 0.0, n, None, 0))


def test_round_robin_is_deterministic():
    wl = Workload(buckets=[Bucket(prompt_set="code", output_tokens=32)], concurrency=[1])
    n = len(load_set("code").prompts)
    ids = [d.meta["prompt_id"] for d in _drafts(wl, n + 2)]
    assert ids[:n] == [p.id for p in load_set("code").prompts] and ids[n:] == ids[:2]
    first = _drafts(wl, 1)[0]
    assert first.messages == [{"role": "user", "content": load_set("code").prompts[0].text}]
    assert first.meta["prompt_set"] == "code" and first.ignore_eos is False  # a prompt set stops at EOS
    wl_c = Workload(api="completions", buckets=[Bucket(prompt_set="code", output_tokens=32)], concurrency=[1])
    assert _drafts(wl_c, 1)[0].messages is None


def test_prompt_set_levels_record_ids_and_achieved_lengths(refserver, tmp_path):
    s = refserver(ttft_s=0.005, itl_s=0.001)
    wl = Workload(buckets=[Bucket(prompt_set="rewrite", output_tokens=8), Bucket(prompt_set="lists", output_tokens=8),
                           Bucket(input_tokens=20, output_tokens=8)],
                  concurrency=[1], warmup_rounds=1, rounds=1, requests_per_round=3, timeout_s=10)
    res = run_workload(Server(base_url=s.url, model="ref"), wl, tmp_path / "r", study="t", config_id="r",
                       record=base_record("t", "r"), progress=False, metrics_interval_s=0)
    recs = read_jsonl(tmp_path / "r" / "records.jsonl")
    # + a level measured again where its TTFTs read as still warming up (a loaded CI machine's hiccup can)
    again = sum(len(x.get("warming_ttft_s") or []) for x in read_jsonl(tmp_path / "r" / "levels.jsonl"))
    assert res.status == "complete" and len(recs) == 3 * 2 * 3 + again
    rw = [r for r in recs if r["bucket"] == "rewrite-out8"]
    want = [p.id for p in load_set("rewrite").prompts]
    assert [r["prompt_id"] for r in rw][:6] == want[:3] + want[3:6]  # round-robin continues into the next round
    rewrite = {p.id: p.text for p in load_set("rewrite").prompts}
    for r in rw:
        text = rewrite[r["prompt_id"]]
        assert r["prompt_set"] == "rewrite" and r["prompt_tokens"] == count_tokens(text) + TEMPLATE_TOKENS
        assert r["target_input_tokens"] == 0
    filler = [r for r in recs if r["bucket"] == "in20-out8"]
    assert all("prompt_set" not in r for r in filler) and {r["prompt_tokens"] for r in filler} == {20}
    summ = RunFolder(tmp_path / "r").summary
    assert list(summ["prompt_set"]) == ["rewrite", "lists", ""]  # one level per set, the filler apart
    row = summ[summ["prompt_set"] == "lists"].iloc[0]
    lists_ids = [p.id for p in load_set("lists").prompts][3:6]  # the measured round
    lists = {p.id: p.text for p in load_set("lists").prompts}
    lens = sorted(count_tokens(lists[i]) + TEMPLATE_TOKENS for i in lists_ids)
    assert row["prompt_tokens"] == lens[1]  # median of the achieved lengths
    assert row["output_tokens_p95"] == 8.0
    levels = read_jsonl(tmp_path / "r" / "levels.jsonl")
    assert all(lv["counters"]["spec_draft_tokens_total"] is None for lv in levels)  # no speculation here
    assert summ["spec_acceptance_rate"].isna().all()


def test_prompt_set_requests_stop_at_eos(refserver, tmp_path, monkeypatch):
    from servelab.measure import client

    sent = []
    orig = client.RequestSpec.body
    monkeypatch.setattr(client.RequestSpec, "body", lambda self: sent.append(orig(self)) or sent[-1])
    s = refserver(ttft_s=0.001, itl_s=0.001)
    wl = Workload(buckets=[Bucket(prompt_set="quality", output_tokens=4),
                           Bucket(prompt_set="quality", output_tokens=4, stop="length", name="forced")],
                  concurrency=[1], warmup_rounds=0, rounds=1, timeout_s=10)
    run_workload(Server(base_url=s.url, model="ref"), wl, tmp_path / "r", study="t", config_id="r",
                 record=base_record("t", "r"), progress=False, metrics_interval_s=0)
    assert [b.get("ignore_eos", False) for b in sent] == [False, True]
    assert sent[0]["messages"] == [{"role": "user", "content": load_set("quality").prompts[0].text}]
    json.dumps(sent)  # bodies are plain JSON
