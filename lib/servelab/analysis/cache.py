"""Prefix-cache hits per level, from what the server said: each response's
`usage.prompt_tokens_details.cached_tokens` (vLLM with --enable-prompt-tokens-details, SGLang
with --enable-cache-report) and, as a check, the server's own counters over the level's
measured rounds (vLLM `prefix_cache_hits_total / prefix_cache_queries_total`, noted by the
runner in levels.jsonl). Beside them: the hit rate the workload asked for (`prefix_reuse`), and
TTFT split into requests that hit the cache and requests that missed it (the two have
different latencies, so they are measured apart). A run without cached-token data has no rows
here, never zeros. Not for sending requests or KV residency (`kv`)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

KEYS = ["config", "bucket", "concurrency", "rate_rps"]


def _pct(s: pd.Series, q: float) -> float:
    s = s.dropna()
    return float(np.percentile(s, q)) if len(s) else float("nan")


def has_cache_data(records: pd.DataFrame) -> bool:
    """Whether any measured response reported its cached prompt tokens."""
    return (not records.empty and "cached_tokens" in records
            and records.loc[~records["warmup"].astype(bool), "cached_tokens"].notna().any())


def cache_levels(records: pd.DataFrame, levels: list[dict[str, Any]] | None = None) -> pd.DataFrame:
    """One row per level with cached-token data: asked share (prefix_reuse, NaN if not set),
    usage share (sum cached / sum prompt tokens), the counters' share (NaN without counters),
    requests that hit (cached_tokens > 0) and missed, and TTFT p50/p95 of each."""
    if not has_cache_data(records):
        return pd.DataFrame()
    m = records[~records["warmup"].astype(bool) & records["ok"].astype(bool) & records["cached_tokens"].notna()]
    by_level = {(lv.get("config"), lv["level"]): lv for lv in levels or [] if "prefix_cache_queries" in lv}
    rows = []
    for key, g in m.groupby(KEYS + ["level"], sort=False):
        d = dict(zip(KEYS + ["level"], key))
        cached, prompt = g["cached_tokens"].astype(float), g["prompt_tokens"].astype(float)
        hit = g[cached > 0]
        miss = g[cached <= 0]
        asked = g["prefix_reuse"].dropna() if "prefix_reuse" in g else pd.Series(dtype=float)
        lv = by_level.get((d["config"], d["level"])) or by_level.get((None, d["level"]))
        counters = (lv["prefix_cache_hits"] / lv["prefix_cache_queries"]
                    if lv and lv.get("prefix_cache_queries") else float("nan"))
        rows.append({**d, "source": g["source"].iloc[0] if "source" in g else "filler",
                     "requests": len(g), "asked_hit_rate": float(asked.iloc[0]) if len(asked) else float("nan"),
                     "usage_hit_rate": float(cached.sum() / prompt.sum()) if prompt.sum() else float("nan"),
                     "counter_hit_rate": float(counters), "hit_requests": len(hit), "miss_requests": len(miss),
                     "ttft_hit_p50_s": _pct(hit["ttft_s"], 50), "ttft_miss_p50_s": _pct(miss["ttft_s"], 50),
                     "ttft_hit_p95_s": _pct(hit["ttft_s"], 95), "ttft_miss_p95_s": _pct(miss["ttft_s"], 95)})
    return pd.DataFrame(rows)


def turn_hits(records: pd.DataFrame) -> pd.DataFrame:
    """Sessions: per (config, bucket, turn) the median cached share of the prompt and TTFT p50,
    so later turns can be seen reusing the history. Empty without session records."""
    if records.empty or "turn" not in records or not has_cache_data(records):
        return pd.DataFrame()
    m = records[~records["warmup"].astype(bool) & records["ok"].astype(bool) & records["turn"].notna()]
    rows = []
    for (c, b, t), g in m.groupby(["config", "bucket", "turn"], sort=True):
        share = g["cached_tokens"].astype(float) / g["prompt_tokens"].astype(float)
        rows.append({"config": c, "bucket": b, "turn": int(t), "requests": len(g),
                     "prompt_tokens_p50": float(g["prompt_tokens"].median()),
                     "cached_share_p50": float(share.median()), "ttft_p50_s": _pct(g["ttft_s"], 50)})
    return pd.DataFrame(rows)


# A level asked a hit rate and got this many points less (server counters, else usage).
MISSED_TARGET_POINTS = 0.10


def cache_symptoms(levels: pd.DataFrame) -> list[tuple[str, dict[str, Any]]]:
    """Findings from the hit rate, as (i18n key, values): an asked rate missed by more than
    MISSED_TARGET_POINTS (evicted or misaligned prefix), and hits that were not faster to the
    first token than misses at the same level (queueing dominates the prefill saved)."""
    out: list[tuple[str, dict[str, Any]]] = []
    for _, r in levels.iterrows() if not levels.empty else []:
        measured = r["counter_hit_rate"] if r["counter_hit_rate"] == r["counter_hit_rate"] else r["usage_hit_rate"]
        d = {**r.to_dict(), "measured_hit_rate": measured}
        if r["asked_hit_rate"] == r["asked_hit_rate"] and measured < r["asked_hit_rate"] - MISSED_TARGET_POINTS:
            out.append(("workload.symptom_missed_target", d))
        if (r["source"] == "filler" and r["hit_requests"] and r["miss_requests"]
                and r["ttft_hit_p50_s"] >= r["ttft_miss_p50_s"]):
            out.append(("workload.symptom_hits_not_faster", d))
    return out
