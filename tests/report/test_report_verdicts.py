"""Every published study's data/verdicts.json is what its records give (report.verdicts re-derives
it), in the documented format; the KV study's between-start figure is what its two runs measure."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from servelab.analysis import verdicts
from servelab.report import load_study_data
from servelab.report.verdicts import study_verdicts
from servelab.runfolder import VERDICTS_JSON, read_json
from paths import ROOT

PUBLISHED = sorted(p.parent.parent for p in ROOT.glob("reports/*/data/study.json"))
KEYS = {"configuration", "baseline", "level", "metric", "effect", "ci", "mde", "verdict", "requests",
        "baseline_requests", "starts", "aa"}


def _same(a, b) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        return (a is None and b is None) or (a is not None and b is not None and math.isclose(a, b, rel_tol=1e-9,
                                                                                                abs_tol=1e-12))
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return a == b


@pytest.mark.parametrize("study", PUBLISHED, ids=lambda p: p.name)
def test_published_verdicts_are_what_the_records_give(study):
    path = study / "data" / VERDICTS_JSON
    assert path.exists(), f"{path}: re-render with `servelab report {study.name}`"
    published, fresh = read_json(path), study_verdicts(load_study_data(study))
    assert published["format_version"] == verdicts.FORMAT_VERSION
    assert len(published["rows"]) == len(fresh["rows"])
    for a, b in zip(published["rows"], fresh["rows"]):
        assert KEYS <= set(a)
        assert all(_same(a[k], b[k]) for k in a), (a, b)
    # floats agree to a relative 1e-9: the last digits of a least-squares fit differ by CPU and BLAS
    assert _same(published["between_starts"], fresh["between_starts"]), (published["between_starts"],
                                                                         fresh["between_starts"])


def test_the_default_study_compares_every_change_and_its_aa_on_every_level():
    from servelab.schema import load_study

    study = load_study(ROOT / "params" / "local-cpu.yaml")
    ids = [c.id for c in study.configurations]
    repeats = [c for c in ids if c.startswith("eager-")]
    r = verdicts.from_json(read_json(ROOT / "reports" / "local-cpu" / "data" / VERDICTS_JSON))
    for metric in (verdicts.DECODE, verdicts.PRIMARY):
        m = r[r["metric"] == metric]
        assert set(m["configuration"]) == set(ids[1:])
        assert m.groupby("configuration").size().to_dict() == {c: 4 for c in ids[1:]}
        assert sorted(m.loc[m["aa"], "configuration"].unique()) == repeats
        changes = m[~m["aa"]]
        assert (changes["baseline_starts"] == 1 + len(repeats)).all()  # eager and its A/A repeats pool as the baseline
        assert set(m["verdict"]) <= {verdicts.FASTER, verdicts.SLOWER, verdicts.NO_CHANGE}


def test_the_kv_studys_between_start_sd_is_what_its_two_runs_measure():
    """params/local-cpu-kv.yaml gives 6.0 %: its two published runs (the fixture's earlier one and
    the one in reports/) are two starts of each configuration."""
    sd = load_study_data(ROOT / "reports" / "local-cpu-kv")
    old = pd.read_csv(ROOT / "tests" / "fixtures" / "local-cpu-kv-aa" / "rounds-fcadee0.csv")
    old["config"] = old["config"] + "-old"
    y = verdicts.log_rounds(pd.concat([sd.rounds, old], ignore_index=True), verdicts.PRIMARY)
    b = verdicts.between_starts(y, [("roomy", "roomy-old"), ("kv-tight", "kv-tight-old")])
    assert b.source == "repeats" and b.df == pytest.approx(18, rel=0.05)  # 18 mean squares, Satterthwaite over levels of unequal noise
    assert round(b.sd_pct, 1) == sd.study.design.between_starts_sd_pct == 6.0


@pytest.mark.parametrize("lang", ["en", "ja"])
def test_disturbed_windows_say_whether_another_process_was_busy(lang):
    """A window of rounds that other processes disturbed gives the cores they took; one without them
    (rounds far slower than their engine's others, not as slow measured again) says so, not "0.0 cores";
    a window recorded before `machine_rounds` reads as before."""
    import types

    from servelab.report.i18n import words
    from servelab.report.verdicts import disturbance_text
    from servelab.schema.runfiles import DesignRecord, SampledLevel

    busy = {"from": 1764950108.0, "to": 1764950123.0, "rounds": 6, "starts": ["a", "b"], "busy_cpu": 0.9,
            "machine_rounds": 6}
    slow = {"from": 1764950219.0, "to": 1764950221.0, "rounds": 1, "starts": ["a"], "busy_cpu": 0.01,
            "machine_rounds": 0}
    lv = SampledLevel(label="rewrite c=4", disturbed=7, remeasured=7, remeasure_s=46.0, waited_s=31.0,
                      windows=[busy, slow])
    sd = load_study_data(ROOT / "reports" / "local-cpu")  # its verdicts.json: the rounds the estimator left out
    w = words(lang)
    text = disturbance_text(types.SimpleNamespace(design=DesignRecord(levels=[lv]), w=w, root=sd.root))
    assert w("verdicts.window", t0="15:55:08", t1="15:55:23", rounds=6, starts=2, cpu="0.9") in text
    assert w("verdicts.window_slow", t0="15:56:59", t1="15:57:01", rounds=1, starts=1, cpu="0.0") in text
    assert w("verdicts.credited", s="31") not in text  # nothing credited: the budget paid for the wait
    lv.credited_s = 31.0
    assert w("verdicts.credited", s="31") in disturbance_text(
        types.SimpleNamespace(design=DesignRecord(levels=[lv]), w=w, root=sd.root))
    lv.windows = [{k: v for k, v in slow.items() if k != "machine_rounds"}]
    text = disturbance_text(types.SimpleNamespace(design=DesignRecord(levels=[lv]), w=w, root=sd.root))
    assert w("verdicts.window", t0="15:56:59", t1="15:57:01", rounds=1, starts=1, cpu="0.0") in text


@pytest.mark.parametrize("lang", ["en", "ja"])
def test_the_page_names_the_levels_that_went_on_past_their_share(lang):
    """A study sampled with borrowing describes that rule and names each level that went on past its
    share of the budget, with the seconds; one without (the published default study) does not."""
    from servelab.report.verdicts import verdicts_text

    sd = load_study_data(ROOT / "reports" / "local-cpu").with_language(lang)
    w = sd.w
    assert "verdicts.borrowed" not in str(sd.design.sampling_rule)
    before = verdicts_text(sd)
    d = sd.design.model_copy(deep=True)
    d.sampling_rule = "mde-borrow-then-budget"
    d.levels[1].borrowed_s = 21.4
    sd.__dict__["design"] = d  # the cached design.json, as a run with borrowing writes it
    text = verdicts_text(sd)
    said = w("verdicts.borrowed", levels=w("verdicts.borrowed_level", label=d.levels[1].label, s="21"))
    assert said in text and said not in before
    assert ("half its share" if lang == "en" else "借りて") in text


@pytest.mark.parametrize("lang", ["en", "ja"])
def test_the_page_says_when_the_engine_starts_were_disturbed(lang):
    """A stretch of the launch in which other processes took the CPU (design.json's launch windows) is
    named with the starts it overlapped; a launch without one says nothing of it."""
    import types

    from servelab.report.i18n import words
    from servelab.report.verdicts import disturbance_text
    from servelab.schema.runfiles import DesignRecord, LaunchTimes

    sd = load_study_data(ROOT / "reports" / "local-cpu")
    w = words(lang)
    win = {"from": 1764950108.0, "to": 1764950138.0, "busy_cpu": 1.94, "cpu_s": 55.0, "starts": ["budget", "x"]}

    def text(launch):
        return disturbance_text(types.SimpleNamespace(design=DesignRecord(launch=launch), w=w,
                                                      root=sd.root, folders={}, labels=lambda: {"budget": "budget 128"}))

    said = text(LaunchTimes(windows=[win]))
    assert w("verdicts.launch_window", t0="15:55:08", t1="15:55:38", cpu="1.9", starts=w("story.count_sep").join(["budget 128", "x"])) in said
    assert said.startswith(w("verdicts.launch_disturbed", when="")[:12])
    assert w("verdicts.launch_disturbed", when="")[:12] not in text(LaunchTimes())


def test_the_opening_figure_reads_every_change_and_aa_pair_of_the_default_study():
    """report.verdicts.lead_points: a single request's decode speed at one request in flight and aggregate tok/s
    at the most in flight, per bucket, each the verdicts.json row's effect, interval and verdict."""
    from servelab.report.verdicts import lead_points

    sd = load_study_data(ROOT / "reports" / "local-cpu")
    pts = lead_points(sd)
    assert list(dict.fromkeys(pts["config"])) == ["compiled", "ngram", "budget", "eager-again", "eager-third"]
    assert pts.groupby("config")["aa"].first().to_dict() == {"compiled": False, "ngram": False, "budget": False,
                                                            "eager-again": True, "eager-third": True}
    assert set(zip(pts["panel"], pts["concurrency"])) == {(verdicts.DECODE, 1), (verdicts.PRIMARY, 4)}
    assert len(pts) == 5 * 2 * 2  # five comparisons, two panels, two buckets
    rows = read_json(ROOT / "reports" / "local-cpu" / "data" / VERDICTS_JSON)["rows"]
    for p in pts.itertuples():
        r = next(x for x in rows if (x["configuration"], x["metric"], x["bucket"], x["concurrency"])
                 == (p.config, p.panel, p.bucket, p.concurrency))
        assert (p.effect, p.lo, p.hi, p.verdict) == (pytest.approx(r["effect"]), pytest.approx(r["ci"][0]),
                                                     pytest.approx(r["ci"][1]), r["verdict"])
    assert (pts["lo"] <= pts["effect"]).all() and (pts["effect"] <= pts["hi"]).all()
    from servelab.report.verdicts import lead_figure

    assert "A/A pairs" in lead_figure(sd).data  # the caption explains the rows under the dashed line ...
    assert "A/A pairs" not in lead_figure(load_study_data(ROOT / "reports" / "h200-smollm2-load")).data  # ... where any


def test_a_study_without_comparisons_opens_without_the_figure():
    from servelab.report.verdicts import lead_figure, lead_points

    sd = load_study_data(ROOT / "reports" / "local-cpu-workloads")
    assert lead_points(sd).empty and lead_figure(sd) is None
