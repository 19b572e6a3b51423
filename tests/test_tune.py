"""Tuning (servelab.tune, analysis.tuning): the keep-or-reject rule, the objectives, candidate
configurations one flag away from the incumbent, and the `capacity:` / `tune:` params blocks."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest

from servelab.analysis.tuning import decide, objective
from servelab.schema import ParamsError, load_study
from servelab.hosts import for_study
from servelab.tune import candidate_id, with_candidate, worst_case_lines


def test_kept_only_when_the_low_end_clears_the_incumbents_high_end():
    inc = {"value": 1.0, "interval": [1.0, 1.2]}
    v, why, gain, iv = decide({"value": 2.0, "interval": [2.0, 2.4]}, inc)
    assert (v, why) == ("kept", "beats") and gain == pytest.approx(100.0)
    assert iv == [pytest.approx((2.0 - 1.2) / 1.2 * 100), pytest.approx((2.4 - 1.0) / 1.0 * 100)]
    assert decide({"value": 1.1, "interval": [1.1, 1.3]}, inc)[:2] == ("rejected", "within_noise")
    assert decide({"value": 0.5, "interval": [0.5, 0.6]}, inc)[:2] == ("rejected", "worse")
    # an incumbent with no failing load (capacity >= max) cannot be beaten beyond noise
    assert decide({"value": 9.0, "interval": [9.0, None]}, {"value": 8.0, "interval": [8.0, None]})[0] == "rejected"


def test_capacity_and_goodput_objectives_read_the_search_bracket():
    run = {"capacity": {"result": {"axis": "rate", "capacity": 2.0, "bracket": [2.0, 2.5], "output_tps": 64.0}}}
    assert objective(run, pd.DataFrame(), "capacity") == {"value": 2.0, "interval": [2.0, 2.5]}
    g = objective(run, pd.DataFrame(), "goodput")  # 32 output tokens per request at the capacity
    assert g == {"value": 64.0, "interval": [64.0, 80.0]}
    none = {"capacity": {"result": {"axis": "rate", "capacity": None, "bracket": [None, 0.25]}}}
    assert objective(none, pd.DataFrame(), "capacity") == {"value": 0.0, "interval": [0.0, 0.25]}


def test_decode_c1_objective_is_a_bootstrap_interval_on_the_median():
    recs = pd.DataFrame({"warmup": False, "ok": True, "concurrency": [1] * 9 + [4],
                         "decode_tps": [100.0, 101, 99, 100, 102, 98, 100, 101, 99, 10.0]})
    o = objective({}, recs, "decode_c1")
    assert o["value"] == 100.0  # the c=4 request is not a c=1 one
    assert 98.0 <= o["interval"][0] <= 100.0 <= o["interval"][1] <= 102.0


def test_candidate_is_one_flag_away_from_the_incumbent():
    study = load_study("params/local-cpu-tune.yaml")
    s = with_candidate(study, "serial", candidate_id("max-num-seqs", 16), "max-num-seqs", 16, "max-num-seqs 16")
    c = s.config("max-num-seqs-16")
    assert c.baseline == "serial"
    assert s.engine_for("max-num-seqs-16").args["max-num-seqs"] == 16
    assert s.engine_for("max-num-seqs-16").args["num-gpu-blocks-override"] == 136  # the rest of the incumbent
    assert s.engine_for("serial").args["max-num-seqs"] == 1
    assert candidate_id("compilation-config", {"mode": 3}) == "compilation-config-mode-3"
    assert worst_case_lines(study) == ["tune: 6 engine starts (base + 5 candidates), each a capacity search: worst "
                                       "case: 6 server start(s) x (8 trials x 24 s) = 1152 s (19.2 min)"]


def _write(tmp_path, text: str):
    p = tmp_path / "s.yaml"
    p.write_text(text)
    return p


BASE = """study: s
title: t
engine: {model: {preset: cpu-tiny}}
workload: {buckets: [{input_tokens: 8, output_tokens: 8}], concurrency: [1]}
configurations: [{id: a}]
"""


def test_params_blocks_are_strict(tmp_path):
    s = load_study(_write(tmp_path, BASE + "capacity: {start: 2, max_load: 16}\n"))
    assert s.capacity_for("a").start == 2
    with pytest.raises(ParamsError, match="capacity.precison: unknown key \\(did you mean 'precision'\\?\\)"):
        load_study(_write(tmp_path, BASE + "capacity: {precison: 0.1}\n"))
    with pytest.raises(ParamsError, match="min_load <= start <= max_load"):
        load_study(_write(tmp_path, BASE + "capacity: {start: 100, max_load: 16}\n"))
    with pytest.raises(ParamsError, match="needs a capacity: block"):
        load_study(_write(tmp_path, BASE + "tune: {flags: [{flag: max-num-seqs, values: [8]}]}\n"))
    with pytest.raises(ParamsError, match="tune.base: 'x' is not a configuration"):
        load_study(_write(tmp_path, BASE + "capacity: {}\ntune: {base: x, flags: [{flag: f, values: [1]}]}\n"))
    own = load_study(_write(tmp_path, BASE.replace("[{id: a}]", "[{id: a, capacity: {start: 0.5}}]")))
    assert own.capacity_for("a").start == 0.5 and own.capacity is None
    assert math.isclose(own.capacity_for("a").precision, 0.1)


def test_coordinate_search_keeps_rejects_and_records_failures(tmp_path, monkeypatch):
    """The Tuner with its measurement replaced by known capacities: batching 16 beats the start,
    40 blocks does not start, 128 blocks is within noise of the incumbent."""
    from servelab import tune
    from servelab.runfolder import RunFolder, read_json, write_json

    monkeypatch.setenv("SERVELAB_RUNS", str(tmp_path / "runs"))
    monkeypatch.setattr(tune, "runs_root", lambda: tmp_path / "runs")
    brackets = {"serial": [1.25, 1.5], "max-num-seqs-16": [20.0, 22.5], "num-gpu-blocks-override-128": [18.75, 21.25],
                "num-gpu-blocks-override-2048": [7.5, 10.0], "max-num-seqs-2": [2.5, 5.0]}
    started = []

    def fake_measure(self, cid):
        started.append((cid, self.study.capacity_for(cid).start))
        if cid == "num-gpu-blocks-override-40":
            return False, "ValueError: max seq len 4096 > KV cache 1280 tokens"
        lo, hi = brackets[cid]
        write_json(self.root / cid / "run.json", {"capacity": {"result": {
            "axis": "rate", "capacity": lo, "bracket": [lo, hi], "output_tps": lo * 16}}})
        return True, ""

    monkeypatch.setattr(tune.Tuner, "measure", fake_measure)
    study = load_study("params/local-cpu-tune.yaml")
    t = tune.Tuner(study, Path("params/local-cpu-tune.yaml"), for_study(study))
    rec = t.run()
    steps = [(s["config"], s["verdict"], s.get("why")) for s in rec["steps"]]
    assert steps == [("serial", "base", None), ("max-num-seqs-16", "kept", "beats"),
                     ("max-num-seqs-2", "rejected", "worse"),
                     ("num-gpu-blocks-override-40", "failed", "start_failed"),
                     ("num-gpu-blocks-override-128", "rejected", "within_noise"),
                     ("num-gpu-blocks-override-2048", "rejected", "worse")]
    assert rec["steps"][3]["why_values"]["reason"].startswith("ValueError: max seq len")
    # the later candidates change the kept incumbent (one flag at a time), and start at its capacity
    assert rec["steps"][4]["incumbent"] == "max-num-seqs-16"
    assert started[1:] == [("max-num-seqs-16", 1.25), ("max-num-seqs-2", 20.0), ("num-gpu-blocks-override-40", 20.0),
                           ("num-gpu-blocks-override-128", 20.0), ("num-gpu-blocks-override-2048", 20.0)]
    s128 = t.study.engine_for("num-gpu-blocks-override-128").args
    assert (s128["max-num-seqs"], s128["num-gpu-blocks-override"]) == (16, 128)
    assert rec["final"]["config"] == "max-num-seqs-16" and rec["final"]["gain_pct"] == pytest.approx(1500.0)
    assert rec["steps"][1]["gain_pct"] == pytest.approx(1500.0)
    # the published study lists every candidate, each against its incumbent
    sj = read_json(tmp_path / "runs" / "local-cpu-tune" / "study.json")["study"]
    assert [(c["id"], c.get("baseline")) for c in sj["configurations"]] == [
        ("serial", None), ("max-num-seqs-16", "serial"), ("max-num-seqs-2", "max-num-seqs-16"),
        ("num-gpu-blocks-override-40", "max-num-seqs-16"),
        ("num-gpu-blocks-override-128", "max-num-seqs-16"), ("num-gpu-blocks-override-2048", "max-num-seqs-16")]
    assert RunFolder(tmp_path / "runs" / "local-cpu-tune" / "serial").run["capacity"]["result"]["capacity"] == 1.25


def test_candidates_are_measured_through_the_pipelines_run_config(tmp_path, monkeypatch):
    """The real `measure` calls `execute.run_config` as it is declared, and the host serves each
    candidate (a signature change, then a host that knew only the base configuration, made
    `servelab run params/local-cpu-tune.yaml` fail at its first candidate while the search test,
    which replaces `measure`, passed)."""
    import inspect

    from servelab import pipeline, tune

    monkeypatch.setattr(tune, "runs_root", lambda: tmp_path / "runs")
    calls = []

    def fake_run_config(*a, **kw):
        bound = inspect.signature(pipeline.run_config).bind(*a, **kw)
        plan, rdir = bound.arguments["plan"], bound.arguments["rdir"]
        plan.host.client_headers(plan.config_id, {"pid": 1})  # what the benchmark stage asks the host
        calls.append((plan.config_id, plan.engine.args.get("max-num-seqs"), rdir.name))
        cap = 1.0 if plan.config_id == "serial" else 0.5
        write_json(rdir / "run.json", {"capacity": {"result": {"axis": "rate", "capacity": cap,
                                                                "bracket": [cap, cap * 1.1], "output_tps": cap}}})

    from servelab.runfolder import write_json

    monkeypatch.setattr(tune, "run_config", fake_run_config)
    study = load_study("params/local-cpu-tune.yaml")
    rec = tune.Tuner(study, Path("params/local-cpu-tune.yaml"), for_study(study)).run()
    assert calls[:2] == [("serial", 1, "serial"), ("max-num-seqs-16", 16, "max-num-seqs-16")]
    assert len(calls) == len(rec["steps"]) > 2 and rec["final"]["config"] == "serial"


def test_start_failure_names_the_root_cause_from_the_engine_log(tmp_path):
    from servelab.tune import start_failure

    (tmp_path / "engine.log").write_text(
        "(EngineCore pid=1) ERROR [core.py:1510] ValueError: To serve at least one request ...\n"
        "Traceback (most recent call last):\n"
        '  File "x.py", line 1, in <module>\n'
        "ValueError: To serve at least one request with the model's max seq len (4096), more KV cache is needed\n"
        "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}\n")
    assert start_failure(tmp_path) == ("ValueError: To serve at least one request with the model's max seq len "
                                       "(4096), more KV cache is needed")
    assert start_failure(tmp_path / "none", RuntimeError("boom\nmore")) == "boom"
    # a reason longer than the kept 300 characters is cut at a word and says so (the report clips a
    # published one the same way)
    long = "ValueError: " + "word " * 100
    (tmp_path / "engine.log").write_text(long + "\n")
    got = start_failure(tmp_path)
    assert len(got) <= 306 and got.endswith("word [cut]") and long.startswith(got[:-6])
