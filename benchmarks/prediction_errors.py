"""How far the predictions are from the measurements over every published configuration: the
roofline bounds servelab stored or computed before (analysis.predict) against the calibrated
performance model (analysis.perfmodel, with data/calibrations/), for c=1 TPOT and the TPOT at each
configuration's highest concurrency. Runs that carry prediction.json use what was stored before
their first request; the rest are predicted now from their run.json (labelled so).

    .venv/bin/python benchmarks/prediction_errors.py [--out benchmarks/results/prediction_errors.json]
    .venv/bin/python benchmarks/prediction_errors.py --now --out /tmp/errors-now.json
    .venv/bin/python benchmarks/prediction_errors.py --after   # writes prediction-after.json beside each stored one

`--now` predicts every configuration with today's model, stored predictions ignored: a comparison of
model versions on data the newer one may have been shaped by (in sample), never a test of it.

    .venv/bin/python benchmarks/prediction_errors.py --smoke DIR    # two studies, DIR/prediction_errors.json

`--after` re-predicts every published configuration that stored a prediction before its measurement with
today's model and writes it beside the stored one as prediction-after.json, labelled as made after the
measurement (the stored prediction.json is never rewritten); the report shows both.

Not a test: a table for the closing note and the README (bias = mean error, spread = its sd).
`--smoke DIR` (make test runs it) reads two published studies instead of all: h200-perfmodel (predictions
stored before measurement) and h200-llama8b-vllm (none stored: predicted now, bounds and estimates).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "lib"))


SMOKE_STUDIES = ("h200-perfmodel", "h200-llama8b-vllm")  # --smoke: stored predictions; none stored (both kinds)


def rows(now: bool = False, studies: tuple[str, ...] = ()) -> list[dict]:
    from servelab.analysis.perfmodel import predict_configuration
    from servelab.analysis.predict import predict_run
    from servelab.report import load_study_data

    out = []
    for study_dir in sorted((ROOT / "reports").iterdir()):
        if not (study_dir / "data" / "study.json").exists() or (studies and study_dir.name not in studies):
            continue
        sd = load_study_data(study_dir)
        s = sd.summary
        for cid in sd.config_ids:
            run, rf = sd.runs[cid], sd.folders[cid]
            g = s[(s["config"] == cid) & (s["rate_rps"] <= 0)] if not s.empty else s
            if g.empty or (run.get("model") or {}).get("facts") is None:
                continue
            b = g[g["bucket"] == g["bucket"].iloc[0]]
            n_in, n_out = int(round(b["prompt_tokens"].median())), int(round(b["output_tokens_p50"].median()))
            measured = {int(r.concurrency): float(r.tpot_p50_s) for r in b.itertuples()}
            c_low, c_high = min(measured), max(measured)
            old = predict_run(run, n_in, n_out) or {}
            wl = sd.study.workload_for(cid)
            stored = rf.prediction if rf.exists("prediction.json") and not now else None
            label = b["bucket"].iloc[0]
            new = ((stored or {}).get("buckets") or {}).get(label)
            source = "stored before measurement"
            if new is None:
                new = (predict_configuration(run, wl, {}, {label: (n_in, n_out)}, "now").get("buckets") or {}).get(label)
                source = "computed now"
            if not new:
                continue
            tp = new.get("tpot_s") or {}
            out.append({"study": study_dir.name, "config": cid, "bucket": label, "c_low": c_low, "c_high": c_high,
                        "measured_low_ms": measured[c_low] * 1e3, "measured_high_ms": measured[c_high] * 1e3,
                        "roofline_low_ms": (old.get("tpot_c1_s") or math.nan) * 1e3,
                        "model_low_ms": (tp.get(str(c_low)) or new.get("c1_tpot_s") or math.nan) * 1e3,
                        "model_high_ms": (tp.get(str(c_high)) or math.nan) * 1e3,
                        "kind": (new.get("kinds") or {}).get("c1_tpot_s"), "source": source,
                        "machine": ((stored or {}).get("machine") or {}).get("calibration")})
    return out


def write_after(studies: tuple[str, ...] = ()) -> list[str]:
    """prediction-after.json beside every stored prediction.json of a GPU configuration in reports/*/data (`studies`:
    only those): today's model on the same buckets, labelled as made after the measurement."""
    from servelab.analysis.perfmodel import MODEL_VERSION, predict_configuration
    from servelab.report import load_study_data
    from servelab.runfolder import PREDICTION_AFTER_JSON, write_json

    done = []
    for study_dir in sorted((ROOT / "reports").iterdir()):
        if not (study_dir / "data" / "study.json").exists() or (studies and study_dir.name not in studies):
            continue
        sd = load_study_data(study_dir)
        for cid in sd.config_ids:
            rf, run = sd.folders[cid], sd.runs[cid]
            if not rf.exists("prediction.json") or not (run.get("gpus_used") or (run.get("client_host") or {}).get("gpus")):
                continue  # the GPU configurations (issue #59)
            stored = rf.prediction
            lengths = {label: (b["input_tokens"], b["output_tokens"]) for label, b in (stored.get("buckets") or {}).items()}
            if not lengths:
                continue
            p = predict_configuration(sd.runs[cid], sd.study.workload_for(cid), sd.study.slo.model_dump(), lengths,
                                      "after the measurement")
            p.update(stored_before_measurement=False, made_after_measurement=True, stored_at=None,
                     note=(f"made after this run was measured, by {MODEL_VERSION} (benchmarks/prediction_errors.py "
                           f"--after); its terms may have been fitted on published measurements that include this "
                           f"study's (in sample); the prediction stored before the run is prediction.json, unchanged"))
            write_json(rf.path / PREDICTION_AFTER_JSON, p)
            done.append(f"{study_dir.name}/{cid}")
    return done


def err(measured: float, predicted: float) -> float:
    return (measured - predicted) / predicted * 100 if predicted and predicted == predicted else math.nan


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "prediction_errors.json"))
    ap.add_argument("--now", action="store_true", help="predict everything with today's model (in sample)")
    ap.add_argument("--after", action="store_true", help="write prediction-after.json beside every stored prediction")
    ap.add_argument("--studies", nargs="+", default=(), help="--after: only these published studies")
    ap.add_argument("--smoke", type=Path, metavar="DIR", help=f"only {' and '.join(SMOKE_STUDIES)}, into DIR")
    a = ap.parse_args()
    if a.after:
        done = write_after(tuple(a.studies))
        print(f"prediction-after.json written for {len(done)} configurations: {', '.join(done)}")
        return
    if a.smoke:
        a.out = str(a.smoke / "prediction_errors.json")
    rs = rows(a.now, SMOKE_STUDIES if a.smoke else ())
    for r in rs:
        r["roofline_err_pct"] = err(r["measured_low_ms"], r["roofline_low_ms"])
        r["model_err_pct"] = err(r["measured_low_ms"], r["model_low_ms"])
        r["model_high_err_pct"] = err(r["measured_high_ms"], r["model_high_ms"]) if r["c_high"] > r["c_low"] else math.nan
    print(f"{'study/config':52} {'c':>3} {'meas':>7} {'roof':>7} {'err%':>7} {'model':>7} {'err%':>7} | {'c':>3} "
          f"{'meas':>7} {'model':>7} {'err%':>7}  kind / source")
    for r in rs:
        print(f"{r['study'] + '/' + r['config']:52} {r['c_low']:>3} {r['measured_low_ms']:7.2f} {r['roofline_low_ms']:7.2f} "
              f"{r['roofline_err_pct']:+7.0f} {r['model_low_ms']:7.2f} {r['model_err_pct']:+7.0f} | {r['c_high']:>3} "
              f"{r['measured_high_ms']:7.2f} {r['model_high_ms']:7.2f} {r['model_high_err_pct']:+7.0f}  {r['kind']} / {r['source']}")

    def stats(key: str, pick=lambda r: True) -> str:
        xs = [r[key] for r in rs if pick(r) and r[key] == r[key]]
        if len(xs) < 2:
            return "n/a"
        return f"bias {statistics.mean(xs):+.0f} %, spread (sd) {statistics.stdev(xs):.0f} %, |error| median " \
               f"{statistics.median(abs(x) for x in xs):.0f} % over {len(xs)}"
    print("c=1 TPOT, roofline bound:     ", stats("roofline_err_pct"))
    print("c=1 TPOT, performance model:  ", stats("model_err_pct"))
    print("  of which calibrated estimates:", stats("model_err_pct", lambda r: r["kind"] == "estimate"))
    print("highest c TPOT, model:        ", stats("model_high_err_pct"))
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(rs, indent=1, allow_nan=True) + "\n")


if __name__ == "__main__":
    main()
