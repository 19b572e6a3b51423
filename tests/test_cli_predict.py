"""`servelab predict PARAMS`: a study's predictions with no server running (the "before I rent"
answer), naming the machine's calibration entry and its date, or the roofline bounds and why."""

from __future__ import annotations

import contextlib
import io
import re
from types import SimpleNamespace

import pytest
from paths import ROOT

from servelab.cli import main as servelab_main


def _cli(*args: str) -> SimpleNamespace:
    """`servelab ARGS` from the repository root, in this process (a subprocess spent ~4 s a call importing
    transformers and torch again): its exit status and what it printed."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.chdir(ROOT), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = servelab_main(list(args))
        except SystemExit as e:  # argparse
            rc = e.code if isinstance(e.code, int) else 1
    return SimpleNamespace(returncode=rc, stdout=out.getvalue(), stderr=err.getvalue())


def test_predict_a_local_study_with_no_server():
    r = _cli("predict", "params/local-cpu-kv.yaml")
    assert r.returncode == 0, r.stderr[-2000:]
    lines = r.stdout.splitlines()
    assert lines[0].startswith("local-cpu-kv: predicted on this CPU")
    for cid in ("roomy", "kv-tight"):
        head = next(ln for ln in lines if ln.startswith(f"{cid}: "))
        assert re.search(r"calibration \S+ \(.+, measured 20\d\d-\d\d-\d\d\)|roofline bounds", head), head
    assert re.search(r"TPOT c=1 [\d.]+ ms", r.stdout) and "capacity at SLO" in r.stdout


def test_predict_a_gpu_study_names_the_gpu_and_an_unknown_configuration_is_one_line():
    r = _cli("predict", "params/h200-perfmodel.yaml", "--config", "qwen3moe", "--hardware", "NVIDIA H200")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "qwen3moe: " in r.stdout and re.search(r"c=32 [\d.]+ ms", r.stdout)
    bad = _cli("predict", "params/h200-perfmodel.yaml", "--config", "nope", "--hardware", "NVIDIA H200")
    assert bad.returncode == 2 and "no configuration nope" in bad.stderr and "Traceback" not in bad.stderr


def test_predict_a_model_without_a_params_file():
    """--model: the facts from the library, then weights, KV, TPOT by concurrency, TTFT and capacity, each
    labelled, estimates with their band; a GPU without a calibration entry of its own gets the nearest calibrated
    GPU's terms carried by the datasheets, each named with its rule and source (issue #59)."""
    r = _cli("predict", "--model", "tests/fixtures/architectures/qwen1.5-moe-a2.7b.json", "--gpu", "NVIDIA H200",
             "--concurrency", "1,32")
    assert r.returncode == 0, r.stderr[-2000:]
    out = r.stdout
    assert out.startswith("qwen1.5-moe-a2.7b: Qwen2MoeForCausalLM (qwen2_moe), 14.32 B parameters; 60 routed experts")
    assert "4 per token, 1 shared" in out and "weights: 26.67 GiB" in out and "calibration nvidia-h200-" in out
    assert re.search(r"TPOT: c=1 [\d.]+ ms \([\d.]+-[\d.]+\), c=32 [\d.]+ ms \([\d.]+-[\d.]+\) \(estimate", out)
    assert re.search(r"TTFT at c=1: [\d.]+ ms \([\d.]+-[\d.]+\) \(estimate\)", out)
    assert re.search(r"KV cache: 196,608 bytes per token .* tokens fit", out) and "capacity at the SLO" in out
    l40s = _cli("predict", "--model", "tests/fixtures/architectures/llama-3.1-8b.json", "--gpu", "L40S")
    assert l40s.returncode == 0 and re.search(r"terms carried from calibration nvidia-h\d00-", l40s.stdout)
    assert "carried: decode bandwidth" in l40s.stdout and "(estimate" in l40s.stdout and "band:" in l40s.stdout
    unknown = _cli("predict", "--model", "tests/fixtures/architectures/llama-3.1-8b.json", "--gpu", "NVIDIA A10G")
    assert unknown.returncode == 2 and "no datasheet row" in unknown.stderr
    neither = _cli("predict")
    assert neither.returncode == 2 and "give a params file or --model" in neither.stderr


def test_the_moe_prefill_fit_says_what_it_needs():
    """calibrate-hw --moe-prefill-from fits nothing from a study without TTFT sweeps, and says so in one line."""
    no_entry = _cli("calibrate-hw", "--moe-prefill-from", "reports/h200-perfmodel")
    assert no_entry.returncode == 2 and "needs --add-to" in no_entry.stderr
    no_sweep = _cli("calibrate-hw", "--moe-prefill-from", "reports/h200-perfmodel", "--add-to", "nvidia-h200-2026-12-02")
    assert no_sweep.returncode == 2 and "needs TTFT sweeps" in no_sweep.stderr and "Traceback" not in no_sweep.stderr


def test_the_h200_entry_refits_from_its_own_points(tmp_path):
    """calibrate-hw --add-to pools a second pass into an entry and fits it again: pooling the committed
    H200 entry with itself gives back its numbers, so the entry is what its points say."""
    import shutil

    import yaml

    from servelab.tables import CALIBRATIONS
    from servelab.calibrate_hw import merge

    src = CALIBRATIONS / "nvidia-h200-2026-12-02.yaml"
    main, other = tmp_path / "a.yaml", tmp_path / "b.yaml"
    shutil.copy(src, main)
    shutil.copy(src, other)
    got, want = merge(main, other), yaml.safe_load(src.read_text())
    assert not other.exists()
    g, w = got["engines"]["vllm"]["graphs"], want["engines"]["vllm"]["graphs"]
    assert set(g) == set(w) == {"dense", "moe", "mla"}
    for kind in g:
        assert g[kind]["gpu_layer_s"] == pytest.approx(w[kind]["gpu_layer_s"], rel=1e-9)
        assert g[kind]["layer_s"] == pytest.approx(w[kind]["layer_s"], rel=1e-9)
        assert g[kind]["floor_s"] == pytest.approx(w[kind]["floor_s"], rel=1e-9)
        assert sorted(p["layers"] for p in g[kind]["points"]) == [2, 4, 8, 16, 32, 64]


@pytest.mark.parametrize("entry", ["amd-epyc-2026-12-02", "nvidia-h200-2026-12-02"])
def test_every_entry_refits_from_its_own_points(tmp_path, entry):
    """The same for every committed entry, the CPU's too: its engine bandwidth (fitted from two
    widths, of which the entry keeps the narrow points only) survives a merge, and its eager line is
    fitted on every depth (a CPU has no CUDA-graph floor to leave)."""
    import shutil

    import yaml

    from servelab.tables import CALIBRATIONS
    from servelab.calibrate_hw import merge

    src = CALIBRATIONS / f"{entry}.yaml"
    main, other = tmp_path / "a.yaml", tmp_path / "b.yaml"
    shutil.copy(src, main)
    shutil.copy(src, other)
    got, want = merge(main, other)["engines"]["vllm"], yaml.safe_load(src.read_text())["engines"]["vllm"]
    assert got.get("bandwidth_Bps") == want.get("bandwidth_Bps")
    assert got.get("request") == want.get("request")  # a fitted term rides along, unchanged
    for mode in want:
        if not isinstance(want[mode], dict) or mode in ("version", "request", "moe_prefill"):
            continue
        for kind, w in want[mode].items():
            assert got[mode][kind]["layer_s"] == pytest.approx(w["layer_s"], rel=1e-9)
            assert got[mode][kind]["step_s"] == pytest.approx(w["step_s"], rel=1e-9)
            assert got[mode][kind]["n"] == w["n"]


def test_the_request_cost_fit_says_what_it_needs(tmp_path):
    """calibrate-hw --ttft-from fits the engine's request cost from published TTFTs into an entry it names: without
    --add-to, one line; a study without a level it can use (no vLLM with CUDA graphs on the entry's GPU), one line."""
    no_entry = _cli("calibrate-hw", "--ttft-from", "reports/h200-perfmodel")
    assert no_entry.returncode == 2 and "needs --add-to" in no_entry.stderr
    none = _cli("calibrate-hw", "--ttft-from", "reports/local-cpu-kv", "--add-to", "nvidia-h200-2026-12-02")
    assert none.returncode == 2 and "three levels" in none.stderr and "Traceback" not in none.stderr


def test_the_latent_attention_fit_says_what_it_needs():
    """calibrate-hw --mla-prefill-from without --add-to, one line; studies without a latent-attention and a dense shape
    prefilled inside CUDA graphs on the entry's GPU (the H200's studies have no such pair), one line naming them."""
    no_entry = _cli("calibrate-hw", "--mla-prefill-from", "reports/h100-host-holdout")
    assert no_entry.returncode == 2 and "needs --add-to" in no_entry.stderr
    none = _cli("calibrate-hw", "--mla-prefill-from", "reports/h200-perfmodel", "--add-to", "nvidia-h200-2026-12-02")
    assert none.returncode == 2 and "latent-attention model and two of a dense one" in none.stderr
    assert "Traceback" not in none.stderr


def test_a_pass_from_another_host_adds_its_eager_kinds_on_this_hosts_scale(tmp_path):
    """calibrate-hw --add-to with eager costs measured on another host of the GPU (its dense line differs): the
    kinds the entry lacks are fitted on that pass and put on this host by the two dense lines; none of its points is
    pooled, and a later merge keeps the scaled kinds as they are."""
    import copy

    import yaml

    from servelab.calibrate_hw import merge
    from servelab.tables import CALIBRATIONS

    src = yaml.safe_load((CALIBRATIONS / "nvidia-h200-2026-12-02.yaml").read_text())
    a = copy.deepcopy(src)
    a["engines"]["vllm"]["eager"] = {"dense": src["engines"]["vllm"]["eager"]["dense"]}
    b = copy.deepcopy(src)
    b["engines"]["vllm"].pop("graphs")
    for kind in ("dense", "moe"):  # the other host: twice as slow per layer and per step
        c = b["engines"]["vllm"]["eager"][kind]
        for p in c["points"]:
            p["tpot_s"] *= 2.0
        c["layer_s"], c["step_s"] = 2.0 * c["layer_s"], 2.0 * c["step_s"]  # as its own fit says, near enough
    b["engines"]["vllm"]["eager"] = {k: b["engines"]["vllm"]["eager"][k] for k in ("dense", "moe")}
    main, other = tmp_path / "a.yaml", tmp_path / "b.yaml"
    main.write_text(yaml.safe_dump(a))
    other.write_text(yaml.safe_dump(b))
    got = merge(main, other)["engines"]["vllm"]["eager"]
    want = src["engines"]["vllm"]["eager"]
    assert got["dense"]["layer_s"] == pytest.approx(want["dense"]["layer_s"], rel=1e-9)
    assert got["moe"]["layer_s"] == pytest.approx(want["moe"]["layer_s"], rel=0.05)
    assert got["moe"]["host_scaled"]["layer_x"] == pytest.approx(0.5)
    again = tmp_path / "c.yaml"
    again.write_text(main.read_text())
    assert merge(main, again)["engines"]["vllm"]["eager"]["moe"]["layer_s"] == pytest.approx(got["moe"]["layer_s"])
