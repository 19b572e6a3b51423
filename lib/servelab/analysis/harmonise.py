"""Harmonised metrics: another tool's per-request data recomputed under servelab's definitions, its
own figure beside each, and the difference explained where the definitions differ.

The definitions table (`data/tool_definitions.yaml`, validated by `schema.tools`) lists, per tool,
the figures it reports: which servelab metric each stands for, with what statistic, and whether
its definition is servelab's. `recompute_per_request` applies servelab's per-request definitions
(decode tok/s = (out - 1) / (e2e - ttft), TPOT its inverse, E2E tok/s = out / e2e) to imported
records; `harmonised_rows` puts, for every level and round (one run of the tool), each figure of the
tool beside servelab's recomputation from the same requests: with servelab's statistic (linear
percentiles), and with the tool's own where its percentiles differ (so a reader sees whether the
per-request values or only the statistic differ). A difference above the figure's tolerance (2 %)
is explained by the table's `why`; one with the same definition is flagged `unexplained`.
Not for reading the tools' files (`analysis.peers`, `analysis.sglang_bench`, `analysis.aiperf`)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from ..schema import ParamsError
from ..schema.tools import Tool, ToolDefinitions, load_tool_definitions
from ..summary import DEFINED_METRICS, itl_values, round_throughput

COLUMNS = ["tool", "bucket", "concurrency", "round", "metric", "field", "label", "stat", "tool_value", "servelab",
           "servelab_tool_stat", "diff_pct", "same", "within", "reason", "requests"]


def definitions() -> ToolDefinitions:
    """The definitions table, its `servelab:` block held to the metrics servelab defines."""
    d = load_tool_definitions()
    if set(d.servelab) != set(DEFINED_METRICS):
        raise ParamsError(f"tool_definitions.yaml: servelab: defines {sorted(d.servelab)}, servelab's metrics are "
                          f"{sorted(DEFINED_METRICS)}")
    return d


def recompute_per_request(df: pd.DataFrame) -> pd.DataFrame:
    """decode_tps, tpot_s and e2e_output_tps of every successful request from its ttft_s, e2e_s and
    output_tokens, by servelab's definitions (NaN where a request has fewer than 2 tokens or no
    decode time); whatever the importer had put there is replaced."""
    df = df.copy()
    out = pd.to_numeric(df["output_tokens"], errors="coerce")
    ttft = pd.to_numeric(df["ttft_s"], errors="coerce")
    e2e = pd.to_numeric(df["e2e_s"], errors="coerce")
    ok = df["ok"].astype(bool)
    decode_time = e2e - ttft
    good = ok & (out > 1) & (decode_time > 0)
    df["decode_tps"] = ((out - 1) / decode_time).where(good)
    df["tpot_s"] = (decode_time / (out - 1)).where(good)
    df["e2e_output_tps"] = (out / e2e).where(ok & (out > 0) & (e2e > 0))
    return df


def drop_role_chunk(df: pd.DataFrame) -> pd.DataFrame:
    """`vllm bench serve` on a chat endpoint times its TTFT at the first chunk with a non-empty
    `choices` list: the role-only chunk, before any text. Where a request has one chunk more than
    output tokens, the first is that chunk: servelab's TTFT is the second (the first carrying text)
    and its pooled ITL leaves out the gap between the two."""
    df = df.copy()
    ct = []
    ttft = []
    for t, out, ok, old in zip(df["chunk_times_s"], df["output_tokens"], df["ok"], df["ttft_s"]):
        if ok and isinstance(t, list) and out and len(t) == int(out) + 1:
            t = t[1:]
            old = t[0]
        ct.append(t)
        ttft.append(old)
    df["chunk_times_s"], df["ttft_s"] = ct, ttft
    return df


def _values(g: pd.DataFrame, metric: str) -> np.ndarray:
    ok = g[g["ok"].astype(bool)]
    if metric == "itl_s":
        return itl_values(g)
    return pd.to_numeric(ok[metric], errors="coerce").dropna().to_numpy(dtype=float)


def statistic(values: np.ndarray, stat: str, method: str = "linear") -> float:
    """p50 / p95 or mean; NaN if empty. `method` linear: numpy's default, servelab's; inverted_cdf:
    GuideLLM's (`DistributionSummary.from_values`): the first distinct value whose cumulative share,
    summed in floating point, reaches p (a float sum of 1/12 twelve times falls short of 0.5 after
    six, so with 12 requests its median is the 7th value)."""
    if not len(values):
        return math.nan
    if stat == "mean":
        return float(np.mean(values))
    q = {"p50": 0.50, "p95": 0.95}[stat]
    if method == "inverted_cdf":
        u, counts = np.unique(np.asarray(values, dtype=float), return_counts=True)
        cdf = np.cumsum(counts / counts.sum())
        return float(u[min(int(np.searchsorted(cdf, q, side="left")), len(u) - 1)])
    return float(np.percentile(values, q * 100, method=method))


def recomputed(g: pd.DataFrame, metric: str, stat: str, method: str = "linear") -> float:
    """servelab's value of `metric` over one round's measured records `g` (recompute_per_request done):
    a statistic of the per-request values, or for `value` metrics the round's one number."""
    g = g[~g["warmup"].astype(bool)]
    if metric == "aggregate_output_tps":
        rt = round_throughput(g)
        return float(rt["aggregate_output_tps"].iloc[0]) if len(rt) == 1 else math.nan
    if metric == "success_rate":
        return float(g["ok"].mean()) if len(g) else math.nan
    return statistic(_values(g, metric), "mean" if stat == "value" else stat, method)


def _no_decode_time(g: pd.DataFrame) -> int:
    """Successful requests of more than one token with no time after their first chunk: the whole output
    came in one chunk (a client too busy to read the stream as it came), so decode tok/s is undefined."""
    ok = g[g["ok"].astype(bool)]
    out = pd.to_numeric(ok["output_tokens"], errors="coerce")
    dt = pd.to_numeric(ok["e2e_s"], errors="coerce") - pd.to_numeric(ok["ttft_s"], errors="coerce")
    return int(((out > 1) & (dt <= 0)).sum())


def _diff_pct(tool_value: Any, ours: float) -> float:
    if tool_value is None or not math.isfinite(ours) or ours == 0:
        return math.nan
    return (float(tool_value) / ours - 1.0) * 100.0


def harmonised_rows(df: pd.DataFrame, reported: Mapping[tuple[str, int, int], Mapping[str, Any]], tool: Tool
                    ) -> pd.DataFrame:
    """One row per (level, round, figure of `tool`) and per metric its data cannot give: the tool's
    figure (None without its summary), servelab's recomputation from the same requests, the
    difference in percent, whether it is within the figure's tolerance, and the reason when not.
    `reported`: (bucket, concurrency, round) -> the tool's figures of that run (`<name>.<stat>`)."""
    df = recompute_per_request(df)
    rows = []
    for (bucket, conc, rnd), g in df[~df["warmup"].astype(bool)].groupby(["bucket", "concurrency", "round"], sort=True):
        rep = reported.get((bucket, int(conc), int(rnd))) or {}
        base = {"tool": tool.tool, "bucket": bucket, "concurrency": int(conc), "round": int(rnd), "requests": len(g)}
        for f in tool.figures:
            ours = recomputed(g, f.metric, f.stat)
            tool_stat = (recomputed(g, f.metric, f.stat, tool.percentiles)
                         if tool.percentiles != "linear" and f.stat in ("p50", "p95") else ours)
            tv = rep.get(f.field)
            d = _diff_pct(tv, ours)
            within = bool(math.isfinite(d) and abs(d) <= f.tolerance_pct) if tv is not None else None
            stuck = _no_decode_time(g)
            if tv is None:
                reason = "not in the tool's summary (no summary beside the file)" if not rep else "not reported"
            elif within:
                reason = None
            elif not f.same:
                reason = f.why
            elif f.no_decode_why and stuck:
                reason = f"{f.no_decode_why} ({stuck} of {len(g)} requests in this run)"
            else:
                reason = "unexplained: the definitions are the same"
            rows.append({**base, "metric": f.metric, "field": f.field, "label": f.label, "stat": f.stat,
                         "tool_value": None if tv is None else float(tv), "servelab": ours,
                         "servelab_tool_stat": tool_stat, "diff_pct": d, "same": f.same, "within": within,
                         "reason": reason})
        for metric, why in tool.not_recomputable.items():
            rows.append({**base, "metric": metric, "field": None, "label": None, "stat": None, "tool_value": None,
                         "servelab": math.nan, "servelab_tool_stat": math.nan, "diff_pct": math.nan, "same": None,
                         "within": None, "reason": f"cannot be recomputed: {why}"})
    return pd.DataFrame(rows, columns=COLUMNS)


def not_recomputable(tool: Tool) -> dict[str, str]:
    """servelab metrics this tool's per-request data cannot give, and why."""
    return dict(tool.not_recomputable)


def unexplained(rows: pd.DataFrame) -> pd.DataFrame:
    """Rows whose difference exceeds the tolerance without a definitional reason."""
    if rows.empty:
        return rows
    return rows[rows["reason"].fillna("").str.startswith("unexplained")]


__all__ = ["COLUMNS", "definitions", "drop_role_chunk", "harmonised_rows", "not_recomputable", "recompute_per_request",
           "recomputed", "statistic", "unexplained"]
