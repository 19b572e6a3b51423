"""Predictions from model facts and the hardware table (analysis.predict), the measurements they
are held against (analysis.capacity), and the run.json record a new run stores before it measures."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest

from servelab.analysis.capacity import brackets_overlap, grid_capacity, grid_verdicts, prediction_for
from servelab.analysis.perfmodel import predict_configuration
from servelab.analysis.predict import errors, predict, predict_run, symptom_evidence
from servelab.analysis.roofline import get_hardware
from servelab.schema import Slo
from paths import ROOT

H200_RUN = ROOT / "reports" / "h200-llama8b-vllm" / "data" / "cudagraph" / "run.json"


@pytest.fixture(scope="module")
def h200_run() -> dict:
    return json.loads(H200_RUN.read_text())


def test_c1_tpot_is_the_bandwidth_roofline_of_llama8b_on_h200(h200_run):
    p = predict_run(h200_run, 256, 256, {"ttft_p95_s": 0.5, "tpot_p95_s": 0.05})
    f = h200_run["model"]["facts"]
    # weights read once per step (all but the input embedding), plus the KV of 256 + 128 tokens
    step_bytes = (f["param_count"] - f["embedding_param_count"]) * 2 + 384 * 131072
    assert p["tpot_c1_s"] == pytest.approx(step_bytes / 4.8e12, rel=1e-12)
    assert p["hardware"] == "H200 SXM"
    # prefill: 2 FLOPs per matmul parameter per token at the dense BF16 peak
    mm = f["param_count"] - f["embedding_param_count"] - f["lm_head_param_count"]
    assert p["prefill_tps"] == pytest.approx(989e12 / (2 * mm), rel=1e-12)


def test_kv_concurrency_from_gpu_memory_share(h200_run):
    p = predict_run(h200_run, 256, 256)
    f = h200_run["model"]["facts"]
    free = 0.9 * 141e9 - f["weight_bytes"]
    tokens = free // (131072 * 16) * 16  # whole blocks of vLLM's default 16
    assert p["kv_tokens"] == tokens and p["kv_from"] == "gpu-memory-utilization"
    assert p["kv_concurrency"] == pytest.approx(tokens / 512)
    assert p["max_num_seqs"] == 256


def test_forced_blocks_and_byte_budget_set_the_kv_tokens(h200_run):
    facts = h200_run["model"]["facts"]
    hw = get_hardware("h200")
    forced = predict(facts, hw, 1, {"num-gpu-blocks-override": 100, "block-size": 32}, 1000, 88)
    assert forced["kv_tokens"] == 3200 and forced["kv_concurrency"] == pytest.approx(3200 / 1088)
    budget = predict(facts, hw, 1, {"kv-cache-memory-bytes": "1G"}, 256, 256)
    assert budget["kv_tokens"] == (2**30 // (131072 * 16)) * 16 and budget["kv_from"] == "kv-cache-memory-bytes"


def test_capacity_is_bound_by_the_tightest_limit(h200_run):
    facts = h200_run["model"]["facts"]
    hw = get_hardware("h200")
    # a KV cache for 4 requests: the KV limit binds; Little's law at 4 concurrent
    p = predict(facts, hw, 1, {"num-gpu-blocks-override": 128, "block-size": 16}, 256, 256,
                {"ttft_p95_s": 0.5, "tpot_p95_s": 0.05})
    assert p["capacity_binding"] == "kv" and p["capacity_concurrency"] == 4
    assert p["capacity_rps"] < 4 / (256 * p["tpot_c1_s"])  # a batch of 4 steps slower than one request
    # a TTFT target below the prefill bound: nothing meets it
    q = predict(facts, hw, 1, {}, 8192, 256, {"ttft_p95_s": 0.01})
    assert q["capacity_rps"] == 0.0 and q["capacity_binding"] == "ttft"


def test_errors_and_evidence():
    pred = {"tpot_c1_s": 0.003, "kv_concurrency": 100.0, "prefill_tps": 1000.0}
    meas = {"tpot_c1_s": 0.012, "kv_concurrency": 80.0, "prefill_tps": float("nan")}
    e = errors(pred, meas)
    assert e["tpot_c1_s"] == pytest.approx(300.0) and e["kv_concurrency"] == pytest.approx(-20.0)
    assert math.isnan(e["prefill_tps"])
    ev = dict(symptom_evidence(pred, meas))
    assert ev["decode_far_below_bound"]["ratio"] == pytest.approx(4.0)
    assert ev["kv_limited_early"] == {"measured": 80.0, "predicted": 100.0}
    assert symptom_evidence(pred, {"tpot_c1_s": 0.006, "kv_concurrency": 95.0}) == []


def _wl():
    from servelab.schema import Bucket, Workload

    return Workload(buckets=[Bucket(input_tokens=256, output_tokens=256)], concurrency=[1, 4])


def test_stored_prediction_wins_over_render_time(h200_run, tmp_path):
    slo = Slo(ttft_p95_s=0.5, tpot_p95_s=0.05)
    stored = predict_configuration(h200_run, _wl(), slo.model_dump(), {"in256-out256": (256, 256)},
                                   "2026-12-01T00:00:00", folder=tmp_path)  # no calibration there: the roofline
    p, src = prediction_for(h200_run, {"input_tokens": 256, "output_tokens": 256, "label": "in256-out256"}, slo, stored)
    assert src == "stored" and p["tpot_c1_s"] == stored["buckets"]["in256-out256"]["c1_tpot_s"]
    assert p["kinds"]["tpot_c1_s"] == "bound" and p["tpot_cmax_s"] > p["tpot_c1_s"] and p["cmax"] == 4
    p2, src2 = prediction_for(h200_run, {"input_tokens": 256, "output_tokens": 256}, slo)
    assert src2 == "render" and p2["tpot_c1_s"] == p["tpot_c1_s"]


def test_a_prediction_never_crashes_it_says_what_is_missing(h200_run, tmp_path):
    """The default study's buckets are prompt sets: their lengths come from counting the prompts;
    a bucket without them, or a run without the model's facts, is said not predictable."""
    slo = Slo(ttft_p95_s=0.5, tpot_p95_s=0.05).model_dump()
    out = predict_configuration(h200_run, _wl(), slo, {"rewrite": (130, 48), "trace": (None, 48)}, "t",
                                folder=tmp_path)
    assert set(out["buckets"]) == {"rewrite"} and out["buckets"]["rewrite"]["input_tokens"] == 130
    assert out["not_predictable_buckets"] == {"trace": "its prompt lengths unknown before the run"}
    bare = {**h200_run, "model": {}}
    none = predict_configuration(bare, _wl(), slo, {"rewrite": (130, 48)}, "t", folder=tmp_path)
    assert none["not_predictable"] == "the model's facts (parameter count) unknown" and "buckets" not in none
    p, src = prediction_for(bare, {"input_tokens": 130, "output_tokens": 48, "label": "rewrite"}, slo, none)
    assert p is None and src == "not_predictable"


def _recs(level: int, rate: float, ttft: float, n: int = 20, failed: int = 0) -> list[dict]:
    out = []
    for i in range(n):
        ok = i >= failed
        out.append({"config": "a", "bucket": "b", "level": level, "rate_rps": rate, "concurrency": 1024,
                    "round": 0, "warmup": False, "ok": ok, "ttft_s": ttft if ok else None, "tpot_s": 0.01 if ok else None,
                    "e2e_s": ttft + 0.1, "output_tokens": 10, "start_s": i / rate, "end_s": i / rate + ttft + 0.1})
    return out


def test_grid_verdicts_and_overlapping_brackets():
    slo = Slo(ttft_p95_s=1.0, tpot_p95_s=None)
    recs = pd.DataFrame(_recs(0, 1.0, 0.2) + _recs(1, 2.0, 0.5) + _recs(2, 4.0, 3.0) + _recs(3, 8.0, 0.3, failed=10))
    v = grid_verdicts(recs, slo)
    assert list(v["passes"]) == [True, True, False, False]
    assert list(v["binding"].fillna("-")) == ["-", "-", "ttft_p95_s", "error_rate"]
    g = grid_capacity(v)[("a", "b")]
    assert (g["capacity"], g["first_fail"]) == (2.0, 4.0)
    assert brackets_overlap([2.0, 2.5], [2.4, 3.0]) and not brackets_overlap([2.0, 2.5], [2.6, 3.0])
    assert brackets_overlap([8.0, None], [9.0, 10.0])
