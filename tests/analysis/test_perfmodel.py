"""The performance model (analysis.perfmodel) on known inputs: the expected distinct experts of a MoE
batch against a simulation of routing, the fixed-cost fit on a known line, a prediction's arithmetic
from a synthetic calibration entry (c=1 TPOT = bytes / bandwidth + fixed costs; a MoE batch of
identical requests reads one token's experts), the labels of what is not calibrated, and the
calibration entry lookup (another CPU of the kind is scaled by its probe, never called its own)."""

from __future__ import annotations

import random

import pytest

from servelab.analysis import calibration as cal
from servelab.analysis import perfmodel
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
        assert perfmodel.distinct_experts(E, k, B) == pytest.approx(mean, rel=0.01), (E, k, B)
    assert perfmodel.distinct_experts(128, 8, 1) == pytest.approx(8.0)
    assert perfmodel.distinct_experts(128, 8, 0) == 0.0


def test_fixed_costs_fit_recovers_a_known_line_after_the_weight_time():
    bw = 4e12
    pts = [{"layers": n, "weight_bytes": 1e8 * n, "tpot_s": 2e-4 + 3e-5 * n + 1e8 * n / bw} for n in (2, 4, 8)]
    f = cal.fit_fixed_costs(pts, bw)
    assert f["layer_s"] == pytest.approx(3e-5) and f["step_s"] == pytest.approx(2e-4) and f["r2"] == pytest.approx(1.0)
    with pytest.raises(ValueError, match="two depths"):
        cal.fit_fixed_costs(pts[:1], bw)
    bw_cpu = cal.fit_engine_bandwidth({"layer_slope_s": 1e-4}, {"layer_slope_s": 3e-4}, 1e6, 3e6)
    assert bw_cpu == pytest.approx(1e10)


def _entry(kind: str = "gpu") -> dict:
    costs = {k: {"layer_s": v, "step_s": 1e-4, "floor_s": 2e-3, "gpu_layer_s": v, "gpu_step_s": 0.0}
             for k, v in (("dense", 1e-5), ("moe", 3e-5), ("mla", 5e-5))}
    return {"id": "test-gpu", "machine": {"kind": kind, "name": "NVIDIA H200", "memory_bytes": 150e9},
            "measured_at": "2026-12-02T00:00:00Z", "source": "synthetic",
            "micro": {"decode_bandwidth_Bps": {"1": 4e12, "8": 4e12, "32": 4e12},
                      "gemm_flops": {"bf16": {"256": 5e14, "4096": 7e14}}},
            "engines": {"vllm": {"graphs": costs, "eager": {k: {"layer_s": 10 * c["layer_s"], "step_s": 1e-3}
                                                            for k, c in costs.items()}}}}


def _facts(preset: str) -> dict:
    return facts_from_config(PRESETS[preset], vocab_size=32000)


def test_c1_tpot_is_the_weight_bytes_over_bandwidth_plus_the_fixed_costs():
    m = cal.Machine(_entry())
    f = _facts("llama-3.1-8b")
    p = perfmodel.predict(f, "vllm", {"kv-cache-memory-bytes": "4G", "max-num-seqs": 64}, m, input_tokens=256,
                   output_tokens=256, concurrency=[1, 32], slo={"tpot_p95_s": 0.05, "ttft_p95_s": 1.0})
    wbytes = perfmodel.weight_bytes(f, 1)
    kv = 384 * f["kv_cache_bytes_per_token"]
    # CUDA graphs: the GPU's bytes and per-layer time, or the engine's CPU-side floor if that is longer
    assert p["c1_tpot_s"] == pytest.approx(max(2e-3, (wbytes + kv) / 4e12 + 32 * 1e-5), rel=1e-6)
    assert p["mode"] == "graphs" and p["kinds"]["c1_tpot_s"] == "estimate" and p["bound_because"] == []
    assert p["tpot_s"]["32"] > p["c1_tpot_s"]  # more KV read, and others' prefills ride along
    assert p["kv_limited_concurrency"] == pytest.approx(p["kv_tokens"] / 512) and p["kv_from"] == "kv-cache-memory-bytes"
    assert 1 <= p["capacity_concurrency"] <= 64 and p["capacity_rps"] > 0
    eager = perfmodel.predict(f, "vllm", {"enforce-eager": True}, m, input_tokens=256, output_tokens=256, concurrency=[1])
    # eager: the CPU side launches every kernel (step + 32 layers of 10x the graph cost), the longer side wins
    assert eager["mode"] == "eager" and eager["c1_tpot_s"] == pytest.approx(max(1e-3 + 32 * 1e-4, p["c1_tpot_s"]))
    tiny = perfmodel.predict(_facts("calib-dense-w256-l2"), "vllm", {}, m, input_tokens=32, output_tokens=64, concurrency=[1])
    assert tiny["c1_tpot_s"] == pytest.approx(2e-3)  # a tiny model sits on the floor


def test_identical_requests_route_as_one_token_and_read_one_tokens_experts():
    m = cal.Machine(_entry())
    f = _facts("qwen3-30b-a3b")
    kw = dict(input_tokens=256, output_tokens=256, concurrency=[1, 32])
    diverse = perfmodel.predict(f, "vllm", {}, m, identical=False, **kw)
    same = perfmodel.predict(f, "vllm", {}, m, identical=True, **kw)
    assert diverse["c1_tpot_s"] == pytest.approx(same["c1_tpot_s"])
    # 32 independent tokens touch ~24 % of 128 experts each... ~112 of them: most of the model
    assert diverse["tpot_s"]["32"] > 3 * same["tpot_s"]["32"]
    assert perfmodel.layer_counts(f) == {"moe": 48}
    assert perfmodel.layer_counts(_facts("deepseek-v2-lite")) == {"mla": 26, "mla_dense": 1}


def test_requests_in_waves_wait_for_half_of_the_waves_prefills():
    """A closed loop of one forced length starts its c requests together: their prompts are prefilled
    at the wave's start, and a request's decode waits, on average, for half of them; staggered
    requests instead carry another's prefill in a share (c - 1) / output of their steps."""
    from servelab.schema import Bucket, Workload

    m = cal.Machine(_entry())
    f = _facts("llama-3.1-8b")
    kv = float(f["kv_cache_bytes_per_token"])
    plain = perfmodel.step_time(m, "vllm", "graphs", f, batch=32, ctx=384, kv_bpt=kv, distinct=32)["total_s"]
    wave = perfmodel.prefill_time(m, "vllm", "graphs", f, 32 * 256, seqs=32)
    waves = perfmodel.tpot(m, "vllm", "graphs", f, 32, 256, 256, kv, False, waves=True)
    assert waves == pytest.approx(plain + wave / 2 / 255)
    staggered = perfmodel.tpot(m, "vllm", "graphs", f, 32, 256, 256, kv, False)
    assert staggered > waves  # 31 of 256 steps each carry a whole prefill
    assert perfmodel.tpot(m, "vllm", "graphs", f, 1, 256, 256, kv, False, waves=True) == pytest.approx(
        perfmodel.tpot(m, "vllm", "graphs", f, 1, 256, 256, kv, False))  # one request: no other prefills
    # attention's square is per prompt: 32 prompts of 256 tokens, not one of 8192
    assert perfmodel.prefill_flops(f, 8192, seqs=32) < perfmodel.prefill_flops(f, 8192)
    fixed = Workload(buckets=[Bucket(input_tokens=256, output_tokens=256)], concurrency=[1, 8])
    assert perfmodel.in_waves(fixed)
    assert not perfmodel.in_waves(fixed.model_copy(update={"concurrency_ramp_s": 2.0}))
    assert not perfmodel.in_waves(Workload(buckets=[Bucket(input_tokens=256, output_tokens=256, ignore_eos=False)],
                                    concurrency=[1, 8]))
    assert not perfmodel.in_waves(Workload(buckets=[Bucket(input_tokens=256, output_tokens=256)], arrival="poisson", concurrency=[1],
                                    rates_rps=[1.0]))


def test_dummy_deepseek_weights_on_vllm_026_route_every_token_to_the_same_experts():
    """vLLM 0.26 ranks DeepSeek-V2's experts on a bf16 softmax: with dummy weights every
    probability is the same bf16 number, so a batch reads one token's experts (the H200 measured
    DeepSeek-V2-Lite at 3.22, 3.69, 4.34 ms for c = 1, 8, 32); Qwen3 (fp32 top-k kernel) spreads."""
    cfg = dict(PRESETS["deepseek-v2-lite"])
    run = {"engine_params": {"kind": "vllm", "load_format": "dummy"}, "model": {"config": cfg},
           "server": {"version": "0.26.0"}}
    assert "bf16 softmax" in perfmodel.router_ties(run)
    assert perfmodel.router_ties({**run, "server": {"version": "0.32.0"}}) is None
    assert perfmodel.router_ties({**run, "engine_params": {"kind": "vllm", "load_format": "auto"}}) is None
    assert perfmodel.router_ties({**run, "model": {"config": dict(PRESETS["qwen3-30b-a3b"])}}) is None
    assert perfmodel.router_ties({**run, "engine_params": {"kind": "sglang", "load_format": "dummy"}}) is None


def test_a_router_with_a_score_correction_bias_ties_under_dummy_weights_on_any_version():
    """ERNIE-4.5 (and DeepSeek's noaux_tc) add a per-expert bias before the top-k: the dummy loader draws it from
    U(-1e-3, 1e-3) like every tensor, the router's logits are ~1e-5, so the bias alone picks the experts and every
    token takes the same k (issue #59: ERNIE-4.5-21B-A3B decoded 32 requests in 5.2 ms on an H100, faster than a
    spread router's bytes allow)."""
    from servelab.models.presets import PRESETS as P

    run = {"engine_params": {"kind": "vllm", "load_format": "dummy"}, "model": {"config": dict(P["ernie-4.5-21b-a3b"])},
           "server": {"version": "0.32.0"}}
    assert "score-correction bias" in perfmodel.router_ties(run)
    assert perfmodel.router_ties({**run, "engine_params": {"kind": "vllm", "load_format": "auto"}}) is None
    dsv3 = {**run, "model": {"config": {**P["deepseek-v2-lite"], "topk_method": "noaux_tc"}}}
    assert "score-correction bias" in perfmodel.router_ties(dsv3)
    glm = {**run, "model": {"config": dict(P["glm-4.7-flash"])}}  # GLM's gate carries the bias in vLLM (glm4_moe.py)
    assert "score-correction bias" in perfmodel.router_ties(glm)
    gptoss = {**run, "model": {"config": dict(P["gpt-oss-20b"])}}  # a router with a bias (vLLM's gpt_oss.py)
    assert "router bias" in perfmodel.router_ties(gptoss)
    assert perfmodel.router_ties({**run, "model": {"config": dict(P["olmoe-1b-7b"])}}) is None


def test_graph_costs_come_from_the_floor_and_the_deepest_model():
    bw = 4e12
    pts = [{"layers": n, "weight_bytes": 1e6 * n, "tpot_s": t} for n, t in
           ((2, 2.3e-3), (4, 2.5e-3), (8, 2.4e-3), (16, 1.9e-3), (32, 2.4e-3), (64, 4.64e-3))]
    g = cal.fit_graph_costs(pts, bw)
    assert g["floor_s"] == pytest.approx(2.4e-3)
    assert g["gpu_layer_s"] == pytest.approx((4.64e-3 - 64e6 / bw) / 64) and "above the floor" in g["gpu_layer_rule"]
    flat = cal.fit_graph_costs([*pts[:5], {"layers": 64, "weight_bytes": 6.4e7, "tpot_s": 2.24e-3}], bw)
    assert flat["gpu_layer_s"] == pytest.approx(2.24e-3 / 64) and "upper bound" in flat["gpu_layer_rule"]


def test_the_committed_h200_calibration_refits_from_its_own_points():
    """The GPU entry (data/calibrations/) was fitted on the device; its points give the same costs here."""
    e, own = cal.calibration_for("gpu", "NVIDIA H200")
    assert own and e["machine"]["name"] == "NVIDIA H200"
    bw = float(e["micro"]["decode_bandwidth_Bps"]["1"])
    for kind, c in e["engines"]["vllm"]["graphs"].items():
        g = cal.fit_graph_costs(c["points"], bw)
        assert g["floor_s"] == pytest.approx(c["floor_s"]) and g["gpu_layer_s"] == pytest.approx(c["gpu_layer_s"]), kind


def test_what_is_not_calibrated_is_a_bound_and_says_why():
    m = cal.Machine(_entry())
    f = _facts("llama-3.1-8b")
    kw = dict(input_tokens=256, output_tokens=256, concurrency=[1])
    tp2 = perfmodel.predict(f, "vllm", {"tensor-parallel-size": 2}, m, n_gpus=2, **kw)
    assert tp2["kinds"]["c1_tpot_s"] == "bound" and "all-reduce" in tp2["bound_because"][0]
    sg = perfmodel.predict(f, "sglang", {}, m, **kw)  # no SGLang calibration: vLLM's fixed costs, a bound
    assert sg["kinds"]["c1_tpot_s"] == "bound" and "not sglang's own graphs calibration" in sg["bound_because"][0]
    spec = perfmodel.predict(f, "vllm", {}, m, speculative=True, **kw)
    assert "speculative" in spec["bound_because"][0]


def test_calibration_lookup_and_another_cpu_of_the_kind(tmp_path):
    import yaml

    cpu = {**_entry("cpu"), "id": "cpu-a", "machine": {"kind": "cpu", "name": "AMD EPYC", "cores": 2},
           "probe": {"copy_bandwidth_Bps": 40e9, "matmul_f32_flops": 2e11, "cpu_count": 2},
           "engines": {"vllm": {"bandwidth_Bps": 2e10, "eager": {"dense": {"layer_s": 1e-4, "step_s": 1e-3}}}}}
    (tmp_path / "cpu-a.yaml").write_text(yaml.safe_dump(cpu))
    (tmp_path / "h200.yaml").write_text(yaml.safe_dump(_entry()))
    e, own = cal.calibration_for("gpu", "NVIDIA H200", tmp_path)
    assert e["id"] == "test-gpu" and own
    run = {"hardware_measured": {"cpu_model": "AMD EPYC", "cpu_count": 2, "copy_bandwidth_Bps": 20e9,
                                 "matmul_f32_flops": 1e11}}
    m, why = cal.machine_for(run, tmp_path)
    assert not m.own and why == ""  # half the copy bandwidth: the other machine type, scaled
    bw, _ = m.bandwidth("vllm", 1)
    assert bw == pytest.approx(1e10)
    fixed, _, _, _ = m.fixed("vllm", "eager", {"dense": 10})
    assert fixed == pytest.approx(1e-3 + 10 * 1e-4)  # the probe's matmul rate is too noisy to scale them by
    p = perfmodel.predict(_facts("llama-3.1-8b"), "vllm", {}, m, input_tokens=64, output_tokens=64, concurrency=[1])
    assert p["kinds"]["c1_tpot_s"] == "bound" and "another machine" in p["bound_because"][0]
    sig = {**run["hardware_measured"], "cpu_signature": "AuthenticAMD family 25 model 1; avx2 avx512f"}
    cpu_sig = {**cpu, "probe": {**cpu["probe"], "cpu_signature": "AuthenticAMD family 26 model 2; avx2 avx512f"}}
    (tmp_path / "sig").mkdir()
    (tmp_path / "sig" / "cpu-a.yaml").write_text(yaml.safe_dump(cpu_sig))
    assert not cal.machine_for({"hardware_measured": {**sig, "copy_bandwidth_Bps": 40e9}}, tmp_path / "sig")[0].own
    same = {**run, "hardware_measured": {**run["hardware_measured"], "copy_bandwidth_Bps": 41e9,
                                         "matmul_f32_flops": 2e11}}
    assert cal.machine_for(same, tmp_path)[0].own
    none, why = cal.machine_for({"gpus_used": [{"name": "NVIDIA A10G"}]}, tmp_path)
    assert none is None and "A10G" in why  # no entry and no datasheet row to carry one to
    carried, why = cal.machine_for({"gpus_used": [{"name": "NVIDIA L40S"}]}, tmp_path)
    assert carried.transferred_from == "test-gpu" and carried.entry["machine"]["name"] == "L40S" and why == ""


def test_a_run_without_a_calibration_gets_the_roofline_bounds_labelled(tmp_path):
    from servelab.schema import Bucket, Workload

    facts = _facts("llama-3.1-8b")
    run = {"study": "s", "config": "c", "model": {"facts": facts}, "engine_params": {"kind": "vllm", "args": {}},
           "gpus_used": [{"name": "NVIDIA H200", "memory": "143771 MiB"}]}
    wl = Workload(buckets=[Bucket(input_tokens=256, output_tokens=256)], concurrency=[1, 8])
    out = perfmodel.predict_configuration(run, wl, {}, {"in256-out256": (256, 256)}, "t", folder=tmp_path)
    assert out["model_version"] == "roofline" and out["stored_before_measurement"]
    b = out["buckets"]["in256-out256"]
    assert set(b["kinds"].values()) == {"bound"} and "no calibration entry" in b["bound_because"][0]
    assert not perfmodel.identical_requests(Workload(buckets=[Bucket(input_tokens=8, output_tokens=8)], concurrency=[1], temperature=1.0,
                                              seed=None))
    assert perfmodel.identical_requests(wl)  # filler prompts, temperature 0
    bare = perfmodel.predict_configuration({**run, "model": {}}, wl, {}, {"in256-out256": (256, 256)}, "t")
    assert "parameter count" in bare["not_predictable"] and "buckets" not in bare
