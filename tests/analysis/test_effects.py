"""analysis.effects on the published KV-residency study: the tight cache matters exactly where
prompts x concurrency exceed it, and the run-to-run noise it is judged against is the A/A repeat
of the same study on this machine."""

from __future__ import annotations

import pandas as pd
import pytest

from servelab.analysis.effects import MIN_ROUNDS, few_rounds, level_effects, run_noise_pct
from servelab.report import baselines, load_study_data
from paths import ROOT

KV = ROOT / "reports" / "local-cpu-kv"
AA = ROOT / "tests" / "fixtures" / "local-cpu-kv-aa" / "rounds-fcadee0.csv"
OVER_CACHE = {("in512-out128", 16), ("in2048-out128", 4), ("in2048-out128", 16)}  # > 4,352 tokens in flight


@pytest.fixture(scope="module")
def sd():
    return load_study_data(KV)


def _matters(e: pd.DataFrame) -> set[tuple[str, int]]:
    return {(r.bucket, r.concurrency) for r in e[e["matters"]].itertuples()}


def test_tight_cache_matters_exactly_where_prompts_times_concurrency_exceed_it(sd):
    e = level_effects(sd.summary, sd.rounds, baselines(sd), run_noise_pct=sd.study.run_noise_pct)
    assert len(e) == 9 and _matters(e) == OVER_CACHE
    hit = e[e["matters"]].set_index(["bucket", "concurrency"])["change_pct"]
    assert hit[("in2048-out128", 16)] == pytest.approx(-38.95, abs=0.05)
    assert hit[("in512-out128", 16)] == pytest.approx(-29.66, abs=0.05)
    assert (hit < -19).all()
    assert few_rounds(e) and MIN_ROUNDS > 2  # 2 rounds per level: said to mean little


def test_rounds_alone_mistake_drift_between_runs_for_an_effect(sd):
    """Without the A/A floor, back-to-back rounds make drift between the two server starts look
    real (in32 c4 -11 %, in512 c4 +17 %): the floor is what keeps the verdict honest."""
    e = level_effects(sd.summary, sd.rounds, baselines(sd), run_noise_pct=None)
    assert _matters(e) > OVER_CACHE
    assert ("in512-out128", 4) in _matters(e) and ("in32-out128", 4) in _matters(e)


def test_the_study_noise_floor_is_the_measured_aa_repeat(sd):
    old = pd.read_csv(AA)
    noise = {c: run_noise_pct(old[old["config"] == c], sd.rounds[sd.rounds["config"] == c]) for c in sd.config_ids}
    assert noise["roomy"] == pytest.approx(15.72, abs=0.01)
    assert noise["kv-tight"] == pytest.approx(18.57, abs=0.01)
    assert sd.study.run_noise_pct == pytest.approx(max(noise.values()), abs=0.05)


def test_run_noise_of_identical_runs_is_zero_and_nan_without_shared_levels(sd):
    r = sd.rounds[sd.rounds["config"] == "roomy"]
    assert run_noise_pct(r, r) == 0
    other = r.assign(bucket="elsewhere")
    assert pd.isna(run_noise_pct(r, other))
