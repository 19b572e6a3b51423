"""Capacity at SLO as an analysis of levels: the search's answer read back from a run folder, the
SLO verdict of every level of a fixed grid (the same rule the search applies), and the
measurements a prediction is held against. Pure functions of records, summaries and run.json;
nothing here runs a trial (`measure.capacity`) or words a sentence (`report.capacity`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import fields
from typing import Any

import pandas as pd

from ..measure.capacity import trial_of
from ..measure.slo_search import SearchSpec, Targets, binding, load_verdict, measured, point_verdict, result, state
from .predict import predict_run


def capacity_result(run: Mapping[str, Any], records: pd.DataFrame | None = None) -> dict[str, Any] | None:
    """The search's answer stored in run.json (`capacity.result`), or None for a grid run. With the
    run's `records`, its trials judged again by today's rule (`slo_search`: a bracket end decided
    only when its p95's 95 % bound is on one side of the target; the first trial an outlier when
    its repeat says so): a search published before that rule shows its ends' confidence too."""
    cap = (run.get("capacity") or {})
    stored = cap.get("result") or None
    if stored is None or records is None or records.empty or not cap.get("spec"):
        return stored
    spec = SearchSpec(**{f.name: cap["spec"][f.name] for f in fields(SearchSpec) if f.name in cap["spec"]})
    t = Targets(**{k: cap.get("targets", {}).get(k) for k in ("ttft_p95_s", "tpot_p95_s")},
                error_rate=cap.get("targets", {}).get("error_rate", 1.0))
    recs = records.to_dict("records")
    trials = [trial_of(recs, li, spec.axis) for li in sorted({int(r["level"]) for r in recs})]
    out = result(state([tr for tr in trials if tr.sent], t, spec), t, spec)
    return {**out, "done": stored.get("done"), "reason": stored.get("reason")}


def grid_verdicts(records: pd.DataFrame, slo: Any, axis: str = "auto", repeats: int = 1) -> pd.DataFrame:
    """One row per level of a run (its load, measured SLO terms, pass, binding term, achieved req/s
    and output tok/s), judged by the search's rule. `axis` auto: rate for open-loop levels."""
    if records is None or records.empty:
        return pd.DataFrame()
    t = Targets.of(slo)
    rows = []
    recs = records.to_dict("records")
    for li in sorted({int(r["level"]) for r in recs}):
        first = next(r for r in recs if r["level"] == li)
        ax = axis if axis != "auto" else ("rate" if first.get("rate_rps") else "concurrency")
        tr = trial_of(recs, li, ax)
        if tr.sent == 0:
            continue
        m = measured(tr.ttft_s, tr.tpot_s, tr.sent, tr.failed)
        v = load_verdict([tr], t, repeats)
        rows.append({"config": first["config"], "bucket": first["bucket"], "level": li, "axis": ax, "load": tr.load,
                     **m, "passes": point_verdict(m, t), "settled": v.settled, "binding": binding(m, t),
                     "request_rps": tr.request_rps, "output_tps": tr.output_tps, "in_flight": tr.in_flight})
    return pd.DataFrame(rows)


def grid_capacity(verdicts: pd.DataFrame) -> dict[str, Any]:
    """The best a fixed grid says about capacity: the highest passing load below the lowest
    failing one (per configuration and bucket), and that failing load."""
    if verdicts is None or verdicts.empty:
        return {}
    out = {}
    for (cid, bucket), g in verdicts.groupby(["config", "bucket"], sort=False):
        g = g.sort_values("load")
        fails = g[~g["passes"]]
        hi = float(fails["load"].min()) if len(fails) else None
        ok = g[g["passes"] & ((g["load"] < hi) if hi is not None else True)]
        lo = ok.iloc[-1] if len(ok) else None
        out[(cid, bucket)] = {"capacity": float(lo["load"]) if lo is not None else None, "first_fail": hi,
                              "axis": g["axis"].iloc[0],
                              "request_rps": float(lo["request_rps"]) if lo is not None else math.nan,
                              "output_tps": float(lo["output_tps"]) if lo is not None else math.nan}
    return out


def brackets_overlap(a: list[float | None], b: list[float | None]) -> bool:
    """Two searches agree when their brackets [lo, hi] overlap (hi None = unbounded)."""
    a_hi = math.inf if a[1] is None else a[1]
    b_hi = math.inf if b[1] is None else b[1]
    return max(a[0], b[0]) <= min(a_hi, b_hi)


def report_quantities(entry: Mapping[str, Any]) -> dict[str, Any]:
    """A prediction bucket under the report's quantity names: prediction.json's (`perfmodel`:
    c1_tpot_s, tpot_s per concurrency, prefill_tok_s, kv_limited_concurrency) or an older run.json's
    roofline keys as they are; `kinds` says which are estimates and which bounds."""
    if "c1_tpot_s" not in entry:
        return {**entry, "kinds": {q: "bound" for q in ("tpot_c1_s", "kv_concurrency", "prefill_tps", "capacity_rps")}}
    tp = entry.get("tpot_s") or {}
    cmax = max((int(c) for c in tp), default=1)
    k = entry.get("kinds") or {}
    return {"tpot_c1_s": entry["c1_tpot_s"], "tpot_cmax_s": tp.get(str(cmax)) if cmax > 1 else None, "cmax": cmax,
            "kv_concurrency": entry.get("kv_limited_concurrency"), "prefill_tps": entry.get("prefill_tok_s"),
            "capacity_rps": entry.get("capacity_rps"), "ttft_c1_s": entry.get("ttft_c1_s"),
            "kinds": {"tpot_c1_s": k.get("c1_tpot_s"), "tpot_cmax_s": k.get("tpot_s"),
                      "ttft_c1_s": k.get("ttft_c1_s", k.get("prefill_tok_s")),
                      "kv_concurrency": k.get("kv_limited_concurrency"), "prefill_tps": k.get("prefill_tok_s"),
                      "capacity_rps": k.get("capacity_rps")}}


def prediction_for(run: Mapping[str, Any], bucket: Mapping[str, Any], slo: Any,
                   stored: Mapping[str, Any] | None = None) -> tuple[dict[str, Any] | None, str]:
    """The run's prediction for a bucket (report quantity names, `report_quantities`), and where it
    came from: stored before the measurement ("stored": prediction.json, or run.json's `prediction`
    of an older run; pass the folder's `RunFolder.prediction` as `stored`), not predictable when the
    run said so ("not_predictable"), or computed now from the committed facts with the roofline of
    the hardware table ("render", a run published before predictions were stored)."""
    pred = stored if stored is not None else (run.get("prediction") or {})
    per = pred.get("buckets") or {}
    entry = per.get(bucket.get("label")) or per.get(f"in{bucket['input_tokens']}-out{bucket['output_tokens']}")
    if entry:
        return report_quantities(entry), "stored"
    if pred.get("not_predictable"):
        return None, "not_predictable"
    slo_d = slo.model_dump() if hasattr(slo, "model_dump") else dict(slo or {})
    p = predict_run(run, bucket["input_tokens"], bucket["output_tokens"], slo_d)
    return (report_quantities(p), "render") if p is not None else (None, "render")


def measurements(summary: pd.DataFrame, samples: pd.DataFrame | None, run: Mapping[str, Any], bucket: str,
                 prefill_fit: Mapping[str, Any] | None, records: pd.DataFrame, slo: Any) -> dict[str, float]:
    """The measured counterparts of the predictions for one configuration and bucket: c=1 TPOT
    (p50 at the lowest load), the KV-limited concurrency (the server's own KV tokens over the
    tokens of one request), the prefill rate (the TTFT fit's slope) and the capacity at SLO
    (the search's, else the best fixed-grid level that meets the SLO)."""
    nan = math.nan
    out = {"tpot_c1_s": nan, "tpot_cmax_s": nan, "ttft_c1_s": nan, "kv_concurrency": nan, "prefill_tps": nan,
           "capacity_rps": nan}
    s = summary[summary["bucket"] == bucket] if summary is not None and not summary.empty else pd.DataFrame()
    if not s.empty:
        low = s.sort_values(["rate_rps", "concurrency"] if (s["rate_rps"] > 0).all() else ["concurrency"]).iloc[0]
        out["tpot_c1_s"] = float(low["tpot_p50_s"])
        out["ttft_c1_s"] = float(low["ttft_p50_s"])
        closed = s[s["rate_rps"] <= 0] if "rate_rps" in s else s
        if len(closed) and int(closed["concurrency"].max()) > 1:
            top = closed.sort_values("concurrency").iloc[-1]
            out["tpot_cmax_s"], out["cmax"] = float(top["tpot_p50_s"]), int(top["concurrency"])
        per_request = float(low["prompt_tokens"]) + float(low["output_tokens_p50"])
        if samples is not None and not samples.empty and "kv_capacity_tokens" in samples.columns:
            kv = samples["kv_capacity_tokens"].dropna()
            if len(kv) and per_request > 0:
                out["kv_concurrency"] = float(kv.iloc[-1]) / per_request
    if prefill_fit and prefill_fit.get("prefill_tps") == prefill_fit.get("prefill_tps"):
        out["prefill_tps"] = float(prefill_fit["prefill_tps"])
    cap = capacity_result(run)
    if cap and cap.get("capacity") is not None:
        out["capacity_rps"] = float(cap["request_rps"] if cap["axis"] == "concurrency" else cap["capacity"])
        out["capacity_source"] = "search"
    else:
        v = grid_verdicts(records[records["bucket"] == bucket] if not records.empty else records, slo)
        g = grid_capacity(v)
        best = next(iter(g.values()), None)
        if best and best["capacity"] is not None:
            out["capacity_rps"] = best["request_rps"]
            # no level of the grid failed: its best level is a lower bound, not the capacity
            out["capacity_source"] = "grid" if best["first_fail"] is not None else "grid_lower_bound"
    return out
