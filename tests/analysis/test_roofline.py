"""Roofline bounds and the hardware table, with hand-computed answers."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from servelab.analysis import roofline as hwm
from servelab.measure import probe
from servelab.models import PRESETS, facts_from_config


def test_table_entries_are_sourced_and_dense():
    names = {h["name"] for h in hwm.HARDWARE}
    assert {"H200 SXM", "H100 SXM", "RTX PRO 6000 Blackwell Server Edition", "L40S"} <= names
    for h in hwm.HARDWARE:
        assert h["source"] and h["as_of"]
        assert h["memory_bandwidth_Bps"] > 0 and h["bf16_dense_flops"] > 0
        assert h["fp8_dense_flops"] == pytest.approx(2 * h["bf16_dense_flops"], rel=0.02)
    h200 = hwm.get_hardware("NVIDIA H200")
    assert h200["memory_bandwidth_Bps"] == 4.8e12 and h200["memory_bytes"] == 141e9
    assert h200["bf16_dense_flops"] == 989e12 and h200["fp8_dense_flops"] == 1979e12
    assert hwm.get_hardware("h100_sxm")["memory_bandwidth_Bps"] == 3.35e12
    assert hwm.get_hardware("l40s")["bf16_dense_flops"] == 362.05e12
    with pytest.raises(KeyError):
        hwm.get_hardware("TPU v9")


def test_bounds_arithmetic():
    assert hwm.decode_bound_s_per_token(16e9, 131072, 1000, 4, 4.8e12) == pytest.approx(
        (16e9 + 4 * 1000 * 131072) / 4.8e12, rel=1e-12)
    assert hwm.prefill_bound_s(8e9, 1000, 989e12) == pytest.approx(2 * 8e9 * 1000 / 989e12, rel=1e-12)
    with pytest.raises(ValueError):
        hwm.decode_bound_s_per_token(1, 1, 1, 1, 0)


TOY = {"param_count": 1000, "embedding_param_count": 100, "lm_head_param_count": 100, "weight_bytes": 2000,
       "kv_cache_bytes_per_token": 10, "dtype": "bfloat16", "tie_word_embeddings": False}
TOY_HW = {"name": "toy", "memory_bandwidth_Bps": 1e4, "bf16_dense_flops": 1e6}


def test_roofline_efficiency_hand_computed():
    summ = pd.DataFrame([
        # c=1: ctx = 100 + 20/2 = 110; step bytes = (1000-100)*2 + 110*10 = 2900 -> 0.29 s
        {"config": "a", "bucket": "b", "concurrency": 1, "prompt_tokens": 100, "output_tokens_p50": 20,
         "tpot_p50_s": 0.58, "ttft_p50_s": 0.32},
        # c=2: 1800 + 2*110*10 = 4000 -> 0.40 s
        {"config": "a", "bucket": "b", "concurrency": 2, "prompt_tokens": 100, "output_tokens_p50": 20,
         "tpot_p50_s": 0.80, "ttft_p50_s": 0.50},
    ])
    r = hwm.roofline_efficiency(summ, TOY, TOY_HW)
    assert list(r["decode_bound_s_per_token"]) == pytest.approx([0.29, 0.40])
    assert list(r["decode_efficiency_pct"]) == pytest.approx([50.0, 50.0])
    assert list(r["implied_bandwidth_Bps"]) == pytest.approx([2900 / 0.58, 4000 / 0.80])
    # prefill: (1000 - 100 - 100) matmul params: 2 * 800 * 100 / 1e6 = 0.16 s against 0.32 s
    assert r["prefill_bound_s"].iloc[0] == pytest.approx(0.16)
    assert r["prefill_efficiency_pct"].iloc[0] == pytest.approx(50.0)
    assert math.isnan(r["prefill_efficiency_pct"].iloc[1])


def test_roofline_two_devices_halve_the_bound():
    # tensor parallel over 2 devices: same bytes, twice the bandwidth and FLOP/s
    summ = pd.DataFrame([{"config": "a", "bucket": "b", "concurrency": 1, "prompt_tokens": 100,
                          "output_tokens_p50": 20, "tpot_p50_s": 0.58, "ttft_p50_s": 0.32}])
    one = hwm.roofline_efficiency(summ, TOY, TOY_HW)
    two = hwm.roofline_efficiency(summ, TOY, TOY_HW, devices=2)
    assert two["decode_bound_s_per_token"].iloc[0] == pytest.approx(0.145)
    assert two["decode_efficiency_pct"].iloc[0] == pytest.approx(one["decode_efficiency_pct"].iloc[0] / 2)
    assert two["prefill_bound_s"].iloc[0] == pytest.approx(0.08)
    assert two["implied_bandwidth_Bps"].iloc[0] == pytest.approx(one["implied_bandwidth_Bps"].iloc[0])
    assert two["hardware"].iloc[0] == "2 x toy"


def test_moe_decode_weight_bytes_expected_experts():
    # fixed 100 params + 8 experts of 10 params, 2 active; 1 byte per param
    moe = {"param_count": 180, "active_param_count": 120, "num_experts": 8, "num_active_experts": 2,
           "weight_bytes": 180, "embedding_param_count": 0}
    assert hwm.decode_weight_bytes(moe, batch=1) == pytest.approx(120)
    assert hwm.decode_weight_bytes(moe, batch=2) == pytest.approx(100 + 8 * (1 - 0.75**2) * 10)
    assert hwm.decode_weight_bytes(moe, batch=10_000) == pytest.approx(180)


def test_llama_decode_bound_on_h200():
    llama = facts_from_config(PRESETS["llama-3.1-8b"])
    bytes_read = (llama["param_count"] - llama["embedding_param_count"]) * 2
    assert hwm.decode_weight_bytes(llama) == bytes_read
    b = hwm.decode_bound_s_per_token(bytes_read, 131072, 0, 1, hwm.get_hardware("H200")["memory_bandwidth_Bps"])
    assert 1 / b == pytest.approx(4.8e12 / bytes_read)  # ~320 tok/s upper limit at c=1
    assert 300 < 1 / b < 340


def test_measure_cpu_and_local_entry():
    m = probe.measure_cpu_bandwidth(seconds=0.2, array_bytes=8 * 2**20, matmul_n=128)
    assert m["array_bytes"] == 8 * 2**20 and m["copy_repeats"] >= 3 and m["matmul_repeats"] >= 3
    assert 1e8 < m["copy_bandwidth_Bps"] < 1e13  # 0.1 GB/s .. 10 TB/s: a plausible host
    assert 1e7 < m["matmul_f32_flops"] < 1e15
    entry = hwm.local_cpu_entry(m)
    assert entry["memory_bandwidth_Bps"] == m["copy_bandwidth_Bps"]
    assert hwm.flops_for(entry, "bf16") == m["matmul_f32_flops"]
    with pytest.raises(ValueError):
        probe.measure_cpu_bandwidth(seconds=0)
