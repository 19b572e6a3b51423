"""The write-up's diagnosis: the prefill fit, saturation and goodput, KV-cache
residency, the roofline, speculative decoding and the symptom table in words, each computed
from a `StudyData` with `servelab.analysis`. Every symptom is a sentence with its evidence
and its first check; the rules get the records-based prefill fit and the
roofline bound the report shows, so the verdicts agree with the tables beside them."""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from ..analysis import (capture_size_warnings, fit_prefill, goodput, knee, kv_residency, kv_verdict, slo_check,
                        spec_ab, spec_stats, symptoms)
from ..analysis.roofline import get_hardware, local_cpu_entry, roofline_efficiency
from ..engines import get as engine_profile
from . import html
from .load import StudyData, baselines, engine_gpus
from .fmt import dash_note, num, pct


def _cached(sd: StudyData, key: str, make: Any) -> Any:
    """Computed once per StudyData (the write-up asks several times)."""
    cache = sd.__dict__.setdefault("_diagnosis_cache", {})
    if key not in cache:
        cache[key] = make()
    return cache[key]


def prefill_fits(sd: StudyData) -> dict[str, dict[str, Any]]:
    """TTFT = overhead + prompt tokens / prefill rate at concurrency 1, per configuration, fitted
    on the measured requests (not on medians)."""
    recs = sd.records
    return _cached(sd, "fits", lambda: fit_prefill(recs[~recs["warmup"].astype(bool)]) if not recs.empty else {})


def prefill_table(sd: StudyData) -> Any:
    fits = prefill_fits(sd)
    cols = sd.w("prefill.columns")
    rows = []
    for cid in sd.config_ids:
        f = fits.get(cid)
        if not f or f["n"] == 0 or f["distinct_prompt_lengths"] < 2:
            continue  # one prompt length (a saturation sweep): nothing to fit
        rows.append([cid, f["prefill_tps"], f["prefill_tps_se"], f["overhead_s"] * 1000, f["overhead_s_se"] * 1000,
                     f["r2"], f["n"], f"{f['ttft_longest_over_shortest']:,.1f}×"
                     if math.isfinite(f["ttft_longest_over_shortest"]) else html.MISSING])
    if not rows:
        return None
    note = sd.w("prefill.not_identifiable")
    t = pd.DataFrame(rows, columns=cols)
    return html.table(t, sd.w("prefill.caption"),
                    formats={cols[1]: "{:,.0f}", cols[2]: "{:,.0f}", cols[3]: "{:,.1f}", cols[4]: "{:,.1f}",
                             cols[5]: "{:.3f}"}, notes=dash_note(t, note))


def goodput_frame(sd: StudyData) -> pd.DataFrame:
    return goodput(sd.summary, sd.study.slo) if not sd.summary.empty else pd.DataFrame()


def saturation_table(sd: StudyData) -> Any:
    """Per configuration and prompt length: the knee, the top level, the goodput level and its
    throughput, and why the first level above it fails the SLO."""
    if sd.summary.empty:
        return None
    k = knee(sd.summary)
    g = goodput_frame(sd)
    chk = slo_check(sd.summary, sd.study.slo)
    cols = sd.w("saturation.columns")
    rows = []
    for r in k.merge(g, on=["config", "bucket"], how="left").itertuples():
        fails = chk[(chk["config"] == r.config) & (chk["bucket"] == r.bucket) & ~chk["meets_slo"]]
        gc = r.goodput_concurrency
        above = fails[fails["concurrency"] > (gc if pd.notna(gc) else 0)].sort_values("concurrency")
        why = f"c={int(above.iloc[0]['concurrency'])}: {above.iloc[0]['slo_fail_reason']}" if len(above) else html.MISSING
        rows.append([r.config, r.bucket, r.knee_concurrency if r.plateau else None, r.top_concurrency, gc,
                     r.aggregate_output_tps, why])
    t = pd.DataFrame(rows, columns=cols)
    notes = dash_note(t, sd.w("saturation.none_note"))
    return html.table(t, sd.w("saturation.caption"),
                    formats={cols[2]: "{:,.0f}", cols[3]: "{:,.0f}", cols[4]: "{:,.0f}", cols[5]: "{:,.1f}"},
                    notes=notes)


def kv_section(sd: StudyData, cid: str) -> tuple[str, Any, pd.DataFrame | None]:
    """(verdict sentence, per-level table, samples for the figure) of one configuration."""
    s = sd.samples(cid)
    label = sd.labels().get(cid, cid)
    if s is None or s.empty:
        return sd.w("kv.no_metrics", label=label), None, None
    v = kv_verdict(s, facts=sd.facts(cid) or None, engine_args=sd.engine_params(cid))
    head = sd.w("kv.head_limited" if v["limited"] else "kv.head_not_limited")
    res = kv_residency(s)
    cols = sd.w("kv.columns")
    t = pd.DataFrame({cols[0]: res["level"], cols[1]: res["kv_usage_max_frac"] * 100, cols[2]: res["running_max"],
                      cols[3]: res["waiting_max"], cols[4]: res["preemptions_delta"], cols[5]: res["crowded_samples"]})
    table = html.table(t, sd.w("kv.caption", label=label), formats={cols[1]: "{:,.1f}", cols[2]: "{:,.0f}",
                                                            cols[3]: "{:,.0f}", cols[4]: "{:,.0f}"},
                     notes=dash_note(t, sd.w("kv.counter_not_exposed")))
    return sd.w("kv.verdict", label=label, head=head, evidence=sd.w.say(v["evidence"])), table, s


def _hardware_for(sd: StudyData, cid: str) -> tuple[dict[str, Any] | None, int]:
    run = sd.runs[cid]
    if run.get("hardware_measured"):
        return local_cpu_entry(run["hardware_measured"], as_of=str(run.get("finished_at", ""))[:10]), 1
    gpus = run.get("gpus_used") or (run.get("client_host") or {}).get("gpus") or []
    if gpus:
        try:
            return get_hardware(gpus[0]["name"]), engine_gpus(sd, cid)
        except KeyError:
            return None, 1
    return None, 1


def roofline(sd: StudyData) -> pd.DataFrame:
    """Measured decode and prefill against the hardware bounds, every level of every configuration."""
    return _cached(sd, "roofline", lambda: _roofline(sd))


def _roofline(sd: StudyData) -> pd.DataFrame:
    eff = []
    for cid in sd.config_ids:
        facts = sd.facts(cid)
        hw, n = _hardware_for(sd, cid)
        if facts and hw:
            eff.append(roofline_efficiency(sd.summary[sd.summary["config"] == cid], facts, hw, devices=n))
    return pd.concat(eff, ignore_index=True) if eff else pd.DataFrame()


def _hardware_words(sd: StudyData, h: dict[str, Any]) -> tuple[str, str]:
    """(name, source) of a hardware entry: a datasheet's as written, a CPU measured on the spot
    (`local_cpu_entry`) in the page's language."""
    m = h.get("measured")
    if not m:
        return h["name"], h.get("source", "")
    return (sd.w("roofline.local_cpu_name", model=m.get("cpu_model") or "unknown", cores=m.get("cpu_count")),
            sd.w("roofline.local_cpu_source", array_bytes=m.get("array_bytes"), matmul_n=m.get("matmul_n")))


def roofline_tables(sd: StudyData) -> tuple[Any, Any]:
    """(hardware bounds used, decode at concurrency 1 against the bandwidth bound)."""
    used: dict[str, dict[str, Any]] = {}
    for cid in sd.config_ids:
        hw, _ = _hardware_for(sd, cid)
        if hw:
            used[hw["name"]] = hw
    if not used:
        return None, None
    hcols = sd.w("roofline.hardware_columns")
    hrows = []
    for h in used.values():
        name, source = _hardware_words(sd, h)
        hrows.append([name, h["memory_bandwidth_Bps"] / 1e12,
                      (h.get("bf16_dense_flops") or h.get("peak_flops") or math.nan) / 1e12,
                      html.quote_cell(f"{source} ({h.get('as_of', '')})", sd.language) if not h.get("measured")
                      else f"{source} ({h.get('as_of', '')})"])  # a datasheet's own words, quoted
    hw_t = html.table(pd.DataFrame(hrows, columns=hcols), sd.w("roofline.hardware_caption"),
                    formats={hcols[1]: "{:,.2f}", hcols[2]: "{:,.2f}"})
    e = roofline(sd)
    if e.empty:
        return hw_t, None
    e = e[e["concurrency"] == e.groupby("config")["concurrency"].transform("min")]
    ecols = sd.w("roofline.columns")
    t = pd.DataFrame({ecols[0]: e["config"], ecols[1]: e["bucket"], ecols[2]: e["tpot_p50_s"] * 1000,
                      ecols[3]: e["decode_bound_s_per_token"] * 1000, ecols[4]: e["decode_efficiency_pct"],
                      ecols[5]: e["implied_bandwidth_Bps"] / 1e12})
    return hw_t, html.table(t, sd.w("roofline.caption"), formats={ecols[2]: "{:,.2f}", ecols[3]: "{:,.3f}",
                                                          ecols[4]: "{:,.1f} %", ecols[5]: "{:,.2f}"})


def decode_bounds(sd: StudyData, cid: str) -> dict[str, float] | None:
    """Roofline bound (s per token) per bucket at the lowest concurrency, for the symptom rule."""
    e = roofline(sd)
    if e.empty:
        return None
    e = e[(e["config"] == cid)]
    if e.empty:
        return None
    e = e[e["concurrency"] == e["concurrency"].min()]
    return dict(zip(e["bucket"], e["decode_bound_s_per_token"]))


def symptom_frame(sd: StudyData, cid: str) -> pd.DataFrame:
    """The symptom table for one configuration, from the records-based fit and the roofline bound."""
    return symptoms(sd.summary, sd.samples(cid), fit=prefill_fits(sd).get(cid), slo=sd.study.slo,
                    decode_bound_s_per_token=decode_bounds(sd, cid), config=cid)


def symptom_text(sd: StudyData, cid: str) -> str:
    """Each symptom as a sentence: the verdict, its evidence, and the first check."""
    verdicts = {"yes": sd.w("symptom.present.yes"), "no": sd.w("symptom.present.no"),
                "n/a": sd.w("symptom.present.na")}
    out = [sd.w("symptom.line", obs=sd.w(f"symptom.{r.rule}.observation"), verdict=verdicts[r.present],
                evidence=sd.w.say(r.evidence).rstrip(sd.w("finding.full_stop")),
                check=sd.w(f"symptom.{r.rule}.first_check"))
           for r in symptom_frame(sd, cid).itertuples()]
    return f"**{sd.labels().get(cid, cid)}**\n\n" + "\n".join(f"- {x}" for x in out)


def spec_section(sd: StudyData) -> tuple[str, Any]:
    """Speculative decoding: acceptance from the server's counters, the A/B against the baseline,
    and CUDA-graph capture-size warnings (a step above the largest captured size runs without a graph)."""
    lines, tables, bases = [], [], baselines(sd)
    conc = sd.study.workload.concurrency
    for cid in sd.config_ids:
        ep = sd.engine_params(cid)
        args = ep.get("args") or {}
        for warn in capture_size_warnings(args, conc):
            lines.append(f"- ⚠ **{cid}**: {warn}")
        if not engine_profile(ep.get("kind", "vllm")).speculative(args):
            continue
        s = sd.samples(cid)
        st = spec_stats(s) if s is not None else {}
        rate, length = st.get("acceptance_rate", math.nan), st.get("mean_acceptance_length", math.nan)
        lines.append("- " + sd.w("speculative.acceptance", config=cid, rate=num(rate * 100, 1), length=num(length, 2),
                                 source=st.get("source") or st.get("note")))
        if cid in bases:
            base = bases[cid]
            ab = spec_ab(sd.summary[sd.summary["config"] == base], sd.summary[sd.summary["config"] == cid])
            tables.append(ab.assign(config=cid))
    if not lines:
        lines.append(sd.w("speculative.none"))
    if not tables:
        return "\n".join(lines), None
    ab = pd.concat(tables, ignore_index=True)
    c = sd.w("speculative.columns")
    t = pd.DataFrame({c[0]: ab["config"], c[1]: ab["bucket"], c[2]: ab["concurrency"],
                      c[3]: [pct(x) for x in ab["aggregate_output_tps_change_pct"]],
                      c[4]: [pct(x) for x in ab["decode_tps_p50_change_pct"]],
                      c[5]: [pct(x) for x in ab["ttft_p50_s_change_pct"]]})
    return "\n".join(lines), html.table(t, sd.w("speculative.caption"))


def client_overhead_text(sd: StudyData) -> str:
    """Rounds where the client itself may have limited the result (run.json client_limited_levels)."""
    where = []
    for cid in sd.config_ids:
        for lv in sd.runs[cid].get("client_limited_levels") or []:
            where.append(sd.w("client.level", config=cid, level=lv["label"], round=lv["round"] + 1,
                              reasons="; ".join(lv["reasons"])))
    if not where:
        return sd.w("client.ok")
    shown = sd.w("finding.clause_sep").join(where[:6]) + (sd.w("client.more", n=len(where) - 6) if len(where) > 6 else "")
    return sd.w("client.limited", n=len(where), where=shown)


__all__ = ["prefill_fits", "prefill_table", "saturation_table", "goodput_frame", "kv_section", "roofline",
           "roofline_tables", "decode_bounds", "symptom_frame", "symptom_text", "spec_section", "client_overhead_text"]
