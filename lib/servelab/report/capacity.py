"""The write-up's capacity sections: capacity at SLO per configuration (when the study searched
it), the prediction table (predicted, measured, error per configuration) with its evidence
sentences, and the tuning story (`tune.json`). Words from i18n/capacity.yaml; numbers from
`analysis.capacity` and `analysis.predict`. Pure functions of the published files."""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from ..analysis.capacity import capacity_result, measurements, prediction_for
from ..analysis.predict import errors, symptom_evidence
from ..analysis.tuning import clip
from ..runfolder import TUNE_JSON
from . import html
from .diagnosis import prefill_fits
from .load import StudyData

QUANTITIES = ("tpot_c1_s", "tpot_cmax_s", "ttft_c1_s", "kv_concurrency", "prefill_tps", "capacity_rps")
SCALE = {"tpot_c1_s": 1000.0, "tpot_cmax_s": 1000.0, "ttft_c1_s": 1000.0}


def _sig(v: Any) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "–"
    v = float(v)
    if abs(v) >= 100:
        return f"{v:,.0f}"
    if abs(v) >= 1:
        return f"{v:.2f}"
    return f"{v:.3g}"


def _load(sd: StudyData, axis: str, x: float | None) -> str:
    if x is None:
        return "–"
    return sd.w("capacity.unit_rate" if axis == "rate" else "capacity.unit_conc", x=f"{x:g}")


def searched(sd: StudyData) -> list[str]:
    return [c for c in sd.config_ids if capacity_result(sd.runs[c])]


def _result(sd: StudyData, cid: str) -> dict[str, Any]:
    """The configuration's search, its ends judged by today's rule (`analysis.capacity`)."""
    return capacity_result(sd.runs[cid], sd.folders[cid].records)


def capacity_lines(sd: StudyData) -> list[str]:
    """One headline sentence per searched configuration."""
    out, labels = [], sd.labels()
    for cid in searched(sd):
        r = _result(sd, cid)
        lo, hi = r["bracket"]
        label = labels.get(cid, cid)
        at = [a for a in r.get("at_target") or [] if hi is None or a["load"] < hi]
        if r["capacity"] is None and at:  # nothing decided passing, but loads under the failing one straddle the target
            out.append(sd.w("capacity.headline_at", label=label, hi=_load(sd, r["axis"], hi),
                            at=", ".join(sd.w("capacity.at_load", load=_load(sd, r["axis"], a["load"]), n=a["requests"])
                                         for a in at)))
        elif r["capacity"] is None:
            out.append(sd.w("capacity.headline_none", label=label, hi=_load(sd, r["axis"], hi)))
        elif hi is None:
            out.append(sd.w("capacity.headline_open", label=label, cap=_load(sd, r["axis"], lo)))
        else:
            out.append(sd.w("capacity.headline", label=label, cap=_load(sd, r["axis"], lo),
                            tps=_sig(r.get("output_tps")), cc=r.get("in_flight") or math.nan,
                            lo=f"{lo:g}", hi=f"{hi:g}", term=sd.w(f"capacity.term.{r['binding']}")) + fit_sentence(sd, r))
    return out


def fit_sentence(sd: StudyData, r: dict[str, Any]) -> str:
    """The capacity read off every trial near the bracket (`slo_search.fitted`): ' Read off ...'."""
    f = r.get("fit")
    if not f:
        return ""
    a, b = f["loads"]
    bounds = (sd.w("capacity.fit_bounds", lo=f"{f['lower']:.3g}", hi=f"{f['upper']:.3g}")
              if f.get("lower") is not None and f.get("upper") is not None else sd.w("capacity.fit_open"))
    loads = sd.w("capacity.unit_rate" if r["axis"] == "rate" else "capacity.unit_conc", x=f"{a:g}–{b:g}")
    return " " + sd.w("capacity.fitted", n=f["trials"], loads=loads, term=sd.w(f"capacity.term.{f['term']}"),
                      x=_load(sd, r["axis"], float(f"{f['load']:.3g}")), bounds=bounds)


def capacity_section(sd: StudyData) -> tuple[str, Any]:
    """(text, table) of the searched capacities; the table is None when nothing was searched."""
    ids = searched(sd)
    if not ids:
        return sd.w("capacity.no_search"), None
    slo = ", ".join(f"{sd.w('capacity.term.' + k)} ≤ {v:g}" + (" s" if k != "error_rate" else "")
                    for k, v in _result(sd, ids[0])["targets"].items())
    cols = sd.w("capacity.columns")
    rows = []
    for cid in ids:
        r = _result(sd, cid)
        lo, hi = r["bracket"]
        rows.append([sd.labels().get(cid, cid), _load(sd, r["axis"], r["capacity"]),
                     f"[{lo:g}, {hi:g}]" if lo is not None and hi is not None else
                     f"[–, {hi:g}]" if hi is not None else sd.w("capacity.open_end"),
                     r.get("output_tps") or math.nan, r.get("in_flight") or math.nan,
                     sd.w(f"capacity.term.{r['binding']}") if r.get("binding") else "–", r["trials"],
                     ends_cell(sd, r)])
    t = html.table(pd.DataFrame(rows, columns=cols), sd.w("capacity.t_capacity"),
                 formats={cols[3]: _sig, cols[4]: "{:,.1f}"})
    return sd.w("capacity.text", slo=slo) + "\n\n" + "\n\n".join(capacity_lines(sd)), t


def ends_cell(sd: StudyData, r: dict[str, Any]) -> str:
    """Each bracket end's verdict with its confidence: "passes (95 %, 60 requests)", "undecided at
    36 requests (p95 TTFT 0.95-∞ s)"."""
    out = []
    for key in ("low", "high"):
        end = (r.get("ends") or {}).get(key)
        if not end:
            continue
        if end.get("settled"):
            word = sd.w("capacity.end.passes" if end.get("passes") else "capacity.end.fails", n=end.get("requests", 0))
        elif end.get("how") == "too few trials":  # its interval decided, but not on enough trials to settle
            word = sd.w("capacity.end.unrepeated", n=end.get("requests", 0), trials=len(end.get("trials") or []),
                        verdict=sd.w("capacity.end.verdict_pass" if end.get("passes") else "capacity.end.verdict_fail"))
        else:
            word = sd.w("capacity.end.undecided", n=end.get("requests", 0))
        out.append(f"{end['load']:g}: {word}")
    return "; ".join(out) or "–"


def _bucket_of(sd: StudyData, cid: str) -> dict[str, int]:
    run = sd.runs[cid]
    cap = (run.get("capacity") or {}).get("bucket")
    buckets = sd.study.workload_for(cid).buckets
    b = next((x for x in buckets if x.label == cap), buckets[0])
    n_in = b.input_tokens
    if n_in is None:  # a prompt set or a trace: the prompts' achieved length (median over the bucket's records)
        recs = sd.folders[cid].records
        got = recs.loc[recs["bucket"] == b.label, "prompt_tokens"].dropna() if "bucket" in recs else recs.iloc[0:0]
        n_in = int(got.median()) if len(got) else None
    return {"input_tokens": n_in, "output_tokens": b.output_tokens, "label": b.label}


def prediction_frame(sd: StudyData) -> pd.DataFrame:
    """Long table: configuration, quantity, predicted, measured, error %, source (one bucket each)."""
    rows = []
    fits = prefill_fits(sd)
    for cid in sd.config_ids:
        b = _bucket_of(sd, cid)
        if b["input_tokens"] is None or b["output_tokens"] is None:
            continue  # no length to predict for
        rf = sd.folders[cid]
        pred, src = prediction_for(sd.runs[cid], b, sd.study.slo, rf.prediction)
        if pred is None and src == "not_predictable":  # said so by the run: a row that says why
            pred = {}
        elif pred is None:
            continue
        m = measurements(rf.summary, rf.samples, sd.runs[cid], b["label"], fits.get(cid), rf.records, sd.study.slo)
        # the prediction stored before the run, and a later model's made after it (prediction-after.json), labelled
        after = prediction_for(sd.runs[cid], b, sd.study.slo, rf.prediction_after)[0] if rf.prediction_after else None
        for p, source, whole in ((pred, src, rf.prediction if src == "stored" else None),
                                 (after, "after", rf.prediction_after)):
            if p is None:
                continue
            version = (whole or {}).get("model_version")
            host = ((whole or {}).get("machine") or {}).get("host") or {}  # perfmodel-5: the host factor it took
            err = errors(p, m)
            for q in QUANTITIES:
                if q == "tpot_cmax_s" and (p.get(q) is None or m.get("cmax") != p.get("cmax")):
                    continue  # no TPOT predicted or measured at the same higher concurrency
                rows.append({"config": cid, "bucket": b["label"], "quantity": q, "predicted": p.get(q),
                             "measured": m.get(q), "error_pct": err.get(q), "source": source,
                             "kind": (p.get("kinds") or {}).get(q), "cmax": m.get("cmax"), "version": version,
                             "capacity_source": m.get("capacity_source"),
                             "host": (host.get("how"), host.get("factor")) if host.get("how") in HOST_WORDS else None})
    return pd.DataFrame(rows)


#: the host factor a prediction took (analysis.hosts): measured on the host, or the typical host of those seen
HOST_WORDS = {"probe": "capacity.host.probe", "hosts seen": "capacity.host.seen"}


def _paren(*bits: Any) -> str:
    """" (a, b)" of the bits that are words, "" when none is."""
    words = [b for b in bits if isinstance(b, str) and b]
    return f" ({', '.join(words)})" if words else ""


def _host(sd: StudyData, host: Any) -> str | None:
    if not isinstance(host, tuple):
        return None
    return sd.w(HOST_WORDS[host[0]], f=f"{float(host[1]):.2f}")


def prediction_section(sd: StudyData) -> tuple[str, Any, str]:
    """(text, table, evidence sentences) of the prediction against the measurement."""
    f = prediction_frame(sd)
    if f.empty:
        return sd.w("capacity.no_prediction"), None, ""
    cols = sd.w("capacity.predict_columns")
    labels = sd.labels()
    rows = []
    for _, r in f.iterrows():
        q = r["quantity"]
        src = r["capacity_source"] if q == "capacity_rps" else None
        key = "capacity.q.capacity_rps_grid" if src in ("grid", "grid_lower_bound") else f"capacity.q.{q}"
        kind = sd.w(f"capacity.kind.{r['kind']}") if r.get("kind") in ("estimate", "bound") else ""
        k = SCALE.get(q, 1.0)
        p = r["predicted"] * k if isinstance(r["predicted"], (int, float)) else r["predicted"]
        mv = r["measured"] * k if isinstance(r["measured"], (int, float)) else r["measured"]
        bound = src == "grid_lower_bound"  # every grid level met the SLO: no error against a lower bound
        rows.append([labels.get(r["config"], r["config"]), sd.w(key, c=r.get("cmax") or ""), _sig(p),
                     ("≥ " if bound else "") + _sig(mv), math.nan if bound else r["error_pct"],
                     sd.w(f"capacity.src.{r['source']}") + _paren(r.get("version"), kind, _host(sd, r.get("host")))])
    buckets = sorted(set(f["bucket"]))
    t = html.table(pd.DataFrame(rows, columns=cols), sd.w("capacity.t_predict", bucket=", ".join(buckets)),
                 formats={cols[4]: "{:+,.0f}"},
                 notes={"–": sd.w("capacity.predict_note_dash"),
                        cols[3]: sd.w("capacity.predict_note_kv") + " " + sd.w("capacity.predict_note_cap")})
    ev = []
    f = f[f["source"] != "after"]  # the evidence holds the prediction made before the measurement only
    for cid, g in f.groupby("config", sort=False):
        pred = dict(zip(g["quantity"], g["predicted"]))
        meas = dict(zip(g["quantity"], g["measured"]))
        for key, vals in symptom_evidence(pred, meas):
            ev.append(sd.w(f"capacity.evidence.{key}", label=labels.get(cid, cid), **vals))
    return sd.w("capacity.predict_text"), t, "\n\n".join(ev) or sd.w("capacity.evidence.none")


def tune_value(sd: StudyData, objective: str, v: float) -> str:
    """A tune objective's value with its unit: capacity in req/s (or requests in flight on the
    concurrency axis), goodput and decode speed in tok/s."""
    if objective == "capacity":
        axis = getattr(getattr(sd.study, "capacity", None), "axis", "rate")
        return sd.w("capacity.unit_rate" if axis == "rate" else "capacity.unit_conc", x=f"{v:.3g}")
    return f"{v:.3g} tok/s"


def tune_record(sd: StudyData) -> dict[str, Any] | None:
    return sd.file(TUNE_JSON)


def tune_section(sd: StudyData) -> tuple[str, Any]:
    """(text, table) of the tuning search: every candidate with its objective, interval, gain and
    verdict; (\"\", None) when the study did not tune."""
    t = tune_record(sd)
    if not t:
        return "", None
    labels = sd.labels()
    steps = t["steps"]
    n = {k: sum(1 for s in steps if s["verdict"] == k) for k in ("kept", "rejected", "failed")}
    obj = sd.w(f"tune.objective.{t['objective']}")
    text = sd.w("tune.text", flags=", ".join(f"`{f}`" for f in t["flags"]), base=labels.get(t["base"], t["base"]),
                objective=obj, quality=sd.w("tune.quality_hook"), kept=n["kept"], rejected=n["rejected"],
                failed=n["failed"])
    cols = sd.w("tune.columns")
    rows = []
    for i, s in enumerate(steps):
        iv = s.get("interval")
        why = sd.w(f"tune.why.{s['why']}", **(s.get("why_values") or {})) if s.get("why") else ""
        if s.get("why") == "start_failed":  # the engine's own message, quoted as it wrote it (cut: said so)
            why = html.quote_cell(clip(why), sd.language)
        rows.append([i, s.get("flag") or "–", "–" if s.get("value") is None else str(s["value"]),
                     labels.get(s["config"], s["config"]), s.get("objective"),
                     f"[{_sig(iv[0])}, {_sig(iv[1])}]" if iv else "–",
                     labels.get(s["incumbent"], s["incumbent"]) if s.get("incumbent") else "–",
                     s.get("gain_pct"), sd.w(f"tune.verdict.{s['verdict']}"), why])
    table = html.table(pd.DataFrame(rows, columns=cols), sd.w("tune.t_steps"),
                     formats={cols[4]: _sig, cols[7]: "{:+,.0f}"})
    fin = t.get("final") or {}
    if fin:
        text += "\n\n" + sd.w("tune.final", final=labels.get(fin["config"], fin["config"]), objective=obj,
                              value=tune_value(sd, t["objective"], fin["objective"]), gain=fin.get("gain_pct") or 0.0)
    return text, table
