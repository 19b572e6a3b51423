"""The host factor (analysis.hosts): the engine's CPU-side terms scaled by the host measured before the first
request, else by the typical host of those seen (with a band over them), else left as calibrated; a study's factor
fitted from its c=1 levels; the probe (measure.hostprobe) run with an engine's Python."""

from __future__ import annotations

import copy
import json
import math
import sys

import pytest

from servelab.analysis import calibration as cal
from servelab.analysis import hosts, perfmodel
from servelab.measure import hostprobe
from servelab.models.facts import facts_from_config
from servelab.models.presets import PRESETS


def _h100():
    return copy.deepcopy(cal.calibration_for("gpu", "NVIDIA H100 80GB HBM3")[0])


def test_a_probe_on_the_host_scales_every_cpu_side_term_by_its_launch_time_over_the_calibrations():
    e = _h100()
    ref = e["micro"]["launch_eager_s"]
    f = hosts.host_factor(e, {"launch_eager_s": 2 * ref})
    assert f["factor"] == pytest.approx(2.0) and f["how"] == "probe" and f["range"] == (0.85, 1.15)
    plain, slow = cal.Machine(e, scale_host=1.0), cal.Machine(e, host_probe={"launch_eager_s": 2 * ref})
    counts = {"dense": 2, "moe": 30}
    assert slow.fixed("vllm", "graphs", counts)[0] == pytest.approx(2 * plain.fixed("vllm", "graphs", counts)[0])
    assert slow.request("vllm")[0] == pytest.approx(2 * plain.request("vllm")[0])
    assert slow.eager_cpu("vllm", {"dense": 32})[0] == pytest.approx(2 * plain.eager_cpu("vllm", {"dense": 32})[0])
    # the GPU's own terms do not move
    assert slow.bandwidth("vllm", 1) == plain.bandwidth("vllm", 1) and slow.flops("bf16", 256) == plain.flops("bf16", 256)
    # a broken probe is bounded, not believed
    assert hosts.host_factor(e, {"launch_eager_s": 1.0})["factor"] == hosts.FACTOR_MAX


def test_a_run_record_with_a_probe_is_predicted_for_its_host():
    run = {"gpus_used": [{"name": "NVIDIA H100 80GB HBM3", "memory": "81559 MiB"}],
           "host_probe": {"launch_eager_s": 1.5 * _h100()["micro"]["launch_eager_s"]}}
    m, _ = cal.machine_for(run)
    assert m.scale_host == pytest.approx(1.5) and m.host["how"] == "probe"
    m, _ = cal.machine_for({"gpus_used": run["gpus_used"]})
    assert m.host["how"] == "hosts seen"


def test_before_you_rent_the_typical_host_of_those_seen_with_a_band_from_the_fastest_to_the_slowest():
    e = _h100()
    e["hosts_seen"] = [{"study": "a", "factor": 1.0}, {"study": "b", "factor": 1.21}, {"study": "c", "factor": 1.69}]
    f = hosts.host_factor(e)
    typ = (1.0 * 1.21 * 1.69) ** (1 / 3)
    assert f["factor"] == pytest.approx(typ) and f["how"] == "hosts seen"
    assert f["range"][0] * typ == pytest.approx(1.0) and f["range"][1] * typ == pytest.approx(1.69)
    e.pop("hosts_seen")
    assert hosts.host_factor(e) == {"factor": 1.0, "range": (1.0, 1.0), "source": ""}
    assert hosts.host_factor({"machine": {"kind": "cpu"}}, {"launch_eager_s": 1e-5})["factor"] == 1.0


def test_the_band_of_a_prediction_spans_the_hosts_seen():
    m, _ = cal.gpu_machine("NVIDIA H100 80GB HBM3")
    seen = [float(h["factor"]) for h in m.entry["hosts_seen"]]
    assert len(seen) >= 3 and m.host["how"] == "hosts seen"
    facts = facts_from_config(PRESETS["olmoe-1b-7b"])
    p = perfmodel.predict(facts, "vllm", {"max-num-seqs": 64}, m, input_tokens=256, output_tokens=256, concurrency=[1])
    lo, hi = p["band"]["ttft_c1_s"]
    assert lo < p["ttft_c1_s"] < hi and hi / lo > max(seen) / min(seen)  # the CPU-bound eager prefill moves with it
    assert "host factor" in p["band"]["rule"]
    host = next(i for i in p["inputs"] if i["name"].startswith("host factor"))
    assert host["value"] == pytest.approx(m.scale_host) and "typical host" in host["source"]


def test_a_studys_factor_is_recovered_from_levels_the_host_dominates_and_gpu_bound_ones_are_left_out():
    cpu = lambda k: (lambda f: k * f)  # noqa: E731  all the host's
    gpu = lambda k: (lambda f: k + 0.0 * f)  # noqa: E731  none of it
    pts = [(1.5 * 0.01, cpu(0.01)), (1.5 * 0.03, cpu(0.03)), (0.5, gpu(0.2))]
    fit = hosts.fit_factor(pts)
    assert fit["factor"] == pytest.approx(1.5, rel=1e-3) and fit["n"] == 2
    assert fit["log_errors"][2] is None and abs(fit["log_errors"][0]) < 1e-3
    with pytest.raises(ValueError, match="two measured levels"):
        hosts.fit_factor([(0.5, gpu(0.2)), (0.015, cpu(0.01))])


def test_the_committed_hosts_seen_are_what_their_studies_give_again():
    """calibrate-hw --hosts-from replayed on the committed studies' levels: each row's factor again."""
    from servelab.calibrate_fit import host_points
    from paths import ROOT

    e = _h100()
    row = next(h for h in e["hosts_seen"] if h["study"] == "h100-holdout")
    base = {k: v for k, v in e.items() if k != "hosts_seen"}
    pts, _ = host_points(ROOT / "reports" / "h100-holdout", base)
    fit = hosts.fit_factor([(p["measured_s"], p["model"]) for p in pts])
    assert fit["factor"] == pytest.approx(row["factor"], rel=1e-3) and fit["n"] == row["n"] == len(row["levels"])
    assert all(math.isfinite(x) for x in fit["log_errors"] if x is not None)


def test_the_probe_runs_with_the_python_it_is_given_and_says_why_when_it_cannot(tmp_path):
    ok = tmp_path / "py"
    ok.write_text(f"#!{sys.executable}\nimport json\nprint(json.dumps({{'launch_eager_s': 6e-6, 'torch': 'x'}}))\n")
    ok.chmod(0o755)
    res, why = hostprobe.probe(str(ok))
    assert why == "" and res["launch_eager_s"] == 6e-6 and res["python"] == str(ok) and res["measured_at"]
    bad = tmp_path / "bad"
    bad.write_text(f"#!{sys.executable}\nraise SystemExit('no CUDA device')\n")
    bad.chmod(0o755)
    res, why = hostprobe.probe(str(bad))
    assert res is None and "no CUDA device" in why
    res, why = hostprobe.probe(str(tmp_path / "missing"))
    assert res is None and "did not run" in why
    silent = tmp_path / "silent"
    silent.write_text(f"#!{sys.executable}\nprint(json_is_not_here := 'hello')\n")
    silent.chmod(0o755)
    res, why = hostprobe.probe(str(silent))
    assert res is None and "no result" in why and json.dumps(why)
