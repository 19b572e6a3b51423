"""What a GPU study runs beside its workloads: the real-weights checks' scoring and /metrics parsing
(measure.realchecks), their write-up (report.checks), and the placement block's groups (schema)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from servelab.measure import realchecks as rc
from servelab.report.checks import compare_quality, speculative_rows
from servelab.report.load import StudyData
from servelab.schema import study_from_dict

ROOT = Path(__file__).resolve().parents[1]


def test_expected_answer_is_matched_as_whole_words():
    assert rc.correct("The capital of France is Paris.", "Paris") is True
    assert rc.correct("Parisian food is good", "Paris") is False  # a word, not a substring
    assert rc.correct("2 + 3 = five!", "5|five") is True
    assert rc.correct("It is 50.", "5|five") is False
    assert rc.correct("anything", None) is None


def test_spec_counters_are_summed_and_keyed_by_position():

    class Client:
        def get(self, url, timeout):
            class R:
                text = "\n".join([
                    "# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.",
                    'vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 10.0',
                    'vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 40.0',
                    'vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 25.0',
                    'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="0"} 9.0',
                    'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="1"} 7.0',
                    'vllm:spec_decode_num_drafts_created{engine="0"} 1.7e9',
                    'vllm:num_requests_running{engine="0"} 1.0',
                ])
            return R()

    m = rc.metrics(Client(), "http://x")
    assert m == {"vllm:spec_decode_num_drafts_total": 10.0, "vllm:spec_decode_num_draft_tokens_total": 40.0,
                 "vllm:spec_decode_num_accepted_tokens_total": 25.0, "pos0": 9.0, "pos1": 7.0}


def _q(outputs: dict[str, list[int]], correct: dict[str, bool]) -> dict:
    prompts = [{"id": k, "set": "quality", "output_text": "", "output_token_ids": v, "finish_reason": "stop",
                "expected": "x", "correct": correct[k]} for k, v in outputs.items()]
    return {"format_version": 1, "measurable": True, "reason": None, "prompts": prompts,
            "score": {"correct": sum(correct.values()), "total": len(correct)}, "elapsed_s": 1.0}


def test_quality_compare_finds_the_first_differing_token():
    base = _q({"a": [1, 2, 3, 4], "b": [5, 6], "c": [7, 8, 9]}, {"a": True, "b": True, "c": False})
    run = _q({"a": [1, 2, 9, 4], "b": [5, 6], "c": [7, 8]}, {"a": False, "b": True, "c": False})
    cmp = compare_quality(run, base)
    assert (cmp["identical"], cmp["total"]) == (1, 3)
    assert cmp["identical_share"] == pytest.approx(1 / 3)
    # a: differs at token 2; c: a prefix of the baseline's output, so it diverges where it stops
    assert cmp["first_divergence"] == [{"id": "a", "set": "quality", "token_index": 2},
                                       {"id": "c", "set": "quality", "token_index": 2}]
    assert cmp["score"] == [1, 3] and cmp["baseline_score"] == [2, 3]
    assert cmp["changed"] and cmp["score_dropped"]
    same = compare_quality(base, base)
    assert same["identical_share"] == 1.0 and not same["changed"] and not same["score_dropped"]


def _spec_row(set_name: str, kind: str, tps: float, counters: dict[str, float]) -> dict:
    return {"set": set_name, "kind": kind, "concurrency": 1, "requests": 8, "output_tokens": 800, "wall_s": 800 / tps,
            "output_tps": tps, "counters": counters, "requests_detail": []}


def test_speculative_rows_pair_each_set_with_the_baseline(tmp_path: Path):
    params = yaml.safe_load((ROOT / "params" / "h200-moe.yaml").read_text())
    study = study_from_dict(params)
    data = tmp_path / "data"
    for cid, rows in {
        "smol-bf16": [_spec_row("rewrite", "copy", 400.0, {}), _spec_row("questions", "free", 420.0, {})],
        "smol-ngram": [_spec_row("rewrite", "copy", 800.0, {
            "vllm:spec_decode_num_drafts_total": 100.0, "vllm:spec_decode_num_draft_tokens_total": 400.0,
            "vllm:spec_decode_num_accepted_tokens_total": 250.0, "pos0": 90.0, "pos1": 70.0, "pos2": 50.0,
            "pos3": 40.0}), _spec_row("questions", "free", 300.0, {})],
    }.items():
        (data / cid).mkdir(parents=True)
        (data / cid / "speculative.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))

    df = speculative_rows(StudyData(root=tmp_path, study=study))
    # the ngram server's free set drafted nothing (no counters): only the copy-heavy row remains
    assert list(df["set"]) == ["rewrite"]
    r = df.iloc[0]
    assert r.speedup == pytest.approx(2.0)
    assert r.acceptance == pytest.approx(250 / 400)
    assert r.mean_accepted_len == pytest.approx(1 + 250 / 100)
    assert r.per_position == pytest.approx([0.9, 0.7, 0.5, 0.4])


def test_placement_groups_name_known_configurations_and_replace_lanes():
    params = yaml.safe_load((ROOT / "params" / "h200-moe.yaml").read_text())
    study = study_from_dict(params)
    assert [c for g in study.placement.groups for c in g][:3] == ["vllm-cudagraph", "vllm-fp8kv", "vllm-eager"]
    bad = json.loads(json.dumps(params))
    bad["placement"]["groups"][0].append("nope")
    with pytest.raises(ValueError, match="unknown configuration"):
        study_from_dict(bad)
    both = json.loads(json.dumps(params))
    both["placement"]["lanes"] = [["vllm-eager"]]
    with pytest.raises(ValueError, match="groups replace lanes"):
        study_from_dict(both)
