"""A calibration carried to a GPU that has none (analysis.transfer, issue #59): each term moves by what it
depends on and says so, the host's terms stay the calibrated host's, the band brackets the estimate, and the
TTFT model's request cost is what its committed points say."""

from __future__ import annotations

import pytest

from servelab.analysis import calibration as cal
from servelab.analysis import perfmodel, transfer
from servelab.analysis.perfmodel_terms import fit_request_cost
from servelab.analysis.roofline import get_hardware
from servelab.models.facts import facts_from_config
from servelab.models.presets import PRESETS


def _facts(preset: str) -> dict:
    return facts_from_config(PRESETS[preset], vocab_size=32000)


def _only(tmp_path, *ids: str):
    """A calibration folder holding only the committed entries `ids`."""
    import shutil

    from servelab.tables import CALIBRATIONS

    for i in ids:
        shutil.copy(CALIBRATIONS / f"{i}.yaml", tmp_path / f"{i}.yaml")
    return tmp_path


def test_the_h100_gets_the_h200s_shares_of_its_datasheet_and_the_h200_hosts_cpu_terms(tmp_path):
    folder = _only(tmp_path, "nvidia-h200-2026-12-02")  # before the H100 had an entry of its own
    h200, _ = cal.gpu_machine("NVIDIA H200", folder)
    h100, why = cal.gpu_machine("NVIDIA H100 80GB HBM3", folder)
    assert why == "" and h100.transferred_from == h200.entry["id"] and h200.transferred_from is None
    share = h200.bandwidth("vllm", 1)[0] / 4.8e12
    assert h100.bandwidth("vllm", 1)[0] == pytest.approx(share * 3.35e12, rel=1e-9)
    assert h100.flops("bf16", 4096)[0] == pytest.approx(h200.flops("bf16", 4096)[0], rel=1e-9)  # the same 989 TFLOP/s
    counts = {"moe": 16}
    f100, g100, _, _ = h100.fixed("vllm", "graphs", counts)
    f200, g200, _, _ = h200.fixed("vllm", "graphs", counts)
    assert f100 == pytest.approx(f200) and g100 == pytest.approx(g200)  # same host floor; same clock, same kernels
    assert h100.request("vllm")[0] == pytest.approx(h200.request("vllm")[0])
    terms = {t["term"]: t for t in h100.transfer}
    assert terms["decode bandwidth"]["range"] == transfer.RANGE_BW_SAME_MEMORY  # HBM3e to HBM3
    assert "nearest calibrated host" in terms["engine CPU side, eager launch costs, request cost"]["rule"]


def test_the_rules_ranges_hold_on_the_h100_measured_later():
    """The H100 was calibrated after the rules were written (nvidia-h100-2026-12-06): the H200's terms carried by
    the rules land within each rule's range of what the H100 and its host measured."""
    h200 = cal.calibration_for("gpu", "NVIDIA H200")[0]
    h100 = cal.calibration_for("gpu", "NVIDIA H100 80GB HBM3")[0]
    carried = transfer.transferred_entry(get_hardware("H100 SXM"), h200, get_hardware("H200 SXM"))
    for b in ("1", "8", "32"):
        got, want = carried["micro"]["decode_bandwidth_Bps"][b], h100["micro"]["decode_bandwidth_Bps"][b]
        assert abs(got - want) / want < transfer.RANGE_BW_SAME_MEMORY, b
    for rows in ("256", "1024", "4096"):
        got, want = carried["micro"]["gemm_flops"]["bf16"][rows], h100["micro"]["gemm_flops"]["bf16"][rows]
        assert abs(got - want) / want < transfer.RANGE_FLOPS, rows
    floor = lambda e: max(c["floor_s"] for c in e["engines"]["vllm"]["graphs"].values())  # noqa: E731
    assert abs(floor(carried) - floor(h100)) / floor(carried) < transfer.RANGE_HOST  # the host: 2.49 against 1.59 ms


def test_a_host_missing_some_terms_gets_them_carried_and_scaled_by_what_it_measured():
    """An H100 entry that measured dense eager costs only: MoE and latent-attention eager costs come from the H200's
    host scaled by the two hosts' dense costs; a missing request cost by the ratio of their floors."""
    import copy

    h200 = cal.calibration_for("gpu", "NVIDIA H200")[0]
    h100 = copy.deepcopy(cal.calibration_for("gpu", "NVIDIA H100 80GB HBM3")[0])
    h100["engines"]["vllm"].pop("request", None)
    h100["engines"]["vllm"]["eager"] = {"dense": h100["engines"]["vllm"]["eager"]["dense"]}
    done = transfer.complete_entry(h100, h200)
    e1, e2 = done["engines"]["vllm"]["eager"], h200["engines"]["vllm"]["eager"]
    ratio = e1["dense"]["layer_s"] / e2["dense"]["layer_s"]
    assert e1["moe"]["layer_s"] == pytest.approx(e2["moe"]["layer_s"] * ratio) and e1["moe"]["carried_from"]
    fl = lambda e: max(c["floor_s"] for c in e["engines"]["vllm"]["graphs"].values())  # noqa: E731
    assert done["engines"]["vllm"]["request"]["request_s"] == pytest.approx(
        h200["engines"]["vllm"]["request"]["request_s"] * fl(h100) / fl(h200))
    assert {t["term"] for t in done["transfer"]} == {"eager launch costs", "request cost", "GPU fixed time per layer"}
    m, _ = cal.gpu_machine("NVIDIA H100 80GB HBM3")  # its own entry, its own request cost, MoE eager carried
    assert m.transferred_from is None and m.entry.get("completed_from") == h200["id"]
    assert m.request("vllm")[0] == pytest.approx(m.scale_host * (h100_request := cal.calibration_for(
        "gpu", "NVIDIA H100 80GB HBM3")[0]["engines"]["vllm"]["request"]["request_s"])) and h100_request < 0.015


def test_a_gddr_gpu_gets_a_wider_band_and_its_clock_scales_the_kernels():
    l40s, _ = cal.gpu_machine("L40S")
    terms = {t["term"]: t for t in l40s.transfer}
    assert terms["decode bandwidth"]["range"] == transfer.RANGE_BW_OTHER_MEMORY
    h200 = get_hardware("H200 SXM")
    assert terms["GPU fixed time per layer"]["value"] == pytest.approx(h200["boost_clock_hz"] / 2520e6)
    f = _facts("llama-3.1-8b")
    p = perfmodel.predict(f, "vllm", {}, l40s, input_tokens=256, output_tokens=256, concurrency=[1, 32])
    assert p["kinds"]["c1_tpot_s"] == "estimate" and p["transferred_from"]
    lo, hi = p["band"]["c1_tpot_s"]
    assert lo < p["c1_tpot_s"] < hi
    assert any(i["name"].startswith("transferred: decode bandwidth") for i in p["inputs"])


def test_a_gpu_neither_calibrated_nor_in_the_hardware_table_is_refused_with_why():
    m, why = cal.gpu_machine("NVIDIA A10G")
    assert m is None and "no datasheet row" in why


@pytest.mark.parametrize("gpu", ["NVIDIA H200", "NVIDIA H100 80GB HBM3"])
def test_the_committed_request_cost_is_the_median_of_its_points(gpu):
    e, _ = cal.calibration_for("gpu", gpu)
    r = e["engines"]["vllm"]["request"]
    again = fit_request_cost(r["points"])
    assert again["request_s"] == pytest.approx(r["request_s"]) and again["n"] == r["n"] >= 10
    # every point of the fit within 35 % of the model's TTFT (its request cost + its prefill steps)
    within = [p for p in r["points"] if p["tokens"] <= 4096
              and p["measured_s"] == pytest.approx(p["model_s"] + r["request_s"], rel=0.35)]
    assert len(within) >= 0.85 * len([p for p in r["points"] if p["tokens"] <= 4096])  # (the fit's own levels)
    with pytest.raises(ValueError, match="three levels"):
        fit_request_cost(r["points"][:2])


def test_the_launch_wait_is_what_gives_launched_levels_the_request_cost_of_those_in_a_graph():
    """Levels prefilled inside a graph hold the request cost alone; the launch wait is the share of the shorter of
    launches and GPU work that makes the launched levels' residuals agree with theirs."""
    from servelab.analysis.perfmodel_terms import fit_launch_wait

    true_wait, req = 0.4, 0.006
    launched = [(0.030, 0.010), (0.020, 0.018), (0.050, 0.040)]  # (launches, GPU work) of three launched levels

    def points_at(w):
        pts = [{"how": "graph", "measured_s": req + t, "model_s": t} for t in (0.002, 0.004, 0.008)]
        pts += [{"how": "launched", "measured_s": req + max(c, g) + true_wait * min(c, g),
                 "model_s": max(c, g) + w * min(c, g)} for c, g in launched]
        return pts
    assert fit_launch_wait(points_at) == pytest.approx(true_wait)
    assert fit_launch_wait(lambda w: [p for p in points_at(w) if p["how"] == "graph"]) is None


def test_a_prefill_past_the_captured_graphs_pays_the_launch_costs():
    """vLLM captures graphs up to min(2 x max-num-seqs, 512) tokens: a 256-token prompt runs in one at the
    default, and without graphs at max-num-seqs 64, where a MoE layer's launches add to the GPU's work."""
    from servelab import engines

    m, _ = cal.gpu_machine("NVIDIA H200")
    prof = engines.get("vllm")
    assert prof.graph_prefill_tokens({}) == 512 and prof.graph_prefill_tokens({"max-num-seqs": 64}) == 128
    assert prof.graph_prefill_tokens({"enforce-eager": True}) == 0
    # vLLM sets gpt-oss's to 1,024 unless the flags set it (h100-mla-holdout's engine log)
    assert prof.graph_prefill_tokens({"max-num-seqs": 64}, "gpt_oss") == 1024
    assert prof.graph_prefill_tokens({"compilation-config": {"max_cudagraph_capture_size": 256}}, "gpt_oss") == 256
    assert prof.prefill_chunk_tokens({}, 80e9) == 8192 and prof.prefill_chunk_tokens({}, 48e9) == 2048
    olmoe = _facts("olmoe-1b-7b")
    inside = perfmodel.prefill_step(m, "vllm", "graphs", olmoe, 256, graph_tokens=512)
    outside = perfmodel.prefill_step(m, "vllm", "graphs", olmoe, 256, graph_tokens=128)
    assert inside["how"] == "graph" and outside["how"] == "launched"
    cpu, _, own = m.eager_cpu("vllm", perfmodel.layer_counts(olmoe))
    # the host's terms at the typical host of those seen (analysis.hosts); the launches run ahead of the GPU, and
    # the H200's host waits on the GPU's work (its launch_wait, fitted with its request cost)
    eager = m.entry["engines"]["vllm"]["eager"]
    step = max(c["step_s"] for c in eager.values())
    assert own and cpu == pytest.approx((step + 16 * eager["moe"]["layer_s"]) * m.scale_host)
    wait = m.launch_wait("vllm")
    assert 0.0 <= wait <= 1.0
    assert outside["total_s"] == pytest.approx(max(cpu, outside["gpu_s"]) + wait * min(cpu, outside["gpu_s"]))
    long = perfmodel.prefill_step(m, "vllm", "graphs", olmoe, 20000, graph_tokens=512, chunk=8192)
    assert long["chunks"] == 3
    # dummy weights that tie the router: a prompt's tokens read one token's experts
    tied = perfmodel.prefill_step(m, "vllm", "graphs", olmoe, 2048, graph_tokens=512, ties=True)
    spread = perfmodel.prefill_step(m, "vllm", "graphs", olmoe, 2048, graph_tokens=512)
    assert tied["memory_s"] < spread["memory_s"] / 4


def test_an_entry_without_the_deeper_pass_gets_the_gpus_per_layer_time_carried_by_the_clocks():
    """The H100's entry measured MoE and latent-attention calibration models of 2 to 8 layers only (their time is the
    CPU side's floor): their GPU per-layer kernel time comes from the H200's deeper pass, by the boost clocks, listed
    and banded; its dense layers' from its own deeper pass."""
    h200 = cal.calibration_for("gpu", "NVIDIA H200")[0]
    h100 = cal.calibration_for("gpu", "NVIDIA H100 80GB HBM3")[0]
    assert "gpu_layer_s" not in h100["engines"]["vllm"]["graphs"]["moe"]
    done = transfer.complete_entry(h100, h200)
    clk = get_hardware("H200 SXM")["boost_clock_hz"] / get_hardware("H100 SXM")["boost_clock_hz"]
    assert "gpu_carried_from" not in done["engines"]["vllm"]["graphs"]["dense"]
    for k in ("moe", "mla"):
        assert done["engines"]["vllm"]["graphs"][k]["gpu_layer_s"] == pytest.approx(
            h200["engines"]["vllm"]["graphs"][k]["gpu_layer_s"] * clk)
    row = next(t for t in done["transfer"] if t["term"] == "GPU fixed time per layer")
    assert row["range"] == transfer.RANGE_CLOCK and row["value"] == pytest.approx(clk)
    m, _ = cal.gpu_machine("NVIDIA H100 80GB HBM3")
    counts = perfmodel.layer_counts(_facts("qwen3-30b-a3b"))
    assert m.fixed("vllm", "graphs", counts)[1] == pytest.approx(
        48 * h200["engines"]["vllm"]["graphs"]["moe"]["gpu_layer_s"] * clk, rel=0.05)
