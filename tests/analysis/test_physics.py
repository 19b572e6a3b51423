"""The physics check (analysis.physics, issue #59): a dummy-weight MoE measured faster than the bytes its
spread router must read is flagged with its likely cause; an honest run (a published dense one) is not; the
engine's own routing report confirms a tie."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from paths import ROOT

from servelab.analysis import perfmodel, physics, routing
from servelab.analysis.roofline import get_hardware
from servelab.models.facts import facts_from_config


def _ernie() -> dict:
    cfg = json.loads((ROOT / "tests" / "fixtures" / "architectures" / "ernie-4.5-21b-a3b.json").read_text())
    return {k: v for k, v in cfg.items() if not k.startswith("_")}


def _summary(rows: list[tuple[int, float, float]]) -> pd.DataFrame:
    return pd.DataFrame([{"bucket": "in256-out256", "concurrency": c, "rate_rps": 0.0, "prompt_tokens": 256.0,
                          "output_tokens_p50": 256.0, "tpot_p50_s": tpot, "ttft_p50_s": ttft} for c, tpot, ttft in rows])


def test_the_issues_ernie_run_on_an_h100_is_faster_than_physics_and_says_why():
    """Issue #59: ERNIE-4.5-21B-A3B (dummy weights, vLLM 0.26.0) decoded 32 requests at 5.2 ms a step on an H100,
    where 32 tokens spread over 64 experts (6 each) touch ~61 per layer, ~39 GB a step: at least 11.7 ms at 3.35
    TB/s. Its c=1 TTFT of 63.6 ms is far above the prefill's FLOP floor: not flagged."""
    cfg = _ernie()
    facts = facts_from_config(cfg)
    h100 = get_hardware("NVIDIA H100 80GB HBM3")
    run = {"engine_params": {"kind": "vllm", "load_format": "dummy"}, "model": {"config": cfg},
           "server": {"version": "0.26.0"}}
    ties = perfmodel.router_ties(run)
    res = physics.check_levels(_summary([(1, 3.9e-3, 63.6e-3), (32, 5.2e-3, 90e-3)]), facts, h100, 1, config="ernie45",
                               identical=False, ties=ties, dummy=True)
    assert res["checked"] == 3 and len(res["flags"]) == 1
    f = res["flags"][0]
    assert f["level"] == "in256-out256 c=32" and f["metric"] == "tpot"
    assert f["experts_touched"] == pytest.approx(61.3, abs=0.1) and f["experts"] == 64
    # the issue counted the touched experts' ~39 GB (11.7 ms); the non-expert weights, the tied head and the KV add ~3 GB
    assert 39e9 < f["bytes"] < 44e9 and 11.7e-3 < f["floor_s"] < 13.2e-3
    assert f["causes"][0]["cause"] == physics.TIES and "score-correction bias" in f["causes"][0]["evidence"]
    # identical requests decoded deterministically route as one token: the same figure is then no violation
    same = physics.check_levels(_summary([(32, 5.2e-3, 90e-3)]), facts, h100, 1, config="ernie45", identical=True)
    assert same["flags"] == []


def test_a_dummy_moe_without_a_known_rule_is_flagged_as_a_likely_tie_and_an_engine_report_confirms_it():
    cfg = _ernie()
    facts = facts_from_config(cfg)
    h100 = get_hardware("H100 SXM")
    res = physics.check_levels(_summary([(32, 5.2e-3, 90e-3)]), facts, h100, 1, config="x", identical=False, dummy=True)
    assert res["flags"][0]["causes"][0]["cause"] == physics.TIES and "likely" in res["flags"][0]["causes"][0]["evidence"]
    # the engine's own report: 32 requests whose tokens all took experts 0-5 in every layer
    tied = [np.tile(np.arange(6), (256 + 63, 27, 1)) for _ in range(32)]
    got = routing.distinct_per_step(tied, [256] * 32)
    assert got["distinct_per_step"] == pytest.approx(6.0) and got["steps"] == 63
    rec = routing.routing_record(got, facts, concurrency=32, source="test")
    assert rec["spread_per_step"] == pytest.approx(61.3, abs=0.1)
    res = physics.check_levels(_summary([(32, 5.2e-3, 90e-3)]), facts, h100, 1, config="x", identical=False, dummy=True,
                               routing=rec)
    assert "confirmed" in res["flags"][0]["causes"][0]["evidence"] and "not confirmed" not in res["flags"][0]["causes"][0]["evidence"]
    rng = np.random.default_rng(1)  # a spread router: every token its own 6 of 64
    spread = [np.stack([np.stack([rng.choice(64, 6, replace=False) for _ in range(27)]) for _ in range(256 + 63)])
              for _ in range(32)]
    s = routing.distinct_per_step(spread, [256] * 32)
    assert s["distinct_per_step"] == pytest.approx(rec["spread_per_step"], rel=0.03)
    import base64
    import io

    buf = io.BytesIO()
    np.save(buf, tied[0].astype(np.uint8))  # vLLM's field: base64 of a .npy array
    assert (routing.decode_routed(base64.b64encode(buf.getvalue()).decode()) == tied[0]).all()


def test_a_wrong_model_and_prefix_hits_are_named_from_their_evidence():
    facts = facts_from_config(_ernie())
    h100 = get_hardware("H100 SXM")
    cs = physics.causes(facts, ties=None, dummy=False, prefix_tokens=200, shared_prefix=False, speculative=True,
                        loaded_bytes=10 * 2**30)
    assert [c["cause"] for c in cs] == [physics.PREFIX, physics.SPECULATIVE, physics.WRONG_MODEL]
    assert "10.00 GiB" in cs[-1]["evidence"]
    assert physics.check_levels(_summary([(1, 1e-3, 1e-3)]), facts, None, 1, config="cpu", identical=False)["not_checked"]
    dense = physics.prefill_floor(facts, h100, 1, 2048)
    from servelab.analysis.roofline import prefill_matmul_params

    assert dense["floor_s"] == pytest.approx(2 * 2048 * prefill_matmul_params(facts) / 989e12)
    assert 3.0e9 < prefill_matmul_params(facts) < 3.35e9  # the active parameters less the embedding (a lookup)


def test_an_honest_published_run_is_not_flagged_and_the_known_tie_is():
    """The published H200 studies: no dense level is below its floor; h200-perfmodel's DeepSeek-V2-Lite at 32
    requests (temperature 1, vLLM 0.26.0's bf16 router tie under dummy weights) is, with the tie named."""
    from servelab.report import load_study_data
    from servelab.report.verdicts import physics_check

    sd = load_study_data(ROOT / "reports" / "h200-llama8b-vllm")
    ph = physics_check(sd)
    assert ph["checked"] > 20 and ph["flags"] == []
    ph = physics_check(load_study_data(ROOT / "reports" / "h200-perfmodel"))
    assert [(f["config"], f["level"]) for f in ph["flags"]] == [("dsv2lite", "in256-out256 c=32")]
    assert ph["flags"][0]["causes"][0]["cause"] == physics.TIES and "bf16 softmax" in ph["flags"][0]["causes"][0]["evidence"]
    local = physics_check(load_study_data(ROOT / "reports" / "local-cpu"))
    assert local["checked"] == 0 and local["not_checked"]


def test_a_headline_figure_from_a_level_faster_than_physics_says_so():
    """h100-eager-holdout's best goodput and its cost sentence come from Moonlight's 32-request level, whose
    router ties under dummy weights: the headline names the flag beside both; an honest study's headline does not."""
    from servelab.report import load_study_data
    from servelab.report.progress import headline
    from servelab.report.verdicts import physics_note

    sd = load_study_data(ROOT / "reports" / "h100-eager-holdout")
    assert physics_note(sd, "moonlight", "in256-out256", 32)
    assert physics_note(sd, "moonlight", "in256-out256", 1) == "" and physics_note(sd, "phi4", "in256-out256", 32) == ""
    lines = [x for x in headline(sd).splitlines() if "faster than physics allows" in x]
    assert len(lines) == 2 and any("goodput" in x for x in lines) and any("per 1M output tokens" in x for x in lines)
    assert "faster than physics allows" not in headline(load_study_data(ROOT / "reports" / "h200-llama8b-vllm"))


def test_a_level_still_warming_up_is_named_and_a_steady_one_is_not():
    """TTFTs that fall request by request by a quarter or more (h100-eager-holdout's first level after each server
    started) are named; a level whose TTFTs wander is not, nor one with two requests."""
    import pandas as pd

    from servelab.analysis.stats import warming_levels
    from servelab.report import load_study_data

    def level(ttfts, cfg="a"):
        return [{"config": cfg, "bucket": "in256-out8", "concurrency": 1, "ok": True, "warmup": False, "round": i,
                 "seq": 0, "ttft_s": t} for i, t in enumerate(ttfts)]
    recs = pd.DataFrame(level([0.107, 0.105, 0.073]) + level([0.050, 0.049, 0.051], "b") + level([0.09, 0.05], "c"))
    assert [x["config"] for x in warming_levels(recs)] == ["a"]
    sd = load_study_data(ROOT / "reports" / "h100-eager-holdout")
    assert {(x["config"], x["bucket"]) for x in warming_levels(sd.records)} == {("moonlight", "in256-out256"),
                                                                                ("phi4", "in256-out256")}


def test_a_hold_out_run_flags_both_tied_routers_and_a_rule_learnt_after_it_names_the_second():
    """h100-mla-holdout (recorded on an H100): GLM-4.7-Flash and gpt-oss-20b decoded 32 requests faster than their spread
    routers' bytes allow; both are flagged (gpt-oss's "likely", from the physics alone, when the page was rendered on
    the GPU host before vLLM's gpt-oss router bias was a known cause; known now), their one-request levels are not. The
    gpt-oss server's first 2,048-token level fell 66 > 56 > 45 ms and the runner measured it again: that pass stays in
    the records, marked, and out of the result and the warming note."""
    from servelab.analysis.stats import warming_levels
    from servelab.report import load_study_data
    from servelab.report.verdicts import physics_check

    sd = load_study_data(ROOT / "reports" / "h100-mla-holdout")
    flags = physics_check(sd)["flags"]
    assert {(f["config"], f["concurrency"]) for f in flags} == {("glm47flash", 32), ("gptoss", 32)}
    assert all(f["faster_than_floor"] > 2 and f["causes"][0]["say"] == "ties_known" for f in flags)
    r = sd.records
    lvl = r[(r["config"] == "gptoss") & (r["bucket"] == "in2048-out8") & (r["concurrency"] == 1) & ~r["warmup"]]
    aside = lvl[lvl["disturbed"].fillna("").str.startswith("still warming up")]
    assert len(aside) == 3 and len(lvl) == 6
    assert aside["ttft_s"].is_monotonic_decreasing and aside["ttft_s"].iloc[0] > 1.25 * aside["ttft_s"].iloc[-1]
    s = sd.summary
    row = s[(s["config"] == "gptoss") & (s["bucket"] == "in2048-out8") & (s["concurrency"] == 1)].iloc[0]
    assert row["sent"] == 3 and row["ttft_p50_s"] < aside["ttft_s"].median()
    assert warming_levels(r) == []
    from servelab.analysis.stats import warming_measured_again

    again = warming_measured_again(r)
    assert [(x["config"], x["bucket"]) for x in again] == [("gptoss", "in2048-out8")]
    assert len(again[0]["first_ttft_s"]) == len(again[0]["ttft_s"]) == 3


def test_a_level_that_changed_speed_partway_is_named_and_a_noisy_one_is_not():
    """h100-mla-holdout's GLM-4.7-Flash 128-token level ran 19.6, 19.4, then 29.2, 31.6, 31.4 ms (the host or GPU
    changed speed): named, with the two speeds; the same on constructed levels, either way. A noisy level
    (gpt-oss's 29.1, 16.6, 31.9 ms), a single slow request, a level still warming up (named as that) and one of
    several prompt lengths are not; nor any other level of the hold-outs recorded on the H100."""
    import pandas as pd

    from servelab.analysis.stats import stepped_levels
    from servelab.report import load_study_data
    from servelab.summary import speed_step

    assert speed_step([0.0196, 0.0194, 0.0292, 0.0316, 0.0314]) == 2
    assert speed_step([0.030, 0.031, 0.030, 0.020, 0.021]) == 3  # faster after
    for steady in ([0.0291, 0.0166, 0.0319], [0.020, 0.020, 0.021, 0.020, 0.040], [0.020, 0.040, 0.020, 0.040],
                   [0.020, 0.021, 0.024, 0.026], [0.0196, 0.0194, 0.0292]):
        assert speed_step(steady) is None, steady

    def level(ttfts, cfg, prompts=None):
        return [{"config": cfg, "bucket": "b", "concurrency": 1, "ok": True, "warmup": False, "round": i, "seq": 0,
                 "ttft_s": t, "prompt_tokens": (prompts or [128] * len(ttfts))[i]} for i, t in enumerate(ttfts)]
    recs = pd.DataFrame(level([0.020, 0.020, 0.030, 0.031], "step") + level([0.09, 0.07, 0.05, 0.04], "warming")
                        + level([0.020, 0.020, 0.030, 0.031], "lengths", [100, 100, 160, 160]))
    (x,) = stepped_levels(recs)
    assert x["config"] == "step" and x["before_s"] == pytest.approx(0.020) and x["after_s"] == pytest.approx(0.0305)
    (x,) = stepped_levels(load_study_data(ROOT / "reports" / "h100-mla-holdout").records)
    assert (x["config"], x["bucket"]) == ("glm47flash-ttft", "in128-out8")
    assert x["before_s"] == pytest.approx(0.0195, abs=3e-4) and x["after_s"] == pytest.approx(0.0314, abs=3e-4)
    for study in ("h100-holdout", "h100-host-holdout", "h100-eager-holdout", "h100-graph-holdout"):
        assert stepped_levels(load_study_data(ROOT / "reports" / study).records) == [], study
