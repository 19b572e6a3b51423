"""Per-level summaries of raw records: a pure function of `records.jsonl`.

One row per (configuration, bucket, concurrency): TTFT p50/p95, E2E, per-request decode
and E2E tok/s, aggregate output tok/s per round (median and range across measured rounds),
success rate, failures by reason, actual prompt and output tokens. Warm-up rounds and rounds the
interleaved runner found disturbed (`measure.interleave`: their records carry `disturbed`, and the
round was measured again as a new `attempt`) are excluded. Not for plotting or prose (`plots`, `report`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import pandas as pd


# prompt_set: "" for the calibrated filler, else the shipped set's name (target_input_tokens 0).
LEVEL_KEYS = ["config", "bucket", "target_input_tokens", "target_output_tokens", "concurrency", "rate_rps",
              "prompt_set"]

#: every exported metric the report defines (its words: report/i18n/setup.yaml `definition.<metric>`)
DEFINED_METRICS = ("ttft_s", "e2e_s", "output_tokens", "e2e_output_tps", "decode_tps", "tpot_s", "itl_s",
                   "aggregate_output_tps", "success_rate")


def _pct(s: pd.Series, q: float) -> float:
    s = s.dropna()
    return float(np.percentile(s, q)) if len(s) else float("nan")


def _with_level_keys(df: pd.DataFrame) -> pd.DataFrame:
    if not df.empty and "rate_rps" not in df:
        df = df.assign(rate_rps=0.0)  # closed-loop records from before open-loop arrivals existed
    if not df.empty:  # filler records carry no prompt_set; a NaN group key would drop them
        df = df.assign(prompt_set=df["prompt_set"].fillna("") if "prompt_set" in df else "")
    return df


def measured(df: pd.DataFrame) -> pd.DataFrame:
    """The records a result is computed from: not warm-up, not a disturbed attempt of a round."""
    keep = ~df["warmup"].astype(bool)
    if "disturbed" in df:
        keep &= df["disturbed"].isna() | df["disturbed"].isin([False, ""])
    return df[keep]


WARMING_RATIO = 1.25  # a level's first measured TTFT over its last, all falling, that reads as still warming up
WARMING_MIN_S = 0.005  # and by at least this much (less is what a client's first connection costs)


def still_warming(ttfts: list[float]) -> bool:
    """A level's TTFTs, in the order its requests ran, that read as a server still warming up (as one does just after
    it starts): three or more, each shorter than the one before, the first at least `WARMING_RATIO` x the last and
    `WARMING_MIN_S` longer."""
    t = [x for x in ttfts if x == x]
    return (len(t) >= 3 and all(a > b for a, b in zip(t, t[1:])) and t[0] >= WARMING_RATIO * t[-1]
            and t[0] - t[-1] >= WARMING_MIN_S)


ONE_LENGTH_RATIO = 1.1  # a level's prompts within this of each other count as one length


def one_prompt_length(tokens: list[float]) -> bool:
    """Whether a level's prompt token counts (unknown ones left out) are one length, the longest within
    `ONE_LENGTH_RATIO` x the shortest: only then do falling or stepping TTFTs say something of the server, not of
    the prompts (a prompt set's shorter prompts take less time)."""
    n = [x for x in tokens if x and x == x]
    return not n or max(n) <= ONE_LENGTH_RATIO * min(n)


def speed_step(ttfts: list[float]) -> int | None:
    """Where a level's TTFTs, in the order its requests ran, changed speed partway through (a host or GPU slowed
    down or sped up, as h100-mla-holdout's 128-token level did: 19.6, 19.4, then 29-32 ms): the index k that splits
    them into two runs of two or more requests, every one of one run at least `WARMING_RATIO` x and `WARMING_MIN_S`
    longer than every one of the other; None where there is no such step. A median across it is neither speed."""
    t = [x for x in ttfts if x == x]
    for k in range(2, len(t) - 1):
        a, b = t[:k], t[k:]
        for lo, hi in ((a, b), (b, a)):
            if min(hi) >= WARMING_RATIO * max(lo) and min(hi) - max(lo) >= WARMING_MIN_S:
                return k
    return None


def _attempts(df: pd.DataFrame) -> pd.DataFrame:
    """`attempt` as a column (0 where a record predates re-measured rounds)."""
    return df.assign(attempt=df["attempt"].fillna(0).astype(int) if "attempt" in df else 0)


#: the record fields `decode_tps_steady` reads (a round's records are handed to it as dicts of these alone: the
#: other columns, the text chunks among them, cost most of `round_throughput`'s time to convert and are not read)
STEADY_FIELDS = ("ok", "start_s", "ttft_s", "e2e_s", "output_tokens", "chunk_times_s", "chunk_tokens")

ROUND_COLUMNS = ["round", "attempt", "wall_s", "output_tokens_sum", "aggregate_output_tps", "decode_tps_mean_tpot",
                 "decode_tps_steady", "ttft_p50_s", "requests"]


def round_throughput(df: pd.DataFrame) -> pd.DataFrame:
    """Aggregate output tok/s, the per-request decode tok/s and TTFT p50 of each measured round (each
    attempt of a re-measured round is its own row): one row per (level, round, attempt). The decode
    speed of a round is 1 / its requests' mean TPOT (vllm bench serve's "Mean TPOT"; `decode_tps_of_round`),
    and the same without the token gaps in which the engine prefilled the round's first requests
    (`decode_tps_steady`, the verdicts' decode metric)."""
    df = _with_level_keys(df)
    if df.empty:
        return pd.DataFrame(columns=LEVEL_KEYS + ROUND_COLUMNS)
    m = _attempts(measured(df))
    steady = [c for c in STEADY_FIELDS if c in m]
    rows = []
    for key, g in m.groupby(LEVEL_KEYS + ["round", "attempt"], sort=False):
        wall = float(g["end_s"].max() - g["start_s"].min())
        ok = g[g["ok"]]
        tokens = float(ok["output_tokens"].sum())
        rows.append(dict(zip(LEVEL_KEYS + ["round", "attempt"], key), wall_s=wall, output_tokens_sum=tokens,
                         aggregate_output_tps=tokens / wall if wall > 0 else float("nan"),
                         decode_tps_mean_tpot=decode_tps_of_round(ok["decode_tps"]) if "decode_tps" in ok else float("nan"),
                         decode_tps_steady=decode_tps_steady(ok[steady].to_dict("records"),
                                                             round_wave(g["concurrency"].iloc[0], g["rate_rps"].iloc[0])),
                         ttft_p50_s=_pct(ok["ttft_s"], 50), requests=int(len(g))))
    return pd.DataFrame(rows)


def decode_tps_of_round(decode_tps: Iterable[Any]) -> float:
    """A round's per-request decode speed: 1 / the mean TPOT of its requests (the harmonic mean of their
    decode tok/s). Not the median: with several requests in flight, which of them the engine prefills
    first (one then three, or two and two) moves the median of four by 12-25 % from round to round and
    their mean TPOT by 2.5-5 % (SmolLM2 on vLLM CPU, c=4, 2026-12-05). NaN without a positive value."""
    v = [float(x) for x in decode_tps if x is not None and math.isfinite(float(x)) and float(x) > 0]
    return len(v) / sum(1.0 / x for x in v) if v else float("nan")


def _field(r: Any, k: str) -> Any:
    v = r.get(k) if isinstance(r, Mapping) else getattr(r, k, None)
    return None if v is None or (isinstance(v, float) and math.isnan(v)) else v


def steady_tpot_s(r: Any, others_first_s: Iterable[float], tol_s: float) -> float | None:
    """One request's TPOT without the token gaps in which the engine prefilled another request: its
    decode time (e2e - TTFT) and decode tokens (output - 1), less each gap between two of its text
    chunks that ends where another request got its first token (`others_first_s`, on the same clock
    as `start_s`; within `tol_s` after the gap's end: the same engine step, parsed a little later).
    A gap's tokens come from `chunk_tokens` (continuous usage stats), else one per chunk when the
    chunks are the tokens, else spread evenly over the chunks. With nobody else in flight, `tpot_s`."""
    times, n = _field(r, "chunk_times_s") or [], _field(r, "output_tokens")
    ttft, e2e, start = _field(r, "ttft_s"), _field(r, "e2e_s"), _field(r, "start_s") or 0.0
    if not n or n < 2 or ttft is None or e2e is None or e2e <= ttft or not times:
        return None
    toks = list(_field(r, "chunk_tokens") or [])
    if len(toks) != len(times):
        per = 1.0 if len(times) == n else (n - 1) / max(len(times) - 1, 1)
        toks = [1.0 + per * k for k in range(len(times))]
    t = np.asarray(times, dtype=float) + float(start)
    stalled: set[int] = set()
    for f in others_first_s:
        if t[0] < f <= t[-1] + tol_s:  # started after this one's first token, before its last
            stalled.add(int(np.searchsorted(t, f - tol_s, side="left")))
    stalled.discard(0)
    gap_s = sum(t[k] - t[k - 1] for k in stalled)
    gap_tokens = sum(toks[k] - toks[k - 1] for k in stalled)
    dt, dn = (e2e - ttft) - gap_s, (n - 1) - gap_tokens
    return dt / dn if dt > 0 and dn > 0 else None


def decode_tps_steady(records: Iterable[Any], wave: int | None = None) -> float:
    """A round's per-request decode speed after its start: 1 / the mean of its requests'
    `steady_tpot_s`, without the gaps in which the engine prefilled the round's first `wave` requests
    (the first to start: a closed-loop level's concurrency; None: all of them; 0: none, the mean TPOT).
    A round starts with `wave` requests at once, and the engine prefills them in groups that change
    from round to round (one then three, two and two, four at once): the request prefilled first waits
    for the others, 40 ms TPOT or 74 ms for the same request (SmolLM2 on vLLM CPU, c=4, 2026-12-05).
    The prefills of requests that replace finished ones later in the round stay in: they are the load.
    At one in flight it is `decode_tps_of_round`. NaN without a value."""
    ok = sorted((r for r in records if _field(r, "ok") is not False), key=lambda r: _field(r, "start_s") or 0.0)
    gaps = [np.diff(_field(r, "chunk_times_s")) for r in ok if len(_field(r, "chunk_times_s") or []) > 1]
    tol = 0.5 * float(np.median(np.concatenate(gaps))) if gaps else 0.0
    first = [(i, (_field(r, "start_s") or 0.0) + _field(r, "ttft_s")) for i, r in enumerate(ok[:wave])
             if _field(r, "ttft_s") is not None]
    tpots = [steady_tpot_s(r, [f for j, f in first if j != i], tol) for i, r in enumerate(ok)]
    v = [x for x in tpots if x is not None and x > 0]
    return len(v) / sum(v) if v else float("nan")


def round_wave(concurrency: Any, rate_rps: Any) -> int:
    """How many requests start a round together: a closed-loop level's concurrency, none open-loop."""
    closed = not rate_rps or (isinstance(rate_rps, float) and math.isnan(rate_rps))
    return int(concurrency) if closed and concurrency else 0


def itl_values(g: pd.DataFrame) -> np.ndarray:
    gaps = [np.diff(t) for t in g.loc[g["ok"], "chunk_times_s"] if isinstance(t, list) and len(t) > 1]
    return np.concatenate(gaps) if gaps else np.array([])


SPEC_COLUMNS = ("spec_acceptance_rate", "spec_mean_accepted_len", "spec_draft_tokens_per_s",
                "spec_accepted_per_position")


def spec_rates(counters: Mapping[str, Any] | None, seconds: float | None = None) -> dict[str, Any]:
    """Speculative decoding from counter increments (`measure.metrics.delta`): acceptance rate =
    accepted / draft tokens; mean accepted length = 1 + accepted / drafts (tokens per verify step,
    bonus included: vLLM's convention, vllm/v1/spec_decode/metrics.py); draft tokens per second;
    acceptance per draft position = accepted at that position / drafts. NaN (None for the list)
    when nothing was drafted: the configuration does not speculate."""
    c = counters or {}

    def num(name: str) -> float:
        v = c.get(name)
        return float(v) if v is not None else float("nan")

    drafts, dtok, acc = num("spec_drafts_total"), num("spec_draft_tokens_total"), num("spec_accepted_tokens_total")
    out: dict[str, Any] = {k: float("nan") for k in SPEC_COLUMNS}
    out["spec_accepted_per_position"] = None
    if not dtok > 0:
        return out
    out["spec_acceptance_rate"] = acc / dtok
    if seconds:
        out["spec_draft_tokens_per_s"] = dtok / seconds
    if drafts > 0:
        out["spec_mean_accepted_len"] = 1.0 + acc / drafts
        pos = c.get("spec_accepted_per_pos_total")
        if pos:
            out["spec_accepted_per_position"] = [float(v) / drafts for v in pos]
    return out


def _level_counters(levels: Any) -> dict[tuple[str, int], dict[str, Any]]:
    """(config, level index) -> levels.jsonl row, for rows that carry engine counters."""
    rows = levels.to_dict("records") if isinstance(levels, pd.DataFrame) else list(levels or [])
    return {(str(r.get("config")), int(r["level"])): r for r in rows if r.get("counters") is not None}


def summarize(df: pd.DataFrame, levels: Any = None, rounds: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per level (configuration x bucket x concurrency) of measured requests. `levels`
    (rows of levels.jsonl with their `config`) adds the engine's counters per level: the
    speculative-decoding columns (`spec_rates`); without them those columns are NaN. `rounds`:
    `round_throughput(df)` where the caller has it already (computed here otherwise)."""
    df = _with_level_keys(df)
    if df.empty:
        return pd.DataFrame()
    rt = round_throughput(df) if rounds is None else rounds
    m = measured(df)
    counters = _level_counters(levels)
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
            "output_tokens_p95": _pct(ok["output_tokens"], 95),  # varies when a bucket stops at end-of-sequence
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
            **_spec_of(counters, str(key[0]), g),
            **_workload_columns(g, ok),
        })
    return pd.DataFrame(rows)


def _spec_of(counters: dict[tuple[str, int], dict[str, Any]], config: str, g: pd.DataFrame) -> dict[str, Any]:
    row = counters.get((config, int(g["level"].iloc[0]))) if counters and "level" in g else None
    return spec_rates(row.get("counters"), row.get("measured_s")) if row else spec_rates(None)


def _workload_columns(g: pd.DataFrame, ok: pd.DataFrame) -> dict[str, Any]:
    """Columns that exist only when the records carry their data (absent, never 0, otherwise):
    cached-token share and TTFT of hits and misses; time to the first content token and
    reasoning tokens; open-loop schedule lag."""
    out: dict[str, Any] = {}
    if "cached_tokens" in ok and ok["cached_tokens"].notna().any():
        c = ok[ok["cached_tokens"].notna()]
        cached = c["cached_tokens"].astype(float)
        out["cached_share"] = float(cached.sum() / c["prompt_tokens"].sum()) if c["prompt_tokens"].sum() else float("nan")
        out["ttft_hit_p50_s"] = _pct(c.loc[cached > 0, "ttft_s"], 50)
        out["ttft_miss_p50_s"] = _pct(c.loc[cached <= 0, "ttft_s"], 50)
    if "reasoning_chunks" in ok and (ok["reasoning_chunks"].fillna(0) > 0).any():
        out["content_ttft_p50_s"] = _pct(ok["content_ttft_s"], 50)
        rt = ok["reasoning_tokens"] if "reasoning_tokens" in ok else pd.Series(dtype=float)
        out["reasoning_tokens_p50"] = float(rt.median()) if rt.notna().any() else float("nan")
    if "send_lag_s" in g and g["send_lag_s"].notna().any() and "source" in g:
        out["send_lag_p99_s"] = _pct(g["send_lag_s"], 99)
    return out


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
