"""Diagnosis arithmetic on synthetic data with known answers (no server, no network)."""

from __future__ import annotations

import math

import matplotlib.figure
import numpy as np
import pandas as pd
import pytest

from servelab import analysis as d
from servelab.engines.vllm import derive_capture_sizes
from servelab.models import kv_bytes_per_token
from servelab.models import PRESETS, facts_from_config
from servelab.report.i18n import words

EN, JA = words("en"), words("ja")

# --------------------------------------------------------------------------- helpers


def level(config="a", bucket="in512-out128", c=1, agg=100.0, decode=50.0, ttft50=0.1, ttft95=0.12, e2e95=2.0,
          tpot95=0.02, success=1.0, prompt=512.0, inp=512, out=128):
    """One summary row (servelab.summary.summarize columns)."""
    return {"config": config, "bucket": bucket, "target_input_tokens": inp, "target_output_tokens": out,
            "concurrency": c, "sent": 10, "ok": int(round(10 * success)), "success_rate": success, "failures": "",
            "prompt_tokens": prompt, "output_tokens_p50": float(out), "ttft_p50_s": ttft50, "ttft_p95_s": ttft95,
            "e2e_p50_s": e2e95 * 0.8, "e2e_p95_s": e2e95, "e2e_output_tps_p50": decode * 0.9,
            "decode_tps_p50": decode, "tpot_p50_s": 1 / decode, "tpot_p95_s": tpot95, "itl_p50_s": 1 / decode,
            "itl_p95_s": tpot95, "aggregate_output_tps": agg, "aggregate_output_tps_min": agg * 0.95,
            "aggregate_output_tps_max": agg * 1.05}


def saturating_summary(config="a"):
    """c = 1..16: aggregate 100, 190, 360, 380, 390 (gains +90%, +89%, +6%, +3%)."""
    rows = []
    for c, agg, t95, tp95, ok, e2e in [(1, 100, 0.10, 0.020, 1.0, 2.0), (2, 190, 0.12, 0.025, 1.0, 2.2),
                                       (4, 360, 0.20, 0.030, 1.0, 2.5), (8, 380, 0.60, 0.050, 1.0, 4.0),
                                       (16, 390, 1.50, 0.090, 0.9, 9.0)]:
        rows.append(level(config=config, c=c, agg=agg, decode=agg / c, ttft95=t95, tpot95=tp95, success=ok,
                          e2e95=e2e))
    return pd.DataFrame(rows)


def samples_frame(kv, waiting, running=None, preempt=None, levels=None, available=True):
    n = len(kv)
    df = pd.DataFrame({
        "t_s": np.arange(n) * 0.5, "level": levels or ["in512-out128 c=1"] * n, "engine": "vllm",
        "kv_usage_frac": kv, "kv_capacity_tokens": 65536.0, "num_gpu_blocks": 2048.0, "block_size": 32.0,
        "running": running if running is not None else [1.0] * n, "waiting": waiting,
        "preemptions_total": preempt if preempt is not None else [0.0] * n,
        "retracted_reqs": [np.nan] * n,
    })
    df.attrs["available"] = available
    return df


# --------------------------------------------------------------------------- 1. prefill fit

OVERHEAD_S, PREFILL_TPS = 0.05, 20000.0
LENGTHS = [128, 512, 1024, 2048, 4096, 8192]


def test_fit_ttft_recovers_exact_line():
    x = np.array(LENGTHS * 3, dtype=float)
    y = OVERHEAD_S + x / PREFILL_TPS
    f = d.fit_ttft(x, y)
    assert abs(f["prefill_tps"] - PREFILL_TPS) < 1e-6
    assert abs(f["overhead_s"] - OVERHEAD_S) < 1e-6
    assert math.isfinite(f["prefill_tps_se"]) and f["prefill_tps_se"] < 1e-6
    assert math.isfinite(f["overhead_s_se"]) and f["overhead_s_se"] < 1e-9
    assert f["r2"] == pytest.approx(1.0)
    assert f["n"] == 18 and f["distinct_prompt_lengths"] == 6
    assert f["slope_significant"] is True


def test_fit_ttft_noise_gives_positive_finite_errors_covering_truth():
    x = np.array(LENGTHS * 4, dtype=float)
    noise = 0.002 * np.sin(np.arange(len(x)) * 1.7)  # deterministic, zero-ish mean
    f = d.fit_ttft(x, OVERHEAD_S + x / PREFILL_TPS + noise)
    assert 0 < f["prefill_tps_se"] < 0.05 * PREFILL_TPS
    assert 0 < f["overhead_s_se"] < 0.01
    lo, hi = f["prefill_tps_ci95"]
    assert lo < PREFILL_TPS < hi
    olo, ohi = f["overhead_s_ci95"]
    assert olo < OVERHEAD_S < ohi
    assert f["prefill_tps"] == pytest.approx(PREFILL_TPS, rel=0.02)
    assert 0.99 < f["r2"] < 1.0
    # OLS standard error of the slope, computed independently
    resid = (OVERHEAD_S + x / PREFILL_TPS + noise) - (f["overhead_s"] + f["slope_s_per_token"] * x)
    se_b = math.sqrt((resid**2).sum() / (len(x) - 2) / ((x - x.mean()) ** 2).sum())
    assert f["slope_se"] == pytest.approx(se_b, rel=1e-9)
    assert f["prefill_tps_se"] == pytest.approx(se_b / f["slope_s_per_token"] ** 2, rel=1e-9)


def test_fit_ttft_needs_two_prompt_lengths():
    f = d.fit_ttft([512, 512, 512], [0.1, 0.11, 0.12])
    assert math.isnan(f["prefill_tps"]) and math.isnan(f["overhead_s"])
    assert "fewer than 2 distinct prompt lengths" in f["note"]
    two = d.fit_ttft([100, 200], [0.06, 0.07])
    assert two["prefill_tps"] == pytest.approx(10000.0)
    assert math.isnan(two["prefill_tps_se"]) and "no standard errors" in two["note"]


def test_fit_ttft_flat_ttft_is_reported_not_inverted():
    f = d.fit_ttft([100, 200, 300, 400], [0.2, 0.19, 0.2, 0.19])
    assert math.isnan(f["prefill_tps"])
    assert "does not grow" in f["note"]
    assert f["slope_significant"] is False


def rec(prompt, ttft, c=1, ok=True, warmup=False, shared=False, config="a"):
    return {"config": config, "bucket": f"in{prompt}-out16", "target_input_tokens": prompt,
            "target_output_tokens": 16, "shared_prefix": shared, "concurrency": c, "round": 0,
            "warmup": warmup, "ok": ok, "prompt_tokens": prompt, "ttft_s": ttft if ok else None}


def test_fit_prefill_uses_only_measured_successful_c1_requests():
    rows = []
    for p in (256, 1024, 4096):
        for _ in range(3):
            rows.append(rec(p, OVERHEAD_S + p / PREFILL_TPS))
        rows.append(rec(p, 9.0, warmup=True))  # warm-up outlier: excluded
        rows.append(rec(p, None, ok=False))  # failed: excluded
        rows.append(rec(p, 5.0, c=4))  # other concurrency: excluded
    rows.append(rec(8192, 0.01, shared=True))  # prefix-cache hit bucket: excluded
    rows += [rec(p, 0.2 + p / 5000.0, config="b") for p in (256, 4096)]
    fits = d.fit_prefill(pd.DataFrame(rows))
    assert set(fits) == {"a", "b"}
    fa = fits["a"]
    assert fa["n"] == 9 and fa["source"] == "records"
    assert fa["prefill_tps"] == pytest.approx(PREFILL_TPS, rel=1e-9)
    assert fa["overhead_s"] == pytest.approx(OVERHEAD_S, abs=1e-9)
    assert fa["prompt_tokens_longest"] == 4096
    assert fa["ttft_longest_over_shortest"] == pytest.approx((0.05 + 4096 / 2e4) / (0.05 + 256 / 2e4))
    assert fits["b"]["prefill_tps"] == pytest.approx(5000.0)


def test_fit_prefill_prompt_set_buckets_are_lengths_of_their_own():
    # prompt sets carry their lengths (target 0): the default study's rewrite (~130 tokens) and
    # code (~42) buckets were one group, so its page said "98 ms at 98 tok -> 98 ms at 98 tok"
    rows = []
    for bucket, lengths in (("rewrite", (120, 130, 147)), ("code", (40, 42, 45))):
        for p in lengths:
            r = rec(p, OVERHEAD_S + p / PREFILL_TPS)
            rows.append({**r, "bucket": bucket, "target_input_tokens": 0})
    f = d.fit_prefill(pd.DataFrame(rows))["a"]
    assert (f["prompt_tokens_shortest"], f["prompt_tokens_longest"]) == (42, 130)
    assert f["ttft_longest_over_shortest"] == pytest.approx((0.05 + 130 / 2e4) / (0.05 + 42 / 2e4))


def test_fit_prefill_from_summary_medians():
    s = pd.DataFrame([level(c=1, prompt=p, ttft50=OVERHEAD_S + p / PREFILL_TPS, bucket=f"in{p}") for p in LENGTHS]
                     + [level(c=8, prompt=128, ttft50=3.0)])
    f = d.fit_prefill(s)["a"]
    assert f["source"] == "summary" and f["n"] == len(LENGTHS)
    assert abs(f["prefill_tps"] - PREFILL_TPS) < 1e-6


# --------------------------------------------------------------------------- 2. saturation

SLO = {"ttft_p95_s": 0.5, "tpot_p95_s": None, "error_rate": 0.01}


def test_saturation_gain_per_doubling_and_knee():
    sat = d.saturation(saturating_summary())
    assert list(sat["concurrency"]) == [1, 2, 4, 8, 16]
    assert math.isnan(sat["gain_per_doubling"].iloc[0])
    assert list(sat["gain_per_doubling"].iloc[1:]) == pytest.approx([0.9, 360 / 190 - 1, 380 / 360 - 1, 390 / 380 - 1])
    assert list(sat["knee"]) == [False, False, True, False, False]
    k = d.knee(sat).iloc[0]
    assert k["knee_concurrency"] == 4 and k["plateau"] and k["top_concurrency"] == 16
    assert k["max_gain_after_knee"] == pytest.approx(380 / 360 - 1)


def test_gain_is_normalised_per_doubling():
    s = pd.DataFrame([level(c=1, agg=100), level(c=4, agg=400)])
    assert d.saturation(s)["gain_per_doubling"].iloc[1] == pytest.approx(1.0)  # 4x over two doublings


def test_knee_needs_every_later_step_below_threshold():
    still_growing = pd.DataFrame([level(c=c, agg=a) for c, a in [(1, 100), (2, 105), (4, 108), (8, 130)]])
    k = d.knee(still_growing).iloc[0]
    assert not k["plateau"] and math.isnan(k["knee_concurrency"])
    late_jump = pd.DataFrame([level(c=c, agg=a) for c, a in [(1, 100), (2, 105), (4, 200), (8, 205)]])
    assert d.knee(late_jump).iloc[0]["knee_concurrency"] == 4
    flat = pd.DataFrame([level(c=c, agg=a) for c, a in [(1, 100), (2, 101), (4, 102)]])
    assert d.knee(flat).iloc[0]["knee_concurrency"] == 1
    single = d.knee(pd.DataFrame([level(c=1)])).iloc[0]
    assert not single["plateau"] and "one concurrency level" in single["reason"]


def test_goodput_highest_level_meeting_slo_with_reasons():
    g = d.goodput(saturating_summary(), SLO).iloc[0]
    assert g["goodput_concurrency"] == 4
    assert g["aggregate_output_tps"] == 360
    assert g["levels_meeting"] == "1, 2, 4"
    assert "c=8: TTFT p95 0.600 s > 0.500 s" in g["failing"]
    assert "c=16: TTFT p95 1.500 s > 0.500 s; error rate 10.0% > 1.0%" in g["failing"]
    tight = d.goodput(saturating_summary(), {"ttft_p95_s": None, "tpot_p95_s": 0.028, "error_rate": 0.01}).iloc[0]
    assert tight["goodput_concurrency"] == 2
    assert "c=4: TPOT p95 30.0 ms > 28.0 ms" in tight["failing"]
    loose = d.goodput(saturating_summary(), {"ttft_p95_s": None, "tpot_p95_s": None, "error_rate": 0.2}).iloc[0]
    assert loose["goodput_concurrency"] == 16 and loose["failing"] == ""
    none = d.goodput(saturating_summary(), {"ttft_p95_s": 0.01}).iloc[0]
    assert math.isnan(none["goodput_concurrency"]) and none["note"] == "no level meets the SLO"


def test_goodput_accepts_pydantic_slo():
    from servelab.schema import Slo

    g = d.goodput(saturating_summary(), Slo(ttft_p95_s=0.5)).iloc[0]
    assert g["goodput_concurrency"] == 4


# --------------------------------------------------------------------------- 3. KV cache


def test_kv_bytes_per_token_known_models():
    llama = facts_from_config(PRESETS["llama-3.1-8b"])
    assert kv_bytes_per_token(llama) == 131072
    assert kv_bytes_per_token(PRESETS["llama-3.1-8b"]) == 131072  # raw HF config works too
    assert kv_bytes_per_token(llama, kv_dtype="fp8") == 65536
    assert kv_bytes_per_token(llama, tensor_parallel_size=2) == 65536  # 4 of 8 KV heads per rank
    assert kv_bytes_per_token(facts_from_config(PRESETS["cpu-tiny"])) == 4096
    ds = facts_from_config(PRESETS["deepseek-v2-lite"])
    assert kv_bytes_per_token(ds) == 27 * (512 + 64) * 2 == 31104
    assert kv_bytes_per_token(PRESETS["deepseek-v2-lite"], tensor_parallel_size=4) == 31104  # MLA replicated
    assert kv_bytes_per_token(ds, kv_dtype="fp8_e4m3") == 15552
    with pytest.raises(ValueError):
        kv_bytes_per_token(llama, kv_dtype="int3")


@pytest.mark.parametrize("preset", list(PRESETS))
def test_modelmake_kv_facts_agree(preset):
    assert facts_from_config(PRESETS[preset])["kv_cache_bytes_per_token"] == kv_bytes_per_token(PRESETS[preset])


def test_sizes_and_capacity():
    assert d.parse_size_bytes("256M") == 256 * 2**20
    assert d.parse_size_bytes("256m") == 256 * 10**6
    assert d.parse_size_bytes("1G") == 2**30
    assert d.parse_size_bytes("2GiB") == 2 * 2**30
    assert d.parse_size_bytes("1.5GB") == 1_500_000_000
    assert d.parse_size_bytes(4096) == 4096
    with pytest.raises(ValueError):
        d.parse_size_bytes("12 parsecs")
    assert d.kv_capacity(d.parse_size_bytes("256M"), 4096) == 65536
    assert d.kv_capacity(100_000, 1000, block_size=16) == 96
    chk = d.kv_capacity_check(facts_from_config(PRESETS["cpu-tiny"]), "256M", 65536, block_size=32)
    assert chk["predicted_capacity_tokens"] == 65536 and chk["diff_pct"] == 0.0
    assert "agrees" in EN.say(chk["phrase"])
    off = d.kv_capacity_check(facts_from_config(PRESETS["cpu-tiny"]), "256M", 60000)
    assert off["diff_pct"] == pytest.approx((60000 - 65536) / 65536 * 100) and "differs" in EN.say(off["phrase"])


def test_kv_verdict_limited_when_queue_waits_on_full_cache():
    s = samples_frame(kv=[0.2, 0.6, 0.99, 0.99, 0.95], waiting=[0, 0, 3, 5, 0], running=[1, 8, 16, 16, 16])
    v = d.kv_verdict(s)
    assert v["assessed"] and v["limited"] is True
    assert v["waiting_max"] == 5 and v["kv_usage_max_frac"] == pytest.approx(0.99)
    assert "up to 5 request(s) waited" in EN.say(v["evidence"]) and "99.0%" in EN.say(v["evidence"])
    assert v["levels_limited"] == ["in512-out128 c=1"]


def test_kv_verdict_not_limited_when_roomy_and_says_why_queue():
    s = samples_frame(kv=[0.1, 0.3, 0.35, 0.2], waiting=[0, 2, 2, 0])
    v = d.kv_verdict(s)
    assert v["assessed"] and v["limited"] is False
    assert "did not limit" in EN.say(v["evidence"]) and "35.0%" in EN.say(v["evidence"])
    assert "scheduler limit" in EN.say(v["evidence"])


def test_kv_verdict_preemptions_alone_mean_limited():
    s = samples_frame(kv=[0.5, 0.8, 0.85], waiting=[0, 0, 0], preempt=[2.0, 2.0, 5.0])
    v = d.kv_verdict(s)
    assert v["limited"] is True and v["preemptions_delta"] == 3
    assert "preempted 3 time(s)" in EN.say(v["evidence"])


def test_kv_verdict_without_metrics_and_capacity_compare():
    empty = pd.DataFrame(columns=["t_s", "level", "kv_usage_frac", "waiting", "running"])
    empty.attrs["available"] = False
    empty.attrs["reason"] = "GET /metrics -> HTTP 404"
    v = d.kv_verdict(empty)
    assert v["limited"] is False and v["assessed"] is False
    assert "/metrics was unavailable" in EN.say(v["evidence"]) and "404" in EN.say(v["evidence"])
    roomy = samples_frame(kv=[0.01, 0.02], waiting=[0, 0])
    run_json_engine = {"args": {"kv-cache-memory-bytes": "256M", "block-size": 32}}
    v2 = d.kv_verdict(roomy, facts=facts_from_config(PRESETS["cpu-tiny"]), engine_args=run_json_engine)
    assert v2["capacity"]["predicted_capacity_tokens"] == 65536
    assert v2["capacity"]["server_capacity_tokens"] == 65536
    assert "agrees" in EN.say(v2["evidence"])


def test_kv_residency_charges_preemptions_to_the_level():
    s = samples_frame(kv=[0.0, 0.1, 0.2, 0.9, 0.97, 0.5], waiting=[0, 0, 0, 1, 2, 0],
                      preempt=[0, 0, 0, 1, 4, 4], running=[0, 1, 1, 4, 4, 4],
                      levels=[None, "A c=1", "A c=1", "A c=4", "A c=4", "A c=4"])
    r = d.kv_residency(s)
    assert list(r["level"]) == ["A c=1", "A c=4"]
    a, b = r.iloc[0], r.iloc[1]
    assert a["preemptions_delta"] == 0 and b["preemptions_delta"] == 4
    assert b["kv_usage_max_frac"] == pytest.approx(0.97) and b["waiting_max"] == 2 and b["running_max"] == 4
    assert b["crowded_samples"] == 2 and a["crowded_samples"] == 0
    assert a["samples"] == 2 and b["samples"] == 3


def test_kv_timeseries_returns_figure():
    s = samples_frame(kv=[0.0, 0.1, 0.9], waiting=[0, 0, 1], levels=[None, "A c=1", "A c=4"])
    fig = d.kv_timeseries(s)
    assert isinstance(fig, matplotlib.figure.Figure) and len(fig.axes) == 3
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert texts == ["A c=1", "A c=4"]
    empty = pd.DataFrame()
    empty.attrs["available"] = False
    assert isinstance(d.kv_timeseries(empty), matplotlib.figure.Figure)


# --------------------------------------------------------------------------- 5. speculative decoding


def test_spec_stats_vllm_counters():
    s = pd.DataFrame({"t_s": [0, 1, 2], "engine": "vllm", "running": [0, 4, 4],
                      "spec_drafts_total": [10, 60, 110], "spec_draft_tokens_total": [10, 60, 110],
                      "spec_accepted_tokens_total": [5, 40, 70]})
    st = d.spec_stats(s)
    assert st["draft_tokens"] == 100 and st["accepted_tokens"] == 65
    assert st["acceptance_rate"] == pytest.approx(0.65)
    assert st["mean_acceptance_length"] == pytest.approx(1.65)
    delta = d.spec_stats({"spec_drafts_total": 50, "spec_draft_tokens_total": 150, "spec_accepted_tokens_total": 90})
    assert delta["acceptance_rate"] == pytest.approx(0.6) and delta["mean_acceptance_length"] == pytest.approx(2.8)


def test_spec_stats_sglang_gauge_and_absent():
    s = pd.DataFrame({"t_s": [0, 1, 2, 3], "engine": "sglang", "running": [0, 2, 2, 0],
                      "spec_accept_length": [0.0, 2.4, 2.6, 0.0]})
    st = d.spec_stats(s, num_speculative_tokens=3)
    assert st["mean_acceptance_length"] == pytest.approx(2.5)
    assert st["acceptance_rate"] == pytest.approx(0.5)
    none = d.spec_stats(pd.DataFrame({"t_s": [0, 1], "spec_drafts_total": [np.nan, np.nan]}))
    assert math.isnan(none["acceptance_rate"]) and "no speculative" in none["note"]


def test_spec_ab_percent_changes():
    base = pd.DataFrame([level(config="base", c=1, agg=100, decode=100, ttft50=0.10),
                         level(config="base", c=4, agg=300, decode=80, ttft50=0.20)])
    spec = pd.DataFrame([level(config="mtp", c=1, agg=135, decode=135, ttft50=0.102),
                         level(config="mtp", c=4, agg=358.4, decode=90, ttft50=0.19)])
    ab = d.spec_ab(base, spec)
    assert list(ab["concurrency"]) == [1, 4]
    assert list(ab["aggregate_output_tps_change_pct"]) == pytest.approx([35.0, (358.4 - 300) / 300 * 100])
    assert list(ab["decode_tps_p50_change_pct"]) == pytest.approx([35.0, 12.5])
    assert list(ab["ttft_p50_s_change_pct"]) == pytest.approx([2.0, -5.0])
    with pytest.raises(ValueError):
        d.spec_ab(pd.concat([base, spec]), spec)


def test_capture_size_warnings_seed001_pitfall():
    spec = {"method": "mtp", "num_speculative_tokens": 1}
    graphs = {"cudagraph_mode": "FULL_DECODE_ONLY", "cudagraph_capture_sizes": [1, 2, 4]}
    short = {"args": {"compilation-config": graphs, "speculative-config": spec}}
    w = d.capture_size_warnings(short, [4])
    assert len(w) == 1 and "concurrency 4" in w[0] and "= 8 tokens" in w[0]
    assert "largest CUDA-graph capture size 4" in w[0]
    ok = {"args": {"compilation-config": {"cudagraph_capture_sizes": [1, 2, 4, 8]}, "speculative-config": spec}}
    assert d.capture_size_warnings(ok, [1, 2, 4]) == []
    # same flags as JSON strings (how they reach the command line)
    as_json = {"compilation-config": '{"cudagraph_capture_sizes": [1, 2, 4]}',
               "speculative-config": '{"method": "mtp", "num_speculative_tokens": 1}'}
    assert len(d.capture_size_warnings(as_json, [4])) == 1
    # without speculation c=4 fits a size-4 graph; eager mode captures nothing
    assert d.capture_size_warnings({"compilation-config": {"cudagraph_capture_sizes": [1, 2, 4]}}, [1, 2, 4]) == []
    assert d.capture_size_warnings({**short["args"], "enforce-eager": True}, [4]) == []
    padded = d.capture_size_warnings(ok, [3])
    assert len(padded) == 1 and "pads it to the 8 graph (2 wasted slot(s))" in padded[0]
    only_max = {"compilation-config": {"max_cudagraph_capture_size": 4}, "speculative-config": spec}
    assert len(d.capture_size_warnings(only_max, [1, 2, 4])) == 1


def test_derive_capture_sizes():
    assert derive_capture_sizes([1, 2, 4], 1) == [1, 2, 4, 8]
    assert derive_capture_sizes([4, 1], 3) == [1, 4, 16]
    assert derive_capture_sizes([2], 0) == [2]


# --------------------------------------------------------------------------- 6. one change at a time

BASE = {"kind": "vllm", "port": 8000, "model": {"preset": "cpu-tiny", "path": None},
        "args": {"max-num-seqs": 64, "compilation-config": {"cudagraph_mode": "NONE"}}, "env": {}}


def test_config_diff_finds_exactly_one_variable():
    graphs = {"cudagraph_mode": "FULL_DECODE_ONLY"}
    b = {**BASE, "port": 8011, "args": {"max-num-seqs": 64, "compilation-config": graphs}}
    assert d.config_diff(BASE, b) == [("args.compilation-config.cudagraph_mode", "NONE", "FULL_DECODE_ONLY")]
    # a JSON string is the same setting as the dict it encodes; None equals absent
    c = {**BASE, "args": {"max-num-seqs": 64, "compilation-config": '{"cudagraph_mode": "NONE"}', "x": None}}
    assert d.config_diff(BASE, c) == []
    e = {**BASE, "env": {"VLLM_ATTENTION_BACKEND": "FLASHINFER"}}
    assert d.config_diff(BASE, e) == [("env.VLLM_ATTENTION_BACKEND", None, "FLASHINFER")]


def test_compare_configs_percentages_and_attribution_warning():
    one = {**BASE, "args": {**BASE["args"], "max-num-batched-tokens": 4096}}
    two = {**one, "args": {**one["args"], "max-num-seqs": 128}, "env": {"X": "1"}}
    summ = pd.DataFrame([level(config="eager", c=1, agg=10, decode=10, ttft50=0.2),
                         level(config="budget", c=1, agg=12, decode=11, ttft50=0.1),
                         level(config="both", c=1, agg=24, decode=22, ttft50=0.1)])
    cmp_ = d.compare_configs([("eager", BASE), ("budget", one), ("both", two)], summ)
    assert list(cmp_["config"]) == ["budget", "both"]
    first, second = cmp_.iloc[0], cmp_.iloc[1]
    assert first["n_changed"] == 1 and first["warning"] == ""
    assert first["changed"] == "args.max-num-batched-tokens: None -> 4096"
    assert first["ttft_p50_change_pct"] == pytest.approx(-50.0)
    assert first["aggregate_change_pct"] == pytest.approx(20.0)
    assert first["decode_change_pct"] == pytest.approx(10.0)
    assert second["n_changed"] == 2
    assert second["warning"] == "not attributable: 2 variables differ: args.max-num-seqs, env.X"
    same = d.compare_configs([("eager", BASE), ("budget", BASE)], summ).iloc[0]
    assert same["warning"].startswith("nothing differs")
    # a named baseline replaces "the previous one": both vs eager, two variables changed
    named = d.compare_configs([("eager", BASE), ("budget", one), ("both", two)], summ, baselines={"both": "eager"})
    assert list(named["baseline"]) == ["eager", "eager"]
    assert named.iloc[1]["aggregate_change_pct"] == pytest.approx(140.0) and named.iloc[1]["n_changed"] == 3


# --------------------------------------------------------------------------- 7. symptom table


def _present(table, rule):
    return table.set_index("rule").loc[rule, "present"]


def test_symptoms_present_on_a_troubled_run():
    rows = []
    for p, t in [(128, 0.05), (8192, 0.9)]:  # TTFT 18x from shortest to longest prompt
        rows.append(level(bucket=f"in{p}", c=1, prompt=p, ttft50=t, ttft95=t * 1.1, agg=20, decode=20, inp=p))
    # in8192: aggregate keeps rising a little while TTFT p95 explodes, then plateaus
    for c, agg, t95 in [(2, 36, 1.2), (4, 60, 3.5), (8, 62, 7.5)]:
        rows.append(level(bucket="in8192", c=c, prompt=8192, agg=agg, decode=agg / c, ttft95=t95, inp=8192))
    summ = pd.DataFrame(rows)
    samples = samples_frame(kv=[0.5, 0.95, 0.99], waiting=[0, 2, 4], preempt=[0, 1, 3])
    table = d.symptoms(summ, samples, d.fit_prefill(summ), SLO, decode_bound_s_per_token=1 / 100.0)
    assert list(table.columns) == ["rule", "present", "evidence"]
    assert list(table["rule"]) == list(d.RULES)
    assert set(table["present"]) == {"yes"}
    found = table.set_index("rule")["evidence"]
    # the numbers travel as numbers ...
    ratio = found["ttft_grows_with_prompt"][0]
    assert ratio.key == "ttft_prompt.ratio" and ratio.values["ratio"] == pytest.approx(18.0)
    decode = found["slow_decode_at_c1"].values["levels"]
    assert [(x.values["bucket"], x.values["frac"]) for x in decode] == [("in128", pytest.approx(0.2)),
                                                                        ("in8192", pytest.approx(0.2))]
    # ... and the report words them, in English as before and in Japanese
    ev = {rule: EN.say(x) for rule, x in found.items()}
    assert "(18.0x)" in ev["ttft_grows_with_prompt"]
    assert "20.0 tok/s vs bound 100.0 tok/s (20%)" in ev["slow_decode_at_c1"]
    assert "knee at c=4 of 8" in ev["throughput_plateau"]
    assert "c=2->4" in ev["latency_spike"]
    assert "breaks the SLO" in ev["latency_spike"]
    assert "preempted 3 time(s)" in ev["kv_eviction"]
    ja = JA.say(found["ttft_grows_with_prompt"])
    assert "（18.0 倍）" in ja and "x)" not in ja
    assert "サーバーは 3 回プリエンプションしました" in JA.say(found["kv_eviction"])


def test_symptoms_absent_on_a_healthy_run():
    rows = [level(bucket="in128", c=1, prompt=128, ttft50=0.050, agg=90, decode=90, inp=128),
            level(bucket="in1024", c=1, prompt=1024, ttft50=0.070, agg=90, decode=90, inp=1024)]
    for c, agg in [(2, 175), (4, 340)]:
        rows.append(level(bucket="in1024", c=c, prompt=1024, agg=agg, decode=agg / c, ttft95=0.08, e2e95=2.0,
                          inp=1024))
    summ = pd.DataFrame(rows)
    samples = samples_frame(kv=[0.05, 0.2, 0.3], waiting=[0, 0, 0])
    table = d.symptoms(summ, samples, None, SLO, decode_bound_s_per_token=1 / 100.0)
    assert set(table["present"]) == {"no"}
    # without a bound, metrics or c=1 prompt variety the rows say n/a
    no_metrics = pd.DataFrame()
    no_metrics.attrs["available"] = False
    t2 = d.symptoms(summ[summ["bucket"] == "in1024"], no_metrics, None, None)
    assert _present(t2, "slow_decode_at_c1") == "n/a"
    assert _present(t2, "kv_eviction") == "n/a"
    assert _present(t2, "ttft_grows_with_prompt") == "n/a"
    assert _present(t2, "throughput_plateau") == "no"


def test_symptoms_needs_a_config_choice_for_several():
    both = pd.concat([saturating_summary("a"), saturating_summary("b")])
    with pytest.raises(ValueError):
        d.symptoms(both, None)
    t = d.symptoms(both, None, config="b")
    assert _present(t, "throughput_plateau") == "yes"
