"""Answers under load (measure.sources.canary, analysis.quality.canaries): a stand-in server whose
answers change once more than a given number of requests are in flight is caught at the levels
above that number and not below; one whose answers never change shows no drop."""

from __future__ import annotations

import math

import pandas as pd

from servelab.analysis.quality import canaries, wilson
from servelab.hosts.base import Server
from servelab.measure.refserver import Behaviour, RefServer
from servelab.measure.runinfo import base_record
from servelab.measure.runner import run_workload
from servelab.prompts import load_set
from servelab.runfolder import load_records
from servelab.schema import Bucket, Workload

KNOWN = {p.raw(): (p.expected or "").split("|")[0] for p in load_set("quality").prompts}


def _answers(change_above: int | None):
    """A stand-in model: the known answer to a quality prompt, filler to anything else; "wrong" for
    every prompt once more than `change_above` requests are already running."""
    def answer(prompt: str, running: int) -> str:
        known = next((a for q, a in KNOWN.items() if q in prompt), None)
        if known is None:
            return "tok " * 8
        if change_above is not None and running >= change_above:
            return "the answer is not known to me"
        return f"the answer is {known} of course"
    return answer


def _alone(answer, max_tokens: int) -> dict:
    """quality.json as one request at a time would give it (nothing else running)."""
    prompts = []
    for p in load_set("quality").prompts:
        words = answer(p.raw(), 0).split()[:max_tokens]
        prompts.append({"id": p.id, "set": "quality", "output_text": " " + " ".join(words),
                        "output_token_ids": [sum(w.encode()) % 997 for w in words], "finish_reason": "stop"})
    return {"measurable": True, "prompts": prompts}


def _measure(tmp_path, change_above: int | None) -> list[dict]:
    srv = RefServer(Behaviour(ttft_s=0.01, itl_s=0.02, answer=_answers(change_above))).start()
    try:
        server = Server(base_url=srv.url, model="ref")
        alone = _alone(_answers(change_above), 16)
        wl = Workload(buckets=[Bucket(input_tokens=20, output_tokens=16)], concurrency=[1, 2, 8], warmup_rounds=1,
                      rounds=1, requests_per_round=1, timeout_s=10, canaries=True, ignore_eos=False)
        run_workload(server, wl, tmp_path / "x", study="t", config_id="x", record=base_record("t", "x"), progress=False)
    finally:
        srv.stop()
    return canaries(load_records(tmp_path / "x"), alone)


def test_answers_that_change_above_a_concurrency_are_caught_there(tmp_path):
    rows = {r["concurrency"]: r for r in _measure(tmp_path, change_above=4)}
    assert set(rows) == {2, 8}  # one request in flight answers one at a time: no canaries
    assert rows[2]["identical"] == rows[2]["canaries"] == 2 and rows[2]["first_divergence"] is None
    # at 8 in flight the first few start before 4 are running, the rest answer differently
    assert rows[8]["canaries"] == 8 and rows[8]["identical"] < 8
    assert rows[8]["first_divergence"]["token_index"] == 3  # "the answer is [not]"
    assert rows[8]["score"] < rows[8]["score_alone"] == 8


def test_answers_that_never_change_show_no_drop(tmp_path):
    rows = _measure(tmp_path, change_above=None)
    assert rows and all(r["identical"] == r["canaries"] and r["score"] == r["score_alone"] for r in rows)
    assert all(r["quality"] != "drops" for r in rows)


def test_canaries_are_in_no_throughput_figure(tmp_path):
    _measure(tmp_path, change_above=None)
    recs = load_records(tmp_path / "x")
    c = recs[recs["canary"].fillna(False).astype(bool)]
    assert len(c) == 2 + 8 and c["warmup"].all() and c["output_token_ids"].map(len).gt(0).all()
    from servelab.summary import round_throughput

    assert set(round_throughput(recs)["round"]) == {1}  # the measured round only


def test_wilson_interval():
    lo, hi = wilson(8, 8)
    assert 0.67 < lo < 0.68 and hi == 1.0
    assert all(math.isnan(x) for x in wilson(0, 0))
    assert canaries(pd.DataFrame(), None) == []
