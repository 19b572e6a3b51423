"""Harmonised metrics: another tool's per-request data recomputed under servelab's definitions, its
own figure beside each, and the difference explained where the definitions differ.

The definitions table (`data/tool_definitions.yaml`, validated by `schema.tools`) lists, per tool,
the figures it reports: which servelab metric each stands for, with what statistic, and whether
its definition is servelab's; where not, the definition that differs, named (`differs`), and how to
recompute the figure by the tool's own definition (`by_tool`). `recompute_per_request` applies
servelab's per-request definitions (decode tok/s = (out - 1) / (e2e - ttft), TPOT its inverse, E2E
tok/s = out / e2e) to imported records; `harmonised_rows` puts, for every level and round (one run of
the tool), each figure of the tool beside servelab's recomputation from the same requests (the
requests the tool measured: those outside its window are flagged `warmup` and left out, as the tool
left them out), and beside the recomputation by the tool's definition. A difference above the
figure's tolerance (2 %) is "definitional (<the definition>)" only when the recomputation by the
tool's definition agrees with the tool; otherwise it is "unexplained", with the numbers. A sampled
report (fewer requests stored than the tool counted) gets servelab's figure only where the sample
supports it; the tool's own figure is quoted, labelled, for the rest.
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
           "servelab_tool_def", "diff_pct", "tool_def_diff_pct", "same", "differs", "within", "reason", "requests",
           "stored", "counted"]
MIN_SAMPLE = 10  # a sampled report's statistic is recomputed from at least this many stored requests
NONE = "none"  # by_tool values: the file does not keep the tool's per-request value


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
    if metric not in ok:
        return np.array([])
    return pd.to_numeric(ok[metric], errors="coerce").dropna().to_numpy(dtype=float)


def _weighted(g: pd.DataFrame, column: str, weights: str | None) -> tuple[np.ndarray, np.ndarray | None]:
    """The successful requests' values of `column` (and their weights: output tokens, or those after
    the first), the rows without one left out."""
    ok = g[g["ok"].astype(bool)]
    if column == "itl_s+role_gap":  # vLLM's pool: servelab's gaps and the role chunk -> first text gap
        if "tool_ttft_s" not in ok or ok["tool_ttft_s"].isna().all():
            return np.array([]), None  # records that do not keep vLLM's own TTFT: not recomputable
        role = (pd.to_numeric(ok["ttft_s"], errors="coerce") - pd.to_numeric(ok["tool_ttft_s"], errors="coerce"))
        return np.concatenate([itl_values(g), role[role > 0].to_numpy(dtype=float)]), None
    if column not in ok:
        return np.array([]), None
    x = pd.to_numeric(ok[column], errors="coerce")
    w = None
    if weights:
        w = pd.to_numeric(ok["output_tokens"], errors="coerce") - (1 if weights == "output_tokens-1" else 0)
    keep = x.notna() & (w.notna() if w is not None else True)
    return x[keep].to_numpy(dtype=float), (w[keep].to_numpy(dtype=float) if w is not None else None)


def statistic(values: np.ndarray, stat: str, method: str = "linear", weights: np.ndarray | None = None) -> float:
    """p50 / p95 or mean; NaN if empty. `method` linear: numpy's default, servelab's; inverted_cdf:
    GuideLLM's (`DistributionSummary.from_values`): the first distinct value whose cumulative share,
    summed in floating point, reaches p (a float sum of 1/12 twelve times falls short of 0.5 after
    six, so with 12 requests its median is the 7th value). `weights`: each value's weight (GuideLLM
    0.4+ weights a request's ITL by its tokens); linear percentiles ignore them."""
    values = np.asarray(values, dtype=float)
    if not len(values):
        return math.nan
    w = np.ones(len(values)) if weights is None else np.asarray(weights, dtype=float)
    if stat == "mean":
        return float(np.sum(values * w) / np.sum(w)) if np.sum(w) > 0 else float(np.mean(values))
    q = {"p50": 0.50, "p95": 0.95}[stat]
    if method == "inverted_cdf":
        u, inv = np.unique(values, return_inverse=True)
        cw = np.zeros(len(u))
        np.add.at(cw, inv, w)
        keep = cw > 0
        u, cw = (u[keep], cw[keep]) if keep.any() else (u, np.ones(len(u)))
        cdf = np.cumsum(cw / cw.sum())
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


def window_throughput(g: pd.DataFrame, window: str) -> float:
    """A run's output tok/s over a tool's window, from its measured successful requests: `successful`:
    their tokens over the first start -> the last response (start + e2e: AIPerf's benchmark duration,
    which a failed request does not lengthen); `token_span`: their tokens over the first token -> the
    last token (GuideLLM's output tokens per second, the time-weighted mean of the rate of token events
    of the requests in its window). NaN where the records lack what it needs."""
    ok = g[g["ok"].astype(bool) & ~g["warmup"].astype(bool)]
    out = pd.to_numeric(ok["output_tokens"], errors="coerce")
    start = pd.to_numeric(ok["start_s"], errors="coerce")
    if window == "successful":
        lo, hi = start, start + pd.to_numeric(ok["e2e_s"], errors="coerce")
    else:
        if "last_token_s" not in ok or ok["last_token_s"].isna().all():
            return math.nan
        lo = start + pd.to_numeric(ok["ttft_s"], errors="coerce")
        hi = pd.to_numeric(ok["last_token_s"], errors="coerce").fillna(lo)
    wall = float(hi.max() - lo.min()) if len(ok) else math.nan
    return float(out.sum()) / wall if wall > 0 else math.nan


def by_tool(g: pd.DataFrame, f: Any, tool: Tool) -> float:
    """servelab's recomputation of figure `f` by the tool's own definition (`f.by_tool`): the tool's
    per-request values (default: servelab's), weighted as the tool weights them, with the tool's
    percentile; a run's throughput over the tool's window. NaN where the file does not keep what it
    needs."""
    g = g[~g["warmup"].astype(bool)]
    bt = f.by_tool
    if bt.values == NONE:
        return math.nan
    if f.stat == "value":
        return window_throughput(g, bt.window) if bt.window else recomputed(g, f.metric, f.stat)
    column = bt.values or f.metric
    vals, w = _weighted(g, column, bt.weights) if (bt.values or bt.weights) else (_values(g, f.metric), None)
    method = tool.percentiles if f.stat in ("p50", "p95") else "linear"
    return statistic(vals, f.stat, method, w)


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


def num(x: Any) -> str:
    """A figure in a reason: four significant digits."""
    return "–" if x is None or not math.isfinite(float(x)) else f"{float(x):.4g}"


def _reason(f: Any, tv: float, ours: float, tool_def: float, g: pd.DataFrame) -> str | None:
    """Why the tool's figure `tv` and servelab's `ours` differ beyond the tolerance (None: they agree)."""
    d, dt = _diff_pct(tv, ours), _diff_pct(tv, tool_def)
    if math.isfinite(d) and abs(d) <= f.tolerance_pct:
        return None
    numbers = f"the tool {num(tv)}, servelab {num(ours)}"
    if not f.same:
        if math.isfinite(dt) and abs(dt) <= f.tolerance_pct:
            return f"definitional ({f.differs}): {f.why}"
        if not math.isfinite(tool_def):
            return (f"definitional ({f.differs}), not checked: the records do not keep the tool's own values to "
                    f"recompute it by its definition; {f.why}")
        return (f"unexplained: {numbers}, {num(tool_def)} by the tool's definition recomputed: {f.differs} "
                f"does not account for the difference")
    stuck = _no_decode_time(g)
    if f.no_decode_why and stuck:
        return f"{f.no_decode_why} ({stuck} of {len(g)} requests in this run)"
    return f"unexplained: the definitions are the same; {numbers}"


def _sampled_row(f: Any, tv: float | None, g: pd.DataFrame, stored: int, counted: int, tool: Tool
                 ) -> dict[str, Any]:
    """A figure of a sampled report: recomputed only where the sample supports it (a statistic of the
    per-request values from at least MIN_SAMPLE stored requests; never a run's total), else the tool's
    own figure quoted."""
    head = f"sampled report: {stored} of the {counted} requests the tool counted are stored"
    if f.stat == "value" or stored < MIN_SAMPLE:
        why = ("a run's total needs every request" if f.stat == "value"
               else f"too few for a {f.stat} (servelab recomputes a sample's statistics from {MIN_SAMPLE})")
        return {"servelab": math.nan, "servelab_tool_def": math.nan, "within": None,
                "reason": f"{head}: {why}; the tool's own figure is quoted"}
    ours = recomputed(g, f.metric, f.stat)
    tdef = by_tool(g, f, tool)
    d = _diff_pct(tv, ours)
    within = bool(math.isfinite(d) and abs(d) <= f.tolerance_pct) if tv is not None else None
    return {"servelab": ours, "servelab_tool_def": tdef, "within": within,
            "reason": None if within else f"{head}: servelab's figure is the sample's, the tool's is of all {counted}"}


def harmonised_rows(df: pd.DataFrame, reported: Mapping[tuple[str, int, int], Mapping[str, Any]], tool: Tool,
                    runs: Mapping[tuple[str, int, int], Mapping[str, Any]] | None = None) -> pd.DataFrame:
    """One row per (level, round, figure of `tool`) and per metric its data cannot give: the tool's
    figure (None without its summary), servelab's recomputation from the same measured requests, the
    recomputation by the tool's definition, the differences in percent, whether servelab's is within
    the figure's tolerance, and the reason when not. `reported`: (bucket, concurrency, round) -> the
    tool's figures of that run (`<name>.<stat>`); `runs`: the same keys -> {"counted": requests the
    tool counted in its window, "window": [start, end] of its measurement window} where known."""
    df = recompute_per_request(df)
    runs = runs or {}
    rows = []
    for (bucket, conc, rnd), g in df[~df["warmup"].astype(bool)].groupby(["bucket", "concurrency", "round"], sort=True):
        key = (bucket, int(conc), int(rnd))
        rep, meta = reported.get(key) or {}, runs.get(key) or {}
        counted = meta.get("counted")
        sampled = counted is not None and len(g) < counted
        base = {"tool": tool.tool, "bucket": bucket, "concurrency": int(conc), "round": int(rnd), "requests": len(g),
                "stored": len(g), "counted": counted}
        for f in tool.figures:
            tv = rep.get(f.field)
            row = {**base, "metric": f.metric, "field": f.field, "label": f.label, "stat": f.stat,
                   "tool_value": None if tv is None else float(tv), "same": f.same, "differs": f.differs}
            if sampled:
                row.update(_sampled_row(f, tv, g, len(g), int(counted), tool))
            else:
                ours, tdef = recomputed(g, f.metric, f.stat), by_tool(g, f, tool)
                d = _diff_pct(tv, ours)
                row.update(servelab=ours, servelab_tool_def=tdef,
                           within=bool(math.isfinite(d) and abs(d) <= f.tolerance_pct) if tv is not None else None,
                           reason=(("not in the tool's summary (no summary beside the file)" if not rep
                                    else "not reported") if tv is None else _reason(f, float(tv), ours, tdef, g)))
            row["diff_pct"] = _diff_pct(tv, row["servelab"])
            row["tool_def_diff_pct"] = _diff_pct(tv, row["servelab_tool_def"])
            rows.append(row)
        for metric, why in tool.not_recomputable.items():
            rows.append({**base, "metric": metric, "field": None, "label": None, "stat": None, "tool_value": None,
                         "servelab": math.nan, "servelab_tool_def": math.nan, "diff_pct": math.nan,
                         "tool_def_diff_pct": math.nan, "same": None, "differs": None, "within": None,
                         "reason": f"cannot be recomputed: {why}"})
    return pd.DataFrame(rows, columns=COLUMNS)


def agreement(rows: pd.DataFrame, pct: float = 5.0) -> tuple[int, int]:
    """(figures whose recomputation by the tool's definition is within `pct` % of the tool's own, figures the
    tool reported): how well the file was read."""
    h = rows[rows["tool_value"].notna()] if len(rows) else rows
    if not len(h):
        return 0, 0
    d = pd.to_numeric(h["tool_def_diff_pct"], errors="coerce").abs()
    return int((d <= pct).sum()), int(len(h))


def not_recomputable(tool: Tool) -> dict[str, str]:
    """servelab metrics this tool's per-request data cannot give, and why."""
    return dict(tool.not_recomputable)


def unexplained(rows: pd.DataFrame) -> pd.DataFrame:
    """Rows whose difference exceeds the tolerance without a definitional reason."""
    if rows.empty:
        return rows
    return rows[rows["reason"].fillna("").str.startswith("unexplained")]


__all__ = ["COLUMNS", "MIN_SAMPLE", "agreement", "by_tool", "definitions", "drop_role_chunk", "harmonised_rows", "num",
           "not_recomputable", "recompute_per_request", "recomputed", "statistic", "unexplained", "window_throughput"]
