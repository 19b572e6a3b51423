"""Comparisons across two runs of a study (results.across): the variance between runs is measured
from the settings both runs have and enters every interval across them, so an identical-setting
comparison (an A/A) is called faster or slower no more often than its stated 5 % (simulated, seeded,
with the default study's design: eager x 3, compiled, n-gram, budget; four levels); the runs the
repository holds (three publications of the default study, 2026-12-02 and -03) compare without a
false alarm."""

from __future__ import annotations

import math
import subprocess

import numpy as np
import pandas as pd
import pytest

from paths import ROOT
from servelab.analysis import verdicts
from servelab.results import across
from servelab.results.compare import compare

CONFIGS = {"eager": "eager", "eager-again": "eager", "eager-third": "eager", "compiled": "compiled",
           "ngram": "ngram", "budget": "budget"}
LEVELS = [("rewrite", 1), ("rewrite", 4), ("code", 1), ("code", 4)]


def _two_runs(rng, *, rounds=3, sw=0.03, sb=0.03, shift=0.0, inter=0.0, change=0.0):
    """Two runs' round tables (log-normal aggregate tok/s): rounds within a start (sw), starts (sb), a
    shift of each run common to its settings at a level (shift), each run's own effect on a setting
    at a level (inter); `change`: B's n-gram is this much faster (log)."""
    prompt = {(lv, r): rng.normal(0, sw) for lv in LEVELS for r in range(rounds)}
    day = {(run, lv): rng.normal(0, shift) for run in "AB" for lv in LEVELS}
    own = {(run, s, lv): rng.normal(0, inter) for run in "AB" for s in set(CONFIGS.values()) for lv in LEVELS}
    rows = []
    for run in "AB":
        for cfg, s in CONFIGS.items():
            b = rng.normal(0, sb) + (change if (run, cfg) == ("B", "ngram") else 0.0)
            for lv in LEVELS:
                for r in range(rounds):
                    y = 3.0 + day[(run, lv)] + own[(run, s, lv)] + b + prompt[(lv, r)] + rng.normal(0, sw)
                    rows.append({"config": f"{run} s:{cfg}", "bucket": lv[0], "concurrency": lv[1], "round": r,
                                 "aggregate_output_tps": math.exp(y)})
    return pd.DataFrame(rows)


def _verdicts(rounds: pd.DataFrame, changed: str | None = None) -> tuple[pd.DataFrame, across.RunTerm]:
    """B's every configuration against A's; `changed`: the one whose setting differs (not an A/A)."""
    settings = {f"{run} s:{c}": {"s": s + ("'" if (run, c) == ("B", changed) else "")}
                for run in "AB" for c, s in CONFIGS.items()}
    groups = list(dict.fromkeys(verdicts.setting_groups(settings).values()))
    cmps = [verdicts.Comparison(f"B s:{c}", f"A s:{c}", (f"B s:{c}",), (f"A s:{c}",), c != changed) for c in CONFIGS]
    rows, _, terms = across.verdict_rows(rounds, cmps, groups, {s: s[0] for s in settings}, metrics=(verdicts.PRIMARY,))
    return rows, terms[verdicts.PRIMARY]


@pytest.mark.parametrize("regime", [
    {"sb": 0.005, "inter": 0.05, "sw": 0.02},  # starts alike, each run its own effect per setting
    {"sb": 0.005, "shift": 0.05, "sw": 0.02},  # a day's shift common to every setting
    {"sb": 0.03, "inter": 0.06, "sw": 0.03, "rounds": 2},  # the worst seen: 2 rounds per level
])
def test_an_identical_setting_comparison_across_runs_is_a_false_alarm_at_most_5_percent(regime):
    rng = np.random.default_rng(46)
    flagged_pairs = flagged_rows = pairs = rows_n = 0
    for _ in range(60):
        rows, term = _verdicts(_two_runs(rng, **regime))
        assert term.source == "runs" and term.pairs == 16  # 4 settings both runs measured x 4 levels
        bad = rows["verdict"].isin([verdicts.FASTER, verdicts.SLOWER])
        flagged_rows += int(bad.sum())
        rows_n += len(rows)
        flagged_pairs += int(rows.assign(bad=bad).groupby("configuration")["bad"].any().sum())
        pairs += rows["configuration"].nunique()
    assert rows_n == 60 * 24
    assert flagged_pairs / pairs <= 0.05  # each pair judged at a family-wise 5 % over its four levels
    assert flagged_rows / rows_n <= 0.05 / 4 + 0.01


def test_a_real_change_across_runs_is_still_found():
    rng = np.random.default_rng(7)
    found = 0
    for _ in range(30):
        rows, _ = _verdicts(_two_runs(rng, sb=0.01, inter=0.02, sw=0.02, change=math.log(1.5)), "ngram")
        found += int((rows.loc[rows["configuration"] == "B s:ngram", "verdict"] == verdicts.FASTER).all())
    assert found >= 27  # +50 % on every level of the changed setting


def test_the_run_term_is_the_excess_of_the_runs_differences_over_starts_and_rounds():
    rng = np.random.default_rng(3)
    sds = [_verdicts(_two_runs(rng, sb=0.02, inter=0.05, sw=0.01, rounds=4))[1].var for _ in range(30)]
    assert math.sqrt(np.mean(sds)) == pytest.approx(0.05, rel=0.25)
    none = [_verdicts(_two_runs(rng, sb=0.02, sw=0.01, rounds=4))[1].var for _ in range(30)]
    assert math.sqrt(np.mean(none)) < 0.015


def test_without_a_setting_in_common_the_term_is_given_or_not_measured():
    y = verdicts.log_rounds(_two_runs(np.random.default_rng(1)), verdicts.PRIMARY)
    b = verdicts.Between(None, math.inf, "not measured")
    groups = [("A s:eager",), ("B s:ngram",)]
    run_of = {"A s:eager": "A", "B s:ngram": "B"}
    assert across.run_term(y, groups, run_of, b).source == "not measured"
    t = across.run_term(y, groups, run_of, b, given_sd_pct=5.0)
    assert t.source == "given" and t.sd_pct == pytest.approx(5.0)


def _publication(commit: str, dest):
    """reports/local-cpu/data as published at `commit` (git archive), beside the test's tmp folder."""
    out = dest / commit
    out.mkdir()
    tar = subprocess.run(["git", "-C", str(ROOT), "archive", commit, "reports/local-cpu/data"], capture_output=True,
                         check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(out)], input=tar, check=True)
    return out / "reports" / "local-cpu"


@pytest.mark.skipif(not (ROOT / ".git").exists(), reason="needs the repository's history")
@pytest.mark.parametrize("a, b", [("833a9d7", "9ad4312"), ("9ad4312", "7ee3dab")])
def test_two_publications_of_the_default_study_compare_without_a_false_alarm(tmp_path, a, b):
    try:
        ra, rb = _publication(a, tmp_path), _publication(b, tmp_path)
    except subprocess.CalledProcessError:
        pytest.skip("the publications' commits are not in this clone")
    res = compare(ra, rb)
    assert len(res.pairs) == 6 and all(p.aa for p in res.pairs)
    assert res.aa_flagged() == (0, 24)
    term = res.pairs[0].between_runs[verdicts.PRIMARY]
    assert term["source"] == "runs" and term["pairs"] == 16 and len(term["settings"]) == 4
