"""Fit the engine terms of the performance model (lib/servelab/data/engine_terms.yaml) from the
published runs that measured them, and predict the runs held out of each fit. Today one term:
SGLang's FA3 MLA backend with an fp8 KV cache converts its whole KV pool every decode step
(reports/h200-moe-explain: the pool swept at 69000, 138000 and 276000 tokens, fitted; the
published 552000-token configuration held out and predicted).

    .venv/bin/python benchmarks/engine_terms.py            # the fit, the held-out prediction, the YAML block

The residual a term is fitted on is the measured c=1 TPOT less the performance model's prediction
without engine terms (`perfmodel.predict_configuration(..., engine_terms=False)`) from the stored
calibration (data/calibrations/), so the term is what the model misses and nothing else. Not a test
(tests/analysis/test_perfmodel_terms.py replays it).

    .venv/bin/python benchmarks/engine_terms.py --smoke DIR   # the same: it takes seconds, writes nothing
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "lib"))

STUDY = "h200-moe-explain"
FITTED_ON = ["sglang-fp8kv-max-total-tokens-69000", "sglang-fp8kv-max-total-tokens-138000",
             "sglang-fp8kv-max-total-tokens-276000", "sglang-fp8kv-max-total-tokens-276000-again"]
HELD_OUT = ["sglang-fp8kv"]


def points(study: str = STUDY, configs: list[str] | None = None) -> list[dict]:
    """Per configuration: pool tokens and bytes, measured c=1 TPOT (median of its rounds' medians),
    the model's c=1 TPOT without engine terms, and with them (as the data file stands)."""
    from servelab.analysis import perfmodel_terms as terms
    from servelab.analysis.perfmodel import predict_configuration
    from servelab.engines.flags import engine_args, get_flag
    from servelab.report import load_study_data

    sd = load_study_data(ROOT / "reports" / study)
    s = sd.summary
    out = []
    for cid in configs or FITTED_ON + HELD_OUT:
        run = sd.runs[cid]
        g = s[(s["config"] == cid) & (s["concurrency"] == 1)]
        label = g["bucket"].iloc[0]
        n_in, n_out = int(round(g["prompt_tokens"].median())), int(round(g["output_tokens_p50"].median()))
        wl = sd.study.workload_for(cid)
        base = predict_configuration(run, wl, {}, {label: (n_in, n_out)}, "replay", engine_terms=False)["buckets"][label]
        full = predict_configuration(run, wl, {}, {label: (n_in, n_out)}, "replay")["buckets"][label]
        args = engine_args((run.get("engine_params") or {}).get("args"))
        kv_dtype = str(get_flag(args, "kv-cache-dtype") or "auto")
        facts = run["model"]["facts"]
        out.append({"config": cid, "pool_tokens": base["kv_tokens"],
                    "pool_bytes": terms.pool_bytes(facts, base["kv_tokens"], kv_dtype),
                    "measured_s": float(g["tpot_p50_s"].median()), "base_s": base["c1_tpot_s"],
                    "predicted_s": full["c1_tpot_s"], "terms": full.get("engine_terms")})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--smoke", type=Path, metavar="DIR",
                    help="the same run (make test's smoke run); DIR is not written")
    ap.parse_args()
    from servelab.analysis import perfmodel_terms as terms

    pts = points()
    fit = terms.fit_pool_term([p for p in pts if p["config"] in FITTED_ON])
    print(f"fit on {len(FITTED_ON)} runs: fixed {fit['fixed_s'] * 1e3:.4f} ms + {fit['pool_byte_s'] * 1e12:.4f} ps per "
          f"pool byte (r2 {fit['r2']:.5f})")
    for p in pts:
        law = fit["fixed_s"] + fit["pool_byte_s"] * p["pool_bytes"]
        pred = p["base_s"] + law
        err = (p["measured_s"] - pred) / pred * 100
        role = "held out" if p["config"] in HELD_OUT else "fitted"
        print(f"  {p['config']:44} {role:8} pool {p['pool_tokens']:>8,.0f} tokens ({p['pool_bytes'] / 1e9:5.2f} GB): "
              f"measured {p['measured_s'] * 1e3:7.3f} ms, model without terms {p['base_s'] * 1e3:6.3f}, with this "
              f"fit {pred * 1e3:7.3f} ({err:+.1f} %); as the data file stands {p['predicted_s'] * 1e3:7.3f}")
    print("per_step:")
    print(f"  fixed_s: {fit['fixed_s']:.6g}")
    print(f"  pool_byte_s: {fit['pool_byte_s']:.6g}")


if __name__ == "__main__":
    main()
