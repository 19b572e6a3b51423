"""Several fresh-clone runs of one study side by side: do their verdicts agree, and are the model's
intervals as wide as the runs actually differ? Each folder's verdicts are derived again from its
records with this checkout's model (report.verdicts.study_verdicts), so runs made with older code
are judged alike.

- agreement: for every pair of runs, the change levels (primary metric, no A/A) with the same
  verdict, those faster in one and slower in the other, and whether every A/A row says "no
  detectable change";
- calibration: for every pair and change level, z = (log effect A - log effect B) / sqrt(se_A^2 +
  se_B^2). If the intervals carry all the variance between runs, z is standard normal: mean z^2
  near 1 and |z| > 1.96 in about 5 % of pairs. A mean z^2 well above 1 means the runs differ by
  more than each run's interval says (a component between runs, e.g. the day's machine, that no
  single run can measure);
- what each run says would reach an MDE of 10 % and of 15 % at every level (plan_for_target);
- expected agreement: taking each change's effect pooled over all runs (inverse-variance weights, log
  scale) as the true one, each run's chance of each verdict from its own se (normal), so each pair's
  expected number of verdicts alike and its chance of at least 11 of 12 (all but one), also were every
  run's se 0.75, 0.5 or 0.25 of what it was (about 1.8, 4 or 16 times the rounds, where rounds dominate). When the
  true effects of some changes sit near the MDE, 10 of 12 alike is what honest intervals give, not a
  fault of one run.

    .venv/bin/python benchmarks/verdict_reruns.py RUN1/reports/local-cpu RUN2/reports/local-cpu ... \
        --out benchmarks/results/verdict-reruns.json

    .venv/bin/python benchmarks/verdict_reruns.py --smoke DIR     # the published default study, twice

Not a test: what runs on one machine gave. `--smoke DIR` (make test runs it) leaves nothing out: the
published reports/local-cpu taken as two runs, DIR/verdict-reruns.json.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import sys
from pathlib import Path

import numpy as np
from scipy.special import ndtr, ndtri

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "lib"))

from servelab.analysis import verdicts as v  # noqa: E402
from servelab.report import load_study_data  # noqa: E402
from servelab.report.verdicts import study_verdicts  # noqa: E402


def run_rows(folder: str, metric: str = v.PRIMARY) -> tuple[dict, dict]:
    sd = load_study_data(folder)
    out = study_verdicts(sd)
    rows = v.from_json(out)
    rows = rows[rows["metric"] == metric]
    plans = {}
    bj = out["between_starts"][metric]  # the estimate the study's own verdicts used
    b = v.Between(bj["var"], bj["df"] or math.inf, bj["source"])
    for target in (0.10, 0.15):
        groups = v.setting_groups({c: sd.engine_params(c) for c in sd.config_ids})
        p = v.plan_from_design(sd.design, groups, rows, b, target)
        plans[f"{target:.2f}"] = p and {k: p.get(k) for k in ("met", "rows", "starts", "rounds", "seconds", "reached",
                                                             "between_floor_mde")}
    keyed = {(r.configuration, r.level): r for r in rows.itertuples()}
    return keyed, {"between_sd_pct": out["between_starts"][metric]["sd_pct"], "to_target": plans,
                   "mde_pct": {f"{r.configuration} {r.level}": round(r.mde * 100, 1) for r in rows.itertuples() if not r.aa}}


def _verdict_probs(mu: float, se: float, t: float) -> tuple[float, float, float]:
    """(faster, no change, slower) chances of a run whose log effect is N(mu, se^2), with the interval
    mu_hat +- t se."""
    f, sl = float(ndtr(mu / se - t)), float(ndtr(-mu / se - t))
    return f, 1.0 - f - sl, sl


def _at_least(ps: list[float], k: int) -> float:
    """Chance of at least k successes among independent trials with chances `ps` (Poisson binomial)."""
    dist = np.zeros(len(ps) + 1)
    dist[0] = 1.0
    for p in ps:
        dist[1:] = dist[1:] * (1 - p) + dist[:-1] * p
        dist[0] *= 1 - p
    return float(dist[k:].sum())


def expected_agreement(runs: dict, names: list[str], shrink: float = 1.0) -> dict:
    """Each pair's expected verdicts alike and chance of all but one alike, from pooled effects (see the
    module's text); `shrink` scales every se (0.5: intervals half as wide)."""
    t = float(ndtri(1 - v.ALPHA / 2))
    keys = [k for k in runs[names[0]][0] if not runs[names[0]][0][k].aa and all(k in runs[n][0] for n in names)]
    pooled = {}
    for k in keys:
        rs = [runs[n][0][k] for n in names if runs[n][0][k].se > 0]
        w = np.array([1 / r.se**2 for r in rs])
        pooled[k] = float(np.sum(w * np.array([math.log1p(r.effect) for r in rs])) / w.sum())
    out = {}
    for x, y in itertools.combinations(names, 2):
        ps = []
        for k in keys:
            a = _verdict_probs(pooled[k], runs[x][0][k].se * shrink, t)
            b = _verdict_probs(pooled[k], runs[y][0][k].se * shrink, t)
            ps.append(sum(i * j for i, j in zip(a, b)))
        out[f"{x}/{y}"] = {"expected_alike": round(sum(ps), 2), "p_all_but_one": round(_at_least(ps, len(ps) - 1), 3),
                           "of": len(ps)}
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("folders", nargs="*")
    ap.add_argument("--names", help="comma-separated names of the runs (default: the folders)")
    ap.add_argument("--out")
    ap.add_argument("--metric", default=v.PRIMARY, choices=list(v.METRICS), help="the verdict metric compared")
    ap.add_argument("--smoke", type=Path, metavar="DIR", help="the published default study as two runs")
    a = ap.parse_args()
    if a.smoke:
        a.folders, a.names, a.out = [str(ROOT / "reports" / "local-cpu")] * 2, "a,b", a.smoke / "verdict-reruns.json"
    if not a.folders:
        ap.error("FOLDERS are needed (or --smoke DIR)")
    names = a.names.split(",") if a.names else a.folders
    runs = {n: run_rows(f, a.metric) for n, f in zip(names, a.folders)}
    pairs, zs = [], []
    for x, y in itertools.combinations(names, 2):
        ra, rb = runs[x][0], runs[y][0]
        keys = [k for k in ra if k in rb and not ra[k].aa]
        same = sum(ra[k].verdict == rb[k].verdict for k in keys)
        flips = [k for k in keys if {ra[k].verdict, rb[k].verdict} == {v.FASTER, v.SLOWER}]
        aa_ok = all(ra[k].verdict == rb[k].verdict == v.NO_CHANGE for k in ra if k in rb and ra[k].aa)
        pairs.append({"runs": [x, y], "agree": same, "of": len(keys), "opposite": len(flips), "aa_all_no_change": aa_ok,
                      "differ": [f"{k[0]} {k[1]}: {ra[k].verdict} / {rb[k].verdict}" for k in keys
                                 if ra[k].verdict != rb[k].verdict]})
        for k in keys:
            se = math.hypot(ra[k].se, rb[k].se)
            if se > 0:
                zs.append((math.log1p(ra[k].effect) - math.log1p(rb[k].effect)) / se)
    z = np.array(zs)
    calib = {"pairs": len(z), "mean_z2": float(np.mean(z**2)), "share_abs_z_over_1_96": float(np.mean(np.abs(z) > 1.96)),
             "median_abs_z": float(np.median(np.abs(z))), "median_abs_z_expected": 0.674}
    effects = {}
    for k in sorted(runs[names[0]][0]):
        if runs[names[0]][0][k].aa:
            continue
        effects[f"{k[0]} {k[1]}"] = {n: {"effect_pct": round(runs[n][0][k].effect * 100, 1), "mde_pct": round(runs[n][0][k].mde * 100, 1),
                                         "verdict": runs[n][0][k].verdict} for n in names if k in runs[n][0]}
    for p in pairs:
        print(f"{p['runs'][0]} vs {p['runs'][1]}: {p['agree']} of {p['of']} agree, {p['opposite']} opposite, "
              f"A/A all no change: {p['aa_all_no_change']}" + (f"  ({'; '.join(p['differ'])})" if p["differ"] else ""))
    print(f"calibration over {calib['pairs']} (pair, change level): mean z^2 {calib['mean_z2']:.2f} (1 expected), "
          f"|z| > 1.96 in {calib['share_abs_z_over_1_96'] * 100:.0f} % (5 % expected)")
    print(f"metric: {a.metric}")
    for n in names:
        info = runs[n][1]
        mdes = [m for k, m in info["mde_pct"].items()]
        print(f"{n}: change-level MDE {min(mdes):.1f}-{max(mdes):.1f} % ({sum(m <= 10 for m in mdes)} of {len(mdes)} at most 10 %)")
        t = {k: (f"{p['met']}/{p['rows']} met; {p['starts']} starts x {p['rounds']} rounds, {p['seconds'] / 60:.0f} min"
                 if p and p.get("reached") else p and f"{p['met']}/{p['rows']} met; not within 12 starts")
             for k, p in info["to_target"].items()}
        print(f"{n}: between-start sd {info['between_sd_pct']:.1f} %; MDE 10 %: {t['0.10']}; MDE 15 %: {t['0.15']}")
    expected = expected_agreement(runs, names) if len(names) >= 2 else {}
    for pair, e in expected.items():
        print(f"{pair}: expected {e['expected_alike']:.1f} of {e['of']} alike, chance of at least {e['of'] - 1}: "
              f"{e['p_all_but_one'] * 100:.0f} %")
    narrower = {}
    for shrink in (0.75, 0.5, 0.25):  # intervals this much narrower: ~1/shrink^2 the rounds where rounds dominate
        e = expected_agreement(runs, names, shrink) if expected else {}
        if e:
            narrower[str(shrink)] = round(float(np.mean([x["p_all_but_one"] for x in e.values()])), 3)
    if narrower:
        print("chance of all but one alike, mean over the pairs, with every se x 1 / " +
              " / ".join(narrower) + ": " + f"{np.mean([x['p_all_but_one'] for x in expected.values()]) * 100:.0f} / " +
              " / ".join(f"{x * 100:.0f}" for x in narrower.values()) + " %")
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(json.dumps({"runs": names, "pairs": pairs, "calibration": calib, "effects": effects,
                                           "expected_agreement": expected, "all_but_one_with_narrower_se": narrower,
                                           "per_run": {n: runs[n][1] for n in names}}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
