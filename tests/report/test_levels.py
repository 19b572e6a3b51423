"""report.levels and report.progress on a real-model study shaped by the engine-side interface
(tests/realstudy.py): speculative counters per level, speed-up per prompt set, time per part,
start-up beside the speed-up, and a change of outputs said in the headline."""

from __future__ import annotations

import re

import pytest

from realstudy import write_study
from servelab.report import load_study_data
from servelab.report import levels, progress


@pytest.fixture(scope="module")
def sd(tmp_path_factory):
    return load_study_data(write_study(tmp_path_factory.mktemp("real") / "real"))


def _rows(table) -> list[list[str]]:
    body = table.data.split("<tbody>")[1]
    return [[re.sub(r"<[^>]+>", "", c).strip() for c in re.findall(r"<t[hd][^>]*>.*?</t[hd]>", tr, re.S)]
            for tr in re.findall(r"<tr>(.*?)</tr>", body, re.S)]


def test_speculative_table_per_level_from_the_level_counters(sd):
    text, t = levels.spec_table(sd)
    rows = _rows(t)
    assert [r[:3] for r in rows] == [["ngram", "rewrite", "1"], ["ngram", "rewrite", "4"], ["ngram", "code", "1"],
                                     ["ngram", "code", "4"]]  # only the speculating configuration
    assert rows[0][3:7] == ["50.0", "3.00", "75 / 50 / 50 / 25", "40.0"]
    assert rows[3][3:7] == ["12.5", "1.50", "19 / 12 / 12 / 6", "160.0"]
    assert rows[0][7] == "+93.9 %" and rows[2][7] == "+9.7 %"  # against eager, aggregate tok/s


def test_speed_up_per_prompt_set_against_each_baseline(sd):
    text, t = levels.prompt_set_table(sd)
    got = {(r[0], r[2]): (r[3], r[4]) for r in _rows(t)}
    assert got[("rewrite", "ngram")] == ("80.0", "+100.0 %") and got[("code", "ngram")] == ("44.0", "+10.0 %")
    assert got[("code", "compiled")] == ("48.0", "+20.0 %") and got[("rewrite", "eager")] == ("40.0", "–")
    assert "concurrency 1" in text


def test_time_per_part_and_start_up_beside_the_speed_up(sd):
    t = levels.timing_rows(sd).set_index("config")
    assert t.loc["compiled", "startup_s"] == 104 and not t["shared_server"].any()
    assert t.loc["ngram", "quality_s"] == 12.5
    assert t.loc["compiled", "compile_s"] == 61.5 and not t.loc["compiled", "compile_cache_hit"]
    assert t["compile_s"].isna().sum() == 2  # eager and n-gram (eager) do not compile
    text, _ = levels.timing_table(sd)
    benchmark = t["benchmark_s"].sum()
    total = 31 + 104 + 33 + benchmark + 3 * 12.5
    assert f"In all {int(total // 60)} min {round(total % 60)} s: 2 min 48 s starting engines" in text
    pytest.importorskip("servelab.analysis.quality")  # the engine side's comparison (branch real-model)
    rows = {r[0]: r for r in _rows(progress.progression_table(sd))}
    assert rows["eager → compiled"][5] == "31 → 104 (compile 62)"
    assert rows["eager → compiled"][2] == "4 faster, 0 slower, 0 no detectable change"


def test_a_whole_settings_block_is_one_lever(sd):
    pytest.importorskip("servelab.analysis.quality")
    assert progress.change_text(sd, "ngram", "eager") == ("args.speculative-config: – → {method: ngram, "
                                                          "num_speculative_tokens: 4, prompt_lookup_max: 4, "
                                                          "prompt_lookup_min: 2}")
    assert "†" not in progress.progression_table(sd).data


def test_headline_without_a_repeated_start_says_so(sd):
    pytest.importorskip("servelab.analysis.quality")
    from servelab.report import verdicts

    h = progress.headline(sd)
    assert h.startswith("- A single request decodes at **40.0 tok/s** on **eager** (rewrite, 1 request in flight).")
    line = next(x for x in h.splitlines() if "**compiled**" in x)
    assert "**compiled** against eager: per-request decode speed **+" in line and "faster on 4 of its 4 levels" in line
    assert len(h.splitlines()) <= progress.MAX_HEADLINE
    # how the verdicts were reached is the verdict section's (the headline keeps one number a line)
    assert "No setting was started twice, so the variance between engine starts was not measured" in verdicts.verdicts_text(sd)
    assert "not measurable" not in h  # real weights: the quality sentence is about outputs, not dummies


def test_changed_outputs_are_said_in_the_headline_and_the_table(sd):
    pytest.importorskip("servelab.analysis.quality")
    h = progress.headline(sd)
    assert "It also changes the outputs at temperature 0: 3 of 4 answers identical to eager's." in h
    cell = progress.quality_cell(sd, "ngram", "eager")
    assert cell.startswith("3 of 4 identical (first difference at token 7 of q-list)")
    assert progress.quality_cell(sd, "compiled", "eager").startswith("identical: 4 of 4")


def test_method_and_results_name_the_prompt_sets(sd):
    from servelab.report import sections

    m = sections.method_text(sd)
    assert "prompt sets shipped with servelab (`rewrite`, `code`)" in m and "stops at end-of-sequence" in m
    assert "calibrated" not in m and "ignore_eos" not in m
    rows = _rows(sections.results_table(sd, "ngram"))
    assert [r[0] for r in rows] == ["code · 60", "code · 60", "rewrite · 120", "rewrite · 120"]
