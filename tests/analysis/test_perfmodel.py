"""The performance model (analysis.perfmodel) on known inputs: the expected distinct experts of a MoE
batch against a simulation of routing, the fixed-cost fit on a known line, a prediction's arithmetic
from a synthetic calibration entry (c=1 TPOT = bytes / bandwidth + fixed costs; a MoE batch of
identical requests reads one token's experts), the labels of what is not calibrated, and the
calibration entry lookup (another CPU of the kind is scaled by its probe, never called its own)."""

from __future__ import annotations

import random

import pytest

from servelab.analysis import perfmodel as pm
from servelab.models.facts import facts_from_config
from servelab.models.presets import PRESETS


def test_expected_distinct_experts_matches_a_simulation_of_routing():
    rng = random.Random(7)
    for E, k, B in ((128, 8, 1), (128, 8, 8), (128, 8, 32), (64, 6, 32), (16, 4, 3)):
        sims = []
        for _ in range(2000):
            touched = set()
            for _ in range(B):
                touched.update(rng.sample(range(E), k))
            sims.append(len(touched))
        mean = sum(sims) / len(sims)
        assert pm.distinct_experts(E, k, B) == pytest.approx(mean, rel=0.01), (E, k, B)
    assert pm.distinct_experts(128, 8, 1) == pytest.approx(8.0)
    assert pm.distinct_experts(128, 8, 0) == 0.0


def test_fixed_costs_fit_recovers_a_known_line_after_the_weight_time():
    bw = 4e12
    pts = [{"layers": n, "weight_bytes": 1e8 * n, "tpot_s": 2e-4 + 3e-5 * n + 1e8 * n / bw} for n in (2, 4, 8)]
    f = pm.fit_fixed_costs(pts, bw)
    assert f["layer_s"] == pytest.approx(3e-5) and f["step_s"] == pytest.approx(2e-4) and f["r2"] == pytest.approx(1.0)
    with pytest.raises(ValueError, match="two depths"):
        pm.fit_fixed_costs(pts[:1], bw)
    bw_cpu = pm.fit_engine_bandwidth({"layer_slope_s": 1e-4}, {"layer_slope_s": 3e-4}, 1e6, 3e6)
    assert bw_cpu == pytest.approx(1e10)


def _entry(kind: str = "gpu") -> dict:
    costs = {k: {"layer_s": v, "step_s": 1e-4} for k, v in (("dense", 1e-5), ("moe", 3e-5), ("mla", 5e-5))}
    return {"id": "test-gpu", "machine": {"kind": kind, "name": "NVIDIA H200", "memory_bytes": 150e9},
            "measured_at": "2026-12-02T00:00:00Z", "source": "synthetic",
            "micro": {"decode_bandwidth_Bps": {"1": 4e12, "8": 4e12, "32": 4e12},
                      "gemm_flops": {"bf16": {"256": 5e14, "4096": 7e14}}},
            "engines": {"vllm": {"graphs": costs, "eager": {k: {"layer_s": 10 * c["layer_s"], "step_s": 1e-3}
                                                            for k, c in costs.items()}}}}


def _facts(preset: str) -> dict:
    return facts_from_config(PRESETS[preset], vocab_size=32000)


def test_c1_tpot_is_the_weight_bytes_over_bandwidth_plus_the_fixed_costs():
    m = pm.Machine(_entry())
    f = _facts("llama-3.1-8b")
    p = pm.predict(f, "vllm", {"kv-cache-memory-bytes": "4G", "max-num-seqs": 64}, m, input_tokens=256,
                   output_tokens=256, concurrency=[1, 32], slo={"tpot_p95_s": 0.05, "ttft_p95_s": 1.0})
    wbytes = pm.weight_bytes(f, 1)
    kv = 384 * f["kv_cache_bytes_per_token"]
    assert p["c1_tpot_s"] == pytest.approx((wbytes + kv) / 4e12 + 1e-4 + 32 * 1e-5, rel=1e-6)
    assert p["mode"] == "graphs" and p["kinds"]["c1_tpot_s"] == "estimate" and p["bound_because"] == []
    assert p["tpot_s"]["32"] > p["c1_tpot_s"]  # more KV read, and others' prefills ride along
    assert p["kv_limited_concurrency"] == pytest.approx(p["kv_tokens"] / 512) and p["kv_from"] == "kv-cache-memory-bytes"
    assert 1 <= p["capacity_concurrency"] <= 64 and p["capacity_rps"] > 0
    eager = pm.predict(f, "vllm", {"enforce-eager": True}, m, input_tokens=256, output_tokens=256, concurrency=[1])
    assert eager["mode"] == "eager" and eager["c1_tpot_s"] > p["c1_tpot_s"] + 32 * 9e-5


def test_identical_requests_route_as_one_token_and_read_one_tokens_experts():
    m = pm.Machine(_entry())
    f = _facts("qwen3-30b-a3b")
    kw = dict(input_tokens=256, output_tokens=256, concurrency=[1, 32])
    diverse = pm.predict(f, "vllm", {}, m, identical=False, **kw)
    same = pm.predict(f, "vllm", {}, m, identical=True, **kw)
    assert diverse["c1_tpot_s"] == pytest.approx(same["c1_tpot_s"])
    # 32 independent tokens touch ~24 % of 128 experts each... ~112 of them: most of the model
    assert diverse["tpot_s"]["32"] > 3 * same["tpot_s"]["32"]
    assert pm.layer_counts(f) == {"moe": 48}
    assert pm.layer_counts(_facts("deepseek-v2-lite")) == {"mla": 26, "mla_dense": 1}


def test_what_is_not_calibrated_is_a_bound_and_says_why():
    m = pm.Machine(_entry())
    f = _facts("llama-3.1-8b")
    kw = dict(input_tokens=256, output_tokens=256, concurrency=[1])
    tp2 = pm.predict(f, "vllm", {"tensor-parallel-size": 2}, m, n_gpus=2, **kw)
    assert tp2["kinds"]["c1_tpot_s"] == "bound" and "all-reduce" in tp2["bound_because"][0]
    sg = pm.predict(f, "sglang", {}, m, **kw)  # no SGLang calibration: vLLM's fixed costs, a bound
    assert sg["kinds"]["c1_tpot_s"] == "bound" and "vllm graphs fixed costs" in sg["bound_because"][0]
    spec = pm.predict(f, "vllm", {}, m, speculative=True, **kw)
    assert "speculative" in spec["bound_because"][0]


def test_calibration_lookup_and_another_cpu_of_the_kind(tmp_path):
    import yaml

    cpu = {**_entry("cpu"), "id": "cpu-a", "machine": {"kind": "cpu", "name": "AMD EPYC", "cores": 2},
           "probe": {"copy_bandwidth_Bps": 40e9, "matmul_f32_flops": 2e11, "cpu_count": 2},
           "engines": {"vllm": {"bandwidth_Bps": 2e10, "eager": {"dense": {"layer_s": 1e-4, "step_s": 1e-3}}}}}
    (tmp_path / "cpu-a.yaml").write_text(yaml.safe_dump(cpu))
    (tmp_path / "h200.yaml").write_text(yaml.safe_dump(_entry()))
    e, own = pm.calibration_for("gpu", "NVIDIA H200", tmp_path)
    assert e["id"] == "test-gpu" and own
    run = {"hardware_measured": {"cpu_model": "AMD EPYC", "cpu_count": 2, "copy_bandwidth_Bps": 20e9,
                                 "matmul_f32_flops": 1e11}}
    m, why = pm.machine_for(run, tmp_path)
    assert not m.own and why == ""  # half the copy bandwidth: the other machine type, scaled
    bw, _ = m.bandwidth("vllm", 1)
    assert bw == pytest.approx(1e10)
    fixed, _, _ = m.fixed("vllm", "eager", {"dense": 10})
    assert fixed == pytest.approx(1e-3 + 10 * 1e-4)  # the probe's matmul rate is too noisy to scale them by
    p = pm.predict(_facts("llama-3.1-8b"), "vllm", {}, m, input_tokens=64, output_tokens=64, concurrency=[1])
    assert p["kinds"]["c1_tpot_s"] == "bound" and "another machine" in p["bound_because"][0]
    sig = {**run["hardware_measured"], "cpu_signature": "AuthenticAMD family 25 model 1; avx2 avx512f"}
    cpu_sig = {**cpu, "probe": {**cpu["probe"], "cpu_signature": "AuthenticAMD family 26 model 2; avx2 avx512f"}}
    (tmp_path / "sig").mkdir()
    (tmp_path / "sig" / "cpu-a.yaml").write_text(yaml.safe_dump(cpu_sig))
    assert not pm.machine_for({"hardware_measured": {**sig, "copy_bandwidth_Bps": 40e9}}, tmp_path / "sig")[0].own
    same = {**run, "hardware_measured": {**run["hardware_measured"], "copy_bandwidth_Bps": 41e9,
                                         "matmul_f32_flops": 2e11}}
    assert pm.machine_for(same, tmp_path)[0].own
    none, why = pm.machine_for({"gpus_used": [{"name": "NVIDIA L40S"}]}, tmp_path)
    assert none is None and "L40S" in why


def test_a_run_without_a_calibration_gets_the_roofline_bounds_labelled(tmp_path):
    from servelab.schema import Bucket, Workload

    facts = _facts("llama-3.1-8b")
    run = {"study": "s", "config": "c", "model": {"facts": facts}, "engine_params": {"kind": "vllm", "args": {}},
           "gpus_used": [{"name": "NVIDIA H200", "memory": "143771 MiB"}]}
    wl = Workload(buckets=[Bucket(input_tokens=256, output_tokens=256)], concurrency=[1, 8])
    out = pm.predict_configuration(run, wl, {}, {"in256-out256": (256, 256)}, "t", folder=tmp_path)
    assert out["model_version"] == "roofline" and out["stored_before_measurement"]
    b = out["buckets"]["in256-out256"]
    assert set(b["kinds"].values()) == {"bound"} and "no calibration entry" in b["bound_because"][0]
    assert not pm.identical_requests(Workload(buckets=[Bucket(input_tokens=8, output_tokens=8)], concurrency=[1], temperature=1.0,
                                              seed=None))
    assert pm.identical_requests(wl)  # filler prompts, temperature 0
    bare = pm.predict_configuration({**run, "model": {}}, wl, {}, {"in256-out256": (256, 256)}, "t")
    assert "parameter count" in bare["not_predictable"] and "buckets" not in bare
