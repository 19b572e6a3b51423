"""Parallel layouts (issue 47): the GPU count each engine's flags start (vLLM, SGLang), what per-GPU
figures divide by, what run.json records (layout, communication flags, NCCL_* environment), what the
report's "what changes" column names, the performance model's TP, DP and EP terms (from a given alpha
and beta, never a measurement of this machine), the dry run of the two-GPU study and the one-line error
of a layout wider than the placement."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from servelab.analysis import calibration as cal
from servelab.analysis import perfmodel
from servelab.analysis.perfmodel_parallel import Parallel, collective_s, replica_counts
from servelab.engines import get
from servelab.engines.base import Layout
from servelab.models.facts import facts_from_config
from servelab.models.presets import PRESETS

ROOT = Path(__file__).resolve().parents[1]
STUDY = ROOT / "params" / "h200x2-layouts.yaml"
AB = (20e-6, 100e9)  # a given all-reduce: 20 us + bytes / 100 GB/s


@pytest.mark.parametrize("kind,args,label,gpus", [
    ("vllm", {}, "TP=1", 1),
    ("vllm", {"tensor-parallel-size": 2}, "TP=2", 2),
    ("vllm", {"data-parallel-size": 2}, "DP=2", 2),
    ("vllm", {"tensor-parallel-size": 2, "enable-expert-parallel": True}, "TP=2, EP=2", 2),
    ("vllm", {"data-parallel-size": 2, "enable-expert-parallel": True}, "DP=2, EP=2", 2),
    ("vllm", {"tensor-parallel-size": 2, "data-parallel-size": 2}, "TP=2, DP=2", 4),
    ("sglang", {"tp-size": 2, "ep-size": 2}, "TP=2, EP=2", 2),
    ("sglang", {"tp-size": 2, "dp-size": 2}, "TP=2, DP=2", 4),
    ("sglang", {"tp-size": 2, "dp-size": 2, "enable-dp-attention": True}, "TP=2, DP=2, DP attention", 2),
])
def test_gpu_count_and_label_from_each_engines_flags(kind, args, label, gpus):
    lay = get(kind).layout(args)
    assert (lay.label(), lay.gpus, get(kind).gpu_count(args)) == (label, gpus, gpus)


def test_layouts_an_engine_would_refuse_are_one_line_each():
    assert get("vllm").validate({"enable-expert-parallel": True}) == [
        "enable-expert-parallel on one GPU (tensor-parallel-size x data-parallel-size = 1): no experts to split"]
    assert get("sglang").validate({"tp-size": 2, "dp-size": 4, "enable-dp-attention": True})[0].startswith(
        "enable-dp-attention: dp-size 4 must divide tp-size 2")
    assert get("vllm").validate({"tensor-parallel-size": 0}) == ["parallel sizes must be at least 1, got TP=0"]


def _sd(engines: dict[str, dict]) -> SimpleNamespace:
    from servelab.report.i18n import words

    return SimpleNamespace(engine_params=lambda c: engines[c], w=words("en"))


def test_per_gpu_figures_and_the_price_divide_by_the_layouts_gpus():
    from servelab.report import money
    from servelab.report.load import engine_gpus
    from servelab.schema import CostParams

    sd = _sd({"tp1": {"kind": "vllm", "args": {}}, "dp2": {"kind": "vllm", "args": {"data-parallel-size": 2}},
              "sg": {"kind": "sglang", "args": {"tp-size": 2, "dp-size": 2, "enable-dp-attention": True}}})
    assert [engine_gpus(sd, c) for c in ("tp1", "dp2", "sg")] == [1, 2, 2]
    sd.study = SimpleNamespace(cost=CostParams(instance_type="p5en.48xlarge", gpus_used=1))
    price = SimpleNamespace(usd_per_hour=64.0, instance_type="p5en.48xlarge")
    assert money.hourly_share(sd, "dp2", price) == (pytest.approx(16.0), "2/8 GPUs")
    assert money.hourly_share(sd, "tp1", price) == (pytest.approx(8.0), "1/8 GPUs")


def test_what_changes_names_the_layout_first():
    from servelab.report.progress import change_text

    base = {"kind": "vllm", "args": {"max-num-seqs": 256}}
    sd = _sd({"tp1": base, "tp2": {"kind": "vllm", "args": {"max-num-seqs": 256, "tensor-parallel-size": 2}}})
    assert change_text(sd, "tp2", "tp1") == "layout: TP=1 (1 GPU) → TP=2 (2 GPUs); args.tensor-parallel-size: – → 2"


def test_run_json_records_the_layout_its_comm_flags_and_nccl_env(monkeypatch):
    from servelab.measure.runinfo import layout_record
    from servelab.schema import EngineParams
    from servelab.schema.runfiles import RunInfo

    monkeypatch.setenv("NCCL_DEBUG", "WARN")
    eng = EngineParams(kind="vllm", args={"tensor-parallel-size": 2, "disable-custom-all-reduce": True,
                                          "compilation-config": {"pass_config": {"fuse_allreduce_rms": False}}},
                       env={"NCCL_P2P_LEVEL": "NVL"})
    rec = layout_record(get("vllm"), eng, {"NCCL_NVLS_ENABLE": "0"})
    assert rec["label"] == "TP=2" and rec["gpus"] == 2 and rec["tp"] == 2
    assert rec["comm_flags"] == {"disable-custom-all-reduce": True,
                                 "compilation-config.pass_config": {"fuse_allreduce_rms": False}}
    assert rec["nccl_env"] == {"NCCL_DEBUG": "WARN", "NCCL_NVLS_ENABLE": "0", "NCCL_P2P_LEVEL": "NVL"}
    assert RunInfo.model_validate({"layout": rec}).layout["label"] == "TP=2"


# -- the model's terms -------------------------------------------------------------------------------

def _machine(collectives: dict | None = None) -> cal.Machine:
    costs = {k: {"layer_s": 1e-5, "step_s": 1e-4, "floor_s": 2e-3, "gpu_layer_s": 1e-5, "gpu_step_s": 0.0}
             for k in ("dense", "moe", "mla")}
    micro = {"decode_bandwidth_Bps": {"1": 4e12, "8": 4e12, "32": 4e12}, "gemm_flops": {"bf16": {"256": 5e14, "4096": 7e14}}}
    if collectives:
        micro["collectives"] = collectives
    return cal.Machine({"id": "t", "machine": {"kind": "gpu", "name": "NVIDIA H200", "memory_bytes": 150e9},
                        "measured_at": "2026-12-02", "micro": micro, "engines": {"vllm": {"graphs": costs}}})


def _facts(preset: str) -> dict:
    return facts_from_config(PRESETS[preset], vocab_size=32000)


KW = dict(input_tokens=256, output_tokens=256, concurrency=[1, 2, 8, 32])


def test_tp2_halves_the_weight_bytes_and_adds_the_all_reduces_of_a_given_alpha_beta():
    f = _facts("qwen2.5-32b")
    ar = {"2": {"all_reduce": {"alpha_s": AB[0], "beta_Bps": AB[1]}}}
    par = Parallel.of(Layout(tp=2), _machine(ar).collective)
    assert par.weight_bytes(f, 1) == pytest.approx(perfmodel.weight_bytes(f, 1) / 2)
    rows = 8
    assert par.comm_s(f, rows) == pytest.approx(2 * 64 * (AB[0] + rows * 5120 * 2 / AB[1]))
    with_ar = perfmodel.predict(f, "vllm", {}, _machine(ar), layout=Layout(tp=2), **KW)
    without = perfmodel.predict(f, "vllm", {}, _machine(), layout=Layout(tp=2), **KW)
    assert with_ar["c1_tpot_s"] - without["c1_tpot_s"] == pytest.approx(par.comm_s(f, 1), rel=1e-6)
    assert with_ar["kinds"]["tpot_s"] == "estimate" and with_ar["bound_because"] == []
    assert without["kinds"]["tpot_s"] == "bound" and "all-reduce" in without["bound_because"][0]
    one = perfmodel.predict(f, "vllm", {}, _machine(ar), **KW)
    assert without["c1_tpot_s"] < one["c1_tpot_s"]  # half the bytes per GPU


def test_dp2_is_two_replicas_each_at_half_the_concurrency():
    f = _facts("qwen2.5-32b")
    one = perfmodel.predict(f, "vllm", {}, _machine(), **KW)
    dp = perfmodel.predict(f, "vllm", {}, _machine(), layout=Layout(dp=2), **KW)
    assert dp["tpot_s"]["2"] == pytest.approx(one["tpot_s"]["1"])
    one16 = perfmodel.predict(f, "vllm", {}, _machine(), **{**KW, "concurrency": [16]})
    assert dp["tpot_s"]["32"] == pytest.approx(one16["tpot_s"]["16"])
    assert dp["kv_limited_concurrency"] == pytest.approx(2 * one["kv_limited_concurrency"])
    tp = [dp["tpot_s"][str(c)] for c in (1, 2, 8, 32)]
    assert tp == sorted(tp)  # monotonic in c
    assert replica_counts(5, 2) == [3, 2] and replica_counts(1, 2) == [1, 0]


def test_ep_splits_the_experts_and_is_a_bound_with_an_all_to_all_across_replicas():
    f = _facts("qwen3-30b-a3b")
    a2a = {"2": {"all_to_all": {"alpha_s": AB[0], "beta_Bps": AB[1]}}}
    args = {"data-parallel-size": 2, "enable-expert-parallel": True}
    par = Parallel.of(get("vllm").layout(args), _machine(a2a).collective)
    assert par.ep == 2 and par.tp == 1 and par.ep_across and par.all_to_all == AB
    from servelab.analysis.perfmodel_parallel import expert_bytes

    touched = expert_bytes(f, touched=True, distinct=4)
    assert par.weight_bytes(f, 4) == pytest.approx(perfmodel.weight_bytes(f, 4) - touched / 2)
    assert par.comm_s(f, 4) == pytest.approx(2 * 48 * collective_s(AB, 4 * 8 * 2048 * 2))
    p = perfmodel.predict(f, "vllm", args, _machine(a2a), layout=get("vllm").layout(args), **KW)
    assert p["kinds"]["tpot_s"] == "bound" and any("busiest GPU" in w for w in p["bound_because"])


def test_predict_configuration_takes_the_layout_from_the_flags():
    f = _facts("qwen2.5-32b")
    run = {"config": "x", "gpus_used": [{"name": "NVIDIA H200"}], "model": {"facts": f},
           "engine_params": {"kind": "vllm", "args": {"data-parallel-size": 2}}}
    wl = SimpleNamespace(concurrency=[1, 2], buckets=[], arrival="concurrency", concurrency_ramp_s=None,
                         temperature=1.0, seed=None)
    out = perfmodel.predict_configuration(run, wl, {}, {"b": (256, 256)}, "now", folder=None)
    inputs = {i["name"]: i["value"] for i in out["buckets"]["b"]["inputs"]}
    assert inputs["layout"] == "DP=2" and inputs["GPUs"] == 2 and inputs["replicas (DP)"] == 2


def test_collective_fit_recovers_alpha_and_beta():
    pts = [{"bytes": float(b), "seconds": AB[0] + b / AB[1]} for b in (4096, 65536, 2**20, 2**24)]
    fit = cal.fit_collective(pts)
    assert fit["alpha_s"] == pytest.approx(AB[0], rel=1e-6) and fit["beta_Bps"] == pytest.approx(AB[1], rel=1e-6)


# -- the study, its dry run, its errors ---------------------------------------------------------------

def test_the_two_gpu_study_validates_and_places_its_layouts():
    from servelab.measure.inventory import stand_in
    from servelab.placement import plan
    from servelab.schema import load_study

    s = load_study(STUDY)
    p = plan(s, [c.id for c in s.configurations], stand_in("2xH200"))
    assert {c: ",".join(map(str, p.server_of(c).gpus)) for c in (x.id for x in s.configurations)} == {
        "dense-tp1": "0", "moe-tp1": "1", "dense-tp2": "0,1", "dense-dp2": "0,1", "moe-tp2": "0,1", "moe-ep2": "0,1",
        "moe-sglang-ep2": "0,1"}


def test_the_dry_run_prints_every_layouts_command_gpus_and_prediction():
    from servelab.pipeline import describe
    from servelab.schema import load_study

    text = describe(load_study(STUDY))
    for flag in ("--tensor-parallel-size 2", "--data-parallel-size 2", "--enable-expert-parallel",
                 "--tp-size 2 --ep-size 2"):
        assert flag in text
    assert "[dense-tp2] layout TP=2: 2 GPUs, CUDA_VISIBLE_DEVICES=0,1" in text
    assert "[dense-tp1] layout TP=1: 1 GPU, CUDA_VISIBLE_DEVICES=0" in text
    assert "[moe-ep2] layout TP=2, EP=2: 2 GPUs" in text
    for cid in ("dense-tp1", "dense-tp2", "dense-dp2", "moe-tp1", "moe-tp2", "moe-ep2", "moe-sglang-ep2"):
        assert f"\n{cid}: calibration " in text
    assert "bound: tensor parallel: the all-reduce cost is not calibrated for 2 GPUs" in text


def test_a_layout_wider_than_the_placement_is_one_line_and_exit_2(tmp_path):
    text = STUDY.read_text().replace("        data-parallel-size: 2", "        data-parallel-size: 2\n"
                                     "        tensor-parallel-size: 2")
    p = tmp_path / "wide.yaml"
    p.write_text(text)
    r = subprocess.run([sys.executable, "-m", "servelab.cli", "run", str(p), "--dry-run"], capture_output=True,
                       text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "configurations[2] (dense-dp2): layout TP=2, DP=2 needs 4 GPUs, placement.gpus is 2" \
        in lines[0]
