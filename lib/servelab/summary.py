"""Per-level summaries of raw records: a pure function of `records.jsonl`.

One row per (configuration, bucket, concurrency): TTFT p50/p95, E2E, per-request decode
and E2E tok/s, aggregate output tok/s per round (median and range across measured rounds),
success rate, failures by reason, actual prompt and output tokens. Warmup rounds are
excluded. Not for plotting or prose (`plots`, `report`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

LEVEL_KEYS = ["config", "bucket", "target_input_tokens", "target_output_tokens", "concurrency", "rate_rps"]

# Tag every exported metric with its definition (design.md); the report prints this table.
DEFINITIONS: dict[str, str] = {
    "ttft_s": "client start (just before the HTTP request is sent) -> first SSE chunk carrying generated text",
    "e2e_s": "client start -> last chunk ([DONE])",
    "output_tokens": "server usage.completion_tokens (stream_options.include_usage), never the requested max",
    "e2e_output_tps": "output_tokens / e2e_s (seed 001 'E2E output tok/sec')",
    "decode_tps": "(output_tokens - 1) / (e2e_s - ttft_s) (seed 001 'Decode output tok/sec')",
    "tpot_s": "1 / decode_tps",
    "itl_s": "every gap between text-carrying chunks, pooled over requests",
    "aggregate_output_tps": "sum(output_tokens of successful requests in a round) / round wall time "
                            "(first send -> last end); median and range across measured rounds",
    "success_rate": "succeeded / sent, measured rounds only",
}


def _pct(s: pd.Series, q: float) -> float:
    s = s.dropna()
    return float(np.percentile(s, q)) if len(s) else float("nan")


def _with_level_keys(df: pd.DataFrame) -> pd.DataFrame:
    if not df.empty and "rate_rps" not in df:
        df = df.assign(rate_rps=0.0)  # closed-loop records from before open-loop arrivals existed
    return df


def round_throughput(df: pd.DataFrame) -> pd.DataFrame:
    """Aggregate output tok/s of each measured round: one row per (level, round)."""
    df = _with_level_keys(df)
    if df.empty:
        return pd.DataFrame(columns=LEVEL_KEYS + ["round", "wall_s", "output_tokens_sum", "aggregate_output_tps"])
    m = df[~df["warmup"]]
    rows = []
    for key, g in m.groupby(LEVEL_KEYS + ["round"], sort=False):
        wall = float(g["end_s"].max() - g["start_s"].min())
        tokens = float(g.loc[g["ok"], "output_tokens"].sum())
        rows.append(dict(zip(LEVEL_KEYS + ["round"], key), wall_s=wall, output_tokens_sum=tokens,
                         aggregate_output_tps=tokens / wall if wall > 0 else float("nan")))
    return pd.DataFrame(rows)


def itl_values(g: pd.DataFrame) -> np.ndarray:
    gaps = [np.diff(t) for t in g.loc[g["ok"], "chunk_times_s"] if isinstance(t, list) and len(t) > 1]
    return np.concatenate(gaps) if gaps else np.array([])


def summarize(df: pd.DataFrame) -> pd.DataFrame:
    """One row per level (configuration x bucket x concurrency) of measured requests."""
    df = _with_level_keys(df)
    if df.empty:
        return pd.DataFrame()
    rt = round_throughput(df)
    m = df[~df["warmup"]]
    rows: list[dict[str, Any]] = []
    for key, g in m.groupby(LEVEL_KEYS, sort=False):
        ok = g[g["ok"]]
        r = rt
        for k, v in zip(LEVEL_KEYS, key):
            r = r[r[k] == v]
        itl = itl_values(g)
        fails = g.loc[~g["ok"], "error_kind"].value_counts().to_dict()
        agg = r["aggregate_output_tps"].dropna()
        rows.append({
            **dict(zip(LEVEL_KEYS, key)),
            "rounds": int(r.shape[0]),
            "sent": int(len(g)),
            "ok": int(len(ok)),
            "success_rate": len(ok) / len(g) if len(g) else float("nan"),
            "failures": ", ".join(f"{k}={v}" for k, v in sorted(fails.items())) or "",
            "prompt_tokens": float(ok["prompt_tokens"].median()) if len(ok) else float("nan"),
            "output_tokens_p50": float(ok["output_tokens"].median()) if len(ok) else float("nan"),
            "ttft_p50_s": _pct(ok["ttft_s"], 50),
            "ttft_p95_s": _pct(ok["ttft_s"], 95),
            "ttft_p99_s": _pct(ok["ttft_s"], 99),
            "e2e_p50_s": _pct(ok["e2e_s"], 50),
            "e2e_p95_s": _pct(ok["e2e_s"], 95),
            "e2e_output_tps_p50": _pct(ok["e2e_output_tps"], 50),
            "decode_tps_p50": _pct(ok["decode_tps"], 50),
            "tpot_p50_s": _pct(ok["tpot_s"], 50),
            "tpot_p95_s": _pct(ok["tpot_s"], 95),
            "itl_p50_s": float(np.percentile(itl, 50)) if len(itl) else float("nan"),
            "itl_p95_s": float(np.percentile(itl, 95)) if len(itl) else float("nan"),
            "aggregate_output_tps": float(agg.median()) if len(agg) else float("nan"),
            "aggregate_output_tps_min": float(agg.min()) if len(agg) else float("nan"),
            "aggregate_output_tps_max": float(agg.max()) if len(agg) else float("nan"),
        })
    return pd.DataFrame(rows)


def format_table(s: pd.DataFrame) -> str:
    """The summary as a fixed-width text table for the terminal."""
    if s.empty:
        return "(no measured requests)"
    cols = {
        "config": "config", "bucket": "bucket", "concurrency": "c", "prompt_tokens": "in_tok",
        "output_tokens_p50": "out_tok", "ttft_p50_s": "TTFT p50 ms", "ttft_p95_s": "TTFT p95 ms",
        "decode_tps_p50": "decode tok/s", "e2e_output_tps_p50": "E2E tok/s",
        "aggregate_output_tps": "agg tok/s", "agg_range": "agg range", "success_rate": "ok %",
    }
    t = s.copy()
    t["ttft_p50_s"] *= 1000
    t["ttft_p95_s"] *= 1000
    t["success_rate"] *= 100
    t["agg_range"] = [f"{a:.1f}-{b:.1f}" for a, b in zip(t["aggregate_output_tps_min"], t["aggregate_output_tps_max"])]
    failed = (t["ok"] == 0).to_numpy() if "ok" in t else np.zeros(len(t), dtype=bool)
    t = t[list(cols)].rename(columns=cols).astype(object)
    for c in t.columns[3:]:  # measured columns: numbers as text, nothing where no request succeeded
        t[c] = [f"{v:.1f}" if isinstance(v, float) else str(v) for v in t[c]]
        if c != cols["success_rate"]:
            t.loc[failed, c] = "-"
    if failed.any():
        # a level without one successful request has no metric to show: it says that it failed, and how
        t["note"] = ["level failed: no successful request (" + (f or "no request sent") + ")" if bad else ""
                     for bad, f in zip(failed, s["failures"])]
    return t.to_string(index=False)
