"""Noise figures of a study's measurement design, before and after: per level and for both sampled
metrics (per-request decode tok/s, aggregate tok/s), the within-start coefficient of variation (the
residual sd of the two-way fit of the repeated baseline starts, else the median sd of each start's
rounds), the largest change MDE under the two-level model (analysis.verdicts, the same model for every
folder), the rounds re-measured, the measured requests per configuration and level, and the
measurement's wall time. Any number of study folders (a published data/ folder,
a runs/<study> folder, or a git revision's published data extracted with --rev).

    .venv/bin/python benchmarks/verdict_noise.py reports/local-cpu --rev 44b6aeb:reports/local-cpu
    .venv/bin/python benchmarks/verdict_noise.py runs-a/local-cpu runs-b/local-cpu --out benchmarks/results/x.json

    .venv/bin/python benchmarks/verdict_noise.py --smoke DIR     # the published default study, twice

Not a test: it prints what the designs achieved on the machine that ran them. `--smoke DIR` (make test
runs it) leaves nothing out: the published reports/local-cpu, once from git (HEAD) and once from the
working tree, figures in DIR/verdict-noise.json.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from datetime import datetime
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "lib"))

from servelab.analysis import verdicts as v  # noqa: E402
from servelab.report import load_study_data  # noqa: E402
from servelab.report.verdicts import study_verdicts  # noqa: E402


def extract(rev_path: str, into: Path) -> Path:
    """`git archive` of REV:PATH (a published report folder) into `into`; returns the folder."""
    rev, path = rev_path.split(":", 1)
    into.mkdir(parents=True, exist_ok=True)
    tar = subprocess.run(["git", "archive", rev, path], cwd=ROOT, capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=tar, check=True)
    return into / path


def wall_s(sd) -> float:
    """First configuration start to the last run's end (run.json stamps), seconds."""
    starts, ends = [], []
    for run in sd.runs.values():
        for k, out in (("started_at", starts), ("finished_at", ends)):
            if run.get(k):
                out.append(datetime.fromisoformat(run[k]))
    return (max(ends) - min(starts)).total_seconds() if starts and ends else float("nan")


def within_cv(rt: pd.DataFrame, col: str, reps: list[str]) -> pd.Series:
    """Per level: the residual sd of the two-way fit (start + round) of the repeated starts `reps`
    on the log scale, or without repeats the median over starts of the sd of their rounds."""
    out = {}
    for (b, c), lv in rt.groupby(["bucket", "concurrency"]):
        y = lv[pd.to_numeric(lv[col], errors="coerce") > 0]
        if len(reps) >= 2:
            f = v.fit_level(pd.DataFrame({"start": y["config"], "round": y["round"], "y": np.log(y[col].astype(float))}),
                            reps)
            out[(b, c)] = float(np.sqrt(f.sigma_w2)) if f is not None else float("nan")
        else:
            out[(b, c)] = float(y.groupby("config")[col].agg(
                lambda x: float(np.std(np.log(x), ddof=1)) if len(x) > 1 else float("nan")).median())
    return pd.Series(out)


def figures(folder: Path) -> dict:
    sd = load_study_data(folder)
    rt = sd.rounds
    out = v.from_json(study_verdicts(sd))
    changes = out[~out["aa"].astype(bool)]
    aa = out[out["aa"].astype(bool)]
    reps = list(dict.fromkeys([*aa["baseline"], *aa["configuration"]]))  # the repeated baseline's starts
    req = sd.records[~sd.records["warmup"]].groupby(["config", "bucket", "concurrency"]).size()
    metrics = {"decode": v.DECODE, "aggregate": v.PRIMARY}
    cvs = {k: within_cv(rt, m, reps) for k, m in metrics.items()}
    mdes = {k: changes[changes["metric"] == m].groupby(["bucket", "concurrency"])["mde"].max() for k, m in metrics.items()}
    sampled = {x.label: x for x in sd.design.levels} if sd.design and sd.design.levels else {}
    levels = []
    for (b, c) in cvs["aggregate"].index:
        label = f"{b} c={int(c)}"
        lv = {"level": label,
              "requests_per_config": {k[0]: int(n) for k, n in req.items() if k[1] == b and k[2] == c}}
        for k in metrics:
            lv[f"within_start_cv_{k}_pct"] = round(100 * float(cvs[k].get((b, c), float("nan"))), 1)
            lv[f"largest_change_mde_{k}_pct"] = round(100 * float(mdes[k].get((b, c), float("nan"))), 1)
        s = sampled.get(label)
        lv["remeasured"] = int(s.remeasured) if s is not None else 0
        lv["disturbed"] = int(s.disturbed) if s is not None else 0
        levels.append(lv)
    prim = changes[changes["metric"] == v.PRIMARY]
    verdicts = {f"{r.configuration} {r.level}": r.verdict for r in prim.itertuples()}
    return {"folder": str(folder), "interleaved": sd.design.interleaved, "wall_s": round(wall_s(sd), 1),
            "within_start_cv": "two-way fit of " + ", ".join(reps) if len(reps) >= 2 else "median sd of each start",
            "levels": levels, "verdicts": verdicts}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folders", nargs="*", help="study folders (reports/<study>, runs/<study>)")
    ap.add_argument("--rev", action="append", default=[], help="REV:reports/<study> from git (repeatable)")
    ap.add_argument("--out", help="write the figures as JSON here")
    ap.add_argument("--smoke", type=Path, metavar="DIR", help="the published default study from git and from the tree")
    a = ap.parse_args()
    if a.smoke:
        a.folders, a.rev = [str(ROOT / "reports" / "local-cpu")], ["HEAD:reports/local-cpu"]
        a.out = a.smoke / "verdict-noise.json"
    with tempfile.TemporaryDirectory() as tmp:
        folders = [extract(r, Path(tmp) / str(i)) for i, r in enumerate(a.rev)] + [Path(f) for f in a.folders]
        res = [figures(f) for f in folders]
    for r, name in zip(res, [*a.rev, *a.folders]):
        print(f"\n{name}: {'interleaved' if r['interleaved'] else 'one at a time'}, measurement {r['wall_s']:.0f} s")
        t = pd.DataFrame([{"level": x["level"],
                           "CV decode %": x["within_start_cv_decode_pct"], "CV aggregate %": x["within_start_cv_aggregate_pct"],
                           "MDE decode %": x["largest_change_mde_decode_pct"],
                           "MDE aggregate %": x["largest_change_mde_aggregate_pct"],
                           "disturbed / again": f"{x['disturbed']} / {x['remeasured']}",
                           "requests per config": "/".join(str(n) for n in x["requests_per_config"].values())}
                          for x in r["levels"]])
        print(t.to_string(index=False))
        print(f"(within-start CV: {r['within_start_cv']})")
    if len(res) >= 2:
        a0, b0 = res[-2]["verdicts"], res[-1]["verdicts"]
        same = [k for k in a0 if a0[k] == b0.get(k)]
        flips = [k for k in a0 if {a0[k], b0.get(k)} == {v.FASTER, v.SLOWER}]
        print(f"\nverdicts of the last two folders agree on {len(same)} of {len(a0)}; opposite: {flips or 'none'}")
        for k in a0:
            print(f"  {k:28s} {a0[k]:22s} {b0.get(k)}")
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
