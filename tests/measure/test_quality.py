"""Tests for the quality check: scoring (servelab.measure.quality), the comparison with the
baseline on real answers of SmolLM2-135M recorded from vLLM CPU (servelab.analysis.quality),
and the stage's dummy-weight rule."""

from __future__ import annotations

import json
import math

from servelab.analysis.quality import compare
from servelab.measure.quality import DUMMY_REASON, normalize, run_quality, score_answer, selected_prompts
from servelab.prompts import load_set
from paths import FIXTURES as TEST_FIXTURES

FIXTURES = TEST_FIXTURES / "quality"


def test_normalized_whole_word_match():
    assert normalize("  The capital of FRANCE is: Paris! ") == "the capital of france is paris"
    assert score_answer("The capital of France is Paris.", "Paris")
    assert score_answer("2 + 3 = 5", "5|five") and score_answer("Five.", "5|five")
    assert not score_answer("The answer is 15.", "5|five")  # whole words: 15 is not 5
    assert not score_answer("Parisian food", "Paris")
    assert score_answer("APPLE", "APPLE") and not score_answer("", "APPLE")


def test_selection_sends_the_scored_set_in_full():
    sel = selected_prompts(["quality", "rewrite", "code"], prompts_per_set=2)
    assert [s for s, _ in sel].count("quality") == len(load_set("quality").prompts)
    assert [(s, p.id) for s, p in sel if s != "quality"] == [
        ("rewrite", load_set("rewrite").prompts[0].id), ("rewrite", load_set("rewrite").prompts[1].id),
        ("code", load_set("code").prompts[0].id), ("code", load_set("code").prompts[1].id)]


def test_dummy_weights_send_nothing_and_say_why(tmp_path):
    q = run_quality("http://127.0.0.1:9", "m", sets=["quality"], measurable=False, reason=DUMMY_REASON,
                    out_dir=tmp_path)  # nothing listens on port 9: a request would fail
    assert q["measurable"] is False and q["prompts"] == [] and q["score"] == {"correct": 0, "total": 0}
    assert "repeated-token loop" in json.loads((tmp_path / "quality.json").read_text())["reason"]
    c = compare(q, q)
    assert c["measurable"] is False and math.isnan(c["identical_share"]) and c["changed"] is False


def _q(*prompts, score=(0, 0)):
    return {"measurable": True, "prompts": list(prompts), "score": {"correct": score[0], "total": score[1]}}


def test_compare_counts_and_first_divergence():
    a = {"id": "a", "set": "s", "output_token_ids": [1, 2, 3, 4]}
    b = {"id": "b", "set": "s", "output_token_ids": [5, 6]}
    base = _q(a, b, {"id": "only-base", "set": "s", "output_token_ids": [9]}, score=(3, 4))
    run = _q(a, {**b, "output_token_ids": [5, 6, 7]}, score=(2, 4))
    c = compare(run, base)
    assert (c["identical"], c["total"], c["identical_share"]) == (1, 2, 0.5)  # only prompts in both count
    assert c["first_divergence"] == [{"id": "b", "set": "s", "token_index": 2}]  # a prefix: diverges at its end
    assert c["changed"] and c["score_dropped"] and c["score"] == [2, 4] and c["baseline_score"] == [3, 4]
    same = compare(base, base)
    assert same["identical_share"] == 1.0 and not same["changed"] and not same["score_dropped"]


def test_the_stage_on_the_dummy_weight_study_writes_not_measurable(tmp_path):
    from servelab import stages
    from servelab.runfolder import ENGINE_JSON, write_json
    from servelab.schema import load_study

    study = load_study("params/local-cpu-kv.yaml")  # the dummy-weight study
    cid = study.configurations[0].id
    write_json(tmp_path / ENGINE_JSON, {"base_url": "http://127.0.0.1:9", "model": "m", "info": {}})
    from servelab.plan import plan_study

    q = stages.quality(plan_study(study)[cid], tmp_path)
    assert q["measurable"] is False and q["reason"] == DUMMY_REASON
    assert json.loads((tmp_path / "quality.json").read_text())["measurable"] is False
    off = study.model_copy(update={"quality": study.quality.model_copy(update={"enabled": False})})
    (tmp_path / "quality.json").unlink()
    assert stages.quality(plan_study(off)[cid], tmp_path) is None and not (tmp_path / "quality.json").exists()


def _fixture(name: str) -> dict:
    return json.loads((FIXTURES / f"{name}.json").read_text())


def test_real_answers_eager_vs_ngram_agree_and_a_changed_token_is_found():
    eager, ngram = _fixture("eager"), _fixture("ngram")
    assert eager["score"] == {"correct": sum(p["correct"] is True for p in eager["prompts"]), "total": 16}
    assert [p["id"] for p in eager["prompts"] if p["set"] == "quality" and p["correct"]][:4] == [
        "capital-france", "capital-japan", "capital-italy", "capital-germany"]
    c = compare(ngram, eager)  # n-gram speculation kept both greedy answers token for token
    assert (c["identical"], c["total"], c["changed"], c["first_divergence"]) == (2, 2, False, [])
    assert c["score_dropped"] is False  # the n-gram run scored no known-answer task: nothing to drop
    # the recorded list answer with its 11th token replaced (the same token as the 12th)
    changed = json.loads(json.dumps(ngram))
    ids = changed["prompts"][0]["output_token_ids"]
    assert changed["prompts"][0]["id"] == "fruits" and ids[10] != ids[11]
    ids[10] = ids[11]
    c = compare(changed, eager)
    assert c["changed"] and c["identical"] == 1 and c["identical_share"] == 0.5
    assert c["first_divergence"] == [{"id": "fruits", "set": "lists", "token_index": 10}]


def test_a_quality_check_that_cannot_reach_the_server_is_recorded_not_raised(tmp_path):
    from servelab import stages
    from servelab.plan import plan_study
    from servelab.runfolder import ENGINE_JSON, write_json
    from servelab.schema import load_study

    study = load_study("params/local-cpu.yaml")  # real weights: the check would send requests
    cid = study.configurations[0].id
    write_json(tmp_path / ENGINE_JSON, {"base_url": "http://127.0.0.1:9", "model": "m", "info": {}})
    q = stages.quality(plan_study(study)[cid], tmp_path)
    assert q["measurable"] is False and q["reason"].startswith("the quality check failed: ")
    assert json.loads((tmp_path / "quality.json").read_text())["reason"] == q["reason"]


def test_compiled_mode_changing_real_answers_is_flagged():
    # real answers of one run (tests/fixtures/quality/local-cpu-bf16-2026-12-03: the default study in bf16
    # on vLLM CPU 0.32 with SmolLM2-135M-Instruct, an AMD EPYC with avx512_bf16): torch.compile changed
    # greedy answers from the first token on; the batch-token budget changed none. A fixed record, not
    # the published study: a run on another machine answers otherwise (bf16 answers depend on the CPU)
    data = FIXTURES / "local-cpu-bf16-2026-12-03"
    eager, compiled, budget = (json.loads((data / f"{c}.json").read_text()) for c in ("eager", "compiled", "budget"))
    c = compare(compiled, eager)
    assert c["changed"] and c["score_dropped"] and c["score"] == [10, 16] and c["baseline_score"] == [12, 16]
    assert {"id": "capital-france", "set": "quality", "token_index": 0} in c["first_divergence"]
    france = {p["id"]: p for p in eager["prompts"]}["capital-france"]
    assert "Paris" in france["output_text"] and france["correct"] is True
    same = compare(budget, eager)
    assert not same["changed"] and same["identical"] == same["total"] == 18


def test_the_published_default_study_compares_every_configuration_with_its_baseline():
    """Whatever machine made the published default study: every configuration answered the same 18
    prompts, and the page's comparison is what its quality.json files give."""
    from paths import ROOT

    from servelab.report import load_study_data
    from servelab.report.progress import quality_compare

    sd = load_study_data(ROOT / "reports" / "local-cpu")
    for cid in ("compiled", "ngram", "budget", "eager-again", "eager-third"):
        c = quality_compare(sd, cid, "eager")
        assert c is not None and c["total"] == 18 and 0 <= c["identical"] <= 18
        assert c["changed"] == (c["identical"] < 18)
