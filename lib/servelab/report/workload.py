"""The write-up's workload section: what each bucket's source was (filler, prefix reuse,
sessions, a scaled trace replay), input/output length histograms, prefix-cache hits asked
against measured with TTFT of hits and misses, session turns, open-loop schedule lag, the
reasoning channel's timing, the symptoms that read the hit rate, and the extra rows of the
metric table. Everything is absent (not zero) for a study whose records carry none of it, so
older reports render as before. Not for computing the numbers (`analysis.cache`, `summary`)."""

from __future__ import annotations

from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from ..analysis.cache import cache_levels, cache_symptoms, turn_hits
from . import html
from .fmt import anchor
from .load import StudyData


def _pct_text(v: float) -> str:
    return f"{v * 100:.1f} %"


def _level(row: Any) -> str:
    if row.get("arrival") == "trace" or row.get("source") == "trace":
        return "trace"
    return f"rate={row['rate_rps']:g}/s" if row.get("rate_rps") else f"c={int(row['concurrency'])}"


def has_workload_data(sd: StudyData) -> bool:
    """Whether the study used a workload source beyond the plain filler or measured cache hits."""
    r = sd.records
    if r.empty:
        return False
    if "source" in r and r["source"].isin(["session", "trace"]).any():
        return True
    if "prefix_reuse" in r and r["prefix_reuse"].notna().any():
        return True
    return "reasoning_chunks" in r and bool((r["reasoning_chunks"].fillna(0) > 0).any())


def extra_definitions(sd: StudyData) -> list[tuple[str, str]]:
    """Rows for the metric table, only for metrics this study's records carry."""
    r, w = sd.records, sd.w
    rows: list[tuple[str, str]] = []
    if not r.empty and "cached_tokens" in r and r["cached_tokens"].notna().any():
        rows += [("cached_tokens", w("workload.def.cached_tokens")), ("hit_rate", w("workload.def.hit_rate")),
                 ("ttft_hit_s / ttft_miss_s", w("workload.def.ttft_hit"))]
    if has_workload_data(sd) and "send_lag_s" in r and r["send_lag_s"].notna().any():
        rows.append(("send_lag_s", w("workload.def.send_lag")))
    if not r.empty and "reasoning_chunks" in r and (r["reasoning_chunks"].fillna(0) > 0).any():
        rows += [("content_ttft_s", w("workload.def.content_ttft")),
                 ("reasoning_tokens", w("workload.def.reasoning_tokens"))]
    return rows


def sources_text(sd: StudyData) -> str:
    """One line per bucket: its source and what was asked of it (scaling said for traces)."""
    w = sd.w
    lines = [w("workload.intro")]
    cal = next(iter(sd.runs.values()), {}).get("calibration", {}) if sd.runs else {}
    r = sd.records
    for b in sd.study.workload.buckets:
        c = cal.get(b.label, {})
        if b.trace is not None:
            lines.append(w("workload.bucket_trace", bucket=b.label, path=b.trace.path.split("/")[-1],
                           format=c.get("format", b.trace.format or ""), requests=c.get("requests", "–"),
                           span=f"{c.get('span_s', 0):.1f}", time_scale=f"{b.trace.time_scale:g}",
                           length_scale=f"{b.trace.length_scale:g}", block=c.get("block_tokens", "–")))
        elif b.session is not None:
            s = b.session
            g = r[(r["bucket"] == b.label) & ~r["warmup"]] if "session_id" in r else r.iloc[0:0]
            lines.append(w("workload.bucket_session", bucket=b.label, sessions=g["session_id"].nunique(),
                           kind=s.kind, turns=s.turns, requests=len(g), system=s.system_tokens,
                           input=b.input_tokens, output=b.output_tokens, think=f"{s.think_time_s:g}",
                           answer=w("workload.answer_real" if s.answer == "real" else "workload.answer_stand_in")))
        elif b.prefix_reuse is not None:
            reuse = c.get("reuse_tokens", 0)
            lines.append(w("workload.bucket_reuse", bucket=b.label, input=b.input_tokens, reuse=reuse,
                           share=_pct_text(reuse / b.input_tokens), block=c.get("block_tokens", "–"),
                           output=b.output_tokens))
        else:
            lines.append(w("workload.bucket_filler", bucket=b.label, input=b.input_tokens, output=b.output_tokens))
    return "\n\n".join(lines)


def lengths_figure(sd: StudyData) -> Any:
    """Histograms of input and output tokens per request (measured, successful), by bucket."""
    w = sd.w
    m = sd.records[~sd.records["warmup"] & sd.records["ok"]]
    fig, axes = plt.subplots(1, 2, figsize=(8, 3.4))
    for ax, col, label in ((axes[0], "prompt_tokens", "workload.axis_input"),
                           (axes[1], "output_tokens", "workload.axis_output")):
        v = m[col].dropna().astype(float)
        bins = np.histogram_bin_edges(v, bins=20) if len(v) else 10
        for b, g in m.groupby("bucket", sort=False):
            ax.hist(g[col].dropna().astype(float), bins=bins, alpha=0.6, label=str(b))
        ax.set_xlabel(w(label))
        ax.set_ylabel(w("workload.axis_requests"))
        ax.grid(alpha=0.3)
    handles, names = axes[0].get_legend_handles_labels()
    fig.legend(handles, names, loc="lower center", ncol=min(len(names), 3), fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.12, 1, 1))
    return html.figure(fig, w("workload.fig_lengths"))


def cache_table(sd: StudyData) -> Any:
    t = cache_levels(sd.records, _levels(sd))
    if t.empty:
        return None
    df = pd.DataFrame({
        "c": [sd.labels().get(c, c) for c in t["config"]], "b": t["bucket"],
        "l": [_level(r) for _, r in t.iterrows()],
        "asked": [_pct_text(v) if v == v else "–" for v in t["asked_hit_rate"]],
        "usage": [_pct_text(v) for v in t["usage_hit_rate"]],
        "counters": [_pct_text(v) if v == v else "–" for v in t["counter_hit_rate"]],
        "hm": [f"{h} / {m}" for h, m in zip(t["hit_requests"], t["miss_requests"])],
        "th": t["ttft_hit_p50_s"] * 1000, "tm": t["ttft_miss_p50_s"] * 1000})
    df.columns = sd.w("workload.cache_cols")
    return html.table(df, sd.w("workload.cache_caption"), formats={df.columns[7]: ",.1f", df.columns[8]: ",.1f"})


def _measured(r: Any) -> float:
    """A level's measured hit rate: the server's counters, else the responses' usage."""
    return r["counter_hit_rate"] if r["counter_hit_rate"] == r["counter_hit_rate"] else r["usage_hit_rate"]


def asked_vs_measured(sd: StudyData) -> str:
    """'asked 50 %, the server reports 49.6 %' for every level that asked a hit rate."""
    t = cache_levels(sd.records, _levels(sd))
    if t.empty:
        return ""
    out = []
    for _, r in t[t["asked_hit_rate"].notna()].iterrows():
        out.append(sd.w("workload.asked_vs_measured", bucket=r["bucket"], level=_level(r),
                        asked=_pct_text(r["asked_hit_rate"]), measured=_pct_text(_measured(r))))
    return " ".join(out)


def headline_sentence(sd: StudyData) -> str:
    """The headline's sentence on the asked prefix-cache hits: asked against what the server
    reports, and TTFT of hits against misses where both were measured; "" when nothing was asked."""
    t = cache_levels(sd.records, _levels(sd))
    if t.empty or not t["asked_hit_rate"].notna().any():
        return ""
    asked = t[t["asked_hit_rate"].notna()]
    pairs = sd.w("story.pair_sep").join(sd.w("story.asked_pair", asked=_pct_text(r["asked_hit_rate"]),
                                             measured=_pct_text(_measured(r))) for _, r in asked.iterrows())
    hit = asked[asked["asked_hit_rate"] > 0]["ttft_hit_p50_s"].dropna()
    miss = asked[asked["asked_hit_rate"] == 0]["ttft_miss_p50_s"].dropna()
    ttft = (" " + sd.w("story.hit_ttft", hit=f"{hit.median() * 1000:,.1f}", miss=f"{miss.median() * 1000:,.1f}")
            if len(hit) and len(miss) else "")
    return sd.w("story.asked_hits", pairs=pairs) + ttft


def turns_table(sd: StudyData) -> Any:
    t = turn_hits(sd.records)
    if t.empty:
        return None
    df = pd.DataFrame({"c": [sd.labels().get(c, c) for c in t["config"]], "b": t["bucket"], "t": t["turn"] + 1,
                       "n": t["requests"], "p": t["prompt_tokens_p50"], "s": [_pct_text(v) for v in t["cached_share_p50"]],
                       "ttft": t["ttft_p50_s"] * 1000})
    df.columns = sd.w("workload.turns_cols")
    return html.table(df, sd.w("workload.turns_caption"), formats={df.columns[6]: ",.1f", df.columns[4]: ",.0f"})


def lag_table(sd: StudyData) -> Any:
    r = sd.records
    if "send_lag_s" not in r or "source" not in r:
        return None
    m = r[~r["warmup"] & r["send_lag_s"].notna()]
    if m.empty:
        return None
    rows = []
    for (c, b, lv), g in m.groupby(["config", "bucket", "level"], sort=False):
        lag = g["send_lag_s"].to_numpy(dtype=float) * 1000
        rows.append({"c": sd.labels().get(c, c), "b": b, "l": _level(g.iloc[0]), "n": len(g),
                     "p50": float(np.percentile(lag, 50)), "p99": float(np.percentile(lag, 99)), "max": float(lag.max())})
    df = pd.DataFrame(rows)
    df.columns = sd.w("workload.lag_cols")
    return html.table(df, sd.w("workload.lag_caption"), formats={k: ",.1f" for k in df.columns[4:]})


def reasoning_table(sd: StudyData) -> Any:
    s = sd.summary
    if "content_ttft_p50_s" not in s:
        return None
    s = s[s["content_ttft_p50_s"].notna()]
    df = pd.DataFrame({"c": [sd.labels().get(c, c) for c in s["config"]], "b": s["bucket"],
                       "l": [_level(r) for _, r in s.iterrows()], "t": s["ttft_p50_s"] * 1000,
                       "ct": s["content_ttft_p50_s"] * 1000, "rt": s["reasoning_tokens_p50"]})
    df.columns = sd.w("workload.reasoning_cols")
    return html.table(df, sd.w("workload.reasoning_caption"), formats={df.columns[3]: ",.1f", df.columns[4]: ",.1f"})


def symptoms_text(sd: StudyData) -> str:
    t = cache_levels(sd.records, _levels(sd))
    out = []
    for key, r in cache_symptoms(t):
        out.append(sd.w(key, bucket=r["bucket"], level=_level(r), asked=_pct_text(r["asked_hit_rate"]),
                        measured=_pct_text(r["measured_hit_rate"]), hit=f"{r['ttft_hit_p50_s'] * 1000:,.0f}",
                        miss=f"{r['ttft_miss_p50_s'] * 1000:,.0f}"))
    return "\n\n".join(out)


def _levels(sd: StudyData) -> list[dict[str, Any]]:
    out = []
    for cid, rf in sd.folders.items():
        out += [{**lv, "config": cid} for lv in rf.jsonl("levels.jsonl")]
    return out


def section(sd: StudyData) -> tuple[str, list[Any]]:
    """(markdown, items) of the workload section, items being tables, figures and markdown
    strings in reading order; ("", []) when there is none."""
    if not has_workload_data(sd):
        return "", []
    w = sd.w
    text = f"{anchor('workload', w('section.workload'))}\n\n{sources_text(sd)}"
    items: list[Any] = [lengths_figure(sd)]
    cache = cache_table(sd)
    if cache is not None:
        items.append(f"### {w('workload.cache_heading')}\n\n{w('workload.cache_text')} {asked_vs_measured(sd)}")
        items.append(cache)
    items += [t for t in (turns_table(sd), lag_table(sd), reasoning_table(sd)) if t is not None]
    sym = symptoms_text(sd)
    if sym:
        items.append(sym)
    return text, items
